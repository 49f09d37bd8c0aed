package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubmesh/hub/clusters"
)

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
func (f *fakeMembership) Ready() (bool, string) { return f.ready, f.reason }

func newTestHandler(m *fakeMembership) http.Handler {
	return NewHandler(Config{Membership: m, Metrics: prometheus.NewRegistry()})
}

func get(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}

func TestClusters(t *testing.T) {
	synced := time.Date(2026, 11, 22, 1, 2, 3, 0, time.UTC)
	m := &fakeMembership{clusters: []clusters.Status{
		{ID: "primary", State: clusters.StateReady, Server: "https://home:6443", Services: 3, Endpoints: 7, LastSyncTime: synced},
		{ID: "bad", Secret: "istio-system/s", State: clusters.StateInvalid, Message: "kubeconfig does not parse"},
	}}
	h := newTestHandler(m)

	rec := get(t, h, "/api/v1/clusters")
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

	rec = get(t, h, "/api/v1/clusters/bad")
	var c Cluster
	if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil || c.State != "Invalid" || c.Message == "" {
		t.Errorf("get bad: %d %s", rec.Code, rec.Body)
	}

	rec = get(t, h, "/api/v1/clusters/nope")
	var p Problem
	if rec.Code != http.StatusNotFound || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("missing cluster: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != 404 || !strings.Contains(p.Detail, "nope") {
		t.Errorf("problem = %+v, %v", p, err)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	m := &fakeMembership{reason: "waiting for clusters to sync: west"}
	h := newTestHandler(m)
	if rec := get(t, h, "/healthz"); rec.Code != http.StatusOK {
		t.Errorf("healthz = %d", rec.Code)
	}
	rec := get(t, h, "/readyz")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "west") {
		t.Errorf("readyz while syncing = %d %q", rec.Code, rec.Body)
	}
	m.ready = true
	if rec := get(t, h, "/readyz"); rec.Code != http.StatusOK {
		t.Errorf("readyz when ready = %d", rec.Code)
	}
	if rec := get(t, h, "/metrics"); rec.Code != http.StatusOK {
		t.Errorf("metrics = %d", rec.Code)
	}
}

func TestUnknownRoutesAreProblems(t *testing.T) {
	h := newTestHandler(&fakeMembership{})
	rec := get(t, h, "/api/v1/nothing")
	if rec.Code != http.StatusNotFound || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("unknown route: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPatch, "/api/v1/clusters", nil))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("wrong method: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
}
