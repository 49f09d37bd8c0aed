package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
)

// The bulk phase (--bulk N --bulk-writers W): once the streams are
// connected, the writes measured and the mesh quiet, W concurrent writers
// create N new services ("bulk-00000"…, each with its Service and
// EndpointSlice in ServiceMembers members, placed like the others) while
// every stream watches. It measures what a burst of changes costs: the
// responses each stream receives, the hub's CPU, how long the API servers
// take to accept the creates (they share the machine with the hub), and
// how long until every stream holds every new cluster in CDS and its
// whole assignment in EDS. Only the envoy shape follows new clusters on
// its own (CDS wildcard, EDS for every cluster), so only it has a bulk
// phase.

// BulkSummary is what the bulk phase measured.
type BulkSummary struct {
	Services int `json:"services"`
	// Objects is the number of (service, member) pairs created, each a
	// Service and an EndpointSlice.
	Objects int `json:"objects"`
	Writers int `json:"writers"`
	// APIWriteSeconds: the first create issued → the last create returned.
	APIWriteSeconds float64 `json:"apiWriteSeconds"`
	// ConvergeSeconds: the first create issued → every stream holds every
	// new cluster in CDS and its assignment with all its endpoints in EDS.
	ConvergeSeconds float64 `json:"convergeSeconds"`
	// StreamConverge: per stream, the first create → it holds them all.
	StreamConverge Percentiles `json:"streamConverge"`
	// QuietSeconds: the first create → no stream received anything for
	// bulkQuiet (the hub's trailing pushes included); 0 if that never
	// happened within bulkQuietMax after convergence.
	QuietSeconds float64 `json:"quietSeconds"`
	// HubCPUSeconds is the hub's CPU (procStats) from the first create
	// to convergence; HubCPUSecondsToQuiet to quiet.
	HubCPUSeconds        float64 `json:"hubCpuSeconds"`
	HubCPUSecondsToQuiet float64 `json:"hubCpuSecondsToQuiet"`
	// Responses are, per type (LDS, RDS, CDS, EDS), the responses a stream
	// received from the first create to convergence: mean and max over the
	// streams. ResponsesToQuiet the same until quiet.
	Responses        map[string]MeanMax `json:"responses"`
	ResponsesToQuiet map[string]MeanMax `json:"responsesToQuiet"`
	// HubResponses is hub_xds_responses_total's growth, first create →
	// quiet.
	HubResponses float64 `json:"hubResponses"`
	LoadBefore   string  `json:"loadBefore"`
	LoadAfter    string  `json:"loadAfter"`
	// Timeline samples the burst once a second, first create → quiet.
	Timeline []BulkSample `json:"timeline"`
}

// BulkSample is where the bulk phase stood some time after the first
// create: counters since the first create.
type BulkSample struct {
	Seconds float64 `json:"seconds"`
	Created int64   `json:"created"` // Services and EndpointSlices created
	// CDS and EDS are the responses the streams received, all streams.
	CDS    int64   `json:"cds"`
	EDS    int64   `json:"eds"`
	HubCPU float64 `json:"hubCpuSeconds"`
	// BenchCPU is this process's CPU: the streams' clients taking in what
	// they are sent, and the writers.
	BenchCPU float64 `json:"benchCpuSeconds"`
	// Pushes are the hub's pushes by trigger (hub_xds_pushes_total; none
	// for istiod).
	Pushes map[string]float64 `json:"pushes,omitempty"`
}

// MeanMax is a mean and a maximum.
type MeanMax struct {
	Mean float64 `json:"mean"`
	Max  int64   `json:"max"`
}

const (
	// bulkQuiet is how long no stream may receive anything for the mesh to
	// count as quiet, before and after the burst.
	bulkQuiet = time.Second
	// bulkQuietMax bounds the wait for quiet.
	bulkQuietMax = 60 * time.Second
)

// bulkServices are the services the bulk phase creates: --bulk of them,
// with as many endpoints as the run's services have on average (at least
// one per member), on addresses after those of the services and writes.
func bulkServices(cfg Config) []*service {
	if cfg.Bulk <= 0 {
		return nil
	}
	sm := cfg.serviceMembers()
	per := bulkEndpoints(cfg)
	next := cfg.Endpoints + cfg.Writes
	out := make([]*service, 0, cfg.Bulk)
	for i := range cfg.Bulk {
		out = append(out, placeService(fmt.Sprintf("bulk-%05d", i), i, per, sm, cfg.Members, false, &next))
	}
	return out
}

// bulkEndpoints is the number of endpoints of every bulk service.
func bulkEndpoints(cfg Config) int {
	return max(cfg.Endpoints/max(cfg.Services, 1), cfg.serviceMembers())
}

// runBulk runs the bulk phase (see above).
func runBulk(ctx context.Context, cfg Config, l *layout, clients []kubernetes.Interface, f *fleet, h *hubProcess) (*BulkSummary, error) {
	b := &BulkSummary{Services: len(l.bulk), Writers: cfg.BulkWriters}
	jobs := serviceJobs(l.bulk)
	b.Objects = len(jobs)
	if _, err := waitQuiet(ctx, f, bulkQuiet, bulkQuietMax); err != nil {
		return nil, err
	}
	before := f.perStreamByType()
	metricsBefore, err := h.metrics(ctx)
	if err != nil {
		return nil, err
	}
	b.LoadBefore = loadAvg()
	cpu0, err := procStats(h.pid())
	if err != nil {
		return nil, fmt.Errorf("reading the hub's /proc: %w", err)
	}
	cfg.progress("bulk: creating %d services (%d Services and EndpointSlices) with %d writers while %d streams watch", b.Services, b.Objects, cfg.BulkWriters, len(f.streams))
	start := time.Now()
	var created atomic.Int64
	stopSampling := sampleBulk(ctx, b, start, f, h, &created, cpu0.CPUSeconds, metricsBefore)
	defer stopSampling()
	if err := runJobs(ctx, clients, cfg.BulkWriters, jobs, func(n int64) { created.Store(n) }); err != nil {
		return nil, fmt.Errorf("bulk: creating services: %w", err)
	}
	b.APIWriteSeconds = time.Since(start).Seconds()
	cfg.progress("bulk: the API servers took %.2fs for the creates", b.APIWriteSeconds)
	if err := waitBulk(ctx, f, h, start, cfg.BulkTimeout, cfg.progress); err != nil {
		return nil, err
	}
	cpu1, err := procStats(h.pid())
	if err != nil {
		return nil, fmt.Errorf("reading the hub's /proc: %w", err)
	}
	b.HubCPUSeconds = cpu1.CPUSeconds - cpu0.CPUSeconds
	b.Responses = responseSpread(before, f.perStreamByType())
	var per []time.Duration
	for _, s := range f.streams {
		per = append(per, time.Unix(0, s.bulkDoneAt.Load()).Sub(start))
	}
	b.StreamConverge = percentiles(per)
	b.ConvergeSeconds = b.StreamConverge.MaxMs / 1000
	cfg.progress("bulk: every stream holds the %d new services after %.2fs", b.Services, b.ConvergeSeconds)

	quiet, err := waitQuiet(ctx, f, bulkQuiet, bulkQuietMax)
	if err != nil {
		return nil, err
	}
	if !quiet.IsZero() {
		b.QuietSeconds = quiet.Sub(start).Seconds()
	}
	cpu2, err := procStats(h.pid())
	if err != nil {
		return nil, fmt.Errorf("reading the hub's /proc: %w", err)
	}
	stopSampling()
	b.HubCPUSecondsToQuiet = cpu2.CPUSeconds - cpu0.CPUSeconds
	b.ResponsesToQuiet = responseSpread(before, f.perStreamByType())
	metricsAfter, err := h.metrics(ctx)
	if err != nil {
		return nil, err
	}
	b.HubResponses = metricsAfter.total() - metricsBefore.total()
	b.LoadAfter = loadAvg()
	return b, nil
}

// sampleBulk appends a BulkSample to b.Timeline every second until the
// returned stop is called (once or more; it waits for the sampler).
func sampleBulk(ctx context.Context, b *BulkSummary, start time.Time, f *fleet, h *hubProcess, created *atomic.Int64, cpu0 float64, m0 hubMetrics) (stop func()) {
	done := make(chan struct{})
	cds, eds := slices.Index(typeNames, "CDS"), slices.Index(typeNames, "EDS")
	sums := func() (c, e int64) {
		for _, st := range f.streams {
			c += st.byType[cds].Load()
			e += st.byType[eds].Load()
		}
		return c, e
	}
	cds0, eds0 := sums()
	self0, _ := procStats(os.Getpid())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-tick.C:
			}
			s := BulkSample{Seconds: math.Round(time.Since(start).Seconds()*10) / 10, Created: created.Load()}
			c, e := sums()
			s.CDS, s.EDS = c-cds0, e-eds0
			if p, err := procStats(h.pid()); err == nil {
				s.HubCPU = math.Round((p.CPUSeconds-cpu0)*10) / 10
			}
			if p, err := procStats(os.Getpid()); err == nil {
				s.BenchCPU = math.Round((p.CPUSeconds-self0.CPUSeconds)*10) / 10
			}
			if m, err := h.metrics(ctx); err == nil && len(m.Pushes) > 0 {
				s.Pushes = map[string]float64{}
				for k, v := range m.Pushes {
					s.Pushes[k] = v - m0.Pushes[k]
				}
			}
			b.Timeline = append(b.Timeline, s)
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(done); wg.Wait() })
	}
}

// waitBulk waits until every stream holds every bulk service, or fails
// after timeout (from start) listing the stragglers.
func waitBulk(ctx context.Context, f *fleet, h *hubProcess, start time.Time, timeout time.Duration, progress func(string, ...any)) error {
	deadline := start.Add(timeout)
	lastReport := time.Now()
	for {
		var lacking []int
		for i, s := range f.streams {
			if s.bulkDoneAt.Load() == 0 {
				lacking = append(lacking, i)
			}
		}
		if len(lacking) == 0 {
			return nil
		}
		if e := h.exited(); e != nil {
			return e
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bulk: %d of %d streams do not hold all %d new services %s after the first create:\n%s",
				len(lacking), len(f.streams), len(f.bulk), timeout, f.describeBulk(lacking, 20))
		}
		if time.Since(lastReport) > 10*time.Second {
			s := f.streams[lacking[0]]
			progress("bulk: %d streams lack some new services (stream %d holds %d/%d in CDS, %d/%d in EDS)",
				len(lacking), lacking[0], s.bulkCDS.Load(), len(f.bulk), s.bulkEDS.Load(), len(f.bulk))
			lastReport = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.failed:
			return f.firstErr
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// describeBulk lists up to n streams with what they hold of the bulk
// services.
func (f *fleet) describeBulk(idx []int, n int) string {
	out := ""
	for k, i := range idx {
		if k == n {
			out += fmt.Sprintf("  ... and %d more\n", len(idx)-n)
			break
		}
		s := f.streams[i]
		out += fmt.Sprintf("  stream %d (node %s): %d/%d new clusters in CDS, %d/%d full assignments in EDS; %d CDS and %d EDS responses in all\n",
			i, s.nodeID, s.bulkCDS.Load(), len(f.bulk), s.bulkEDS.Load(), len(f.bulk), s.typeResponses(typeURLOf("CDS")), s.typeResponses(typeURLOf("EDS")))
	}
	return out
}

// typeURLOf is the type URL of a short type name of typeNames.
func typeURLOf(name string) string {
	for i, n := range typeNames {
		if n == name {
			return subscriptionOrder[i]
		}
	}
	panic("unknown type " + name)
}

// waitQuiet waits until no stream has received a response for quiet, at
// most limit; it returns when the quiet began, or the zero time if the
// streams never went quiet within limit.
func waitQuiet(ctx context.Context, f *fleet, quiet, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	last, _ := f.totals()
	lastChange := time.Now()
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-f.failed:
			return time.Time{}, f.firstErr
		case <-time.After(50 * time.Millisecond):
		}
		now := time.Now()
		if n, _ := f.totals(); n != last {
			last, lastChange = n, now
		}
		if now.Sub(lastChange) >= quiet {
			return lastChange, nil
		}
		if now.After(deadline) {
			return time.Time{}, nil
		}
	}
}

// perStreamByType are every stream's response counts, in subscriptionOrder.
func (f *fleet) perStreamByType() [][4]int64 {
	out := make([][4]int64, len(f.streams))
	for i, s := range f.streams {
		for t := range s.byType {
			out[i][t] = s.byType[t].Load()
		}
	}
	return out
}

// responseSpread is, per type, the mean and max over streams of the
// responses received between two snapshots.
func responseSpread(before, after [][4]int64) map[string]MeanMax {
	out := map[string]MeanMax{}
	for t, name := range typeNames {
		var sum, hi int64
		for i := range after {
			d := after[i][t] - before[i][t]
			sum += d
			hi = max(hi, d)
		}
		if len(after) > 0 {
			out[name] = MeanMax{Mean: math.Round(float64(sum)/float64(len(after))*100) / 100, Max: hi}
		}
	}
	return out
}

// writeText prints the bulk phase's lines of the summary.
func (b *BulkSummary) writeText(p func(string, ...any), after ProcStats) {
	p("")
	p("bulk:     %d services (%d Services + EndpointSlices) created by %d writers while every stream watched; load average %s → %s",
		b.Services, b.Objects, b.Writers, b.LoadBefore, b.LoadAfter)
	p("  API write time            %8.2f s    (first create issued → last create returned)", b.APIWriteSeconds)
	p("  time to converge          %8.2f s    (first create → every stream holds every new cluster in CDS and its full assignment in EDS; per stream p50 %.0f ms, p99 %.0f ms)",
		b.ConvergeSeconds, b.StreamConverge.P50Ms, b.StreamConverge.P99Ms)
	quiet := "never quiet within " + bulkQuietMax.String() + " of converging"
	if b.QuietSeconds > 0 {
		quiet = fmt.Sprintf("quiet (no response for %s) after %.2f s", bulkQuiet, b.QuietSeconds)
	}
	p("  hub CPU during the burst  %8.2f s    (first create → converged; %.2f s until %s)", b.HubCPUSeconds, b.HubCPUSecondsToQuiet, quiet)
	for _, t := range []string{"CDS", "EDS"} {
		r, q := b.Responses[t], b.ResponsesToQuiet[t]
		p("  %s responses per stream   mean %6.1f, max %4d   (first create → converged; until quiet: mean %.1f, max %d)", t, r.Mean, r.Max, q.Mean, q.Max)
	}
	p("  hub responses             %8.0f      (hub_xds_responses_total, first create → quiet); hub RSS after %.0f MiB, peak %.0f MiB",
		b.HubResponses, after.RSSMiB, after.PeakRSSMiB)
	p("  timeline (s: created, CDS and EDS responses over all streams, hub CPU s, hubbench CPU s, hub pushes leading/quiet/max):")
	var line strings.Builder
	for i, s := range b.Timeline {
		fmt.Fprintf(&line, " %.0f:%d/%d/%d/%.1f/%.1f/%.0f-%.0f-%.0f", s.Seconds, s.Created, s.CDS, s.EDS, s.HubCPU, s.BenchCPU,
			s.Pushes["leading_edge"], s.Pushes["quiet"], s.Pushes["max_wait"])
		if i%6 == 5 || i == len(b.Timeline)-1 {
			p("   %s", line.String())
			line.Reset()
		}
	}
}
