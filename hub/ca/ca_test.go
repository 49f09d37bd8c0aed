package ca

import (
	"context"
	"testing"
)

// A caller whose context ended gets no worker slot, however often it asks:
// callers that give up (a tiny grpc-timeout, a cancel) never leak the CA's
// slots.
func TestCASlotsSurviveCallersThatGiveUp(t *testing.T) {
	s := &Server{workers: make(chan struct{}, 1), renewals: make(chan struct{}, 1), maxWaiting: 4}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for range 100 {
		for _, renewal := range []bool{false, true} {
			if release, err := s.acquire(done, renewal); release != nil || err == nil {
				t.Fatalf("a cancelled caller got a slot (err %v)", err)
			}
		}
	}
	release, err := s.acquire(context.Background(), false)
	if err != nil || release == nil {
		t.Fatalf("a live caller got no free slot: %v", err)
	}
	release()
	if len(s.workers) != 0 || len(s.renewals) != 0 {
		t.Errorf("slots in use after every caller left: %d workers, %d renewals", len(s.workers), len(s.renewals))
	}
}
