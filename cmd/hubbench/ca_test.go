package main

import (
	"context"
	"testing"
	"time"
)

// TestRunCATiny runs the ca shape briefly against real local clusters,
// real tokens and the real hub binary: every certificate asked for is
// issued, and the hub is measured.
func TestRunCATiny(t *testing.T) {
	requireK8sBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := defaultConfig()
	cfg.Shape, cfg.Streams, cfg.CADuration = shapeCA, 2, 2*time.Second
	cfg.Progress = t.Logf
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	sum, err := runCA(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing here depends on the machine's speed: a slow machine issues
	// fewer certificates (and may burn less than a clock tick of hub CPU),
	// but every call ends before its 30 s timeout and none is refused.
	if sum.Issued == 0 || sum.Failed != 0 || sum.Callers != 2 || sum.HubRSSMiB <= 0 || sum.HubCPUSeconds < 0 {
		t.Errorf("summary %+v; want certificates issued, none failed, the hub measured", sum)
	}
}
