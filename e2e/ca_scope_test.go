package e2e

import (
	"context"
	cryptorand "crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/trust"
)

// rsaCSR is a fresh RSA-2048 key and a CSR of it.
func rsaCSR(t *testing.T) (*rsa.PrivateKey, string) {
	t.Helper()
	key, err := rsa.GenerateKey(cryptorand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(cryptorand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// scopeCSR is a fresh RSA-2048 CSR.
func scopeCSR(t *testing.T) string {
	t.Helper()
	_, csr := rsaCSR(t)
	return csr
}

// workloadToken creates ServiceAccount ns/sa in cs (and ns) and
// returns a token of it for audience.
func workloadToken(t *testing.T, cs kubernetes.Interface, ns, sa, audience string) string {
	t.Helper()
	ctx := testContext(t)
	if err := localcluster.EnsureNamespace(ctx, cs, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// reviewerOnlyKubeconfig is a kubeconfig of west whose credentials may
// create TokenReviews and nothing else (list nothing: such a member never
// syncs), and a function that grants them what a member needs to sync.
func reviewerOnlyKubeconfig(t *testing.T, c *localcluster.Cluster) ([]byte, func()) {
	t.Helper()
	ctx := testContext(t)
	cs := client(t, c)
	name := "hub-reviewer-" + rand.String(5)
	bind := func(role string, rules []rbacv1.PolicyRule) {
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: rules}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: "default"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bind(name, []rbacv1.PolicyRule{{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}}})
	expiry := int64(3600)
	tok, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c.TokenKubeconfig(tok.Status.Token), func() {
		bind(name+"-sync", []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "nodes", "namespaces", "secrets"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		})
	}
}

// TestCAMemberIdentityScope: the hub's CA signs a member's workload
// identities only once the member has synced, never in the hub's own
// namespace, and in Istio's root namespace only when the member's remote
// Secret carries hub.federation/allow-root-namespace-identities: "true".
// A member whose API server answers TokenReviews but never synced (its
// credentials may list nothing) gets nothing, and is not even asked.
func TestCAMemberIdentityScope(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west := e.Cluster("primary"), e.Cluster("west")
	ns := hubNamespace(t, home)
	ctx := testContext(t)
	wc := client(t, west)
	app := "scope-" + rand.String(5)
	secrets := client(t, home).CoreV1().Secrets(ns)
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{"west": west.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("scope.test")
	root := "root-" + rand.String(5) // Istio's root namespace of this test
	h := startHub(t, home, "--namespace", ns, "--root-namespace", root, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0")
	h.clusterState(t, 30*time.Second, "west", "Ready")
	creds := credentials.NewTLS(tlsconfig.TLSClientConfig(h.bundle(t, td), tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub"))))
	addr := h.addrs["xds-tls"]
	issue := func(token, cluster string) (string, error) {
		resp, err := createCertificate(addr, creds, token, cluster, scopeCSR(t), 600)
		if err != nil {
			return "", err
		}
		chain := parseCertChain(t, resp)
		member, _ := trust.MemberOf(chain[0])
		return chain[0].URIs[0].String() + " bound to " + member, nil
	}
	want := func(what string, got string, err error, code codes.Code, says string) {
		t.Helper()
		if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), says) {
			t.Errorf("%s: %q, %v; want %s saying %q", what, got, err, code, says)
		}
	}

	appToken := workloadToken(t, wc, app, "api", "istio-ca")
	gatewayToken := workloadToken(t, wc, root, "ingressgateway", "istio-ca")
	hubToken := workloadToken(t, wc, ns, "impostor", "istio-ca")
	got, err := issue(appToken, "west")
	want("an app of west", got, err, codes.OK, "")
	got, err = issue(gatewayToken, "west")
	want("west's gateway in the root namespace, no annotation", got, err, codes.PermissionDenied,
		"member west may not assert identities of Istio's root namespace "+root+": its remote Secret lacks the annotation hub.federation/allow-root-namespace-identities")
	got, err = issue(hubToken, "west")
	want("west asserting the hub's namespace", got, err, codes.PermissionDenied, "identities of namespace "+ns+", the hub's own, are never issued")

	// The operator allows west's root namespace: applies without a restart.
	s, err := secrets.Get(ctx, "members", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Annotations = map[string]string{clusters.AnnotationAllowRootNamespaceIdentities: "true"}
	if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		got, err := issue(gatewayToken, "west")
		if err != nil {
			return fmt.Errorf("west's gateway with the annotation: %v", err)
		}
		if w := "spiffe://" + td.Name() + "/ns/" + root + "/sa/ingressgateway bound to west"; got != w {
			return fmt.Errorf("issued %s; want %s", got, w)
		}
		return nil
	})
	got, err = issue(hubToken, "west")
	want("west asserting the hub's namespace, with the annotation", got, err, codes.PermissionDenied, "the hub's own, are never issued")

	// A member whose credentials may create TokenReviews but list nothing
	// never syncs: a token of west (west's API server would accept it)
	// claiming that member gets nothing, and no review is sent.
	reviewerOnly, grant := reviewerOnlyKubeconfig(t, west)
	gone := strings.Replace(string(west.Kubeconfig()), west.Server(), "https://127.0.0.1:1", 1)
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "late", map[string][]byte{"unsynced": reviewerOnly, "stopped": []byte(gone)}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		cl := h.clusters(t)
		if _, ok := cl["unsynced"]; !ok {
			return fmt.Errorf("members: %+v", cl)
		}
		if _, ok := cl["stopped"]; !ok {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})
	reviewsBefore := metric(t, h, `hub_token_reviews_total{result="accepted"}`)
	for _, member := range []string{"unsynced", "stopped"} {
		got, err = issue(appToken, member)
		want("a west token claiming never-synced member "+member, got, err, codes.PermissionDenied, "member "+member+" has not synced since this hub started")
	}
	if after := metric(t, h, `hub_token_reviews_total{result="accepted"}`); after != reviewsBefore {
		t.Errorf("accepted token reviews went from %s to %s while only never-synced members were asked", reviewsBefore, after)
	}
	if n := metric(t, h, `hub_ca_requests_failed_total{reason="member_not_synced"}`); n != "2" {
		t.Errorf("hub_ca_requests_failed_total{reason=member_not_synced} = %q; want 2", n)
	}

	// Once the member may list what it must, it syncs and its workloads
	// get their identities, bound to it.
	grant()
	eventually(t, 90*time.Second, func() error {
		got, err := issue(appToken, "unsynced")
		if err != nil {
			return fmt.Errorf("the member once synced: %v (state %s)", err, h.clusters(t)["unsynced"].State)
		}
		if w := "spiffe://" + td.Name() + "/ns/" + app + "/sa/api bound to unsynced"; got != w {
			return fmt.Errorf("issued %s; want %s", got, w)
		}
		return nil
	})

	logs, err := os.ReadFile(h.logPath)
	if err != nil {
		t.Fatal(err)
	}
	for what, token := range map[string]string{"app": appToken, "gateway": gatewayToken, "impostor": hubToken} {
		if strings.Contains(string(logs), token) {
			t.Errorf("the hub's log contains the %s token", what)
		}
	}
	for _, reason := range []string{"root_namespace", "hub_namespace", "member_not_synced"} {
		if !strings.Contains(string(logs), `"reason":"`+reason+`"`) {
			t.Errorf("no refusal for %s is logged", reason)
		}
	}
}

// tokenReviewsServed reads how many TokenReviews c's API server has
// answered (its apiserver_request_total for tokenreviews, all codes).
func tokenReviewsServed(t *testing.T, c *localcluster.Cluster) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := client(t, c).CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "apiserver_request_total{") && strings.Contains(line, `resource="tokenreviews"`) && strings.Contains(line, `verb="POST"`) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			n += int(v)
		}
	}
	return n
}

// TestCAMadeUpTokensAreLimited: anonymous callers sending made-up tokens
// make the hub send at most a burst of TokenReviews (plus one a second)
// to the member's real API server, counted by the API server itself; the
// rest are refused with ResourceExhausted, and a token already rejected
// is not reviewed again.
func TestCAMadeUpTokensAreLimited(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west := e.Cluster("primary"), e.Cluster("west")
	ns := hubNamespace(t, home)
	ctx := testContext(t)
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{"west": west.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("flood.test")
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0")
	h.clusterState(t, 30*time.Second, "west", "Ready")
	creds := credentials.NewTLS(tlsconfig.TLSClientConfig(h.bundle(t, td), tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub"))))
	csr := scopeCSR(t)
	before := tokenReviewsServed(t, west)
	start := time.Now()
	const tries, burst = 100, 20 // burst: the hub's tokenFailureBurst
	codesSeen := map[codes.Code]int{}
	for i := range tries {
		_, err := createCertificate(h.addrs["xds-tls"], creds, "made-up-"+rand.String(20), "west", csr, 0)
		codesSeen[status.Code(err)]++
		if i == 0 { // the same token again: answered from the negative cache
			_, err := createCertificate(h.addrs["xds-tls"], creds, "made-up-again", "west", csr, 0)
			_, again := createCertificate(h.addrs["xds-tls"], creds, "made-up-again", "west", csr, 0)
			if status.Code(err) != codes.Unauthenticated || status.Code(again) != codes.Unauthenticated {
				t.Fatalf("a made-up token twice: %v, %v; want Unauthenticated", err, again)
			}
		}
	}
	refills := int(time.Since(start)/time.Second) + 1
	served := tokenReviewsServed(t, west) - before
	t.Logf("%d made-up tokens in %s: %d TokenReviews reached west's API server; codes %v", tries, time.Since(start).Round(time.Millisecond), served, codesSeen)
	if limit := burst + refills; served > limit {
		t.Errorf("west's API server answered %d TokenReviews for %d made-up tokens; want at most %d (burst %d + one a second)", served, tries, limit, burst)
	}
	if tries > burst+refills && codesSeen[codes.ResourceExhausted] == 0 {
		t.Errorf("no made-up token was refused with ResourceExhausted: %v", codesSeen)
	}
	if codesSeen[codes.ResourceExhausted]+codesSeen[codes.Unauthenticated] != tries {
		t.Errorf("codes %v; want only Unauthenticated and ResourceExhausted", codesSeen)
	}
	if got, want := metric(t, h, `hub_token_reviews_total{result="rejected"}`), strconv.Itoa(served); got != want {
		t.Errorf("hub_token_reviews_total{result=rejected} = %s; west's API server counted %s", got, want)
	}
	if got := metric(t, h, `hub_token_refusals_total{reason="cached_rejection"}`); got != "1" {
		t.Errorf("hub_token_refusals_total{reason=cached_rejection} = %s; want 1", got)
	}
}
