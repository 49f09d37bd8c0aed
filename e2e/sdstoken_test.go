package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/xdstest"
)

// bearer sends a service-account token the way istio-agent does.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false } // the plaintext case is tested too

// sdsTry asks for SDS resources, with token as a bearer token unless it is
// empty, and returns what the first response held, or the stream's error.
func sdsTry(addr string, creds credentials.TransportCredentials, token bearer, cluster string, names ...string) (map[string]*tlsv3.Secret, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(token))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := xdstest.Fetch(ctx, conn, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("token-"+rand.String(4), cluster), TypeUrl: resourcev3.SecretType, ResourceNames: names})
	if err != nil {
		return nil, err
	}
	out := map[string]*tlsv3.Secret{}
	for _, a := range resp.Resources {
		var s tlsv3.Secret
		if err := a.UnmarshalTo(&s); err != nil {
			return nil, err
		}
		out[s.Name] = &s
	}
	return out, nil
}

// TestSDSWithServiceAccountToken: a proxy without a client certificate
// proves its identity with a Kubernetes service-account token, which the
// hub checks with a TokenReview in the member the proxy names. It gets that
// member's secrets of its own namespace and nothing else.
func TestSDSWithServiceAccountToken(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ns := hubNamespace(t, home)
	app := "tok-" + rand.String(5)
	ctx := testContext(t)
	for c, cert := range map[*localcluster.Cluster]string{west: "WEST", east: "EAST"} {
		cs := client(t, c)
		if err := localcluster.EnsureNamespace(ctx, cs, app); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Secrets(app).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gw-cert"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": []byte(cert + "-CERT"), "tls.key": []byte(cert + "-KEY")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The same service account name in both members: a token binds to
		// the account's UID, which only the issuing member has.
		if _, err := cs.CoreV1().ServiceAccounts(app).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "gateway"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"west": west.Kubeconfig(), "east": east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("token.test")
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0")
	eventually(t, 30*time.Second, func() error {
		if cl := h.clusters(t); cl["west"].State != "Ready" || cl["east"].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})
	bundle := h.bundle(t, td)
	// Server-authenticated TLS only: the client has no certificate.
	tlsCreds := credentials.NewTLS(tlsconfig.TLSClientConfig(bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub"))))
	token := func(audience string) bearer {
		tr, err := client(t, west).CoreV1().ServiceAccounts(app).CreateToken(ctx, "gateway", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return bearer(tr.Status.Token)
	}
	westToken := token("istio-ca")
	names := []string{"kubernetes://gw-cert", "ROOTCA", "kubernetes://other/gw-cert"}
	tlsAddr := h.addrs["xds-tls"]

	eventually(t, 30*time.Second, func() error { // the secret informers sync shortly after the members
		got, err := sdsTry(tlsAddr, tlsCreds, westToken, "west", names...)
		if err != nil {
			return err
		}
		if c := got["kubernetes://gw-cert"].GetTlsCertificate().GetCertificateChain().GetInlineBytes(); string(c) != "WEST-CERT" || got["ROOTCA"] == nil {
			return fmt.Errorf("a west token got %v", keys(got))
		}
		if got["kubernetes://other/gw-cert"] != nil {
			t.Fatal("a token of namespace " + app + " got a secret of namespace other")
		}
		return nil
	})
	// West's token claiming to be an east proxy is refused by east's API
	// server, so it can never read east's secrets.
	if got, err := sdsTry(tlsAddr, tlsCreds, westToken, "east", names...); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a west token presented as east: %v, %v; want Unauthenticated", keys(got), err)
	}
	// A token for another audience (the API server's own) is refused.
	if got, err := sdsTry(tlsAddr, tlsCreds, token("https://kubernetes.default.svc.cluster.local"), "west", names...); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a token for another audience: %v, %v; want Unauthenticated", keys(got), err)
	}
	if got, err := sdsTry(tlsAddr, tlsCreds, "not-a-token", "west", names...); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a garbage token: %v, %v; want Unauthenticated", keys(got), err)
	}
	// Over plaintext a token proves nothing: no secrets at all.
	if got, err := sdsTry(h.xdsAddr, insecure.NewCredentials(), westToken, "west", names...); err != nil || len(got) != 0 {
		t.Errorf("a plaintext client with a token got %v, %v; want no secrets", keys(got), err)
	}
}
