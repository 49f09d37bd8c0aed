package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub"
	"github.com/hubmesh/hub/web"
)

// members is the membership and registrar of the admin test: one ready
// home cluster, registrations failing (as if the home cluster refused
// them).
type members struct{}

func (members) Clusters() []clusters.Status {
	return []clusters.Status{{ID: "primary", State: clusters.StateReady}}
}
func (members) Cluster(string) (clusters.Status, bool) { return clusters.Status{}, false }
func (members) History(string) []clusters.Transition   { return nil }
func (members) Ready() (bool, string)                  { return true, "" }
func (members) Register(context.Context, string, []byte) (string, bool, error) {
	return "", false, errors.New("registrations are refused in this test")
}
func (members) Remove(context.Context, string) error { return nil }

// TestAdminServesAPIAndDashboard: the admin port as serve composes it (a
// real web.Server on a loopback port, a real hub, static API tokens)
// serves the REST API with its bearer-token auth, and the dashboard with
// its sessions, cross-origin checks and live stream on every other path;
// every response carries security headers, the dashboard's pages its own
// CSP.
func TestAdminServesAPIAndDashboard(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("s3cret-token,ann,write\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := api.LoadStaticTokens(tokens)
	if err != nil {
		t.Fatal(err)
	}
	h, err := hub.New(hub.Options{DomainSuffix: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	m := members{}
	dashboard := web.New(web.Config{Membership: m, Registrar: m, Serving: h, Auth: auth, Refresh: 50 * time.Millisecond})
	admin, err := web.NewServer(adminHandler(api.Config{Membership: m, Registrar: m, Serving: h, Auth: auth,
		Metrics: prometheus.NewRegistry()}, dashboard), web.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin.RegisterOnShutdown(dashboard.Shutdown)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- admin.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	base := "http://" + lis.Addr().String()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, header map[string]string, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
			t.Errorf("%s %s: no security headers: %v", method, path, resp.Header)
		}
		return resp, string(b)
	}
	bearer := map[string]string{"Authorization": "Bearer s3cret-token"}
	crossSite := map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://attacker.example",
		"Content-Type": "application/x-www-form-urlencoded"}
	for _, tc := range []struct {
		name, method, path string
		header             map[string]string
		body               string
		status             int
		contentType, csp   string
	}{
		{"health", "GET", "/healthz", nil, "", 200, "text/plain", "default-src 'none'"},
		{"readiness", "GET", "/readyz", nil, "", 200, "text/plain", "default-src 'none'"},
		{"metrics without a token", "GET", "/metrics", nil, "", 401, "application/problem+json", "default-src 'none'"},
		{"metrics with a token", "GET", "/metrics", bearer, "", 200, "text/plain", "default-src 'none'"},
		{"API without a token", "GET", "/api/v1/clusters", nil, "", 401, "application/problem+json", "default-src 'none'"},
		{"API with a token", "GET", "/api/v1/clusters", bearer, "", 200, "application/json", "default-src 'none'"},
		{"API unknown route", "GET", "/api/v1/nothing", bearer, "", 404, "application/problem+json", "default-src 'none'"},
		// The API is not behind the dashboard's cross-origin check (bearer
		// tokens, no cookies): the API answers with the registrar's failure.
		{"API write from another origin", "POST", "/api/v1/clusters", map[string]string{"Authorization": "Bearer s3cret-token",
			"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}, `{"id":"x","kubeconfig":"y"}`, 502, "application/problem+json", "default-src 'none'"},
		{"dashboard page without a session", "GET", "/clusters", nil, "", 303, "", "script-src 'self'"},
		{"dashboard sign-in page", "GET", "/signin", nil, "", 200, "text/html", "script-src 'self'"},
		{"dashboard static file", "GET", "/static/hub.js", nil, "", 200, "text/javascript", "script-src 'self'"},
		{"dashboard sign-in from another site", "POST", "/signin", crossSite, "token=s3cret-token", 403, "text/plain", "script-src 'self'"},
		{"unknown path", "GET", "/nothing", nil, "", 404, "text/plain", "script-src 'self'"},
	} {
		resp, body := do(tc.method, tc.path, tc.header, tc.body)
		if resp.StatusCode != tc.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.contentType) ||
			!strings.Contains(resp.Header.Get("Content-Security-Policy"), tc.csp) {
			t.Errorf("%s: %s %s: %s %q (CSP %q): %.200s; want %d %q, CSP with %q", tc.name, tc.method, tc.path,
				resp.Status, resp.Header.Get("Content-Type"), resp.Header.Get("Content-Security-Policy"), body, tc.status, tc.contentType, tc.csp)
		}
	}

	// Signing in with an API token opens a session whose pages and live
	// stream work.
	resp, _ := do("POST", "/signin", map[string]string{"Content-Type": "application/x-www-form-urlencoded"},
		url.Values{"token": {"s3cret-token"}, "next": {"/services"}}.Encode())
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "hub_session" {
			session = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/services" || session == nil {
		t.Fatalf("sign-in: %s to %q, cookies %v", resp.Status, resp.Header.Get("Location"), resp.Cookies())
	}
	cookie := map[string]string{"Cookie": session.Name + "=" + session.Value}
	if resp, body := do("GET", "/services", cookie, ""); resp.StatusCode != http.StatusOK || !strings.Contains(body, `name="csrf"`) {
		t.Errorf("services page with a session: %s: %.300s", resp.Status, body)
	}
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	req, err := http.NewRequestWithContext(streamCtx, "GET", base+"/events?page=/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(session)
	stream, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	first := make([]byte, len("event: update\n"))
	if _, err := io.ReadFull(stream.Body, first); stream.StatusCode != http.StatusOK || err != nil || string(first) != "event: update\n" {
		t.Errorf("live stream: %s %q, first bytes %q (%v)", stream.Status, stream.Header.Get("Content-Type"), first, err)
	}
}
