package main

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// The bulk phase with real Envoys (--real-envoys N --bulk M): after the
// measured writes, W writers create M new services while the Envoys watch
// (CDS wildcard, EDS for every cluster). It measures when every Envoy
// holds every new cluster (its admin /clusters, none warming) and how many
// responses of each type the server sent per Envoy for the burst (the
// server's own counters: hub_xds_responses_total or istiod's
// pilot_xds_pushes), until the server is quiet.

// RealEnvoyBulk is what the real-Envoy bulk phase measured.
type RealEnvoyBulk struct {
	Services int `json:"services"`
	Objects  int `json:"objects"` // (service, member) pairs: a Service and an EndpointSlice each
	Writers  int `json:"writers"`
	// APIWriteSeconds: first create issued → last create returned.
	APIWriteSeconds float64 `json:"apiWriteSeconds"`
	// ConvergeSeconds: first create → every Envoy holds every new cluster,
	// none warming; EnvoyConverge per Envoy.
	ConvergeSeconds float64     `json:"convergeSeconds"`
	EnvoyConverge   Percentiles `json:"envoyConverge"`
	// QuietSeconds: first create → the server sent nothing for
	// realBulkQuiet (0 if not within realBulkQuietMax of convergence).
	QuietSeconds float64 `json:"quietSeconds"`
	// ResponsesPerEnvoy: the server's responses by type, first create →
	// quiet, divided by the Envoys.
	ResponsesPerEnvoy map[string]float64 `json:"responsesPerEnvoy"`
	// ServerCPUSeconds: the server's CPU, first create → quiet.
	ServerCPUSeconds float64 `json:"serverCpuSeconds"`
	LoadAfter        string  `json:"loadAfter"`
}

// How long the server must send nothing to be quiet after a bulk, and how
// long after convergence to wait for that.
const (
	realBulkQuiet    = 2 * time.Second
	realBulkQuietMax = 30 * time.Second
)

// realEnvoyBulk runs the bulk phase against the Envoys of h.
func realEnvoyBulk(ctx context.Context, cfg Config, l *layout, clients []kubernetes.Interface, envoys []*realEnvoy, h *hubProcess) (*RealEnvoyBulk, error) {
	b := &RealEnvoyBulk{Services: len(l.bulk), Writers: cfg.BulkWriters}
	jobs := serviceJobs(l.bulk)
	b.Objects = len(jobs)
	want := map[string]bool{}
	for _, s := range l.services {
		want[s.cluster] = true
	}
	for _, s := range l.bulk {
		want[s.cluster] = true
	}
	before, err := h.metrics(ctx)
	if err != nil {
		return nil, err
	}
	cpu0, err := procStats(h.pid())
	if err != nil {
		return nil, fmt.Errorf("reading the server's /proc: %w", err)
	}
	cfg.progress("bulk: creating %d services (%d Services and EndpointSlices) with %d writers while %d real Envoys watch", b.Services, b.Objects, cfg.BulkWriters, len(envoys))
	waitCtx, cancel := context.WithTimeout(ctx, cfg.BulkTimeout)
	defer cancel()
	start := time.Now()
	per := make([]time.Duration, len(envoys))
	errc := make(chan error, len(envoys))
	var wg sync.WaitGroup
	for i, e := range envoys {
		wg.Go(func() {
			if _, err := waitEnvoyHolds(waitCtx, e, want); err != nil {
				errc <- fmt.Errorf("envoy %d: %w", e.idx, err)
				return
			}
			per[i] = time.Since(start)
		})
	}
	if err := runJobs(ctx, clients, cfg.BulkWriters, jobs, nil); err != nil {
		cancel()
		wg.Wait()
		return nil, fmt.Errorf("bulk: creating services: %w", err)
	}
	b.APIWriteSeconds = time.Since(start).Seconds()
	wg.Wait()
	close(errc)
	if err := fleetError(errc, h); err != nil {
		return nil, err
	}
	b.EnvoyConverge = percentiles(per)
	b.ConvergeSeconds = b.EnvoyConverge.MaxMs / 1000
	cfg.progress("bulk: every Envoy holds the %d new services after %.2fs", b.Services, b.ConvergeSeconds)

	after, quiet, err := waitServerQuiet(ctx, h, before, start)
	if err != nil {
		return nil, err
	}
	b.QuietSeconds = quiet
	cpu1, err := procStats(h.pid())
	if err != nil {
		return nil, fmt.Errorf("reading the server's /proc: %w", err)
	}
	b.ServerCPUSeconds = math.Round((cpu1.CPUSeconds-cpu0.CPUSeconds)*100) / 100
	b.ResponsesPerEnvoy = map[string]float64{}
	for t, v := range after.Responses {
		if d := v - before.Responses[t]; d > 0 {
			b.ResponsesPerEnvoy[t] = math.Round(d/float64(len(envoys))*100) / 100
		}
	}
	b.LoadAfter = loadAvg()
	return b, nil
}

// waitServerQuiet waits up to realBulkQuietMax for the server to be quiet:
// its response counters (from before on) unchanged for realBulkQuiet. It
// returns the server's metrics at the end and when it went quiet, in
// seconds from start (0 if it did not).
func waitServerQuiet(ctx context.Context, h *hubProcess, before hubMetrics, start time.Time) (after hubMetrics, quiet float64, err error) {
	last, lastChange := before.total(), time.Now()
	for deadline := time.Now().Add(realBulkQuietMax); ; {
		if after, err = h.metrics(ctx); err != nil {
			return hubMetrics{}, 0, err
		}
		if t := after.total(); t != last {
			last, lastChange = t, time.Now()
		} else if time.Since(lastChange) >= realBulkQuiet {
			quiet = lastChange.Sub(start).Seconds()
			break
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return hubMetrics{}, 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return after, quiet, nil
}

// writeText prints the bulk phase's figures.
func (b *RealEnvoyBulk) writeText(p func(string, ...any)) {
	p("  bulk                      %8d services (%d Services and EndpointSlices) by %d writers while the Envoys watch", b.Services, b.Objects, b.Writers)
	p("    API writes              %8.2f s", b.APIWriteSeconds)
	p("    converged               %8.2f s    (first create → every Envoy holds every new cluster, none warming; per Envoy p50 %.0f ms, p99 %.0f ms)",
		b.ConvergeSeconds, b.EnvoyConverge.P50Ms, b.EnvoyConverge.P99Ms)
	p("    quiet                   %8.2f s    (the server sent nothing for %s)", b.QuietSeconds, realBulkQuiet)
	p("    responses per Envoy     %v (by type, first create → quiet, the server's counters ÷ Envoys)", b.ResponsesPerEnvoy)
	p("    server CPU              %8.2f s    (first create → quiet); load after %s", b.ServerCPUSeconds, b.LoadAfter)
}
