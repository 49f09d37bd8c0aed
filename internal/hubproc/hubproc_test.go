package hubproc

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A stand-in for `hub serve` (a shell): the launcher's own contract, not
// the hub's, which the e2e tests, the demo and the benchmark prove.
func start(t *testing.T, script string) *Process {
	t.Helper()
	p, err := Start(Options{Bin: "/bin/sh", Args: []string{"-c", script}, LogPath: filepath.Join(t.TempDir(), "hub.log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill() })
	return p
}

func TestListeningThenStop(t *testing.T) {
	p := start(t, `echo '{"msg":"starting"}'; echo '{"msg":"hub listening","admin":"127.0.0.1:1","xds":"127.0.0.1:2"}'; trap 'exit 0' TERM; while :; do sleep 0.05; done`)
	addrs, err := p.Listening(context.Background())
	if err != nil || addrs["admin"] != "127.0.0.1:1" || addrs["xds"] != "127.0.0.1:2" {
		t.Fatalf("Listening = %v, %v", addrs, err)
	}
	if err := p.Exited(); err != nil {
		t.Fatalf("Exited while running: %v", err)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("Stop of a hub that exits 0 on SIGTERM: %v", err)
	}
}

func TestExitBeforeListening(t *testing.T) {
	p := start(t, `echo 'refusing to start: no kubeconfig'; exit 3`)
	_, err := p.Listening(context.Background())
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "refusing to start") {
		t.Fatalf("Listening of a hub that exited = %v; want how it exited and its log", err)
	}
}

func TestStopKillsAfterGrace(t *testing.T) {
	p := start(t, `trap '' TERM; echo '{"msg":"hub listening","admin":"a"}'; while :; do sleep 0.05; done`)
	if _, err := p.Listening(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(200 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "did not stop") {
		t.Fatalf("Stop of a hub that ignores SIGTERM = %v", err)
	}
	<-p.Done()
}
