package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// loadResult is what loadRun measured: calls answered, failures, calls per
// second, and the latency of answered calls.
type loadResult struct {
	calls, errors int
	firstErr      string // the first failure's error, "" with none
	rps           float64
	p50, p99      time.Duration
}

func (r loadResult) String() string {
	s := fmt.Sprintf("calls=%d errors=%d rps=%.0f p50=%v p99=%v", r.calls, r.errors, r.rps,
		r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond))
	if r.firstErr != "" {
		s += " first error: " + r.firstErr
	}
	return s
}

// loadRun calls call from workers goroutines, back to back, for d, and
// reports throughput and latency (a measurement for the log, never a
// condition of a test).
func loadRun(ctx context.Context, workers int, d time.Duration, call func(context.Context) error) loadResult {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	// gRPC times a call out by the deadline itself, a moment before ctx
	// says it is done: a call failing then ended with the window, it did
	// not fail.
	deadline, _ := ctx.Deadline()
	windowOpen := func() bool { return ctx.Err() == nil && time.Until(deadline) > 10*time.Millisecond }
	var (
		mu       sync.Mutex
		lat      []time.Duration
		errors   int
		firstErr string
		wg       sync.WaitGroup
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for windowOpen() {
				t0 := time.Now()
				err := call(ctx)
				el := time.Since(t0)
				mu.Lock()
				if err != nil {
					if windowOpen() {
						if errors++; errors == 1 {
							firstErr = strings.ReplaceAll(err.Error(), "\n", " ")
						}
					}
				} else {
					lat = append(lat, el)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r := loadResult{calls: len(lat), errors: errors, firstErr: firstErr, rps: float64(len(lat)) / time.Since(start).Seconds()}
	if len(lat) > 0 {
		slices.Sort(lat)
		r.p50, r.p99 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return r
}
