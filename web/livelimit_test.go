package web

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hubmesh/hub/internal/wait"
)

// TestLiveStreamsBounded: on a real admin server, a session's live streams
// are bounded: a newer one displaces the oldest, which ends with a reason
// (so the browser tab does not reconnect) while the others keep updating;
// and the hub's streams of all sessions are bounded: beyond that a new one
// is refused with 503 and Retry-After until a stream closes.
func TestLiveStreamsBounded(t *testing.T) {
	models := &messageModels{msg: "v1"}
	cfg := Config{Membership: models, Registrar: models, Serving: models, Auth: &fakeAuth{}, Refresh: 20 * time.Millisecond,
		MaxLiveStreamsPerSession: 3, MaxLiveStreams: 4}
	dash := New(cfg)
	s := serveDashboard(t, dash, ServerOptions{}, nil)
	cookieA, _ := s.signIn(t, "good")
	cookieB, _ := s.signIn(t, "good")

	var tabs []*stream
	for range 4 {
		st := s.openStream(t, "/clusters", cookieA)
		if ev := st.next(t, 30*time.Second); ev.name != "update" || !strings.Contains(ev.data, "v1") {
			t.Fatalf("first live update: %+v", ev)
		}
		tabs = append(tabs, st)
	}
	want := "more than 3 pages of this session are live; this one stopped updating"
	if reason := tabs[0].waitEnd(t, 15*time.Second); reason != want {
		t.Errorf("the oldest stream ended with %q; want %q", reason, want)
	}
	// The three newer ones are live: each gets the next change.
	models.mu.Lock()
	models.msg = "v2"
	models.mu.Unlock()
	for i, st := range tabs[1:] {
		if ev := st.next(t, 30*time.Second); ev.name != "update" || !strings.Contains(ev.data, "v2") {
			t.Errorf("stream %d after the change: %+v", i+2, ev)
		}
	}

	// Session B: one stream fits (4 in all), the next is refused.
	bCtx, closeB := context.WithCancel(context.Background())
	defer closeB()
	if code, _ := s.tryStream(t, bCtx, cookieB); code != http.StatusOK {
		t.Fatalf("a stream within the hub's bound: %d", code)
	}
	if code, retry := s.tryStream(t, context.Background(), cookieB); code != http.StatusServiceUnavailable || retry == "" {
		t.Errorf("a stream beyond the hub's bound: %d, Retry-After %q; want 503 with Retry-After", code, retry)
	}
	// When B's stream closes its place is free again.
	closeB()
	sidB := cookieB.Value // the session's ID
	wait.Until(t, 30*time.Second, func() error {
		if n, total := dash.live.count(sidB); n != 0 || total != 3 {
			return fmt.Errorf("B holds %d streams, the hub %d", n, total)
		}
		return nil
	})
	bCtx2, closeB2 := context.WithCancel(context.Background())
	defer closeB2()
	if code, _ := s.tryStream(t, bCtx2, cookieB); code != http.StatusOK {
		t.Errorf("a stream after one closed: %d", code)
	}
}

// tryStream opens /events of the overview with cookie and returns the
// status and Retry-After; a 200 stream stays open until ctx is done.
func (s *testServer) tryStream(t *testing.T, ctx context.Context, cookie *http.Cookie) (int, string) {
	t.Helper()
	resp := s.requestEvents(t, ctx, "/", cookie)
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
	} else {
		context.AfterFunc(ctx, func() { resp.Body.Close() })
	}
	return resp.StatusCode, resp.Header.Get("Retry-After")
}
