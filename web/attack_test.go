package web

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Attacks on the dashboard, on a real admin server (NewServer on a loopback
// port). Browsers mark every request with Sec-Fetch-Site (and Origin on
// POSTs); the requests below carry what a browser sends when a page of
// another site submits a form to the hub.

// postForm posts a form with extra headers and returns the response.
func (s *testServer) postForm(t *testing.T, path string, form url.Values, cookie *http.Cookie, header map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if cookie != nil {
		req.AddCookie(cookie)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestCrossSiteFormsRefused: a page of another site cannot sign a browser
// in (login CSRF: the victim would then work, and paste kubeconfigs, in the
// attacker's session) nor submit any other dashboard form; the same forms
// from the dashboard's own pages work.
func TestCrossSiteFormsRefused(t *testing.T) {
	s := startServer(t, liveConfig(&fakeAuth{}), ServerOptions{}, nil)
	crossSite := map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://attacker.example"}
	resp := s.postForm(t, "/signin", url.Values{"token": {"good"}}, nil, crossSite)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site sign-in: %s; want 403", resp.Status)
	}
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie && c.Value != "" {
			t.Errorf("cross-site sign-in set a session cookie")
		}
	}
	// An older browser without Sec-Fetch-Site still sends Origin.
	resp = s.postForm(t, "/signin", url.Values{"token": {"good"}}, nil, map[string]string{"Origin": "https://attacker.example"})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin sign-in without Sec-Fetch-Site: %s; want 403", resp.Status)
	}

	sameOrigin := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": s.base}
	resp = s.postForm(t, "/signin", url.Values{"token": {"good"}}, nil, sameOrigin)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("same-origin sign-in: %s; want 303", resp.Status)
	}
	cookie, csrf := s.signIn(t, "good")
	// Even with the CSRF token (leaked, say), another site's form is refused.
	resp = s.postForm(t, "/clusters/west/remove", url.Values{"csrf": {csrf}}, cookie, crossSite)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site remove: %s; want 403", resp.Status)
	}
	resp = s.postForm(t, "/clusters/west/remove", url.Values{"csrf": {csrf}}, cookie, sameOrigin)
	if resp.StatusCode != http.StatusSeeOther {
		t.Errorf("same-origin remove: %s; want 303", resp.Status)
	}
}

// TestLiveStreamEndReason: a stream says why its session ended also when
// another request ended it (a page load that found the token revoked, a
// newer sign-in of the same user that evicted it), not "signed out".
func TestLiveStreamEndReason(t *testing.T) {
	t.Run("revoked, noticed by a page load", func(t *testing.T) {
		auth := &fakeAuth{}
		cfg := liveConfig(auth)
		cfg.Refresh = maxRefresh // the page load below notices first
		s := startServer(t, cfg, ServerOptions{}, nil)
		cookie, _ := s.signIn(t, "good")
		st := s.openStream(t, "/", cookie)
		st.next(t, 30*time.Second)
		auth.set(func(f *fakeAuth) { f.revoked = true })
		if code, _ := s.get(t, "/", cookie); code != http.StatusSeeOther {
			t.Fatalf("page with a revoked token: %d; want a redirect to sign in", code)
		}
		if reason := st.waitEnd(t, 30*time.Second); reason != "session revoked" {
			t.Errorf("stream ended with %q; want %q", reason, "session revoked")
		}
	})
	t.Run("evicted by newer sign-ins", func(t *testing.T) {
		cfg := liveConfig(&fakeAuth{})
		cfg.Refresh = maxRefresh
		s := startServer(t, cfg, ServerOptions{}, nil)
		cookie, _ := s.signIn(t, "good")
		st := s.openStream(t, "/", cookie)
		st.next(t, 30*time.Second)
		for range maxSessionsPerUser {
			s.postForm(t, "/signin", url.Values{"token": {"good"}}, nil, nil)
		}
		if reason := st.waitEnd(t, 30*time.Second); reason != "too many newer sessions" {
			t.Errorf("stream ended with %q; want %q", reason, "too many newer sessions")
		}
	})
}

// TestFormBodyTooLarge: a form over the 1 MiB bound is refused as too
// large, not as a CSRF failure that tells the user to reload.
func TestFormBodyTooLarge(t *testing.T) {
	s := startServer(t, liveConfig(&fakeAuth{}), ServerOptions{}, nil)
	cookie, csrf := s.signIn(t, "good")
	resp := s.postForm(t, "/clusters", url.Values{"csrf": {csrf}, "id": {"west"}, "kubeconfig": {strings.Repeat("x", 2<<20)}}, cookie, nil)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("2 MiB form: %s; want 413", resp.Status)
	}
}

// TestMemberTextEscaped: text a member controls (a cluster's status
// message) reaches pages and live updates as text, never as markup.
func TestMemberTextEscaped(t *testing.T) {
	msg := `<img src=x onerror=alert(1)><script>alert(2)</script>"'`
	models := &messageModels{msg: msg}
	cfg := Config{Membership: models, Registrar: models, Serving: models, Auth: &fakeAuth{}, Refresh: 20 * time.Millisecond}
	s := startServer(t, cfg, ServerOptions{}, nil)
	cookie, _ := s.signIn(t, "good")
	_, page := s.get(t, "/clusters", cookie)
	ev := s.openStream(t, "/clusters", cookie).next(t, 30*time.Second)
	for where, html := range map[string]string{"page": page, "live update": ev.data} {
		if strings.Contains(html, "<img") || strings.Contains(html, "<script>alert") {
			t.Errorf("%s carries the member's markup unescaped", where)
		}
		if !strings.Contains(html, "&lt;img src=x onerror=alert(1)&gt;") {
			t.Errorf("%s does not show the member's message as text", where)
		}
	}
}

// TestSignInWhileAuthenticatorDown: a sign-in the hub cannot check right now
// is answered 503 and "try again", not "that token is not valid".
func TestSignInWhileAuthenticatorDown(t *testing.T) {
	auth := &fakeAuth{}
	auth.set(func(f *fakeAuth) { f.down = true })
	s := startServer(t, liveConfig(auth), ServerOptions{}, nil)
	if resp := s.postForm(t, "/signin", url.Values{"token": {"good"}}, nil, nil); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("sign-in while the authenticator is down: %s; want 503", resp.Status)
	}
}
