package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub"
	"github.com/hubmesh/hub/hub/xdsstatus"
)

// Pure-logic fakes for handler tests; tests on real API servers and real
// hubs are in e2e/.
type fakeMembership struct {
	clusters []clusters.Status
	ready    bool
	reason   string
}

func (f *fakeMembership) Clusters() []clusters.Status { return f.clusters }
func (f *fakeMembership) Cluster(id string) (clusters.Status, bool) {
	for _, c := range f.clusters {
		if c.ID == id {
			return c, true
		}
	}
	return clusters.Status{}, false
}
func (f *fakeMembership) History(string) []clusters.Transition { return nil }
func (f *fakeMembership) Ready() (bool, string)                { return f.ready, f.reason }

type fakeRegistrar struct{ removed []string }

func (f *fakeRegistrar) Register(_ context.Context, id string, kc []byte) (string, bool, error) {
	if _, err := clusters.ParseKubeconfig(kc); err != nil {
		return "", false, &clusters.InvalidError{}
	}
	return "istio-system/istio-remote-secret-" + id, true, nil
}
func (f *fakeRegistrar) Remove(_ context.Context, id string) error {
	f.removed = append(f.removed, id)
	return nil
}

type fakeServing struct{}

func (fakeServing) Services() []hub.ServiceSummary { return nil }
func (fakeServing) Proxies() []xdsstatus.Proxy     { return nil }
func (fakeServing) ProxyConfig(string) (xdsstatus.ProxyConfig, bool) {
	return xdsstatus.ProxyConfig{}, false
}

func newTestHandler(t *testing.T, m *fakeMembership) (http.Handler, *fakeRegistrar) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("# comment\nreader-token,rita,read\nwriter-token,walt,write\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := LoadStaticTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := &fakeRegistrar{}
	return NewHandler(Config{Membership: m, Registrar: reg, Serving: fakeServing{}, Auth: auth, Metrics: prometheus.NewRegistry()}), reg
}

func do(t *testing.T, h http.Handler, method, path, token, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func problem(t *testing.T, rec *httptest.ResponseRecorder, status int, detail string) {
	t.Helper()
	if rec.Code != status || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("got %d %s %s; want %d problem+json", rec.Code, rec.Header().Get("Content-Type"), rec.Body, status)
	}
	var p Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != status || !strings.Contains(p.Detail, detail) {
		t.Fatalf("problem = %+v (%v); want detail containing %q", p, err, detail)
	}
}

func TestClusters(t *testing.T) {
	synced := time.Date(2026, 11, 22, 1, 2, 3, 0, time.UTC)
	h, _ := newTestHandler(t, &fakeMembership{clusters: []clusters.Status{
		{ID: "primary", State: clusters.StateReady, Server: "https://home:6443", Services: 3, Endpoints: 7, LastSyncTime: synced},
		{ID: "bad", Secret: "istio-system/s", State: clusters.StateInvalid, Message: "kubeconfig does not parse"},
	}})
	rec := do(t, h, "GET", "/api/v1/clusters", "reader-token", "")
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("list: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	var raw map[string][]map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	items := raw["items"]
	if len(items) != 2 {
		t.Fatalf("items = %v", items)
	}
	for _, field := range []string{"id", "secret", "state", "message", "server", "services", "endpoints", "lastSyncTime"} {
		if _, ok := items[0][field]; !ok {
			t.Errorf("Cluster JSON lacks %q: %v", field, items[0])
		}
	}
	if items[0]["lastSyncTime"] != "2026-11-22T01:02:03Z" || items[1]["lastSyncTime"] != nil {
		t.Errorf("lastSyncTime = %v, %v", items[0]["lastSyncTime"], items[1]["lastSyncTime"])
	}
	var c Cluster
	rec = do(t, h, "GET", "/api/v1/clusters/bad", "reader-token", "")
	if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil || c.State != "Invalid" || c.Message == "" {
		t.Errorf("get bad: %d %s", rec.Code, rec.Body)
	}
	problem(t, do(t, h, "GET", "/api/v1/clusters/nope", "reader-token", ""), 404, "cluster nope is not registered")
}

func TestAuth(t *testing.T) {
	h, reg := newTestHandler(t, &fakeMembership{})
	for _, path := range []string{"/api/v1/clusters", "/api/v1/services", "/api/v1/proxies", "/api/v1/openapi.json", "/api/v1/clusters/x", "/api/v1/proxies/x/config"} {
		problem(t, do(t, h, "GET", path, "", ""), 401, "bearer token is required")
		problem(t, do(t, h, "GET", path, "wrong", ""), 401, "not valid")
	}
	problem(t, do(t, h, "POST", "/api/v1/clusters", "", `{}`), 401, "bearer token is required")
	problem(t, do(t, h, "POST", "/api/v1/clusters", "reader-token", `{"id":"x","kubeconfig":"y"}`), 403, "rita may only read")
	problem(t, do(t, h, "DELETE", "/api/v1/clusters/x", "reader-token", ""), 403, "rita may only read")
	if len(reg.removed) != 0 {
		t.Fatal("a reader removed a cluster")
	}
	if rec := do(t, h, "DELETE", "/api/v1/clusters/x", "writer-token", ""); rec.Code != http.StatusNoContent {
		t.Errorf("writer delete: %d", rec.Code)
	}
	if rec := do(t, h, "DELETE", "/api/v1/clusters/x", "writer-token", ""); rec.Code != http.StatusNoContent {
		t.Errorf("repeated delete: %d; want 204 (idempotent)", rec.Code)
	}
}

func TestRegisterValidation(t *testing.T) {
	h, _ := newTestHandler(t, &fakeMembership{})
	for _, tc := range []struct {
		body   string
		status int
		detail string
	}{
		{``, 400, "request body is empty"},
		{`{"id":`, 400, "not valid JSON"},
		{`{"id":"a","kubeconfig":"b","extra":1}`, 400, `unknown field "extra"`},
		{`{"id":7,"kubeconfig":"b"}`, 400, `field "id" must be a string`},
		{`{"id":"a","kubeconfig":"b"} {}`, 400, "exactly one JSON object"},
		{`{"id":"a"}`, 422, `both "id" and "kubeconfig" are required`},
		{`{"id":"a","kubeconfig":"` + strings.Repeat("x", 2<<20) + `"}`, 413, "exceeds 1048576 bytes"},
	} {
		problem(t, do(t, h, "POST", "/api/v1/clusters", "writer-token", tc.body), tc.status, tc.detail)
	}
	req := httptest.NewRequest("POST", "/api/v1/clusters", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer writer-token")
	req.Header.Set("Content-Type", "text/plain")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	problem(t, rec, 415, "Content-Type must be application/json")
}

func TestHealthAndReadiness(t *testing.T) {
	m := &fakeMembership{reason: "waiting for clusters to sync: west"}
	h, _ := newTestHandler(t, m)
	if rec := do(t, h, "GET", "/healthz", "", ""); rec.Code != http.StatusOK {
		t.Errorf("healthz = %d", rec.Code)
	}
	rec := do(t, h, "GET", "/readyz", "", "")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "west") {
		t.Errorf("readyz while syncing = %d %q", rec.Code, rec.Body)
	}
	m.ready = true
	if rec := do(t, h, "GET", "/readyz", "", ""); rec.Code != http.StatusOK {
		t.Errorf("readyz when ready = %d", rec.Code)
	}
}

func TestUnknownRoutesAreProblems(t *testing.T) {
	h, _ := newTestHandler(t, &fakeMembership{})
	problem(t, do(t, h, "GET", "/api/v1/nothing", "reader-token", ""), 404, "no route")
	problem(t, do(t, h, "PATCH", "/api/v1/clusters", "writer-token", ""), 405, "PATCH is not allowed")
}

// TestOpenAPIMatchesRoutes checks that the OpenAPI document lists exactly
// the routes the router serves under /api/v1.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	r := chi.NewRouter()
	Mount(r, Config{Membership: &fakeMembership{}})
	var routes []string
	err := chi.Walk(r, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if strings.HasPrefix(route, "/api/v1/") {
			routes = append(routes, strings.ToLower(method)+" "+strings.TrimSuffix(route, "/"))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for path, ops := range openAPI["paths"].(obj) {
		for method := range ops.(obj) {
			documented = append(documented, method+" "+path)
		}
	}
	sort.Strings(routes)
	sort.Strings(documented)
	if strings.Join(routes, "\n") != strings.Join(documented, "\n") {
		t.Errorf("routes:\n%s\n\nOpenAPI:\n%s", strings.Join(routes, "\n"), strings.Join(documented, "\n"))
	}
	h, _ := newTestHandler(t, &fakeMembership{})
	rec := do(t, h, "GET", "/api/v1/openapi.json", "reader-token", "")
	var doc map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || doc["openapi"] != "3.0.3" {
		t.Errorf("openapi.json: %d %v", rec.Code, err)
	}
}
