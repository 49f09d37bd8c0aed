package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"time"
)

// HeapSummary is the hub's heap before the streams connect and once all of
// them hold their configuration.
type HeapSummary struct {
	// LiveBeforeMiB and LiveAfterMiB are the live heap found by a GC
	// (GODEBUG=gctrace=1, whole MiB) made to run after the point;
	// LivePerStreamKiB is their difference ÷ streams.
	LiveBeforeMiB    int     `json:"liveBeforeMiB"`
	LiveAfterMiB     int     `json:"liveAfterMiB"`
	LivePerStreamKiB float64 `json:"livePerStreamKiB"`
	// InuseBeforeMiB, InuseAfterMiB: go_memstats_heap_inuse_bytes at the
	// same points, garbage included; InusePerStreamKiB the difference ÷
	// streams.
	InuseBeforeMiB    float64 `json:"inuseBeforeMiB"`
	InuseAfterMiB     float64 `json:"inuseAfterMiB"`
	InusePerStreamKiB float64 `json:"inusePerStreamKiB"`
}

// heapPoint is the hub's heap at one point.
type heapPoint struct {
	liveMiB  int
	inuseMiB float64
}

// heapGCTimeout bounds how long reading the hub's API may take to make it
// run a GC.
const heapGCTimeout = 2 * time.Minute

// heapNow measures the hub's heap now.
func (h *hubProcess) heapNow(ctx context.Context) (heapPoint, error) {
	live, err := h.liveHeap(ctx, heapGCTimeout)
	if err != nil {
		return heapPoint{}, err
	}
	m, err := h.metrics(ctx)
	if err != nil {
		return heapPoint{}, err
	}
	return heapPoint{liveMiB: live, inuseMiB: m.HeapInuseMiB}, nil
}

// writeHeapProfile writes the hub's heap profile, taken after a GC, to
// path.
func (h *hubProcess) writeHeapProfile(ctx context.Context, path string) error {
	profile, err := h.get(ctx, "/debug/pprof/heap?gc=1")
	if err != nil {
		return fmt.Errorf("reading the hub's heap profile: %w", err)
	}
	if err := os.WriteFile(path, profile, 0o644); err != nil {
		return fmt.Errorf("writing the hub's heap profile: %w", err)
	}
	return nil
}

func heapPerStream(before, after heapPoint, streams int) HeapSummary {
	per := func(b, a float64) float64 { return math.Round((a-b)*1024/float64(streams)*10) / 10 }
	return HeapSummary{
		LiveBeforeMiB: before.liveMiB, LiveAfterMiB: after.liveMiB,
		LivePerStreamKiB: per(float64(before.liveMiB), float64(after.liveMiB)),
		InuseBeforeMiB:   math.Round(before.inuseMiB*10) / 10, InuseAfterMiB: math.Round(after.inuseMiB*10) / 10,
		InusePerStreamKiB: per(before.inuseMiB, after.inuseMiB),
	}
}
