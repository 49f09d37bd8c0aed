package web

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// testServer is a real admin server (NewServer) serving the dashboard on
// a loopback port (cmd/hub's tests serve it next to the REST API).
type testServer struct {
	base   string
	client *http.Client // does not follow redirects
	srv    *Server
	// stop shuts the server down and waits for Serve to return (at the
	// test's end unless called before).
	stop func()
}

// startServer serves the dashboard of cfg with NewServer, as cmd/hub does,
// until the test ends.
func startServer(t *testing.T, cfg Config, opts ServerOptions, tlsClient *tls.Config) *testServer {
	t.Helper()
	return serveDashboard(t, New(cfg), opts, tlsClient)
}

// serveDashboard is startServer for a dashboard the test keeps.
func serveDashboard(t *testing.T, dash *Dashboard, opts ServerOptions, tlsClient *tls.Config) *testServer {
	t.Helper()
	srv, err := NewServer(dash, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.RegisterOnShutdown(dash.Shutdown)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	t.Cleanup(stop)
	scheme := "http"
	if srv.TLS() {
		scheme = "https"
	}
	return &testServer{
		base: scheme + "://" + lis.Addr().String(),
		srv:  srv,
		stop: stop,
		client: &http.Client{
			Transport:     &http.Transport{TLSClientConfig: tlsClient},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// rawStream opens /events for page with cookie and returns the response,
// to be read as bytes (openStream parses events).
func (s *testServer) rawStream(t *testing.T, page string, cookie *http.Cookie) *bufio.Reader {
	t.Helper()
	resp := s.requestEvents(t, context.Background(), page, cookie)
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /events: %s", resp.Status)
	}
	return bufio.NewReader(resp.Body)
}

// requestEvents sends GET /events for page with cookie, for as long as ctx
// lasts, and returns the response, whatever its status.
func (s *testServer) requestEvents(t *testing.T, ctx context.Context, page string, cookie *http.Cookie) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/events?page="+url.QueryEscape(page), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(cookie)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// signIn signs in with token and returns the session cookie and the CSRF
// token the pages carry.
func (s *testServer) signIn(t *testing.T, token string) (*http.Cookie, string) {
	t.Helper()
	resp, err := s.client.PostForm(s.base+"/signin", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie {
			cookie = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || cookie == nil {
		t.Fatalf("sign in: %s, cookies %v", resp.Status, resp.Cookies())
	}
	code, body := s.get(t, "/", cookie)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("overview after sign in: %d, no CSRF token in %q", code, body)
	}
	return cookie, m[1]
}

func (s *testServer) get(t *testing.T, path string, cookie *http.Cookie) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(cookie)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (s *testServer) signOut(t *testing.T, cookie *http.Cookie, csrf string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.base+"/signout", strings.NewReader(url.Values{"csrf": {csrf}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(cookie)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign out: %s", resp.Status)
	}
	return resp
}

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	name, data string
	fields     []string // every field name seen in the event, in order
}

// stream is an open live stream; events arrive on its channel, which is
// closed when the server ends the stream.
type stream struct {
	events <-chan sseEvent
	raw    *bytes.Buffer // everything read, for byte-level checks (after close)
}

// openStream opens /events for page with cookie. The reader goroutine stops
// when the server ends the stream or the test ends.
func (s *testServer) openStream(t *testing.T, page string, cookie *http.Cookie) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/events?page="+url.QueryEscape(page), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(cookie)
	resp, err := s.client.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		resp.Body.Close()
		cancel()
		t.Fatalf("GET /events: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	events := make(chan sseEvent, 64)
	st := &stream{events: events, raw: &bytes.Buffer{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(events)
		defer resp.Body.Close()
		readSSE(io.TeeReader(resp.Body, st.raw), events)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return st
}

// readSSE parses a text/event-stream as a browser does (lines end at \r\n,
// \r or \n) and sends each dispatched event.
func readSSE(r io.Reader, out chan<- sseEvent) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		for i, c := range data {
			switch {
			case c == '\n':
				return i + 1, data[:i], nil
			case c == '\r' && i+1 < len(data):
				if data[i+1] == '\n' {
					return i + 2, data[:i], nil
				}
				return i + 1, data[:i], nil
			case c == '\r' && atEOF:
				return i + 1, data[:i], nil
			case c == '\r':
				return 0, nil, nil // a \n may follow
			}
		}
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	})
	var ev sseEvent
	var data []string
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if data != nil {
				ev.data = strings.Join(data, "\n")
				out <- ev
			}
			ev, data = sseEvent{}, nil
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		ev.fields = append(ev.fields, field)
		switch field {
		case "event":
			ev.name = value
		case "data":
			data = append(data, value)
		}
	}
}

// next returns the next event, failing the test if none comes in time or
// the stream ends.
func (st *stream) next(t *testing.T, timeout time.Duration) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-st.events:
		if !ok {
			t.Fatal("the live stream ended early")
		}
		return ev
	case <-time.After(timeout):
		t.Fatalf("no live update within %s", timeout)
	}
	return sseEvent{}
}

// waitEnd waits until the server ends the stream and returns the reason of
// its closing "end" event ("" if it ended without one).
func (st *stream) waitEnd(t *testing.T, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	reason := ""
	for {
		select {
		case ev, ok := <-st.events:
			if !ok {
				return reason
			}
			if ev.name == "end" {
				reason = ev.data
			}
		case <-deadline:
			t.Fatalf("the live stream was still open %s later", timeout)
		}
	}
}

// selfSigned writes a new self-signed certificate for 127.0.0.1 and its key
// to dir/tls.crt and dir/tls.key, and returns a client configuration that
// trusts it.
func selfSigned(t *testing.T, dir, name string) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// Write to temporary names and rename, as a Kubernetes Secret volume
	// swaps its files, so a reload never sees half a pair.
	for file, block := range map[string]*pem.Block{
		"tls.crt": {Type: "CERTIFICATE", Bytes: der}, "tls.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		tmp := filepath.Join(dir, file+".tmp")
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, file)); err != nil {
			t.Fatal(err)
		}
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// signedInGet signs in to h with the token "good" (fakeAuth) and returns
// the body of GET path in that session.
func signedInGet(t *testing.T, h http.Handler, path string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/signin", strings.NewReader(url.Values{"token": {"good"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	h.ServeHTTP(rec, req)
	session := rec.Result().Cookies()[0]
	rec = httptest.NewRecorder()
	req = httptest.NewRequest("GET", path, nil)
	req.AddCookie(session)
	h.ServeHTTP(rec, req)
	return rec.Body.String()
}
