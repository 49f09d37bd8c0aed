package register

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitReady returns once the member is Ready with the wanted kubeconfig,
// and reports the other states it saw on the way.
func TestWaitReady(t *testing.T) {
	var calls atomic.Int32
	answers := []string{
		`404`,
		`{"state":"Syncing","message":"waiting","kubeconfigSHA256":"new"}`,
		`{"state":"Ready","kubeconfigSHA256":"old"}`,
		`{"state":"Ready","kubeconfigSHA256":"new"}`,
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/clusters/west" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		a := answers[min(int(calls.Add(1))-1, len(answers)-1)]
		if a == "404" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, a)
	}))
	defer srv.Close()
	h := &Hub{URL: srv.URL + "/", Token: "tok", Poll: time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	notReady, err := h.waitReady(ctx, "west", "new")
	if err != nil || strings.Join(notReady, ",") != "Syncing" || calls.Load() != 4 {
		t.Errorf("waitReady: %v, not ready %v after %d calls", err, notReady, calls.Load())
	}
}

func TestWaitReadyFails(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   string
	}{
		{http.StatusOK, `{"state":"Ready","kubeconfigSHA256":"old"}`, "last seen: Ready, with another kubeconfig)"},
		{http.StatusOK, `{"state":"Ready"}`, "it is older than this command"},
		{http.StatusForbidden, `{"title":"Forbidden"}`, `hub answered 403 Forbidden: {"title":"Forbidden"} (check --hub-token-file)`},
		{http.StatusBadGateway, `down`, `last seen: hub answered 502 Bad Gateway: down`},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			fmt.Fprint(w, tc.body)
		}))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := (&Hub{URL: srv.URL, Poll: 10 * time.Millisecond}).waitReady(ctx, "west", "new")
		cancel()
		srv.Close()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%d %s: %v; want an error saying %q", tc.status, tc.body, err, tc.want)
		}
	}
}

// With Settle, the first answer showing the new kubeconfig opens a window
// that every answer must confirm: an answer from a replica still on the
// previous one starts it again. Each poll is a connection of its own, so
// that a Service spreads them over the replicas.
func TestWaitReadySettles(t *testing.T) {
	var (
		mu      sync.Mutex
		answers = []string{"new", "old", "new", "new", "new"} // then new for ever
		seen    []string
		conns   atomic.Int32
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sha := "new"
		if len(seen) < len(answers) {
			sha = answers[len(seen)]
		}
		seen = append(seen, sha)
		mu.Unlock()
		fmt.Fprintf(w, `{"state":"Ready","secret":"ns/s","kubeconfigSHA256":%q}`, sha)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	const settle = 200 * time.Millisecond
	// A client that would keep connections alive: Hub asks each time for a new one.
	h := &Hub{URL: srv.URL, Poll: 20 * time.Millisecond, Settle: settle, Client: &http.Client{}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := h.waitReady(ctx, "west", "new"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	mu.Lock()
	n := len(seen)
	mu.Unlock()
	// The window opened at the first answer and restarted at the third
	// (after "old"), so it closed at least settle after the third answer.
	if n < 3+int(settle/h.Poll)-1 || took < settle+2*h.Poll {
		t.Errorf("returned after %s and %d answers", took, n)
	}
	if int(conns.Load()) != n {
		t.Errorf("%d answers over %d connections: each poll must dial anew", n, conns.Load())
	}

	// A window still open when the wait ends is no success, and says so.
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	h.Settle = time.Hour
	if _, err := h.waitReady(ctx, "west", "new"); err == nil || !strings.Contains(err.Error(), "short of the 1h0m0s settle window") {
		t.Errorf("an unsettled wait: %v", err)
	}
}

// waitRuns waits for the kubeconfig in any state (undoing a rotation:
// which client the hub runs matters, not whether the member is Ready).
func TestWaitRuns(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"state":"Stale","secret":"ns/s","kubeconfigSHA256":"old"}`)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := &Hub{URL: srv.URL, Poll: time.Millisecond, Settle: 10 * time.Millisecond}
	if err := h.waitRuns(ctx, "west", "old"); err != nil {
		t.Error(err)
	}
	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if _, err := h.waitReady(short, "west", "old"); err == nil || !strings.Contains(err.Error(), "last seen: Stale") {
		t.Errorf("waitReady on a Stale member: %v", err)
	}
}

// The API token never crosses the network in clear text.
func TestHubValidate(t *testing.T) {
	for _, tc := range []struct {
		url, token string
		want       string // "" valid
	}{
		{"https://hub.example:8080", "t", ""},
		{"http://127.0.0.1:8080", "t", ""},
		{"http://[::1]:8080", "t", ""},
		{"http://localhost:8080/", "t", ""},
		{"http://hub.example:8080", "", ""}, // no token to leak
		{"http://hub.example:8080", "t", `hub URL "http://hub.example:8080" is plain http to a host that is not loopback`},
		{"http://10.0.0.1:8080", "t", "is plain http to a host that is not loopback"},
		{"http://localhost.example.com", "t", "is plain http to a host that is not loopback"},
		{"ftp://hub.example", "", "want http:// or https://"},
		{"hub.example:8080", "", "want http:// or https://"},
		{"https://", "", "has no host"},
	} {
		err := (&Hub{URL: tc.url, Token: tc.token}).Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s (token %q): %v, want %q", tc.url, tc.token, err, tc.want)
		}
	}
}
