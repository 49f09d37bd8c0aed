package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Summary is everything one run measured.
type Summary struct {
	Config   Config        `json:"config"`
	Protocol string        `json:"protocol"` // SotW or Delta
	Shape    string        `json:"shape"`    // named, envoy, grpc or istiod
	Targets  Targets       `json:"targets"`
	Machine  Machine       `json:"machine"`
	Layout   LayoutSummary `json:"layout"`

	ClustersStartSeconds float64 `json:"clustersStartSeconds"`
	CreateSeconds        float64 `json:"createSeconds"`
	// MemberSyncSeconds: hub start → every member Ready and every service
	// listed with all its endpoints.
	MemberSyncSeconds float64 `json:"memberSyncSeconds"`
	// ColdConnectSeconds: first dial → every stream holds EDS for all its
	// services.
	ColdConnectSeconds float64 `json:"coldConnectSeconds"`
	// ConnectRefused counts new streams the server refused (its rate
	// limit) and hubbench dialled again.
	ConnectRefused int64 `json:"connectRefused"`
	// StreamConnect: per stream, its dial → it holds EDS for all its services.
	StreamConnect    Percentiles `json:"streamConnect"`
	ConnectResponses int64       `json:"connectResponses"`
	// ConnectResponsesByType splits ConnectResponses by type (LDS, RDS,
	// CDS, EDS).
	ConnectResponsesByType map[string]int64 `json:"connectResponsesByType"`

	// Convergence: write issued → a watching stream received the new
	// endpoint, over every (write, watching stream) pair.
	Convergence Percentiles   `json:"convergence"`
	Writes      []WriteResult `json:"writes"`
	// ResponseBytes (istiod shape): over every (write, stream) pair, the
	// size of the ServiceEntry response that brought the write to the
	// stream (the full set of ServiceEntries: SotW is full state).
	ResponseBytes *MinMax `json:"responseBytes,omitempty"`

	// Resends: a SotW version (Delta: a resource version) received again on
	// the same stream, although we never NACK. Must be 0.
	Resends int64 `json:"resends"`

	WritePhaseSeconds float64 `json:"writePhaseSeconds"`
	// WriteResponses: responses all streams received during the writes;
	// PushesPerSecond = WriteResponses / WritePhaseSeconds (gaps included).
	WriteResponses  int64   `json:"writeResponses"`
	PushesPerSecond float64 `json:"pushesPerSecond"`
	// HubWriteResponses and HubPushesPerSecond: the same from the hub's
	// hub_xds_responses_total.
	HubWriteResponses  float64 `json:"hubWriteResponses"`
	HubPushesPerSecond float64 `json:"hubPushesPerSecond"`
	// HubWriteCPUSeconds is the hub process's CPU (procStats: its CPU
	// clock) from just before the first write to just after the
	// last one reached every watcher, gaps included; HubCPUPerWriteMs is
	// that ÷ writes.
	HubWriteCPUSeconds float64 `json:"hubWriteCpuSeconds"`
	HubCPUPerWriteMs   float64 `json:"hubCpuPerWriteMs"`
	// HubMetrics is /metrics after the writes, HubMetricsAfterConnect
	// after cold connect.
	HubMetrics             hubMetrics `json:"hubMetrics"`
	HubMetricsAfterConnect hubMetrics `json:"hubMetricsAfterConnect"`

	// Heap is the hub's heap before and after cold connect, per stream.
	Heap HeapSummary `json:"heap"`
	// Bulk is the bulk phase (--bulk), if any.
	Bulk *BulkSummary `json:"bulk,omitempty"`
	// RealEnvoys is the real-Envoy mode's figures (--real-envoys), if any.
	RealEnvoys *RealEnvoySummary `json:"realEnvoys,omitempty"`
	// Scale is the scale mode's figures (--apiservers), if any.
	Scale *ScaleSummary `json:"scale,omitempty"`

	Hub struct {
		AfterSync    ProcStats `json:"afterSync"`
		AfterConnect ProcStats `json:"afterConnect"`
		AfterWrites  ProcStats `json:"afterWrites"`
		AfterBulk    ProcStats `json:"afterBulk"`
	} `json:"hub"`
	HubPID   int    `json:"hubPid"`
	HubBuild string `json:"hubBuild"`
	HubLog   string `json:"hubLog,omitempty"`
	// LoadBefore/After: /proc/loadavg around the write phase (the machine
	// may be shared).
	LoadBefore string `json:"loadBefore"`
	LoadAfter  string `json:"loadAfter"`
}

// Machine is where the run happened.
type Machine struct {
	CPUs      int     `json:"cpus"`
	CPUModel  string  `json:"cpuModel"`
	MemGiB    float64 `json:"memGiB"`
	Kernel    string  `json:"kernel"`
	GoVersion string  `json:"goVersion"`
	LoadAvg   string  `json:"loadAvg"` // at start
}

// LayoutSummary is what the run created.
type LayoutSummary struct {
	Clusters []string `json:"clusters"`
	// APIServers are the scale mode's member API servers (the members
	// share them).
	APIServers          []string `json:"apiServers,omitempty"`
	ServicesPerMember   int      `json:"servicesPerMember"` // max over members
	EndpointsPerService int      `json:"endpointsPerService"`
	SlicesCreated       int      `json:"slicesCreated"`
	WatchersPerService  MinMax   `json:"watchersPerService"`
}

// MinMax is a range with its mean.
type MinMax struct {
	Min  int     `json:"min"`
	Mean float64 `json:"mean"`
	Max  int     `json:"max"`
}

// WriteResult is one measured write.
type WriteResult struct {
	Service  string  `json:"service"`
	Member   string  `json:"member"`
	Address  string  `json:"address"`
	APIMs    float64 `json:"apiMs"` // the Update call itself
	Watchers int     `json:"watchers"`
	Reached  int     `json:"reached"`
	P50Ms    float64 `json:"p50Ms"`
	MaxMs    float64 `json:"maxMs"`
	// ResponseBytes (istiod shape) is the mean size, over the streams, of
	// the ServiceEntry response that brought the write.
	ResponseBytes int64 `json:"responseBytes,omitempty"`
}

// minMax is the range and mean of a non-empty set.
func minMax(v []int) *MinMax {
	out := &MinMax{Min: slices.Min(v), Max: slices.Max(v)}
	total := 0
	for _, x := range v {
		total += x
	}
	out.Mean = float64(total) / float64(len(v))
	return out
}

// Percentiles of a set of durations, in milliseconds (nearest rank).
type Percentiles struct {
	N     int     `json:"n"`
	P50Ms float64 `json:"p50Ms"`
	P90Ms float64 `json:"p90Ms"`
	P99Ms float64 `json:"p99Ms"`
	MaxMs float64 `json:"maxMs"`
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e4) / 100 }

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(i, 0)]
	}
	return Percentiles{N: len(s), P50Ms: ms(rank(0.50)), P90Ms: ms(rank(0.90)), P99Ms: ms(rank(0.99)), MaxMs: ms(s[len(s)-1])}
}

func (l *layout) summary(cfg Config) LayoutSummary {
	out := LayoutSummary{Clusters: append([]string{homeID}, l.memberIDs...)}
	if l.scale {
		out.APIServers = l.servers
	}
	perMember := make([]int, cfg.Members)
	for _, s := range l.services {
		for _, m := range s.members {
			perMember[m]++
			out.SlicesCreated++
		}
		out.EndpointsPerService = max(out.EndpointsPerService, s.endpoints())
	}
	out.ServicesPerMember = slices.Max(perMember)
	out.WatchersPerService.Min = math.MaxInt
	total := 0
	for _, w := range l.watchers {
		out.WatchersPerService.Min = min(out.WatchersPerService.Min, len(w))
		out.WatchersPerService.Max = max(out.WatchersPerService.Max, len(w))
		total += len(w)
	}
	out.WatchersPerService.Mean = float64(total) / float64(len(l.watchers))
	return out
}

// Targets are the figures a run at the documented large size (10 members,
// 1,000 services, 20,000 endpoints, 2,000 streams) must meet; a zero
// field has no target. Smaller runs are judged by the same figures.
type Targets struct {
	Source        string  `json:"source"`
	P99Ms         float64 `json:"p99Ms"`
	PeakRSSMiB    float64 `json:"peakRssMiB,omitempty"`
	CPUPerWriteMs float64 `json:"cpuPerWriteMs,omitempty"`
}

// targetsFor are a shape's targets: issue 4's for the named shape (50
// services per stream), issue 13's for the envoy and grpc shapes, issue
// 14's for the istiod shape (10 streams).
func targetsFor(shape string, delta bool) Targets {
	switch shape {
	case shapeIstiod:
		return Targets{Source: "issue 14, istiod shape", P99Ms: 20}
	case shapeEnvoy:
		t := Targets{Source: "issue 13, envoy shape", P99Ms: 150, PeakRSSMiB: 600, CPUPerWriteMs: 15}
		if delta {
			t.PeakRSSMiB = 400
		}
		return t
	case shapeGRPC:
		return Targets{Source: "issue 13, grpc shape", P99Ms: 50}
	}
	return Targets{Source: "issue 4, named shape", P99Ms: 250, PeakRSSMiB: 400}
}

// check lists every target with its verdict; missed counts the misses.
func (s *Summary) check() (verdicts []string, missed []string) {
	t := s.Targets
	add := func(ok bool, what string) {
		if ok {
			verdicts = append(verdicts, what+" met")
		} else {
			verdicts = append(verdicts, what+" MISSED")
			missed = append(missed, "target missed: "+what)
		}
	}
	add(s.Convergence.P99Ms <= t.P99Ms, fmt.Sprintf("p99 convergence %.0f ms ≤ %.0f ms:", s.Convergence.P99Ms, t.P99Ms))
	if t.PeakRSSMiB > 0 {
		add(s.Hub.AfterWrites.PeakRSSMiB <= t.PeakRSSMiB, fmt.Sprintf("hub peak RSS %.0f MiB ≤ %.0f MiB:", s.Hub.AfterWrites.PeakRSSMiB, t.PeakRSSMiB))
	}
	if t.CPUPerWriteMs > 0 {
		add(s.HubCPUPerWriteMs <= t.CPUPerWriteMs, fmt.Sprintf("hub CPU per write %.1f ms ≤ %.0f ms:", s.HubCPUPerWriteMs, t.CPUPerWriteMs))
	}
	add(s.Resends == 0, "zero resends:")
	return verdicts, missed
}

// Problems are correctness failures that make the run fail.
func (s *Summary) Problems() []string {
	var out []string
	if s.Resends != 0 {
		out = append(out, fmt.Sprintf("%d responses were resent (same version and type twice on one stream) although no stream ever NACKed", s.Resends))
	}
	if s.RealEnvoys != nil {
		out = append(out, s.RealEnvoys.problems(s.Config.Peer)...)
	} else if s.HubMetrics.Nacks != 0 {
		out = append(out, fmt.Sprintf("the hub counted %v NACKs although no stream ever NACKed", s.HubMetrics.Nacks))
	}
	for i, w := range s.Writes {
		if w.Reached != w.Watchers {
			out = append(out, fmt.Sprintf("write %d reached %d of %d watching streams", i+1, w.Reached, w.Watchers))
		}
	}
	if s.Scale != nil {
		out = append(out, s.Scale.problems()...)
	}
	return out
}

// Missed lists the targets the run missed.
func (s *Summary) Missed() []string {
	_, missed := s.check()
	return missed
}

// WriteText prints the human summary.
func (s *Summary) WriteText(w io.Writer) {
	c := s.Config
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	s.writeSetup(p)
	p("")
	p("  member sync time          %8.2f s    (hub start → %d clusters Ready and %d services listed with all endpoints)", s.MemberSyncSeconds, c.Members+1, c.Services)
	byType := s.ConnectResponsesByType
	if s.RealEnvoys != nil {
		s.RealEnvoys.writeText(p, s)
	} else if s.Shape == shapeIstiod {
		p("  cold connect              %8.2f s    (first dial → all %d streams got a response for each of the %d config types; %d responses, %d of them ServiceEntry)",
			s.ColdConnectSeconds, c.Streams, len(istiodConfigTypes), s.ConnectResponses, byType[istiodKind(serviceEntryType)])
		p("    per stream              p50 %.0f ms, p99 %.0f ms, max %.0f ms (dial → every type answered, %d connecting at once)", s.StreamConnect.P50Ms, s.StreamConnect.P99Ms, s.StreamConnect.MaxMs, c.ConnectConcurrency)
	} else {
		p("  cold connect              %8.2f s    (first dial → all %d streams hold EDS for their services; %d responses: %d LDS, %d RDS, %d CDS, %d EDS)",
			s.ColdConnectSeconds, c.Streams, s.ConnectResponses, byType["LDS"], byType["RDS"], byType["CDS"], byType["EDS"])
		p("    per stream              p50 %.0f ms, p99 %.0f ms, max %.0f ms (dial → full EDS, %d connecting at once)", s.StreamConnect.P50Ms, s.StreamConnect.P99Ms, s.StreamConnect.MaxMs, c.ConnectConcurrency)
	}
	if s.ConnectRefused > 0 {
		p("    refused and redialled   %d times (the server's new-stream rate limit; jittered backoff from 250 ms, as Envoy retries)", s.ConnectRefused)
	}
	p("  convergence p50           %8.1f ms", s.Convergence.P50Ms)
	p("  convergence p90           %8.1f ms", s.Convergence.P90Ms)
	p("  convergence p99           %8.1f ms", s.Convergence.P99Ms)
	p("  convergence max           %8.1f ms   (%d (write, watching stream) pairs, all reached)", s.Convergence.MaxMs, s.Convergence.N)
	if r := s.ResponseBytes; r != nil {
		p("  bytes per push per stream %8.0f KiB  (ServiceEntry response that brought a write: min %d, mean %.0f, max %d bytes)", r.Mean/1024, r.Min, r.Mean, r.Max)
	}
	if s.RealEnvoys == nil {
		p("  pushes/s (client)         %8.1f      (%d responses in %.1fs of writes, gaps of %s included)", s.PushesPerSecond, s.WriteResponses, s.WritePhaseSeconds, c.WriteGap)
	}
	p("  pushes/s (hub /metrics)   %8.1f      (hub_xds_responses_total +%.0f)", s.HubPushesPerSecond, s.HubWriteResponses)
	if s.RealEnvoys != nil {
		p("  server-counted NACKs      %8.0f      (the server's own NACK counter over the run)", s.HubMetrics.Nacks)
	} else {
		p("  resends                   %8d      (never NACKed; hub counted %.0f NACKs)", s.Resends, s.HubMetrics.Nacks)
	}
	p("  hub RSS now / peak        %8.0f / %.0f MiB after the writes (after sync %.0f / %.0f, after connect %.0f / %.0f)",
		s.Hub.AfterWrites.RSSMiB, s.Hub.AfterWrites.PeakRSSMiB,
		s.Hub.AfterSync.RSSMiB, s.Hub.AfterSync.PeakRSSMiB, s.Hub.AfterConnect.RSSMiB, s.Hub.AfterConnect.PeakRSSMiB)
	for _, m := range []struct {
		when string
		m    hubMetrics
	}{{"after connect", s.HubMetricsAfterConnect}, {"after writes ", s.HubMetrics}} {
		p("  hub Go runtime %s heap in use %.0f MiB (GC goal %.0f), stacks %.0f MiB, runtime total %.0f MiB, %.0f goroutines, %.0f GCs",
			m.when, m.m.HeapInuseMiB, m.m.NextGCMiB, m.m.StackInuseMiB, m.m.GoSysMiB, m.m.Goroutines, m.m.GCs)
	}
	p("  hub live heap per stream  %8.1f KiB  (live heap at a GC %d → %d MiB, before → after cold connect; heap in use %.0f → %.0f MiB, %.1f KiB per stream)",
		s.Heap.LivePerStreamKiB, s.Heap.LiveBeforeMiB, s.Heap.LiveAfterMiB, s.Heap.InuseBeforeMiB, s.Heap.InuseAfterMiB, s.Heap.InusePerStreamKiB)
	p("  hub CPU                   %8.1f s    (after sync %.1f s, after connect %.1f s; %d threads)",
		s.Hub.AfterWrites.CPUSeconds, s.Hub.AfterSync.CPUSeconds, s.Hub.AfterConnect.CPUSeconds, s.Hub.AfterWrites.Threads)
	if l := s.HubMetrics.EDSPushLatency.since(s.HubMetricsAfterConnect.EDSPushLatency); l.Count > 0 {
		p("  hub index → stream (EDS)  %8.1f ms   mean over %.0f pushed responses in the writes; p50 ≤ %.1f ms, p99 ≤ %.1f ms (hub_xds_push_latency_seconds buckets)",
			l.Sum/l.Count*1000, l.Count, l.quantile(0.5), l.quantile(0.99))
	}
	p("  hub CPU per write         %8.1f ms   (%.2f s over the %d writes, gaps included; the process CPU clock)", s.HubCPUPerWriteMs, s.HubWriteCPUSeconds, c.Writes)
	p("")
	s.writeWrites(p)
	if b := s.Bulk; b != nil {
		b.writeText(p, s.Hub.AfterBulk)
	}
	if sc := s.Scale; sc != nil {
		sc.writeText(p, s)
	}
	p("")
	verdicts, _ := s.check()
	p("targets:  %s (%s, for the large size)", strings.Join(verdicts, "; "), s.Targets.Source)
	if s.HubLog != "" {
		p("hub log:  %s", s.HubLog)
	}
}

// writeSetup prints the summary's head: what ran, on what machine, the
// layout, the server and how long the setup took.
func (s *Summary) writeSetup(p func(string, ...any)) {
	c := s.Config
	cds := "CDS " + c.CDS
	if s.Shape == shapeIstiod {
		cds = "MCP config, no CDS"
	}
	p("hubbench: %s ADS, %d members + home, %d services (each in %d members), %d endpoints, %d streams × %d services (%s shape, %s), %d writes",
		s.Protocol, c.Members, c.Services, c.serviceMembers(), c.Endpoints, c.Streams, c.servicesPerStream(), s.Shape, cds, c.Writes)
	p("shape:    %s", c.shapeText())
	p("machine:  %d CPUs (%s), %.1f GiB, Linux %s, %s; load average %s at start, %s → %s around the writes",
		s.Machine.CPUs, s.Machine.CPUModel, s.Machine.MemGiB, s.Machine.Kernel, s.Machine.GoVersion, s.Machine.LoadAvg, s.LoadBefore, s.LoadAfter)
	p("layout:   ≤%d services per member, ≤%d endpoints per service, %d EndpointSlices, %d–%d watchers per service (mean %.1f)",
		s.Layout.ServicesPerMember, s.Layout.EndpointsPerService, s.Layout.SlicesCreated,
		s.Layout.WatchersPerService.Min, s.Layout.WatchersPerService.Max, s.Layout.WatchersPerService.Mean)
	if c.Peer != "" {
		p("SERVER:   %s, not the hub: every \"hub\" figure below is istiod's (%s)", c.Peer, s.HubBuild)
	} else {
		p("hub:      %s", s.HubBuild)
	}
	p("setup:    API servers started in %.1fs, objects created in %.1fs", s.ClustersStartSeconds, s.CreateSeconds)
}

// writeWrites prints the table of the measured writes, with the bytes per
// stream in the istiod shape.
func (s *Summary) writeWrites(p func(string, ...any)) {
	if s.Shape == shapeIstiod {
		p("  write  service     member  watchers  reached   p50 ms   max ms   API ms   bytes/stream")
		for i, wr := range s.Writes {
			p("  %5d  %-10s  %-6s  %8d  %7d  %7.1f  %7.1f  %7.1f   %12d", i+1, wr.Service, wr.Member, wr.Watchers, wr.Reached, wr.P50Ms, wr.MaxMs, wr.APIMs, wr.ResponseBytes)
		}
	} else {
		p("  write  service     member  watchers  reached   p50 ms   max ms   API ms")
		for i, wr := range s.Writes {
			p("  %5d  %-10s  %-6s  %8d  %7d  %7.1f  %7.1f  %7.1f", i+1, wr.Service, wr.Member, wr.Watchers, wr.Reached, wr.P50Ms, wr.MaxMs, wr.APIMs)
		}
	}
}

// setWriteCPU records the hub's CPU over the measured writes, per write,
// and the load average after them.
func (sum *Summary) setWriteCPU(cpuSeconds float64, writes int) {
	sum.HubWriteCPUSeconds = cpuSeconds
	if writes > 0 {
		sum.HubCPUPerWriteMs = math.Round(cpuSeconds/float64(writes)*1e4) / 10
	}
	sum.LoadAfter = loadAvg()
}
