package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub"
	"github.com/hubmesh/hub/hub/authz"
	"github.com/hubmesh/hub/hub/xdsstatus"
)

// Pure-logic fakes for handler and session tests (live_test.go runs them on a
// real server); kube_test.go uses a real API server, and the dashboard is
// tested in real Chromium against a real hub in e2e/dashboard_test.go.
type fakeAuth struct {
	mu        sync.Mutex
	revoked   bool // the token no longer authenticates
	forbidden bool // the user may no longer read
	down      bool // the authenticator cannot answer
}

func (f *fakeAuth) set(change func(*fakeAuth)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f)
}

func (f *fakeAuth) Authenticate(_ context.Context, token string) (api.User, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.down:
		return api.User{}, errors.New("token review: connection refused")
	case token != "good" || f.revoked:
		return api.User{}, api.ErrUnauthenticated
	}
	return api.User{Name: "ann"}, nil
}
func (f *fakeAuth) Authorize(context.Context, api.User, api.Access) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.forbidden {
		return fmt.Errorf("%w: ann may not get secrets", api.ErrForbidden)
	}
	return nil
}

type fakeModels struct{}

func (fakeModels) Clusters() []clusters.Status {
	return []clusters.Status{{ID: "primary", State: clusters.StateReady}}
}
func (fakeModels) Cluster(string) (clusters.Status, bool) { return clusters.Status{}, false }
func (fakeModels) History(string) []clusters.Transition   { return nil }
func (fakeModels) Ready() (bool, string)                  { return true, "" }
func (fakeModels) Services() []hub.ServiceSummary         { return nil }
func (fakeModels) Proxies() []xdsstatus.Proxy             { return nil }
func (fakeModels) ProxyConfig(string) (xdsstatus.ProxyConfig, bool) {
	return xdsstatus.ProxyConfig{}, false
}
func (fakeModels) Register(context.Context, string, []byte) (string, bool, error) {
	return "", false, nil
}
func (fakeModels) Remove(context.Context, string) error { return nil }

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/clusters":        "/clusters",
		"/clusters/a?x=1":  "/clusters/a?x=1",
		"":                 "/",
		"https://evil.com": "/",
		"//evil.com":       "/",
		"/\t/evil.com":     "/",
		"/\n/evil.com":     "/",
		`/\evil.com`:       "/",
		"evil.com":         "/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestSessions(t *testing.T) {
	auth := &fakeAuth{}
	m := fakeModels{}
	h := New(Config{Membership: m, Registrar: m, Serving: m, Auth: auth})

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/clusters", nil))
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/signin?next=%2Fclusters" {
		t.Fatalf("unauthenticated page: %d %s", rec.Code, rec.Header().Get("Location"))
	}

	form := url.Values{"token": {"bad"}}
	rec = httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/signin", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized || len(rec.Result().Cookies()) != 0 {
		t.Fatalf("bad token: %d, cookies %v", rec.Code, rec.Result().Cookies())
	}

	form = url.Values{"token": {"good"}, "next": {"/\t/evil.com"}}
	rec = httptest.NewRecorder()
	req = httptest.NewRequest("POST", "/signin", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	h.ServeHTTP(rec, req)
	cookies := rec.Result().Cookies()
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/" || len(cookies) != 1 {
		t.Fatalf("sign in: %d %q %v", rec.Code, rec.Header().Get("Location"), cookies)
	}
	c := cookies[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || strings.Contains(c.Value, "good") {
		t.Fatalf("session cookie %+v must be HttpOnly, SameSite=Strict and not carry the token", c)
	}
	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", path, nil)
		req.AddCookie(c)
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := get("/clusters"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "primary") {
		t.Fatalf("signed-in page: %d", rec.Code)
	}

	// POSTs need the CSRF token; oversized bodies are refused before parsing.
	post := func(body string) int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/clusters", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(c)
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := post("id=x&kubeconfig=y"); code != http.StatusForbidden {
		t.Errorf("POST without CSRF: %d", code)
	}
	if code := post("id=" + strings.Repeat("x", 2<<20)); code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized POST: %d", code)
	}

	// Revoking the token ends the session.
	auth.mu.Lock()
	auth.revoked = true
	auth.mu.Unlock()
	if rec := get("/clusters"); rec.Code != http.StatusSeeOther {
		t.Errorf("revoked token still signed in: %d", rec.Code)
	}
}

// TestTemplatesRender renders every page with empty and full data, so that
// template errors show up without a browser.
func TestTemplatesRender(t *testing.T) {
	m := fakeModels{}
	h := New(Config{Membership: m, Registrar: m, Serving: m, Auth: &fakeAuth{}})
	form := url.Values{"token": {"good"}}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/signin", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	h.ServeHTTP(rec, req)
	c := rec.Result().Cookies()[0]
	for _, path := range []string{"/", "/clusters", "/clusters/nope", "/services", "/proxies", "/proxies/nope", "/trust", "/distribution", "/signin"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", path, nil)
		req.AddCookie(c)
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 || !strings.Contains(rec.Body.String(), "</html>") {
			t.Errorf("%s: %d %s", path, rec.Code, rec.Body.String())
		}
	}
}

type fakeDistribution distribute.Status

func (f fakeDistribution) Status() distribute.Status { return distribute.Status(f) }

// The distribution page lists every refused object with its reason.
func TestDistributionPageShowsRefusals(t *testing.T) {
	m := fakeModels{}
	st := distribute.Status{Discovered: true, Objects: 1, Rejected: 1, Kinds: []distribute.KindStatus{{
		Kind: "networking.istio.io/v1/ServiceEntry", Served: "networking.istio.io/v1", Ready: true, Objects: 1,
		Rejected: []distribute.Rejected{{Object: "tenant/claim", Reason: distribute.ReasonHost,
			Message: `host "echo.demo.svc.clusterset.local" is under the federated domain <clusterset.local>`}},
	}}}
	h := New(Config{Membership: m, Registrar: m, Serving: m, Distribution: fakeDistribution(st), Auth: &fakeAuth{}})
	body := signedInGet(t, h, "/distribution")
	for _, want := range []string{"tenant/claim", distribute.ReasonHost, "echo.demo.svc.clusterset.local", "&lt;clusterset.local&gt;"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q:\n%s", want, body)
		}
	}
}

// The distribution page lists what the hub's own xDS applies differently
// (notes), escaped.
func TestDistributionPageShowsNotes(t *testing.T) {
	m := fakeModels{}
	st := distribute.Status{Discovered: true, Objects: 1, Kinds: []distribute.KindStatus{{
		Kind: "security.istio.io/v1/AuthorizationPolicy", Ready: true, Objects: 1,
		Notes: []distribute.Note{{Object: "app/ext", Message: `CUSTOM (extension provider "<opa>"): requests its rules match are denied`}},
	}}}
	h := New(Config{Membership: m, Registrar: m, Serving: m, Distribution: fakeDistribution(st), Auth: &fakeAuth{}})
	body := signedInGet(t, h, "/distribution")
	for _, want := range []string{"Applied differently by the hub", "app/ext", "&lt;opa&gt;", "requests its rules match are denied"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q:\n%s", want, body)
		}
	}
}

// serverModels has one proxyless gRPC server connected.
type serverModels struct{ fakeModels }

func (serverModels) ProxyConfig(id string) (xdsstatus.ProxyConfig, bool) {
	return xdsstatus.ProxyConfig{Proxy: xdsstatus.Proxy{ID: id, Proxyless: true, Server: &xdsstatus.ServerSecurity{
		Workload:            authz.Workload{Namespace: "app", ServiceAccount: "echo", Member: "west", Verified: true, Claimed: "other"},
		PeerAuthentications: []string{"app/strict"},
		Policies:            authz.Applied{Allow: []string{"app/only-alice"}, Custom: []string{"app/ext"}},
		Listeners:           []xdsstatus.InboundListener{{Name: "xds.istio.io/grpc/lds/inbound/0.0.0.0:8080", Port: 8080, Mode: authz.Strict, PolicyMode: authz.Strict}},
	}}}, true
}

// A proxyless server's page shows its workload, the policies that apply
// and each inbound listener's mode.
func TestProxyPageShowsServerPolicies(t *testing.T) {
	m := serverModels{}
	h := New(Config{Membership: m, Registrar: m, Serving: m, Auth: &fakeAuth{}})
	body := signedInGet(t, h, "/proxies/echo-0.app")
	for _, want := range []string{"Proxyless gRPC server", "app / echo in west", "from its verified identity", "claimed namespace other",
		"app/strict", "app/only-alice", "app/ext", "enforced as DENY", "0.0.0.0:8080", `class="mtls-mode">STRICT`} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q:\n%s", want, body)
		}
	}
}
