package e2e

import (
	"bufio"
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
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	krand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

// Attacks on the admin port, replayed against the real hub binary: a live
// dashboard stream that outlives its session, and an admin port that sends
// the session cookie in the clear.

// TestSecurityWebLiveStreamEndsOnSignOut signs in to the dashboard of a hub
// that authenticates with Kubernetes TokenReview (with --api-audience), opens
// the live stream as a browser does and signs out: the stream must end
// within seconds. Tokens for another audience get nowhere.
func TestSecurityWebLiveStreamEndsOnSignOut(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("primary")
	ns := hubNamespace(t, home)
	const audience = "hub.e2e.example"
	h := startHub(t, home, "--namespace", ns, "--api-audience", audience)
	w := newWebClient(h.adminURL, nil)

	reader := adminAudienceToken(t, home, ns, audience)
	otherAudience := adminAudienceToken(t, home, ns, "")
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"token for the API audience", reader, http.StatusOK},
		{"token for the API server's audience", otherAudience, http.StatusUnauthorized},
		{"static admin token (no audience)", home.AdminToken(), http.StatusUnauthorized},
	} {
		if got := w.apiStatus(t, "/api/v1/clusters", tc.token); got != tc.want {
			t.Errorf("%s: GET /api/v1/clusters answered %d; want %d", tc.name, got, tc.want)
		}
	}

	cookie, csrf := w.signIn(t, reader)
	st := w.openStream(t, "/", cookie)
	st.waitEvent(t, "update", 30*time.Second)
	w.signOut(t, cookie, csrf)
	signedOut := time.Now()
	reason := st.waitEnd(t, 15*time.Second)
	t.Logf("live stream ended %s after sign-out (end event %q)", time.Since(signedOut).Round(time.Millisecond), reason)
	if reason != "signed out" {
		t.Errorf("the stream ended with %q; want an end event saying \"signed out\"", reason)
	}
	if code := w.streamStatus(t, "/", cookie); code != http.StatusUnauthorized {
		t.Errorf("a new stream with the signed-out cookie: %d; want 401", code)
	}
}

// TestSecurityWebAdminTLS runs the hub with --admin-tls-cert/--admin-tls-key
// and a static token file: the dashboard and the API answer over TLS only,
// the session cookie is Secure, the live stream works over HTTP/2, and
// removing a token from the file ends its live stream within seconds.
func TestSecurityWebAdminTLS(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("primary")
	ns := hubNamespace(t, home)
	dir := t.TempDir()
	clientTLS := adminSelfSigned(t, dir)
	tokens := filepath.Join(dir, "tokens")
	adminWriteFile(t, tokens, "admin-token-e2e,ann,write\nreader-token-e2e,bob,read\n")
	h := startHubAdminTLS(t, home, clientTLS, "--namespace", ns, "--api-token-file", tokens,
		"--admin-tls-cert", filepath.Join(dir, "tls.crt"), "--admin-tls-key", filepath.Join(dir, "tls.key"))
	w := newWebClient(h.adminURL, clientTLS)

	if got := w.apiStatus(t, "/api/v1/clusters", "reader-token-e2e"); got != http.StatusOK {
		t.Errorf("GET /api/v1/clusters over TLS: %d", got)
	}
	plainURL := "http://" + strings.TrimPrefix(h.adminURL, "https://")
	if resp, err := http.Get(plainURL + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the TLS admin port: %s; want it refused", resp.Status)
		}
	}

	resp, err := w.client.PostForm(w.base+"/signin", url.Values{"token": {"reader-token-e2e"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(resp.Cookies()) != 1 || !resp.Cookies()[0].Secure || !resp.Cookies()[0].HttpOnly {
		t.Fatalf("session cookie over TLS: %+v (want Secure, HttpOnly)", resp.Cookies())
	}
	cookie := resp.Cookies()[0]
	if code, body := w.get(t, "/clusters", cookie); code != http.StatusOK || !strings.Contains(body, home.Name) {
		t.Fatalf("dashboard over TLS: %d", code)
	}

	st := w.openStream(t, "/clusters", cookie)
	if st.proto != "HTTP/2.0" {
		t.Errorf("live stream over %s; want HTTP/2.0", st.proto)
	}
	st.waitEvent(t, "update", 30*time.Second)
	adminWriteFile(t, tokens, "admin-token-e2e,ann,write\n")
	revoked := time.Now()
	reason := st.waitEnd(t, 15*time.Second)
	t.Logf("live stream ended %s after the token was removed (end event %q)", time.Since(revoked).Round(time.Millisecond), reason)
	if reason != "session revoked" {
		t.Errorf("the stream ended with %q; want \"session revoked\"", reason)
	}
	if got := w.apiStatus(t, "/api/v1/clusters", "reader-token-e2e"); got != http.StatusUnauthorized {
		t.Errorf("removed token on the API: %d; want 401", got)
	}
	if got := w.apiStatus(t, "/api/v1/clusters", "admin-token-e2e"); got != http.StatusOK {
		t.Errorf("remaining token on the API: %d; want 200", got)
	}
}

// webClient talks to the admin port as a browser would, without following
// redirects.
type webClient struct {
	base   string
	client *http.Client
}

func newWebClient(base string, tlsCfg *tls.Config) *webClient {
	return &webClient{base: base, client: &http.Client{
		Transport:     &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       0, // live streams; every request below has its own context
	}}
}

func (w *webClient) do(t *testing.T, req *http.Request) *http.Response {
	t.Helper()
	resp, err := w.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	return resp
}

func (w *webClient) apiStatus(t *testing.T, path, token string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, w.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp := w.do(t, req)
	resp.Body.Close()
	return resp.StatusCode
}

func (w *webClient) get(t *testing.T, path string, cookie *http.Cookie) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, w.base+path, nil)
	req.AddCookie(cookie)
	resp := w.do(t, req)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// signIn posts the sign-in form and returns the session cookie and the
// CSRF token of the overview page.
func (w *webClient) signIn(t *testing.T, token string) (*http.Cookie, string) {
	t.Helper()
	resp, err := w.client.PostForm(w.base+"/signin", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("sign in: %s, cookies %v", resp.Status, resp.Cookies())
	}
	cookie := resp.Cookies()[0]
	code, body := w.get(t, "/", cookie)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("overview after sign in: %d, no CSRF token", code)
	}
	return cookie, m[1]
}

func (w *webClient) signOut(t *testing.T, cookie *http.Cookie, csrf string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, w.base+"/signout", strings.NewReader(url.Values{"csrf": {csrf}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(cookie)
	resp := w.do(t, req)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign out: %s", resp.Status)
	}
}

func (w *webClient) streamStatus(t *testing.T, page string, cookie *http.Cookie) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, w.base+"/events?page="+url.QueryEscape(page), nil)
	req.AddCookie(cookie)
	resp := w.do(t, req)
	resp.Body.Close()
	return resp.StatusCode
}

// liveStream is an open /events stream; its events channel closes when the
// server ends the stream.
type liveStream struct {
	proto  string
	events <-chan [2]string // event name, data
}

func (w *webClient) openStream(t *testing.T, page string, cookie *http.Cookie) *liveStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, w.base+"/events?page="+url.QueryEscape(page), nil)
	req.Header.Set("Accept", "text/event-stream")
	req.AddCookie(cookie)
	resp, err := w.client.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		resp.Body.Close()
		cancel()
		t.Fatalf("GET /events: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	events := make(chan [2]string, 64)
	done := make(chan struct{})
	go func() { // owned by the test: cancel stops it
		defer close(done)
		defer close(events)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		var name string
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if data != nil {
					events <- [2]string{name, strings.Join(data, "\n")}
				}
				name, data = "", nil
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = append(data, strings.TrimPrefix(line, "data: "))
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return &liveStream{proto: resp.Proto, events: events}
}

func (s *liveStream) waitEvent(t *testing.T, name string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatalf("the live stream ended before a %q event", name)
			}
			if ev[0] == name {
				return ev[1]
			}
		case <-deadline:
			t.Fatalf("no %q event within %s", name, timeout)
		}
	}
}

// waitEnd waits until the server ends the stream and returns the data of
// its "end" event ("" if none came).
func (s *liveStream) waitEnd(t *testing.T, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	reason := ""
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				return reason
			}
			if ev[0] == "end" {
				reason = ev[1]
			}
		case <-deadline:
			t.Fatalf("the live stream was still open %s later", timeout)
		}
	}
}

// adminAudienceToken creates a service account that may get secrets in ns and
// returns a token for it issued for audience (empty: the API server's own).
func adminAudienceToken(t *testing.T, home *localcluster.Cluster, ns, audience string) string {
	t.Helper()
	ctx := testContext(t)
	cs := client(t, home)
	name := "web-user-" + krand.String(5)
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	spec := authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}
	if audience != "" {
		spec.Audiences = []string{audience}
	}
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Status.Token
}

// adminSelfSigned writes a self-signed serving certificate for 127.0.0.1
// to dir/tls.crt and dir/tls.key and returns a client configuration that
// trusts it.
func adminSelfSigned(t *testing.T, dir string) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "hub admin e2e"},
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
	adminWriteFile(t, filepath.Join(dir, "tls.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	adminWriteFile(t, filepath.Join(dir, "tls.key"), string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})))
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// adminWriteFile replaces a file atomically (write, then rename), as a
// Kubernetes volume update does.
func adminWriteFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
