package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hubmesh/hub/internal/wait"
)

// TestDemoCABundleRefused: when the hub's API refuses the trust bundle,
// the demo says what it answered (not a formatting artefact).
func TestDemoCABundleRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no trust domain cluster.local", http.StatusNotFound)
	}))
	defer srv.Close()
	_, err := newDemoCA(context.Background(), srv.URL, "token", "cluster.local", "127.0.0.1:1")
	if err == nil {
		t.Fatal("newDemoCA succeeded without a bundle")
	}
	if msg := err.Error(); strings.Contains(msg, "%!") || !strings.Contains(msg, "404") || !strings.Contains(msg, "no trust domain cluster.local") {
		t.Errorf("error %q; want the status and the API's answer", msg)
	}
}

// A workload's certificate is renewed half-way through its lifetime, never
// earlier, again and again; a failed renewal is reported and retried.
func TestDemoCertificatesAreRenewed(t *testing.T) {
	const lifetime = 400 * time.Millisecond
	var mu sync.Mutex
	var calls []time.Time
	var prev validity
	fail := true
	issue := func(context.Context) (validity, error) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		if now.Before(prev.renewAt()) {
			t.Errorf("renewed at %s, before half-way (%s)", now.Format(time.StampMilli), prev.renewAt().Format(time.StampMilli))
		}
		calls = append(calls, now)
		if fail { // the first renewal fails once
			fail = false
			return validity{}, errors.New("member unreachable")
		}
		prev = validity{issued: now, notAfter: now.Add(lifetime)}
		return prev, nil
	}
	now := time.Now()
	prev = validity{issued: now, notAfter: now.Add(lifetime)}
	failures := make(chan error, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { renewCertificate(ctx, prev, issue, func(err error) { failures <- err }); close(done) }()
	wait.Until(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(calls) < 4 {
			return fmt.Errorf("%d renewals so far; want 4 (one failed, three after)", len(calls))
		}
		return nil
	})
	cancel()
	<-done
	if err := <-failures; err == nil || !strings.Contains(err.Error(), "member unreachable") {
		t.Errorf("the failed renewal was reported as %v", err)
	}
	if got := (validity{issued: now, notAfter: now.Add(24 * time.Hour)}).refreshInterval(); got != 15*time.Minute {
		t.Errorf("refresh interval of a 24 h certificate: %s; want istio-agent's 15m", got)
	}
	if got := (validity{issued: now, notAfter: now.Add(time.Minute)}).refreshInterval(); got != 15*time.Second {
		t.Errorf("refresh interval of a 1 m certificate: %s; want a quarter of it", got)
	}
}
