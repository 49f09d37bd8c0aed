package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
)

// apiCall is one request to the hub's API; every response body is kept so
// that the test can scan all of them for credential material.
type apiClient struct {
	base   string
	bodies []string
}

func (c *apiClient) call(t *testing.T, method, path, token, body string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	c.bodies = append(c.bodies, string(b))
	return resp.StatusCode, string(b), resp.Header
}

func (c *apiClient) expect(t *testing.T, method, path, token, body string, status int, contains string) string {
	t.Helper()
	got, b, h := c.call(t, method, path, token, body)
	if got != status || !strings.Contains(b, contains) {
		t.Fatalf("%s %s: %d %s; want %d containing %q", method, path, got, b, status, contains)
	}
	if status >= 400 && h.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%s %s: error with Content-Type %q", method, path, h.Get("Content-Type"))
	}
	return b
}

// serviceAccountToken creates a service account in the home cluster bound to
// a Role over secrets in ns with the given verbs (none: no binding).
func serviceAccountToken(t *testing.T, home *localcluster.Cluster, ns string, verbs ...string) string {
	t.Helper()
	ctx := testContext(t)
	cs := client(t, home)
	name := "api-user-" + rand.String(5)
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(verbs) > 0 {
		if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: verbs}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	exp := int64(3600)
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Status.Token
}

// TestAPIOnRealClusters drives every route of the REST API against a real
// hub with Kubernetes TokenReview/SubjectAccessReview authentication.
func TestAPIOnRealClusters(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ns := hubNamespace(t, home)
	h := startHub(t, home, "--namespace", ns)
	c := &apiClient{base: h.adminURL}
	admin := home.AdminToken()
	reader := serviceAccountToken(t, home, ns, "get")
	nobody := serviceAccountToken(t, home, ns)

	routes := []struct{ method, path string }{
		{"GET", "/api/v1/clusters"}, {"GET", "/api/v1/clusters/primary"}, {"POST", "/api/v1/clusters"},
		{"DELETE", "/api/v1/clusters/x"}, {"GET", "/api/v1/services"}, {"GET", "/api/v1/proxies"},
		{"GET", "/api/v1/proxies/x/config"}, {"GET", "/api/v1/openapi.json"},
	}
	for _, r := range routes {
		c.expect(t, r.method, r.path, "", "", 401, "a bearer token is required")
		c.expect(t, r.method, r.path, "not-a-token", "", 401, "not valid")
		c.expect(t, r.method, r.path, nobody, "", 403, "may not")
	}
	c.expect(t, "GET", "/api/v1/clusters", reader, "", 200, `"id":"primary"`)
	body := func(id string, kc []byte) string {
		b, _ := json.Marshal(api.RegisterRequest{ID: id, Kubeconfig: string(kc)})
		return string(b)
	}
	c.expect(t, "POST", "/api/v1/clusters", reader, body("west", west.Kubeconfig()), 403, "may not create secrets")
	c.expect(t, "DELETE", "/api/v1/clusters/west", reader, "", 403, "may not create secrets")

	// Validation: nothing is written for a bad request.
	c.expect(t, "POST", "/api/v1/clusters", admin, `{"id":"west","kubeconfig":"x","token":"y"}`, 400, `unknown field \"token\"`)
	c.expect(t, "POST", "/api/v1/clusters", admin, body("primary", west.Kubeconfig()), 422, "home cluster's own ID")
	c.expect(t, "POST", "/api/v1/clusters", admin, body("bad id", west.Kubeconfig()), 422, "must match")
	execKC := strings.Replace(string(west.Kubeconfig()), "client-certificate-data:", "exec: {command: /bin/true, apiVersion: client.authentication.k8s.io/v1}\n    client-certificate-data:", 1)
	c.expect(t, "POST", "/api/v1/clusters", admin, body("west", []byte(execKC)), 422, "exec credential plugins are not allowed")
	c.expect(t, "POST", "/api/v1/clusters", admin, `{"id":"west","kubeconfig":"`+strings.Repeat("a", 1<<20)+`"}`, 413, "exceeds")
	if list, err := client(t, home).CoreV1().Secrets(ns).List(testContext(t), metav1.ListOptions{LabelSelector: "istio/multiCluster=true"}); err != nil || len(list.Items) != 0 {
		t.Fatalf("rejected requests wrote %d remote secrets (%v)", len(list.Items), err)
	}

	// Register, update, read, remove.
	c.expect(t, "POST", "/api/v1/clusters", admin, body("west", west.Kubeconfig()), 201, `"id":"west"`)
	c.expect(t, "POST", "/api/v1/clusters", admin, body("west", west.Kubeconfig()), 200, `"secret":"`+ns+`/istio-remote-secret-west"`)
	c.expect(t, "POST", "/api/v1/clusters", admin, body("east", east.Kubeconfig()), 201, `"id":"east"`)
	eventually(t, 30*time.Second, func() error {
		_, b, _ := c.call(t, "GET", "/api/v1/clusters/east", admin, "")
		if !strings.Contains(b, `"state":"Ready"`) {
			return fmt.Errorf("east: %s", b)
		}
		return nil
	})
	c.expect(t, "GET", "/api/v1/clusters/nowhere", admin, "", 404, "cluster nowhere is not registered")
	c.expect(t, "GET", "/api/v1/services", admin, "", 200, `"hostname":"kubernetes.default.svc.cluster.local"`)
	c.expect(t, "DELETE", "/api/v1/clusters/primary", admin, "", 422, "cannot be removed")
	c.expect(t, "DELETE", "/api/v1/clusters/east", admin, "", 204, "")
	c.expect(t, "DELETE", "/api/v1/clusters/east", admin, "", 204, "")
	eventually(t, 30*time.Second, func() error {
		if code, b, _ := c.call(t, "GET", "/api/v1/clusters/east", admin, ""); code != 404 {
			return fmt.Errorf("east still there: %s", b)
		}
		return nil
	})

	// Proxies and their config.
	nackingProxy(t, h.xdsAddr, "api-proxy", "rejected for the API test")
	eventually(t, 10*time.Second, func() error {
		_, b, _ := c.call(t, "GET", "/api/v1/proxies", admin, "")
		if !strings.Contains(b, `"nackError":"rejected for the API test"`) {
			return fmt.Errorf("proxies: %s", b)
		}
		return nil
	})
	c.expect(t, "GET", "/api/v1/proxies/api-proxy/config", admin, "", 200, `"CDS":[`)
	c.expect(t, "GET", "/api/v1/proxies/ghost/config", admin, "", 404, "not connected")
	var doc map[string]any
	if err := json.Unmarshal([]byte(c.expect(t, "GET", "/api/v1/openapi.json", reader, "", 200, "openapi")), &doc); err != nil {
		t.Fatal(err)
	}
	// Only east's readiness was waited for above: wait for west's gauge too.
	eventually(t, 30*time.Second, func() error {
		_, metrics, _ := c.call(t, "GET", "/metrics", admin, "")
		for _, m := range []string{`hub_cluster_state{cluster="west",secret="` + ns + `/istio-remote-secret-west",state="Ready"} 1`, "hub_xds_nacks_total", "hub_xds_connected_streams"} {
			if !strings.Contains(metrics, m) {
				return fmt.Errorf("/metrics lacks %s", m)
			}
		}
		return nil
	})

	// No response ever carried credentials.
	for i, b := range c.bodies {
		requireNoSecrets(t, fmt.Sprintf("response %d", i), b, home, west, east)
		for _, tok := range []string{reader, nobody} {
			if strings.Contains(b, tok) {
				t.Errorf("response %d contains a service-account token", i)
			}
		}
	}
}
