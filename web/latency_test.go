package web

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hubmesh/hub/hub/xdsstatus"
)

// latencyModels reports a settable push latency summary.
type latencyModels struct {
	fakeModels
	mu sync.Mutex
	s  xdsstatus.Latency
}

func (m *latencyModels) PushLatency() xdsstatus.Latency {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.s
}

func (m *latencyModels) set(s xdsstatus.Latency) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.s = s
}

// The overview shows push latency p50 / p99 of the last five minutes, and
// its live stream updates them.
func TestOverviewShowsPushLatency(t *testing.T) {
	models := &latencyModels{}
	cfg := Config{Membership: models, Registrar: models, Serving: models, Auth: &fakeAuth{}, Refresh: 20 * time.Millisecond}
	s := startServer(t, cfg, ServerOptions{}, nil)
	cookie, _ := s.signIn(t, "good")

	code, body := s.get(t, "/", cookie)
	if code != http.StatusOK || !strings.Contains(body, "Push latency") || !strings.Contains(body, "no pushes") {
		t.Fatalf("overview without pushes: %d, no empty push latency card in:\n%s", code, body)
	}

	models.set(xdsstatus.Latency{Window: 5 * time.Minute, Count: 12, P50: 1500 * time.Microsecond, P99: 42 * time.Millisecond})
	code, body = s.get(t, "/", cookie)
	if want := "1.50 ms / 42 ms"; code != http.StatusOK || !strings.Contains(body, want) || !strings.Contains(body, "p50 / p99 (last 5 min) of 12 pushed responses") {
		t.Fatalf("overview: %d, no %q with its count in:\n%s", code, want, body)
	}

	st := s.openStream(t, "/", cookie)
	if ev := st.next(t, 30*time.Second); ev.name != "update" || !strings.Contains(ev.data, "1.50 ms / 42 ms") {
		t.Fatalf("first live update %+v; want the push latency", ev)
	}
	models.set(xdsstatus.Latency{Window: 5 * time.Minute, Count: 13, P50: 250 * time.Millisecond, P99: 2500 * time.Millisecond})
	for {
		ev := st.next(t, 30*time.Second)
		if ev.name != "update" {
			t.Fatalf("live event %+v; want an update", ev)
		}
		if strings.Contains(ev.data, "250 ms / 2.50 s") && strings.Contains(ev.data, "of 13 pushed responses") {
			break
		}
	}
}

func TestFormatLatency(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                       "0.00 ms",
		1234 * time.Microsecond: "1.23 ms",
		57 * time.Millisecond:   "57 ms",
		30 * time.Second:        "30.00 s",
	} {
		if got := formatLatency(d); got != want {
			t.Errorf("formatLatency(%v) = %q; want %q", d, got, want)
		}
	}
}
