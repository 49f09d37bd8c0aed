package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsNeedATokenByDefault: on a real HTTP server, /metrics answers
// a request without a valid token like the API does (401 problem+json with
// a Bearer challenge) and any valid token with the metrics; with
// OpenMetrics (--metrics-auth=none) it needs none.
func TestMetricsNeedATokenByDefault(t *testing.T) {
	auth := staticAuth(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "hub_test_member_secret", Help: "a series naming a member"}))
	serve := func(open bool) string {
		srv := httptest.NewServer(NewHandler(Config{Membership: &fakeMembership{}, Registrar: &fakeRegistrar{}, Serving: fakeServing{},
			Auth: auth, Metrics: reg, OpenMetrics: open}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	get := func(url, token string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(body)
	}
	guarded := serve(false)
	for _, tc := range []struct{ token, detail string }{{"", "a bearer token is required"}, {"not-a-token", "the bearer token is not valid"}} {
		code, h, body := get(guarded, tc.token)
		var p Problem
		if code != http.StatusUnauthorized || h.Get("Content-Type") != "application/problem+json" || json.Unmarshal([]byte(body), &p) != nil || p.Detail != tc.detail {
			t.Errorf("/metrics with token %q: %d %s %s; want 401 problem+json %q", tc.token, code, h.Get("Content-Type"), body, tc.detail)
		}
		if !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer ") {
			t.Errorf("/metrics with token %q: no Bearer challenge (%q)", tc.token, h.Get("WWW-Authenticate"))
		}
		if strings.Contains(body, "hub_test_member_secret") {
			t.Errorf("/metrics with token %q leaked the metrics", tc.token)
		}
	}
	for _, tok := range []string{"reader-token", "writer-token"} {
		if code, _, body := get(guarded, tok); code != http.StatusOK || !strings.Contains(body, "hub_test_member_secret") {
			t.Errorf("/metrics with %s: %d %.200s", tok, code, body)
		}
	}
	if code, _, body := get(serve(true), ""); code != http.StatusOK || !strings.Contains(body, "hub_test_member_secret") {
		t.Errorf("open /metrics without a token: %d %.200s", code, body)
	}
}

// TestProfilesNeedWriteAccess: Go's runtime profiles are served to tokens
// that may change the hub only (a CPU profile costs the hub CPU).
func TestProfilesNeedWriteAccess(t *testing.T) {
	srv := httptest.NewServer(NewHandler(Config{Membership: &fakeMembership{}, Registrar: &fakeRegistrar{}, Serving: fakeServing{}, Auth: staticAuth(t)}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {"reader-token", http.StatusForbidden}, {"writer-token", http.StatusOK}} {
		for _, path := range []string{"/debug/pprof/heap", "/debug/pprof/goroutine", "/debug/pprof/"} {
			req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want || tc.want == http.StatusOK && len(body) == 0 {
				t.Errorf("GET %s with %q: %d (%d bytes), want %d", path, tc.token, resp.StatusCode, len(body), tc.want)
			}
		}
	}
}
