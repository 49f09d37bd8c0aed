package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/hubmesh/hub/internal/envoy"
)

// The real-Envoy mode (--real-envoys N, envoy shape only): instead of
// simulated streams, N real Envoy processes (internal/envoy: the upstream
// build internal/tools/envoy/install.sh fetches) form the fleet, each with
// --concurrency 1 and its own directory, the node of an Istio sidecar in
// member i mod members (envoynode.go: CLUSTER_ID, the sidecar~ node ID and
// Istio's metadata, as the simulated envoy shape sends to the hub and to
// istiod alike), ADS over SotW or Delta (--delta) with
// set_node_on_first_message_only, CDS only (no LDS: the hub serves no
// listeners) and EDS as the clusters ask. Every figure comes from Envoy's
// own admin API: a write has reached an Envoy when the written cluster's
// membership_total gauge grew, polled every realEnvoyPoll.

// maxRealEnvoys bounds --real-envoys.
const maxRealEnvoys = 500

// realEnvoyPoll is how often an Envoy's admin API is polled while a write
// is awaited: the latencies' resolution.
const realEnvoyPoll = 20 * time.Millisecond

// realEnvoyStartConcurrency bounds the Envoys being started and getting
// their first configuration at once (also by --connect-concurrency).
const realEnvoyStartConcurrency = 10

// validateRealEnvoys checks --real-envoys and makes the fleet's size the
// stream count (the layout gives every stream every service).
func (c *Config) validateRealEnvoys() []error {
	switch {
	case c.RealEnvoys < 0 || c.RealEnvoys > maxRealEnvoys:
		return []error{fmt.Errorf("--real-envoys must be between 0 and %d, not %d", maxRealEnvoys, c.RealEnvoys)}
	case c.RealEnvoys == 0:
		return nil
	}
	var errs []error
	if c.Shape != shapeEnvoy {
		errs = append(errs, fmt.Errorf("--real-envoys needs --shape envoy (an Envoy subscribes to every cluster), not --shape %s", c.Shape))
	}
	if c.Streams != 0 && c.Streams != c.RealEnvoys {
		errs = append(errs, fmt.Errorf("--streams does not apply with --real-envoys: the Envoys are the fleet"))
	}
	c.Streams = c.RealEnvoys
	if c.scale() {
		errs = append(errs, errors.New("--real-envoys does not apply in scale mode (--apiservers)"))
	}
	if c.Networks > 1 || c.LocalityFailover {
		errs = append(errs, errors.New("--real-envoys does not apply with --networks or --locality-failover"))
	}
	return errs
}

// RealEnvoySummary is what the real-Envoy mode measured beyond the
// figures every run has (cold connect, convergence and the server's CPU
// and memory, in Summary).
type RealEnvoySummary struct {
	Envoys  int    `json:"envoys"`
	Bin     string `json:"bin"`
	Version string `json:"version"` // from /server_info
	// ExpectedClusters is how many of the layout's clusters every Envoy
	// must hold (the server may send more, e.g. istiod's
	// PassthroughCluster).
	ExpectedClusters int `json:"expectedClusters"`
	// ActiveClusters is cluster_manager.active_clusters after cold
	// connect, over the Envoys (the static xds-grpc cluster included).
	ActiveClusters MinMax  `json:"activeClusters"`
	PollMs         float64 `json:"pollMs"`
	// SDS (istiod's Envoys) is the SDS server standing in for istio-agent
	// (realenvoy_sds.go).
	SDS string `json:"sds,omitempty"`
	// Nacks is the sum over the Envoys of every *.update_rejected stat
	// (CDS and every cluster's EDS), after cold connect and after the
	// writes; NacksBy splits the latter by stat ("cluster_manager.cds",
	// "cluster.<name>" summed as "cluster.*" (EDS)).
	NacksAfterConnect uint64            `json:"nacksAfterConnect"`
	NacksAfterWrites  uint64            `json:"nacksAfterWrites"`
	NacksBy           map[string]uint64 `json:"nacksBy,omitempty"`
	// Rejected is a sample of what an Envoy logged for a rejected update.
	Rejected string `json:"rejected,omitempty"`
	// Warming is the sum of cluster_manager.warming_clusters after cold
	// connect and after the writes. Must be 0.
	WarmingAfterConnect uint64 `json:"warmingAfterConnect"`
	WarmingAfterWrites  uint64 `json:"warmingAfterWrites"`
	// RSS is VmRSS per Envoy after the writes, RSSSumMiB their sum;
	// PssSumMiB sums /proc/<pid>/smaps_rollup's Pss (shared text counted
	// once).
	RSS       FloatRange `json:"rssMiB"`
	RSSSumMiB float64    `json:"rssSumMiB"`
	PssSumMiB float64    `json:"pssSumMiB"`
	// EnvoyWriteCPUSeconds is the CPU all Envoys used over the write phase
	// (procStats, the admin polling included), BenchWriteCPUSeconds
	// hubbench's own (the polling's client side): on a small machine
	// they compete with the server.
	EnvoyWriteCPUSeconds float64 `json:"envoyWriteCpuSeconds"`
	BenchWriteCPUSeconds float64 `json:"benchWriteCpuSeconds"`
	// Bulk is the bulk phase (--bulk), after the writes.
	Bulk *RealEnvoyBulk `json:"bulk,omitempty"`
}

// fleetCPU is the CPU seconds the Envoys and this process have used.
func fleetCPU(envoys []*realEnvoy) (envoysCPU, self float64, err error) {
	for _, e := range envoys {
		st, err := procStats(e.p.PID())
		if err != nil {
			return 0, 0, fmt.Errorf("envoy %d: %w", e.idx, err)
		}
		envoysCPU += st.CPUSeconds
	}
	st, err := procStats(os.Getpid())
	return envoysCPU, st.CPUSeconds, err
}

// FloatRange is a range with its mean.
type FloatRange struct {
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
	Max  float64 `json:"max"`
}

func floatRange(v []float64) FloatRange {
	if len(v) == 0 {
		return FloatRange{}
	}
	total := 0.0
	for _, x := range v {
		total += x
	}
	r := func(x float64) float64 { return math.Round(x*10) / 10 }
	return FloatRange{Min: r(slices.Min(v)), Mean: r(total / float64(len(v))), Max: r(slices.Max(v))}
}

// realEnvoy is one Envoy of the fleet.
type realEnvoy struct {
	idx       int
	clusterID string
	p         *envoy.Process
}

// realEnvoyBootstrap is Envoy idx's bootstrap: an Istio sidecar's node in
// member clusterID (envoyNode), ADS to xdsAddr, CDS only, and stats
// limited to what the run reads (Istio's bootstrap limits them too). With
// sdsAddr (istiod's Envoys), a static sds-grpc cluster reaches the SDS
// server there, as a sidecar's reaches istio-agent. Of the clusters' own
// stats only update_rejected (NACKs) and the membership_total of the
// clusters the run writes to (measured) are kept: every poll of a write
// filters the stats, and fewer stats make it cheaper.
func realEnvoyBootstrap(idx int, clusterID, xdsAddr, sdsAddr string, delta bool, written []string) ([]byte, error) {
	node := envoyNode(idx, clusterID, "")
	b, err := envoy.ADS{
		NodeID: node.GetId(), NodeCluster: node.GetCluster(), XDSAddr: xdsAddr,
		Delta: delta, SetNodeOnFirstMessageOnly: true,
		InitialFetchTimeout: ptr.To(time.Duration(0)), // wait for the whole config, however long it takes
	}.Bootstrap()
	if err != nil {
		return nil, err
	}
	b.Node.Metadata, b.Node.Locality = node.GetMetadata(), node.GetLocality()
	b.Admin = envoy.LoopbackAdmin()
	if sdsAddr != "" {
		host, port, err := net.SplitHostPort(sdsAddr)
		if err != nil {
			return nil, err
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, err
		}
		sds := envoy.StaticCluster(sdsCluster, host, uint32(p))
		sds.TypedExtensionProtocolOptions = b.StaticResources.Clusters[0].TypedExtensionProtocolOptions // HTTP/2, as xds-grpc's
		b.StaticResources.Clusters = append(b.StaticResources.Clusters, sds)
	}
	var patterns []*matcherv3.StringMatcher
	for _, p := range []string{"cluster_manager.", "control_plane.", "server.", "cluster." + envoy.XDSCluster + "."} {
		patterns = append(patterns, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: p}})
	}
	patterns = append(patterns, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: ".update_rejected"}})
	for _, c := range written {
		for _, name := range []string{"cluster." + c + ".membership_total", "cluster." + c + ";.membership_total"} {
			patterns = append(patterns, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: name}})
		}
	}
	b.StatsConfig = &metricsv3.StatsConfig{StatsMatcher: &metricsv3.StatsMatcher{
		StatsMatcher: &metricsv3.StatsMatcher_InclusionList{InclusionList: &matcherv3.ListStringMatcher{Patterns: patterns}},
	}}
	return envoy.Marshal(b)
}

// realEnvoyMember is the member Envoy idx runs in: round robin.
func realEnvoyMember(idx int, memberIDs []string) string { return memberIDs[idx%len(memberIDs)] }

// nackStats sums the update_rejected stats of one Envoy, keyed by what
// was rejected: "cluster_manager.cds" (CDS) or "cluster.*" (any cluster's
// EDS) or the stat's own prefix.
func nackStats(stats map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for name, v := range stats {
		prefix, ok := strings.CutSuffix(name, ".update_rejected")
		if !ok || v == 0 {
			continue
		}
		if strings.HasPrefix(prefix, "cluster.") && prefix != "cluster."+envoy.XDSCluster {
			prefix = "cluster.*"
		}
		out[prefix] += v
	}
	return out
}

// procMemMiB reads a VmRSS-style "Key: N kB" line from a /proc file.
func procMemMiB(text, key string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != key {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			return 0, false
		}
		n, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, false
		}
		return n / 1024, true
	}
	return 0, false
}

// rejectedLine is the first line of an Envoy log saying an update was
// rejected.
var rejectedLine = regexp.MustCompile(`(?m)^.*(rejected|gRPC config for .* rejected).*$`)

// runRealEnvoys is the real-Envoy mode's fleet and write phase, once the
// server under test (h) is synced: cold connect of the Envoys, the writes
// measured at every Envoy's admin API, and their NACKs, warming clusters
// and memory.
func runRealEnvoys(ctx context.Context, cfg Config, l *layout, clients []kubernetes.Interface, h *hubProcess, work string, heapBefore heapPoint, sum *Summary) (err error) {
	bin, err := envoy.Binary()
	if err != nil {
		return err
	}
	rs := &RealEnvoySummary{Envoys: cfg.RealEnvoys, Bin: bin, ExpectedClusters: len(l.services), PollMs: ms(realEnvoyPoll)}
	sum.RealEnvoys = rs
	want := map[string]bool{}
	for _, s := range l.services {
		want[s.cluster] = true
	}

	// Cold connect: start every Envoy (bounded), then wait until each holds
	// every cluster of the layout and warms none.
	envoys := make([]*realEnvoy, cfg.RealEnvoys)
	defer stopEnvoys(envoys)
	var sds *sdsServer
	if cfg.Peer != "" {
		if sds, err = startSDS(ctx); err != nil {
			return err
		}
		defer sds.stop() // runs before the Envoys stop: they only lose their SDS stream
		rs.SDS = sds.addr
	}
	written, err := writtenServices(cfg, l)
	if err != nil {
		return err
	}
	fl := &realEnvoyFleet{envoys: envoys, bin: bin, work: work, want: want, written: written, writtenClusters: serviceClusters(l, written)}
	if sds != nil {
		fl.sdsAddr = sds.addr
	}
	conc := min(cfg.ConnectConcurrency, realEnvoyStartConcurrency)
	cfg.progress("starting %d real Envoys (%s, %s ADS, CDS wildcard + EDS, no LDS; %d at once) against %s", cfg.RealEnvoys, bin, sum.Protocol, conc, h.xdsAddr)
	connectCtx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	if err := connectEnvoys(connectCtx, cfg, l, h, fl, sum); err != nil {
		return err
	}
	if info, err := envoys[0].p.ServerInfo(ctx); err == nil {
		rs.Version = info.GetVersion()
	}
	cfg.progress("cold connect: all %d Envoys hold all %d clusters after %.2fs", cfg.RealEnvoys, len(want), sum.ColdConnectSeconds)
	if rs.NacksAfterConnect, rs.WarmingAfterConnect, _, err = fleetNacks(ctx, envoys); err != nil {
		return err
	}
	heapAfter, err := h.heapNow(ctx)
	if err != nil {
		return err
	}
	sum.Heap = heapPerStream(heapBefore, heapAfter, cfg.RealEnvoys)
	if sum.Hub.AfterConnect, err = procStats(h.pid()); err != nil {
		return fmt.Errorf("reading the server's /proc: %w", err)
	}

	// Writes, one at a time, each timed at every Envoy.
	if err := realEnvoyWritePhase(ctx, cfg, l, clients, h, fl, sum); err != nil {
		return err
	}
	if cfg.Bulk > 0 {
		if rs.Bulk, err = realEnvoyBulk(ctx, cfg, l, clients, envoys, h); err != nil {
			return err
		}
	}
	if rs.NacksAfterWrites, rs.WarmingAfterWrites, rs.NacksBy, err = fleetNacks(ctx, envoys); err != nil {
		return err
	}
	if rs.NacksAfterWrites > 0 {
		rs.Rejected = rejectedSample(envoys)
	}
	return envoyMemory(envoys, rs)
}

// realEnvoyFleet is the real-Envoy mode's fleet: the Envoys, what they are
// started with, and the services the writes go to.
type realEnvoyFleet struct {
	envoys          []*realEnvoy    // Envoy i once started: the caller of connectEnvoys stops them
	bin             string          // the Envoy binary
	work            string          // Envoy i runs in work/envoys/envoy-<i>
	sdsAddr         string          // the SDS server's address (istiod's Envoys), or ""
	want            map[string]bool // the layout's clusters: every Envoy must hold them
	written         []int           // the services the writes go to, in order
	writtenClusters []string        // their clusters, once each
}

// stopEnvoys stops the Envoys that started, all at once.
func stopEnvoys(envoys []*realEnvoy) {
	var wg sync.WaitGroup
	for _, e := range envoys {
		if e != nil && e.p != nil {
			wg.Add(1)
			go func() { defer wg.Done(); _ = e.p.Stop() }()
		}
	}
	wg.Wait()
}

// serviceClusters are the clusters of the services, once each, in the
// services' order.
func serviceClusters(l *layout, services []int) []string {
	var clusters []string
	for _, si := range services {
		if c := l.services[si].cluster; !slices.Contains(clusters, c) {
			clusters = append(clusters, c)
		}
	}
	return clusters
}

// connectEnvoys starts the fleet's Envoys (at most
// realEnvoyStartConcurrency at once) and waits until each holds every
// cluster of fl.want and warms none, all within connectCtx, then records
// the cold connect figures. It fills fl.envoys in as the Envoys start,
// also when it fails.
func connectEnvoys(connectCtx context.Context, cfg Config, l *layout, h *hubProcess, fl *realEnvoyFleet, sum *Summary) error {
	perEnvoy := make([]time.Duration, cfg.RealEnvoys)
	active := make([]int, cfg.RealEnvoys)
	sem := make(chan struct{}, min(cfg.ConnectConcurrency, realEnvoyStartConcurrency))
	errc := make(chan error, cfg.RealEnvoys)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range fl.envoys {
		sem <- struct{}{}
		if connectCtx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			e := &realEnvoy{idx: i, clusterID: realEnvoyMember(i, l.memberIDs)}
			t0 := time.Now()
			boot, err := realEnvoyBootstrap(i, e.clusterID, h.xdsAddr, fl.sdsAddr, cfg.Delta, fl.writtenClusters)
			if err != nil {
				errc <- err
				return
			}
			e.p, err = envoy.Start(connectCtx, envoy.Options{Bin: fl.bin, Bootstrap: boot, Dir: filepath.Join(fl.work, "envoys", fmt.Sprintf("envoy-%03d", i))})
			fl.envoys[i] = e
			if err != nil {
				errc <- fmt.Errorf("envoy %d: %w", i, err)
				return
			}
			n, err := waitEnvoyHolds(connectCtx, e, fl.want)
			if err != nil {
				errc <- fmt.Errorf("envoy %d (CLUSTER_ID %s): %w", i, e.clusterID, err)
				return
			}
			perEnvoy[i], active[i] = time.Since(t0), n
		}()
	}
	wg.Wait()
	close(errc)
	if err := fleetError(errc, h); err != nil {
		return err
	}
	if err := connectCtx.Err(); err != nil {
		return fmt.Errorf("starting the Envoys: %w", err)
	}
	sum.ColdConnectSeconds = time.Since(start).Seconds()
	sum.StreamConnect = percentiles(perEnvoy)
	sum.RealEnvoys.ActiveClusters = *minMax(active)
	return nil
}

// realEnvoyWritePhase makes the measured writes (realEnvoyWrites), with
// --hub-perf under perf, and records what they cost: the server's CPU,
// responses, metrics and process figures, and the CPU of the Envoys and
// of hubbench.
func realEnvoyWritePhase(ctx context.Context, cfg Config, l *layout, clients []kubernetes.Interface, h *hubProcess, fl *realEnvoyFleet, sum *Summary) error {
	rs := sum.RealEnvoys
	before, err := h.metrics(ctx)
	if err != nil {
		return err
	}
	sum.LoadBefore = loadAvg()
	cpuBefore, err := procStats(h.pid())
	if err != nil {
		return err
	}
	var perf *perfRecorder
	if cfg.HubPerf != "" {
		if perf, err = startPerf(h.pid(), cfg.HubPerf); err != nil {
			return err
		}
	}
	envoyCPUBefore, selfCPUBefore, err := fleetCPU(fl.envoys)
	if err != nil {
		return err
	}
	writeStart := time.Now()
	err = realEnvoyWrites(ctx, cfg, l, fl.written, clients, fl.envoys, h, sum)
	sum.WritePhaseSeconds = time.Since(writeStart).Seconds()
	if perr := perf.stop(); err == nil && perr != nil {
		err = perr
	}
	if err != nil {
		return err
	}
	cpuAfter, err := procStats(h.pid())
	if err != nil {
		return err
	}
	envoyCPUAfter, selfCPUAfter, err := fleetCPU(fl.envoys)
	if err != nil {
		return err
	}
	rs.EnvoyWriteCPUSeconds = math.Round((envoyCPUAfter-envoyCPUBefore)*100) / 100
	rs.BenchWriteCPUSeconds = math.Round((selfCPUAfter-selfCPUBefore)*100) / 100
	sum.setWriteCPU(cpuAfter.CPUSeconds-cpuBefore.CPUSeconds, cfg.Writes)
	after, err := h.metrics(ctx)
	if err != nil {
		return err
	}
	sum.HubWriteResponses = after.total() - before.total()
	if sum.WritePhaseSeconds > 0 {
		sum.HubPushesPerSecond = sum.HubWriteResponses / sum.WritePhaseSeconds
	}
	sum.HubMetrics, sum.HubMetricsAfterConnect = after, before
	if sum.Hub.AfterWrites, err = procStats(h.pid()); err != nil {
		return err
	}
	return nil
}

// rejectedSample is the first line saying an update was rejected from the
// first Envoy log that has one, with its Envoy; "" when none has.
func rejectedSample(envoys []*realEnvoy) string {
	for _, e := range envoys {
		if log, err := e.p.Log(); err == nil {
			if m := rejectedLine.FindString(log); m != "" {
				return fmt.Sprintf("envoy %d: %s", e.idx, truncateText(strings.TrimSpace(m), 600))
			}
		}
	}
	return ""
}

// envoyMemory records the Envoys' memory: VmRSS per Envoy and summed, and
// their Pss summed.
func envoyMemory(envoys []*realEnvoy, rs *RealEnvoySummary) error {
	var rss []float64
	for _, e := range envoys {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.p.PID()))
		if err != nil {
			return fmt.Errorf("envoy %d: %w", e.idx, err)
		}
		r, _ := procMemMiB(string(status), "VmRSS")
		rss = append(rss, r)
		rs.RSSSumMiB += r
		if rollup, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", e.p.PID())); err == nil {
			p, _ := procMemMiB(string(rollup), "Pss")
			rs.PssSumMiB += p
		}
	}
	rs.RSS = floatRange(rss)
	rs.RSSSumMiB = math.Round(rs.RSSSumMiB*10) / 10
	rs.PssSumMiB = math.Round(rs.PssSumMiB*10) / 10
	return nil
}

func truncateText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// waitEnvoyHolds polls an Envoy until it holds every cluster of want (by
// /clusters) and warms none, returning cluster_manager.active_clusters.
func waitEnvoyHolds(ctx context.Context, e *realEnvoy, want map[string]bool) (int, error) {
	last := "no answer yet"
	for {
		st, err := e.p.Stats(ctx, `^cluster_manager\.(active|warming)_clusters$`)
		if err == nil {
			act, warm := st["cluster_manager.active_clusters"], st["cluster_manager.warming_clusters"]
			last = fmt.Sprintf("%d active, %d warming clusters (want %d of the layout's)", act, warm, len(want))
			if warm == 0 && act >= uint64(len(want)) {
				cs, err := e.p.Clusters(ctx)
				if err != nil {
					return 0, err
				}
				held := 0
				for _, c := range cs {
					if want[c.Name] {
						held++
					}
				}
				if held == len(want) {
					return int(act), nil
				}
				last += fmt.Sprintf(", %d of the layout's", held)
			}
		} else if ctx.Err() == nil {
			last = err.Error()
		}
		select {
		case <-e.p.Done():
			return 0, fmt.Errorf("envoy exited: %s", e.p.LogTail(20))
		case <-ctx.Done():
			return 0, fmt.Errorf("not holding every cluster before %v: %s; log tail:\n%s", context.Cause(ctx), last, e.p.LogTail(10))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// fleetError joins the Envoys' errors (the first five, and how many more),
// with the server's exit if it exited; nil when there are none.
func fleetError(errc <-chan error, h *hubProcess) error {
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil
	}
	if e := h.exited(); e != nil {
		errs = append(errs, e)
	}
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Errorf("and %d more", len(errs)-5))
	}
	return errors.Join(errs...)
}

// fleetNacks sums every Envoy's update_rejected stats and warming
// clusters.
func fleetNacks(ctx context.Context, envoys []*realEnvoy) (nacks, warming uint64, by map[string]uint64, err error) {
	by = map[string]uint64{}
	for _, e := range envoys {
		st, err := e.p.Stats(ctx, `(update_rejected|^cluster_manager\.warming_clusters)$`)
		if err != nil {
			return 0, 0, nil, fmt.Errorf("envoy %d: %w", e.idx, err)
		}
		warming += st["cluster_manager.warming_clusters"]
		for k, v := range nackStats(st) {
			by[k] += v
			nacks += v
		}
	}
	return nacks, warming, by, nil
}

// membershipStat is the regular expression of a cluster's
// membership_total gauge. istiod names its clusters' stats
// alt_stat_name "<name>;" (the semicolon is Istio's), the hub by the
// cluster's name.
func membershipStat(cluster string) string {
	return "^cluster\\." + regexp.QuoteMeta(cluster) + ";?\\.membership_total$"
}

// membership is an Envoy's cluster's membership_total.
func (e *realEnvoy) membership(ctx context.Context, cluster string) (uint64, error) {
	body, err := e.p.Get(ctx, "/stats?format=json&type=Gauges&filter="+url.QueryEscape(membershipStat(cluster)))
	if err != nil {
		return 0, err
	}
	st, err := envoy.ParseStats(body)
	if err != nil {
		return 0, err
	}
	if len(st) != 1 {
		return 0, fmt.Errorf("%d membership_total stats for cluster %s, want 1: %v", len(st), cluster, st)
	}
	for _, v := range st {
		return v, nil
	}
	return 0, nil
}

// writtenServices are the services the writes go to, in order: those
// measureWrites picks, the same for every run with the same seed.
func writtenServices(cfg Config, l *layout) ([]int, error) {
	var watched []int
	for s, w := range l.watchers {
		if len(w) > 0 {
			watched = append(watched, s)
		}
	}
	if len(watched) == 0 && cfg.Writes > 0 {
		return nil, errors.New("no service is watched")
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7772697465))
	rng.Shuffle(len(watched), func(i, j int) { watched[i], watched[j] = watched[j], watched[i] })
	var out []int
	for w := range cfg.Writes {
		out = append(out, watched[w%len(watched)])
	}
	return out, nil
}

// realEnvoyWrites adds one endpoint at a time to the EndpointSlice of
// each written service and times, at every Envoy, the written cluster's
// membership_total growing.
func realEnvoyWrites(ctx context.Context, cfg Config, l *layout, written []int, clients []kubernetes.Interface, envoys []*realEnvoy, h *hubProcess, sum *Summary) error {
	var all []time.Duration
	for w := range cfg.Writes {
		svc := l.services[written[w]]
		base := make([]uint64, len(envoys))
		for i, e := range envoys {
			var err error
			if base[i], err = e.membership(ctx, svc.cluster); err != nil {
				return fmt.Errorf("write %d: envoy %d: %w", w+1, e.idx, err)
			}
		}
		slicesAPI, slice, addr, member, err := nextWrite(ctx, cfg, l, clients, svc, w)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, cfg.WriteTimeout)
		lat := make([]time.Duration, len(envoys))
		start := time.Now()
		if _, err := slicesAPI.Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
			cancel()
			return fmt.Errorf("write %d: updating EndpointSlice %s/%s-hub in %s: %w", w+1, svc.namespace, svc.name, member, err)
		}
		apiLatency := time.Since(start)
		var wg sync.WaitGroup
		for i, e := range envoys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(realEnvoyPoll)
				defer tick.Stop()
				for {
					if n, err := e.membership(wctx, svc.cluster); err == nil && n > base[i] {
						lat[i] = time.Since(start)
						return
					}
					select {
					case <-wctx.Done():
						return
					case <-tick.C:
					}
				}
			}()
		}
		wg.Wait()
		timedOut := wctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		var got []time.Duration
		var stragglers []string
		for i, d := range lat {
			if d == 0 {
				stragglers = append(stragglers, fmt.Sprintf("envoy %d (CLUSTER_ID %s)", envoys[i].idx, envoys[i].clusterID))
				continue
			}
			got = append(got, d)
		}
		if len(stragglers) > 0 {
			err := fmt.Errorf("write %d (endpoint %s added to %s in %s): %d of %d Envoys did not apply it within %s (timed out: %v): %s",
				w+1, addr, svc.cluster, member, len(stragglers), len(envoys), cfg.WriteTimeout, timedOut, strings.Join(stragglers[:min(len(stragglers), 10)], ", "))
			if e := h.exited(); e != nil {
				err = fmt.Errorf("%w\n%w", err, e)
			}
			return err
		}
		all = append(all, got...)
		p := percentiles(got)
		sum.Writes = append(sum.Writes, WriteResult{
			Service: svc.name, Member: member, Address: addr, APIMs: ms(apiLatency),
			Watchers: len(envoys), Reached: len(got), P50Ms: p.P50Ms, MaxMs: p.MaxMs,
		})
		cfg.progress("write %d/%d: %s in %s applied by %d/%d Envoys: p50 %.1f ms, max %.1f ms", w+1, cfg.Writes, svc.name, member, len(got), len(envoys), p.P50Ms, p.MaxMs)
		if err := writeGap(ctx, cfg); err != nil {
			return err
		}
	}
	sum.Convergence = percentiles(all)
	return nil
}

// writeText prints the real-Envoy figures.
func (rs *RealEnvoySummary) writeText(p func(string, ...any), s *Summary) {
	c := s.Config
	p("  real Envoys               %8d      (Envoy %s, --concurrency 1 each, %s ADS, CDS wildcard + EDS, no LDS; %s)", rs.Envoys, rs.Version, s.Protocol, rs.Bin)
	p("  cold connect              %8.2f s    (first Envoy started → all %d hold the layout's %d clusters, none warming; active clusters per Envoy %d–%d)",
		s.ColdConnectSeconds, rs.Envoys, rs.ExpectedClusters, rs.ActiveClusters.Min, rs.ActiveClusters.Max)
	p("    per Envoy               p50 %.0f ms, p99 %.0f ms, max %.0f ms (start → every cluster held, %d starting at once)",
		s.StreamConnect.P50Ms, s.StreamConnect.P99Ms, s.StreamConnect.MaxMs, min(c.ConnectConcurrency, realEnvoyStartConcurrency))
	if rs.SDS != "" {
		p("  SDS (istio-agent's part)  %s: serves the secrets default and ROOTCA (self-signed) that istiod's mTLS clusters ask for on the static cluster %s", rs.SDS, sdsCluster)
	}
	p("  NACKs (update_rejected)   %8d      after the writes (%d after cold connect) over all Envoys %v", rs.NacksAfterWrites, rs.NacksAfterConnect, rs.NacksBy)
	if rs.Rejected != "" {
		p("    rejected                %s", rs.Rejected)
	}
	p("  warming clusters          %8d      after the writes (%d after cold connect), all Envoys", rs.WarmingAfterWrites, rs.WarmingAfterConnect)
	p("  Envoy RSS                 %8.1f MiB  summed (Pss %.1f MiB); per Envoy min %.1f, mean %.1f, max %.1f MiB", rs.RSSSumMiB, rs.PssSumMiB, rs.RSS.Min, rs.RSS.Mean, rs.RSS.Max)
	p("  CPU over the writes       %8.2f s    all Envoys (admin polling included), %.2f s hubbench (the polling's client side), %.2f s the server, in %.1f s",
		rs.EnvoyWriteCPUSeconds, rs.BenchWriteCPUSeconds, s.HubWriteCPUSeconds, s.WritePhaseSeconds)
	p("  convergence: write issued → the written cluster's membership_total grew in an Envoy's admin /stats, polled every %.0f ms", rs.PollMs)
	if rs.Bulk != nil {
		rs.Bulk.writeText(p)
	}
}

// problems are the real-Envoy mode's correctness failures: clusters still
// warming, and NACKs of the hub's config (istiod's Envoys' NACKs are
// reported, not failed: upstream Envoy lacks Istio's own filters).
func (rs *RealEnvoySummary) problems(peer string) []string {
	var out []string
	if rs.WarmingAfterConnect+rs.WarmingAfterWrites > 0 {
		out = append(out, fmt.Sprintf("Envoys warm clusters: %d after cold connect, %d after the writes", rs.WarmingAfterConnect, rs.WarmingAfterWrites))
	}
	if peer == "" && rs.NacksAfterWrites > 0 {
		out = append(out, fmt.Sprintf("the Envoys rejected %d updates of the hub's (%v): %s", rs.NacksAfterWrites, rs.NacksBy, rs.Rejected))
	}
	return out
}

// realEnvoyIstiodEnv is what istiod's environment gets in the real-Envoy
// mode: no Istio-only filters upstream Envoy lacks (metadata exchange,
// istio.alpn).
var realEnvoyIstiodEnv = []string{"PILOT_ENABLE_METADATA_EXCHANGE=false", "PILOT_ENABLE_ALPN_FILTER=false"}

// istiodPeerEnv is istiod's extra environment: --hub-env, and in the
// real-Envoy mode realEnvoyIstiodEnv unless --hub-env sets those names.
func istiodPeerEnv(cfg Config) []string {
	env := slices.Clone(cfg.HubEnv)
	if cfg.RealEnvoys == 0 {
		return env
	}
	for _, kv := range realEnvoyIstiodEnv {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.ContainsFunc(cfg.HubEnv, func(s string) bool { return strings.HasPrefix(s, name+"=") }) {
			env = append(env, kv)
		}
	}
	return env
}
