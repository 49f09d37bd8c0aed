package e2e

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
)

// scrapeMetrics returns the hub's /metrics text, read with its admin token
// (--metrics-auth=token is the default).
func (h *hubProcess) scrapeMetrics(t *testing.T) string {
	t.Helper()
	code, body := h.do(t, "GET", "/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %.300s", code, body)
	}
	return body
}

// metricsScraperToken returns the token of a service account in a
// namespace of its own whose service accounts are bound, cluster-wide, to a
// ClusterRole allowing get on the non-resource URL /metrics (what a
// Prometheus scraping Kubernetes components has).
func metricsScraperToken(t *testing.T, home *localcluster.Cluster) string {
	t.Helper()
	ctx := testContext(t)
	cs := client(t, home)
	ns := hubNamespace(t, home)
	name := "metrics-scraper-" + ns
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "Group", Name: "system:serviceaccounts:" + ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := testContext(t)
		_ = cs.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = cs.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return serviceAccountToken(t, home, ns)
}

// TestMetricsAuth: the real hub with Kubernetes TokenReview and
// SubjectAccessReview answers /metrics without a valid token with 401
// problem+json, a token without the right with 403, and serves it to a
// scraper allowed get on the non-resource URL /metrics, to an API reader
// and to the admin; with --metrics-auth=none it needs no token.
func TestMetricsAuth(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("primary")
	ns := hubNamespace(t, home)
	h := startHub(t, home, "--namespace", ns)
	c := &apiClient{base: h.adminURL}
	c.expect(t, "GET", "/metrics", "", "", 401, "a bearer token is required")
	c.expect(t, "GET", "/metrics", "not-a-token", "", 401, "the bearer token is not valid")
	nobody := serviceAccountToken(t, home, ns)
	c.expect(t, "GET", "/metrics", nobody, "", 403, "may not get /metrics (non-resource URL) nor get secrets in namespace "+ns)
	scraper := metricsScraperToken(t, home)
	reader := serviceAccountToken(t, home, ns, "get")
	for who, tok := range map[string]string{"scraper": scraper, "reader": reader, "admin": home.AdminToken()} {
		if code, body, _ := c.call(t, "GET", "/metrics", tok, ""); code != 200 || !strings.Contains(body, "hub_xds_connected_streams") {
			t.Errorf("/metrics for the %s: %d %.200s", who, code, body)
		}
	}
	// The scraper may read metrics, not the API.
	c.expect(t, "GET", "/api/v1/clusters", scraper, "", 403, "may not get secrets")
	for i, b := range c.bodies {
		for _, tok := range []string{scraper, reader, nobody} {
			if strings.Contains(b, tok) {
				t.Errorf("response %d carries a token", i)
			}
		}
	}
	if log, _ := os.ReadFile(h.logPath); strings.Contains(string(log), scraper) || strings.Contains(string(log), nobody) {
		t.Error("the hub's log carries a token")
	}

	open := startHub(t, home, "--namespace", hubNamespace(t, home), "--metrics-auth", "none")
	oc := &apiClient{base: open.adminURL}
	if code, body, _ := oc.call(t, "GET", "/metrics", "", ""); code != 200 || !strings.Contains(body, "hub_xds_connected_streams") {
		t.Errorf("/metrics with --metrics-auth=none and no token: %d %.200s", code, body)
	}
}

// TestBundleEndpointGuard: with loopback denied for bundle endpoints, the
// real hub refuses a PUT whose bundleEndpointURL is a denied IP literal
// (422 problem+json, nothing written) and, for a DNS name resolving into a
// denied range, refuses every connection: the trust domain is in Error
// with the reason, the log says why, and the peer's real HTTPS endpoint
// never sees a request.
func TestBundleEndpointGuard(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("primary")
	ns := hubNamespace(t, home)
	h := startHub(t, home, "--namespace", ns, "--bundle-endpoint-deny-cidrs", "127.0.0.0/8,::1/128,169.254.0.0/16,fe80::/10")
	var requests atomic.Int32
	peer := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { requests.Add(1) }))
	defer peer.Close()
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: peer.Certificate().Raw}))
	put := func(url string) (int, string) {
		body, _ := json.Marshal(api.PeerRequest{BundleEndpointURL: url, Profile: "https_web", CABundle: caPEM})
		return h.do(t, "PUT", "/api/v1/trustdomains/peer.test", string(body))
	}
	c := &apiClient{base: h.adminURL}
	for url, msg := range map[string]string{
		"https://169.254.169.254/bundle": "address 169.254.169.254 is in the denied range 169.254.0.0/16 (--bundle-endpoint-deny-cidrs)",
		"https://[::]:8443/bundle":       "address :: is unspecified",
		peer.URL:                         "is in the denied range 127.0.0.0/8",
	} {
		body, _ := json.Marshal(api.PeerRequest{BundleEndpointURL: url, Profile: "https_web", CABundle: caPEM})
		c.expect(t, "PUT", "/api/v1/trustdomains/peer.test", h.token, string(body), 422, msg)
	}
	if code, body := h.do(t, "GET", "/api/v1/trustdomains/peer.test", ""); code != 404 {
		t.Fatalf("a refused relationship is listed: %d %s", code, body)
	}

	if code, body := put(strings.Replace(peer.URL, "127.0.0.1", "localhost", 1)); code != 201 {
		t.Fatalf("PUT by DNS name: %d %s", code, body)
	}
	eventually(t, 60*time.Second, func() error {
		st, err := h.findTrustDomain(t, "peer.test")
		if err != nil {
			return err
		}
		if st.State != "Error" || !strings.Contains(st.Message, "refusing to connect to a bundle endpoint: address ") ||
			!strings.Contains(st.Message, "(--bundle-endpoint-deny-cidrs)") {
			return fmt.Errorf("peer.test: %s %q", st.State, st.Message)
		}
		return nil
	})
	log, _ := os.ReadFile(h.logPath)
	if !strings.Contains(string(log), `"msg":"peer bundle rejected"`) || !strings.Contains(string(log), `"reason":"address_refused"`) {
		t.Errorf("no log line for the refused fetch:\n%s", tail(string(log), 20))
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("the peer's endpoint served %d requests", n)
	}
}
