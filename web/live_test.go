package web

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/clusters"
)

// Tests on a real admin server (NewServer on a loopback port) with real
// sessions; the authenticator is a fake here and the real Kubernetes one in
// kube_test.go.

// clock is a settable clock for session expiry.
type clock struct{ now atomic.Int64 }

func newClock() *clock                   { c := &clock{}; c.now.Store(time.Now().UnixNano()); return c }
func (c *clock) Now() time.Time          { return time.Unix(0, c.now.Load()) }
func (c *clock) advance(d time.Duration) { c.now.Add(int64(d)) }

// messageModels shows one member whose status message is msg.
type messageModels struct {
	fakeModels
	mu  sync.Mutex
	msg string
}

func (m *messageModels) Clusters() []clusters.Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return []clusters.Status{{ID: "west", State: clusters.StateStale, Message: m.msg}}
}

func liveConfig(auth api.Authenticator) Config {
	m := fakeModels{}
	return Config{Membership: m, Registrar: m, Serving: m, Auth: auth, Refresh: 20 * time.Millisecond}
}

func TestLiveStreamEndsWithItsSession(t *testing.T) {
	for _, tc := range []struct {
		name   string
		end    func(t *testing.T, s *testServer, auth *fakeAuth, clk *clock, cookie *http.Cookie, csrf string)
		reason string
	}{
		{"sign-out", func(t *testing.T, s *testServer, _ *fakeAuth, _ *clock, cookie *http.Cookie, csrf string) {
			resp := s.signOut(t, cookie, csrf)
			for _, c := range resp.Cookies() {
				if c.Name == sessionCookie && (c.MaxAge >= 0 || c.Value != "") {
					t.Errorf("sign-out did not clear the cookie: %+v", c)
				}
			}
		}, "signed out"},
		{"expiry", func(_ *testing.T, _ *testServer, _ *fakeAuth, clk *clock, _ *http.Cookie, _ string) {
			clk.advance(13 * time.Hour)
		}, "session expired"},
		{"token revoked", func(_ *testing.T, _ *testServer, auth *fakeAuth, _ *clock, _ *http.Cookie, _ string) {
			auth.set(func(f *fakeAuth) { f.revoked = true })
		}, "session revoked"},
		{"read access removed", func(_ *testing.T, _ *testServer, auth *fakeAuth, _ *clock, _ *http.Cookie, _ string) {
			auth.set(func(f *fakeAuth) { f.forbidden = true })
		}, "session revoked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			auth, clk := &fakeAuth{}, newClock()
			cfg := liveConfig(auth)
			cfg.Now = clk.Now
			s := startServer(t, cfg, ServerOptions{}, nil)
			cookie, csrf := s.signIn(t, "good")
			st := s.openStream(t, "/clusters", cookie)
			if ev := st.next(t, 30*time.Second); ev.name != "update" || !strings.Contains(ev.data, "primary") {
				t.Fatalf("first live update: %+v", ev)
			}
			tc.end(t, s, auth, clk, cookie, csrf)
			if reason := st.waitEnd(t, 15*time.Second); reason != tc.reason {
				t.Errorf("stream ended with reason %q; want %q", reason, tc.reason)
			}
			if code, _ := s.get(t, "/clusters", cookie); code != http.StatusSeeOther {
				t.Errorf("page after the session ended: %d; want a redirect to sign in", code)
			}
			req, _ := http.NewRequest(http.MethodGet, s.base+"/events?page=/", nil)
			req.AddCookie(cookie)
			resp, err := s.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("new stream after the session ended: %s", resp.Status)
			}
		})
	}
}

// TestLiveStreamClosesWhenSessionCannotBeChecked: an authenticator that
// cannot answer closes the stream (no "end": the browser reconnects) and
// answers pages with 503, but keeps the session.
func TestLiveStreamClosesWhenSessionCannotBeChecked(t *testing.T) {
	auth := &fakeAuth{}
	s := startServer(t, liveConfig(auth), ServerOptions{}, nil)
	cookie, csrf := s.signIn(t, "good")
	st := s.openStream(t, "/", cookie)
	st.next(t, 30*time.Second)
	auth.set(func(f *fakeAuth) { f.down = true })
	if reason := st.waitEnd(t, 15*time.Second); reason != "" {
		t.Errorf("stream ended with %q; want no end event", reason)
	}
	if code, _ := s.get(t, "/", cookie); code != http.StatusServiceUnavailable {
		t.Errorf("page while the authenticator is down: %d", code)
	}
	// Signing out works without the authenticator.
	s.signOut(t, cookie, csrf)
	auth.set(func(f *fakeAuth) { f.down = false })
	if code, _ := s.get(t, "/", cookie); code != http.StatusSeeOther {
		t.Errorf("page after signing out: %d", code)
	}
}

func TestLiveStreamFramesKeepLineBreaksInData(t *testing.T) {
	// A status message (from a member's API server or a kubeconfig error)
	// trying to inject SSE fields with every kind of line break.
	msg := "a\rretry: 1\r\nevent: end\rid: 7\ndata: injected\r\rz"
	models := &messageModels{msg: msg}
	cfg := Config{Membership: models, Registrar: models, Serving: models, Auth: &fakeAuth{}, Refresh: 20 * time.Millisecond}
	s := startServer(t, cfg, ServerOptions{}, nil)
	cookie, csrf := s.signIn(t, "good")
	st := s.openStream(t, "/clusters", cookie)
	ev := st.next(t, 30*time.Second)
	if ev.name != "update" {
		t.Fatalf("first event %+v", ev)
	}
	for _, f := range ev.fields {
		if f != "event" && f != "data" {
			t.Errorf("the data injected an SSE field %q", f)
		}
	}
	// The browser gets the message back: \r as a character reference, \n as \n.
	if want := strings.ReplaceAll(msg, "\r", "&#13;"); !strings.Contains(ev.data, want) {
		t.Errorf("update does not carry the message %q:\n%s", want, ev.data)
	}
	s.signOut(t, cookie, csrf)
	st.waitEnd(t, 15*time.Second)
	if strings.Contains(st.raw.String(), "\r") {
		t.Errorf("the stream carried a raw \\r")
	}

	var b strings.Builder
	writeEvent(&b, "up\rdate\n", "x\r\ny")
	if got, want := b.String(), "event: update\ndata: x&#13;\ndata: y\n\n"; got != want {
		t.Errorf("writeEvent = %q; want %q", got, want)
	}
}

func TestSecureCookieUnderTLS(t *testing.T) {
	dir := t.TempDir()
	clientTLS := selfSigned(t, dir, "first")
	s := startServer(t, liveConfig(&fakeAuth{}), ServerOptions{TLSCertFile: dir + "/tls.crt", TLSKeyFile: dir + "/tls.key"}, clientTLS)
	if !strings.HasPrefix(s.base, "https://") {
		t.Fatalf("server is not TLS: %s", s.base)
	}
	resp, err := s.client.PostForm(s.base+"/signin", map[string][]string{"token": {"good"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(resp.Cookies()) != 1 || !resp.Cookies()[0].Secure || !resp.Cookies()[0].HttpOnly {
		t.Fatalf("session cookie over TLS: %+v", resp.Cookies())
	}
	cookie := resp.Cookies()[0]
	code, body := s.get(t, "/", cookie)
	if code != http.StatusOK {
		t.Fatalf("overview over TLS: %d", code)
	}
	csrf := body[strings.Index(body, `name="csrf" value="`)+len(`name="csrf" value="`):]
	csrf = csrf[:strings.Index(csrf, `"`)]
	out := s.signOut(t, cookie, csrf)
	if len(out.Cookies()) != 1 || !out.Cookies()[0].Secure {
		t.Errorf("sign-out cookie over TLS: %+v", out.Cookies())
	}

	// Plain HTTP to the TLS port gets nothing but a refusal.
	plain, err := http.Get("http://" + strings.TrimPrefix(s.base, "https://") + "/signin")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the TLS port: %s", plain.Status)
		}
	}

	// A new key pair in the same files is served without a restart.
	second := selfSigned(t, dir, "second")
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(s.base, "https://"), second)
		if err == nil {
			cn := conn.ConnectionState().PeerCertificates[0].Subject.CommonName
			conn.Close()
			if cn == "second" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rotated certificate was not served within 30s (last error %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A cookie set over plain HTTP is not Secure.
	p := startServer(t, liveConfig(&fakeAuth{}), ServerOptions{}, nil)
	resp, err = p.client.PostForm(p.base+"/signin", map[string][]string{"token": {"good"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(resp.Cookies()) != 1 || resp.Cookies()[0].Secure {
		t.Errorf("session cookie over plain HTTP: %+v", resp.Cookies())
	}

	if _, err := NewServer(New(liveConfig(&fakeAuth{})), ServerOptions{TLSCertFile: dir + "/tls.crt"}); err == nil {
		t.Errorf("a certificate without a key was accepted")
	}
	if _, err := NewServer(New(liveConfig(&fakeAuth{})), ServerOptions{TLSCertFile: dir + "/tls.crt", TLSKeyFile: dir + "/missing"}); err == nil {
		t.Errorf("a missing key file was accepted")
	}
}

func TestServerTimeouts(t *testing.T) {
	srv, err := NewServer(New(liveConfig(&fakeAuth{})), ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := srv.http
	if h.ReadHeaderTimeout <= 0 || h.ReadTimeout <= 0 || h.WriteTimeout <= 0 || h.IdleTimeout <= 0 || h.MaxHeaderBytes <= 0 {
		t.Errorf("admin server defaults leave a timeout unset: %+v", h)
	}

	short := ServerOptions{ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond, IdleTimeout: time.Second}
	cfg := liveConfig(&fakeAuth{})
	cfg.Heartbeat = 50 * time.Millisecond
	s := startServer(t, cfg, short, nil)

	// A client dribbling its headers is cut off after ReadHeaderTimeout,
	// long before it would have finished.
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /signin HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { _, err := io.ReadAll(conn); closed <- err }()
	start := time.Now()
	dribble := time.NewTicker(50 * time.Millisecond)
	defer dribble.Stop()
	for cut := false; !cut; {
		select {
		case <-closed:
			cut = true
		case <-dribble.C:
			if time.Since(start) > 30*time.Second {
				t.Fatalf("a header-dribbling client was still connected after 30s")
			}
			_, _ = io.WriteString(conn, "X-Slow: 1\r\n")
		}
	}
	t.Logf("header-dribbling client cut after %s", time.Since(start).Round(time.Millisecond))

	// The live stream outlives the read and write timeouts: it gets
	// heartbeats well past them.
	cookie, _ := s.signIn(t, "good")
	r := s.rawStream(t, "/", cookie)
	opened := time.Now()
	heartbeats := 0
	for time.Since(opened) < 3*short.WriteTimeout || heartbeats < 3 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("the live stream ended after %s (%d heartbeats): %v", time.Since(opened).Round(time.Millisecond), heartbeats, err)
		}
		if line == ":\n" {
			heartbeats++
		}
	}
	// An idle keep-alive connection is closed after IdleTimeout.
	idle, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	fmt.Fprint(idle, "GET /signin HTTP/1.1\r\nHost: x\r\n\r\n")
	ir := bufio.NewReader(idle)
	if resp, err := http.ReadResponse(ir, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("signin page: %v %v", resp, err)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	_ = idle.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := ir.ReadByte(); err != io.EOF {
		t.Errorf("idle keep-alive connection: %v; want it closed by the server", err)
	}
}

func TestSessionStoreBounds(t *testing.T) {
	clk := newClock()
	st := newSessionStore(clk.Now)
	add := func(user string, ttl time.Duration) *session {
		s := &session{id: randomToken(), user: api.User{Name: user}, expires: clk.Now().Add(ttl), ended: make(chan struct{})}
		st.add(s)
		return s
	}
	// One user signing in again and again replaces their oldest session.
	first := add("ann", time.Hour)
	for range maxSessionsPerUser {
		add("ann", 2*time.Hour)
	}
	if st.len() != maxSessionsPerUser || st.get(first.id) != nil {
		t.Errorf("after %d sign-ins of one user: %d sessions, first kept %v", maxSessionsPerUser+1, st.len(), st.get(first.id) != nil)
	}
	select {
	case <-first.ended:
	default:
		t.Errorf("the evicted session was not ended")
	}
	// The store never exceeds maxSessions.
	for i := range maxSessions {
		add(fmt.Sprintf("user-%d", i), time.Hour)
	}
	if st.len() != maxSessions {
		t.Errorf("store holds %d sessions; bound %d", st.len(), maxSessions)
	}
	// Expired sessions are swept even if nobody looks them up.
	clk.advance(3 * time.Hour)
	st.get("nothing")
	if st.len() != 0 {
		t.Errorf("%d expired sessions left after a sweep", st.len())
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.perUser) != 0 {
		t.Errorf("per-user counts left behind: %d", len(st.perUser))
	}
}

// TestShutdownEndsLiveStreams: a server shutting down ends the dashboard's
// live streams at once (Dashboard.Shutdown, registered with the server):
// each stream's response ends cleanly, instead of being cut when the
// server gives up waiting for it.
func TestShutdownEndsLiveStreams(t *testing.T) {
	s := startServer(t, liveConfig(&fakeAuth{}), ServerOptions{}, nil)
	cookie, _ := s.signIn(t, "good")
	r := s.rawStream(t, "/", cookie)
	if line, err := r.ReadString('\n'); err != nil || line != "event: update\n" {
		t.Fatalf("live stream: first line %q, %v", line, err)
	}
	go s.stop()
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Errorf("the live stream was cut at shutdown (%v); want it ended by the dashboard", err)
	}
}
