package e2e

import (
	"fmt"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

// sdsFetch asks the hub for SDS resources and returns the secrets by name.
func sdsFetch(t *testing.T, addr string, creds credentials.TransportCredentials, cluster string, names ...string) map[string]*tlsv3.Secret {
	t.Helper()
	got, err := sdsTry(addr, creds, "", cluster, names...)
	if err != nil {
		t.Fatalf("SDS: %v", err)
	}
	return got
}

// TestSDSEndToEnd serves TLS material from real member Secrets over the
// hub's mTLS port, only to a verified identity of the secret's namespace
// and member, never over plaintext.
func TestSDSEndToEnd(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ns := hubNamespace(t, home)
	app := "app-" + rand.String(5)
	ctx := testContext(t)
	for c, cert := range map[*localcluster.Cluster]string{west: "WEST", east: "EAST"} {
		cs := client(t, c)
		if err := localcluster.EnsureNamespace(ctx, cs, app); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Secrets(app).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gw-cert"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": []byte(cert + "-CERT"), "tls.key": []byte(cert + "-KEY"), "ca.crt": []byte(cert + "-CA")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"west": west.Kubeconfig(), "east": east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("sds.test")
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0")
	eventually(t, 30*time.Second, func() error {
		cl := h.clusters(t)
		if cl["west"].State != "Ready" || cl["east"].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})
	ca := hubCA(t, home, ns, td)
	workload := workloadCreds(t, ca, h.bundle(t, td))
	creds := func(ns, member string) credentials.TransportCredentials { return workload(ns, "gateway", member) }
	names := []string{"kubernetes://gw-cert", "gw-cert-cacert", "ROOTCA", "kubernetes://other/gw-cert"}
	tlsAddr := h.addrs["xds-tls"]

	eventually(t, 30*time.Second, func() error { // the secret informers sync shortly after the members
		got := sdsFetch(t, tlsAddr, creds(app, "west"), "west", names...)
		if c := got["kubernetes://gw-cert"].GetTlsCertificate().GetCertificateChain().GetInlineBytes(); string(c) != "WEST-CERT" {
			return fmt.Errorf("west gateway got %v", keys(got))
		}
		if string(got["gw-cert-cacert"].GetValidationContext().GetTrustedCa().GetInlineBytes()) != "WEST-CA" || got["ROOTCA"] == nil {
			return fmt.Errorf("west gateway got %v", keys(got))
		}
		if got["kubernetes://other/gw-cert"] != nil {
			t.Fatal("a proxy in namespace " + app + " got a secret of namespace other")
		}
		return nil
	})
	if got := sdsFetch(t, tlsAddr, creds(app, "east"), "east", "kubernetes://gw-cert"); string(got["kubernetes://gw-cert"].GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != "EAST-CERT" {
		t.Errorf("an east proxy must get east's secret: %v", keys(got))
	}
	if got := sdsFetch(t, tlsAddr, creds("intruder", "west"), "west", names...); len(got) != 1 || got["ROOTCA"] == nil {
		t.Errorf("a proxy of another namespace got %v; want only ROOTCA", keys(got))
	}
	if got := sdsFetch(t, h.xdsAddr, insecure.NewCredentials(), "west", names...); len(got) != 0 {
		t.Errorf("a plaintext client got secrets: %v", keys(got))
	}

	// Another namespace's secret is served once the proxy's service account
	// may list Secrets there (SubjectAccessReview in the proxy's member).
	westClient := client(t, west)
	if _, err := westClient.RbacV1().Roles(app).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "gw-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := westClient.RbacV1().RoleBindings(app).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gw-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "gw-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "gateway", Namespace: "intruder"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cross := "kubernetes://" + app + "/gw-cert"
	if got := sdsFetch(t, tlsAddr, creds("intruder", "west"), "west", cross); string(got[cross].GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != "WEST-CERT" {
		t.Errorf("a service account allowed to list %s's secrets in west got %v", app, keys(got))
	}
	if got := sdsFetch(t, tlsAddr, creds("intruder", "east"), "east", cross); len(got) != 0 {
		t.Errorf("the grant in west must not open east: got %v", keys(got))
	}
}

func keys(m map[string]*tlsv3.Secret) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
