package e2e

import (
	"context"
	cryptorand "crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/chromium"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/trust"
)

// createCertificate calls Istio's CA API as istio-agent does: the token as
// authorization: Bearer, the member in the ClusterID header.
func createCertificate(addr string, creds credentials.TransportCredentials, token, cluster, csr string, ttl int64) (*securityv1alpha1.IstioCertificateResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token, "ClusterID", cluster)
	return securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx,
		&securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: ttl})
}

// TestCACertificatesForServiceAccountTokens: the hub's CA issues a workload
// its identity from a real ServiceAccount token reviewed in the member its
// ClusterID header names, whatever the CSR asks for; a token never obtains
// a certificate in another member's name, and requests the hub must not
// sign are refused with the code istio-agent expects.
func TestCACertificatesForServiceAccountTokens(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ns := hubNamespace(t, home)
	app := "ca-" + rand.String(5)
	ctx := testContext(t)
	for _, c := range []*localcluster.Cluster{west, east} {
		cs := client(t, c)
		if err := localcluster.EnsureNamespace(ctx, cs, app); err != nil {
			t.Fatal(err)
		}
		for _, sa := range []string{"gateway", "doomed"} {
			if _, err := cs.CoreV1().ServiceAccounts(app).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"west": west.Kubeconfig(), "east": east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("ca.test")
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0", "--max-workload-cert-ttl", "48h")
	eventually(t, 30*time.Second, func() error {
		if cl := h.clusters(t); cl["west"].State != "Ready" || cl["east"].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})
	bundle := h.bundle(t, td)
	creds := credentials.NewTLS(tlsconfig.TLSClientConfig(bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub"))))
	addr := h.addrs["xds-tls"]
	token := func(sa, audience string) string {
		tr, err := client(t, west).CoreV1().ServiceAccounts(app).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	westToken := token("gateway", "istio-ca")

	// The CSR claims kube-system's admin: it is ignored.
	key, err := rsa.GenerateKey(cryptorand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	admin, _ := url.Parse("spiffe://" + td.Name() + "/ns/kube-system/sa/admin")
	der, err := x509.CreateCertificateRequest(cryptorand.Reader, &x509.CertificateRequest{URIs: []*url.URL{admin}}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))

	resp, err := createCertificate(addr, creds, westToken, "west", csr, 3600)
	if err != nil {
		t.Fatalf("a west token asking in west: %v", err)
	}
	chain := parseCertChain(t, resp)
	want := "spiffe://" + td.Name() + "/ns/" + app + "/sa/gateway"
	if len(chain) < 2 || len(chain[0].URIs) != 1 || chain[0].URIs[0].String() != want {
		t.Fatalf("issued chain of %d, leaf URIs %v; want leaf for %s and the root", len(chain), chain[0].URIs, want)
	}
	if m, ok := trust.MemberOf(chain[0]); !ok || m != "west" {
		t.Errorf("leaf bound to member %q; want west", m)
	}
	if root := chain[len(chain)-1]; !containsAuthority(bundle.X509Authorities(), root) {
		t.Errorf("the last element %q is not a root of our bundle", root.Subject)
	}
	if !key.PublicKey.Equal(chain[0].PublicKey) {
		t.Error("the leaf does not carry the CSR's key")
	}

	deadToken := token("doomed", "istio-ca")
	if err := client(t, west).CoreV1().ServiceAccounts(app).Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		token, cluster string
		csr            string
		ttl            int64
		code           codes.Code
	}{
		// East's API server does not know west's token (it names a
		// ServiceAccount UID only west has).
		{"a west token claiming east", westToken, "east", csr, 0, codes.Unauthenticated},
		{"a token for the API server's audience", token("gateway", "https://kubernetes.default.svc.cluster.local"), "west", csr, 0, codes.Unauthenticated},
		// Token lifetimes are at least 10 minutes: a token whose
		// ServiceAccount was deleted stands for an expired one (both fail
		// the member's TokenReview).
		{"a token of a deleted ServiceAccount", deadToken, "west", csr, 0, codes.Unauthenticated},
		{"a garbage CSR", westToken, "west", "-----BEGIN CERTIFICATE REQUEST-----\nZ2FyYmFnZQ==\n-----END CERTIFICATE REQUEST-----\n", 0, codes.InvalidArgument},
		{"a TTL above --max-workload-cert-ttl", westToken, "west", csr, 72 * 3600, codes.InvalidArgument},
	} {
		if resp, err := createCertificate(addr, creds, tc.token, tc.cluster, tc.csr, tc.ttl); status.Code(err) != tc.code {
			t.Errorf("%s: %d certificates, %v; want %s", tc.name, len(resp.GetCertChain()), err, tc.code)
		}
	}

	// The API shows the issuance and the refusals.
	var st api.Certificates
	h.getJSON(t, "/api/v1/certificates", &st)
	var group *api.CertificateGroup
	for i, g := range st.Issued {
		if g.Member == "west" && g.Namespace == app {
			group = &st.Issued[i]
		}
	}
	if group == nil || group.Issued != 1 || group.Valid != 1 || group.NextExpiry == nil || !group.NextExpiry.Equal(chain[0].NotAfter) {
		t.Errorf("/api/v1/certificates issued %+v; want west/%s: 1 issued, 1 valid, next expiry %s", st.Issued, app, chain[0].NotAfter)
	}
	failures := map[string]uint64{}
	for _, f := range st.Failures {
		failures[f.Reason] = f.Total
	}
	if failures["token_rejected"] != 3 || failures["invalid_csr"] != 1 || failures["invalid_ttl"] != 1 || st.MaxTTLSeconds != 48*3600 {
		t.Errorf("/api/v1/certificates failures %v, max TTL %ds; want 3 token_rejected, 1 invalid_csr, 1 invalid_ttl, 172800", failures, st.MaxTTLSeconds)
	}

	// The dashboard's Trust page shows the same, in a real browser, and
	// never the token or the CSR.
	bctx := chromium.Start(t)
	chromium.Do(t, bctx, "sign in", chromedp.Navigate(h.adminURL+"/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SetValue(chromedp.ID("token"), home.AdminToken()), chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.CSS("#members-total")))
	chromium.Do(t, bctx, "open trust", chromedp.Navigate(h.adminURL+"/trust"), chromedp.WaitVisible(chromedp.CSS("section.certificates")))
	chromium.Screenshot(t, bctx, chromium.Artifacts(t), "ca-trust-certificates")
	page := chromium.PageHTML(t, bctx)
	for _, want := range []string{"<td>west</td><td>" + app + "</td><td>1</td><td>1</td>", "token_rejected", "invalid_ttl"} {
		if !strings.Contains(page, want) {
			t.Errorf("the Trust page does not show %q", want)
		}
	}
	for what, secret := range map[string]string{"token": westToken, "CSR": strings.Split(csr, "\n")[1]} {
		if strings.Contains(page, secret) {
			t.Errorf("the Trust page shows the %s", what)
		}
	}

	// The hub's log (at debug level) never holds a token or the CSR.
	logs, err := os.ReadFile(h.logPath)
	if err != nil {
		t.Fatal(err)
	}
	for what, secret := range map[string]string{"token": westToken, "deleted account's token": deadToken, "CSR": strings.Split(csr, "\n")[1]} {
		if strings.Contains(string(logs), secret) {
			t.Errorf("the hub's log contains the %s", what)
		}
	}
	if !strings.Contains(string(logs), `"msg":"workload certificate refused"`) {
		t.Error("no refusal is logged")
	}
}

// parseCertChain parses the PEM certificates of a CreateCertificate answer.
func parseCertChain(t *testing.T, resp *securityv1alpha1.IstioCertificateResponse) []*x509.Certificate {
	t.Helper()
	var chain []*x509.Certificate
	for _, p := range resp.GetCertChain() {
		block, _ := pem.Decode([]byte(p))
		if block == nil {
			t.Fatalf("cert_chain element is not PEM: %q", p)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		chain = append(chain, c)
	}
	return chain
}

func containsAuthority(list []*x509.Certificate, c *x509.Certificate) bool {
	for _, a := range list {
		if a.Equal(c) {
			return true
		}
	}
	return false
}

// TestCAAccountDeletedAfterUse: a ServiceAccount whose token got a
// certificate is deleted in its member. Its token gets nothing within
// seconds (the CA re-reviews tokens older than 5 s and the member says no),
// and the certificate it got renews only up to its own expiry: a leaked
// certificate does not outlive itself by renewing.
func TestCAAccountDeletedAfterUse(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west := e.Cluster("primary"), e.Cluster("west")
	ns := hubNamespace(t, home)
	app := "ca-del-" + rand.String(5)
	ctx := testContext(t)
	wc := client(t, west)
	if err := localcluster.EnsureNamespace(ctx, wc, app); err != nil {
		t.Fatal(err)
	}
	if _, err := wc.CoreV1().ServiceAccounts(app).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "leaky"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"west": west.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("ca-del.test")
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0")
	eventually(t, 30*time.Second, func() error {
		if cl := h.clusters(t); cl["west"].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})
	bundle := h.bundle(t, td)
	verify := tlsconfig.TLSClientConfig(bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub")))
	addr := h.addrs["xds-tls"]
	tr, err := wc.CoreV1().ServiceAccounts(app).CreateToken(ctx, "leaky", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newCSR := func() (*rsa.PrivateKey, string) { return rsaCSR(t) }
	key, csr := newCSR()
	resp, err := createCertificate(addr, credentials.NewTLS(verify), tr.Status.Token, "west", csr, 600)
	if err != nil {
		t.Fatalf("the account's token before its deletion: %v", err)
	}
	chain := parseCertChain(t, resp)
	issued := tls.Certificate{PrivateKey: key, Leaf: chain[0]}
	for _, c := range chain {
		issued.Certificate = append(issued.Certificate, c.Raw)
	}

	if err := wc.CoreV1().ServiceAccounts(app).Delete(ctx, "leaky", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The member's API server caches accepted tokens itself (10 s in
	// kube-apiserver); the CA's own cache adds at most 5 s.
	eventually(t, 30*time.Second, func() error {
		_, csr := newCSR()
		_, err := createCertificate(addr, credentials.NewTLS(verify), tr.Status.Token, "west", csr, 600)
		if status.Code(err) != codes.Unauthenticated {
			return fmt.Errorf("the deleted account's token: %v; want Unauthenticated", err)
		}
		return nil
	})

	// The certificate alone renews (key rotation), never beyond itself.
	withCert := verify.Clone()
	withCert.Certificates = []tls.Certificate{issued}
	_, csr = newCSR()
	resp, err = createCertificate(addr, credentials.NewTLS(withCert), "", "west", csr, 48*3600)
	if err != nil {
		t.Fatalf("renewal by certificate: %v", err)
	}
	if got := parseCertChain(t, resp)[0].NotAfter; got.After(issued.Leaf.NotAfter) {
		t.Errorf("the renewed certificate ends %s, after the one presented (%s)", got, issued.Leaf.NotAfter)
	}
}
