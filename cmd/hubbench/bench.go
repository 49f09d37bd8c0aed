package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typeddiscoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/hubmesh/hub/internal/localcluster"
)

// run performs one benchmark: clusters, objects, hub, streams, writes. It
// cleans up everything it started before returning, also when ctx ends.
func run(ctx context.Context, cfg Config) (_ *Summary, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sum := &Summary{Config: cfg, Protocol: "SotW", Shape: cfg.Shape, Targets: targetsFor(cfg.Shape, cfg.Delta), Machine: machine()}
	if cfg.Delta {
		sum.Protocol = "Delta"
	}
	if err := raiseFileLimit(cfg.Streams); err != nil {
		return nil, err
	}

	work := cfg.WorkDir
	if work == "" {
		if work, err = os.MkdirTemp("", "hubbench-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(work)
	} else if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}

	// Build the hub while the clusters start.
	hubBuilt := startHubBuild(ctx, cfg, work, sum)
	l, env, err := startClusters(ctx, cfg, work, sum)
	if err != nil {
		hubBuilt()
		return nil, err
	}
	defer env.Stop()
	hubBin, err := hubBuilt()
	if err != nil {
		return nil, err
	}

	clients, err := createObjects(ctx, cfg, l, env, sum)
	if err != nil {
		return nil, err
	}
	home, kubeconfigs, err := prepareHome(ctx, cfg, l, env, sum)
	if err != nil {
		return nil, err
	}
	h, hubStart, err := startServer(ctx, cfg, home, kubeconfigs, hubBin, work, sum)
	if err != nil {
		return nil, err
	}
	defer func() { h.stop() }() // the scale mode restarts the hub: stop the last one
	defer func() {
		if err != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w\nhub log (%s) tail:\n%s", err, h.logPath, h.tail(20))
		}
	}()
	if err := measureSync(ctx, cfg, l, h, hubStart, work, sum); err != nil {
		return nil, err
	}

	// Live heap before the streams (heap.go).
	heapBefore, err := h.heapNow(ctx)
	if err != nil {
		return nil, err
	}

	if cfg.RealEnvoys > 0 {
		if err := runRealEnvoys(ctx, cfg, l, clients, h, work, heapBefore, sum); err != nil {
			return nil, err
		}
		if e := h.exited(); e != nil {
			return nil, e
		}
		return sum, nil
	}
	if h, err = runStreams(ctx, cfg, l, clients, h, heapBefore, sum); err != nil {
		return nil, err
	}
	return sum, nil
}

// startHubBuild records in sum which server runs and, unless --peer or
// --hub-bin names it, starts building the hub in work. The function it
// returns waits for the build and returns the hub binary (cfg.HubBin
// unless built).
func startHubBuild(ctx context.Context, cfg Config, work string, sum *Summary) func() (string, error) {
	hubBin := cfg.HubBin
	built := make(chan error, 1)
	switch {
	case cfg.Peer != "":
		sum.HubBuild = "istiod " + cfg.istiodBin()
		built <- nil
	case hubBin == "":
		go func() {
			var err error
			hubBin, sum.HubBuild, err = buildHub(ctx, work)
			built <- err
		}()
	default:
		sum.HubBuild = hubBuild(hubBin)
		built <- nil
	}
	return func() (string, error) {
		err := <-built
		return hubBin, err
	}
}

// startClusters finds the API server binaries, lays out the run and starts
// the local API servers its layout needs: the home cluster's and
// l.servers. The caller stops them.
func startClusters(ctx context.Context, cfg Config, work string, sum *Summary) (*layout, *localcluster.Env, error) {
	binDir, err := localcluster.BinDir(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("kube-apiserver and etcd binaries: %w", err)
	}
	l := newLayout(cfg)
	names := append([]string{homeID}, l.servers...)
	if l.scale {
		cfg.progress("scale mode: starting %d local API servers (%s and %d for the %d member IDs) from %s", len(names), homeID, len(l.servers), cfg.Members, binDir)
	} else {
		cfg.progress("starting %d local API servers (%s and %d members) from %s", len(names), homeID, cfg.Members, binDir)
	}
	clustersDir := filepath.Join(work, "clusters")
	if err := os.MkdirAll(clustersDir, 0o755); err != nil {
		return nil, nil, err
	}
	start := time.Now()
	env, err := localcluster.Start(ctx, localcluster.Options{Names: names, BinDir: binDir, Dir: clustersDir})
	if err != nil {
		return nil, nil, fmt.Errorf("starting local clusters: %w", err)
	}
	sum.ClustersStartSeconds = time.Since(start).Seconds()
	return l, env, nil
}

// createObjects creates the layout's Services and EndpointSlices in the
// members' API servers and returns every member's client: clients[i] is
// member i's API server's (one client per API server).
func createObjects(ctx context.Context, cfg Config, l *layout, env *localcluster.Env, sum *Summary) ([]kubernetes.Interface, error) {
	serverClients := make([]kubernetes.Interface, len(l.servers))
	for i, name := range l.servers {
		var err error
		if serverClients[i], err = kubernetes.NewForConfig(env.Cluster(name).RESTConfig()); err != nil {
			return nil, err
		}
	}
	clients := make([]kubernetes.Interface, cfg.Members)
	for i := range clients {
		clients[i] = serverClients[l.server[i]]
	}
	if l.scale {
		cfg.progress("creating %d members × %d services × %d endpoints: %d Services and EndpointSlices, %d endpoints, over %d API servers (%d workers)",
			cfg.Members, cfg.ServicesPerMember, cfg.EndpointsPerService, cfg.Members*cfg.ServicesPerMember, cfg.Endpoints, len(l.servers), cfg.CreateWorkers)
	} else {
		cfg.progress("creating %d services × %d members with %d endpoints (%d workers)", cfg.Services, cfg.serviceMembers(), cfg.Endpoints, cfg.CreateWorkers)
	}
	start := time.Now()
	if err := l.create(ctx, clients, cfg.CreateWorkers, cfg.progress); err != nil {
		return nil, fmt.Errorf("creating services: %w", err)
	}
	sum.CreateSeconds = time.Since(start).Seconds()
	sum.Layout = l.summary(cfg)
	if l.scale {
		sum.Scale = &ScaleSummary{APIServers: l.servers}
	}
	return clients, nil
}

// prepareHome readies the home cluster for the server: the hub's
// namespace, the members' remote Secret (with their networks when there are
// several; in scale mode one Secret per member ID) and, with
// --locality-failover, the failover rule. It returns the home cluster and
// the members' kubeconfigs (none in scale mode).
func prepareHome(ctx context.Context, cfg Config, l *layout, env *localcluster.Env, sum *Summary) (*localcluster.Cluster, map[string][]byte, error) {
	home := env.Cluster(homeID)
	homeClient, err := kubernetes.NewForConfig(home.RESTConfig())
	if err != nil {
		return nil, nil, err
	}
	if err := localcluster.EnsureNamespace(ctx, homeClient, hubNamespace); err != nil {
		return nil, nil, err
	}
	kubeconfigs := map[string][]byte{}
	if l.scale {
		// One Secret per member ID, each with its own client certificate
		// and namespace (scale.go).
		if sum.Scale.SecretsSeconds, err = createScaleSecrets(ctx, cfg, l, env, homeClient); err != nil {
			return nil, nil, err
		}
	} else {
		for _, id := range l.memberIDs {
			kubeconfigs[id] = env.Cluster(id).Kubeconfig()
		}
		secret := localcluster.RemoteSecret(hubNamespace, "hubbench-members", kubeconfigs)
		if cfg.Networks > 1 { // the operator confirms each member's network (hub.federation/network)
			var nets []string
			for i, id := range l.memberIDs {
				nets = append(nets, id+"="+l.memberNetwork(i))
			}
			secret.Annotations = map[string]string{"hub.federation/network": strings.Join(nets, ",")}
		}
		if _, err := homeClient.CoreV1().Secrets(hubNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			return nil, nil, fmt.Errorf("creating the remote secret: %w", err)
		}
	}
	if cfg.LocalityFailover {
		if err := applyFailoverRule(ctx, home); err != nil {
			return nil, nil, err
		}
	}
	return home, kubeconfigs, nil
}

// startServer starts the server under test on the home cluster in its
// directory under work: istiod with --peer (given the members'
// kubeconfigs), else the hub hubBin. It returns the server and when it was
// started; the caller stops it.
func startServer(ctx context.Context, cfg Config, home *localcluster.Cluster, kubeconfigs map[string][]byte, hubBin, work string, sum *Summary) (*hubProcess, time.Time, error) {
	hubDir := filepath.Join(work, "hub-run")
	if cfg.Peer != "" {
		hubDir = peerDir(work)
	}
	if err := os.MkdirAll(hubDir, 0o755); err != nil {
		return nil, time.Time{}, err
	}
	hubStart := time.Now()
	var h *hubProcess
	var err error
	if cfg.Peer != "" {
		cfg.progress("starting istiod in the hub's place (%s)", sum.HubBuild)
		h, err = startIstiodPeer(ctx, cfg, home, kubeconfigs, hubDir)
	} else {
		cfg.progress("starting the hub %s (%s)", hubBin, sum.HubBuild)
		h, err = startHub(ctx, hubBin, hubDir, home.Kubeconfig(), cfg.HubArgs, cfg.HubEnv)
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	if cfg.WorkDir != "" {
		sum.HubLog = h.logPath
	}
	sum.HubPID = h.pid()
	return h, hubStart, nil
}

// measureSync waits until the server under test, started at hubStart, has
// synced every member and service (in scale mode timing the members'
// readiness first), records how long that took and the server's process
// figures, and in scale mode measures the steady state (measureSteady).
func measureSync(ctx context.Context, cfg Config, l *layout, h *hubProcess, hubStart time.Time, work string, sum *Summary) (err error) {
	if l.scale {
		cfg.progress("waiting for all %d members to be Ready (polling /api/v1/clusters)", cfg.Members)
		if sum.Scale.Start, err = readyTimeline(ctx, h, cfg, l, hubStart); err != nil {
			return err
		}
	}
	if cfg.Peer != "" {
		err = waitIstiodSynced(ctx, h, cfg, l)
	} else {
		err = waitSynced(ctx, h, cfg, l)
	}
	if err != nil {
		return err
	}
	sum.MemberSyncSeconds = time.Since(hubStart).Seconds()
	cfg.progress("hub synced %d members and %d services in %.1fs", cfg.Members+1, cfg.Services, sum.MemberSyncSeconds)
	if sum.Hub.AfterSync, err = procStats(h.pid()); err != nil {
		return fmt.Errorf("reading the hub's /proc: %w", err)
	}
	if l.scale {
		if err := measureSteady(ctx, cfg, l, h, work, sum.Scale); err != nil {
			return err
		}
	}
	return nil
}

// runStreams is the simulated fleet's part of a run, once the server under
// test (h) is synced: cold connect of the streams, the measured writes, the
// bulk phase and, in scale mode, the API, the other shapes and a restart.
// It returns the server running at the end (in scale mode the restarted
// hub), also with an error.
func runStreams(ctx context.Context, cfg Config, l *layout, clients []kubernetes.Interface, h *hubProcess, heapBefore heapPoint, sum *Summary) (_ *hubProcess, err error) {
	// Cold connect.
	f := newFleet(ctx, h.xdsAddr, cfg, l)
	defer f.close()
	if err := coldConnect(ctx, cfg, f, h, heapBefore, sum); err != nil {
		return h, err
	}

	// Convergence: one write at a time.
	if err := writePhase(ctx, cfg, l, clients, f, h, sum); err != nil {
		return h, err
	}
	if cfg.Bulk > 0 {
		if sum.Bulk, err = runBulk(ctx, cfg, l, clients, f, h); err != nil {
			return h, err
		}
		if sum.Hub.AfterBulk, err = procStats(h.pid()); err != nil {
			return h, fmt.Errorf("reading the hub's /proc: %w", err)
		}
	}
	if e := h.exited(); e != nil {
		return h, e
	}
	if l.scale {
		// With the streams of the shape still connected: the REST API and
		// the dashboard, then the other shapes, then a restart.
		if sum.Scale.API, err = measureAPI(ctx, cfg, h); err != nil {
			return h, err
		}
		f.close()
		for _, shape := range cfg.AlsoShapes {
			r, err := measureShape(ctx, cfg, shape, l, clients, h)
			if err != nil {
				return h, err
			}
			sum.Scale.Shapes = append(sum.Scale.Shapes, r)
		}
		if h, err = measureRestart(ctx, cfg, l, h, sum.Scale); err != nil {
			return h, err
		}
		sum.HubPID = h.pid()
		if cfg.WorkDir != "" {
			sum.Scale.RestartHubLog = h.logPath
		}
	}
	return h, nil
}

// coldConnect opens the fleet's streams and waits until every one holds
// its config, then records the connect figures, the hub's live heap per
// stream and its process figures.
func coldConnect(ctx context.Context, cfg Config, f *fleet, h *hubProcess, heapBefore heapPoint, sum *Summary) error {
	cfg.progress("opening %d %s ADS streams (%d connecting at once), %s", cfg.Streams, sum.Protocol, cfg.ConnectConcurrency, cfg.shapeText())
	connectStart := time.Now()
	if err := f.connect(cfg.ConnectConcurrency, cfg.ConnectTimeout, cfg.progress); err != nil {
		if e := h.exited(); e != nil {
			return e
		}
		return err
	}
	sum.ColdConnectSeconds = time.Since(connectStart).Seconds()
	sum.ConnectRefused = f.refused.Load()
	var perStream []time.Duration
	for _, s := range f.streams {
		perStream = append(perStream, time.Unix(0, s.readyAt.Load()).Sub(s.dialAt))
	}
	sum.StreamConnect = percentiles(perStream)
	if err := waitCDS(ctx, f, 60*time.Second); err != nil {
		return err
	}
	sum.ConnectResponses, _ = f.totals()
	sum.ConnectResponsesByType = f.byType()
	cfg.progress("cold connect: all %d streams hold their config after %.2fs", cfg.Streams, sum.ColdConnectSeconds)
	heapAfter, err := h.heapNow(ctx)
	if err != nil {
		return err
	}
	sum.Heap = heapPerStream(heapBefore, heapAfter, cfg.Streams)
	cfg.progress("hub live heap %d → %d MiB: %.1f KiB per stream", sum.Heap.LiveBeforeMiB, sum.Heap.LiveAfterMiB, sum.Heap.LivePerStreamKiB)
	if cfg.HubHeap != "" {
		if err := h.writeHeapProfile(ctx, cfg.HubHeap); err != nil {
			return err
		}
		cfg.progress("hub heap profile: %s", cfg.HubHeap)
	}
	if sum.Hub.AfterConnect, err = procStats(h.pid()); err != nil {
		return fmt.Errorf("reading the hub's /proc: %w", err)
	}
	return nil
}

// writePhase makes the measured writes (measureWrites), with --hub-perf
// under perf, and records what they cost the hub: its CPU, the responses
// it and the streams counted, its metrics and its process figures after.
func writePhase(ctx context.Context, cfg Config, l *layout, clients []kubernetes.Interface, f *fleet, h *hubProcess, sum *Summary) error {
	before, err := h.metrics(ctx)
	if err != nil {
		return err
	}
	responsesBefore, _ := f.totals()
	sum.LoadBefore = loadAvg()
	cpuBefore, err := procStats(h.pid())
	if err != nil {
		return fmt.Errorf("reading the hub's /proc: %w", err)
	}
	var perf *perfRecorder
	if cfg.HubPerf != "" {
		if perf, err = startPerf(h.pid(), cfg.HubPerf); err != nil {
			return err
		}
	}
	writeStart := time.Now()
	err = measureWrites(ctx, cfg, l, clients, f, h, sum)
	sum.WritePhaseSeconds = time.Since(writeStart).Seconds()
	if perr := perf.stop(); err == nil && perr != nil {
		err = perr
	}
	if err != nil {
		return err
	}
	cpuAfter, err := procStats(h.pid())
	if err != nil {
		return fmt.Errorf("reading the hub's /proc: %w", err)
	}
	sum.setWriteCPU(cpuAfter.CPUSeconds-cpuBefore.CPUSeconds, cfg.Writes)
	after, err := h.metrics(ctx)
	if err != nil {
		return err
	}
	responsesAfter, resends := f.totals()
	sum.WriteResponses = responsesAfter - responsesBefore
	sum.HubWriteResponses = after.total() - before.total()
	if sum.WritePhaseSeconds > 0 {
		sum.PushesPerSecond = float64(sum.WriteResponses) / sum.WritePhaseSeconds
		sum.HubPushesPerSecond = sum.HubWriteResponses / sum.WritePhaseSeconds
	}
	sum.Resends = resends
	sum.HubMetrics, sum.HubMetricsAfterConnect = after, before
	if sum.Hub.AfterWrites, err = procStats(h.pid()); err != nil {
		return fmt.Errorf("reading the hub's /proc: %w", err)
	}
	return nil
}

// raiseFileLimit lifts the soft RLIMIT_NOFILE to the hard limit (the hub
// inherits it) and checks that every stream's connection fits on both ends.
func raiseFileLimit(streams int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return fmt.Errorf("raising RLIMIT_NOFILE to %d: %w", lim.Max, err)
		}
	}
	if need := uint64(streams) + 1024; lim.Cur < need {
		return fmt.Errorf("%d streams need about %d open files, but RLIMIT_NOFILE is %d (hard limit %d): raise it (ulimit -n) or use fewer --streams", streams, need, lim.Cur, lim.Max)
	}
	return nil
}

// waitSynced waits until every cluster is Ready in /api/v1/clusters and
// /api/v1/services lists every service with its endpoints in every member.
func waitSynced(ctx context.Context, h *hubProcess, cfg Config, l *layout) error {
	want := map[string]map[string]int{} // hostname → member → endpoints
	for _, s := range l.services {
		m := map[string]int{}
		for k, mi := range s.members {
			m[l.memberIDs[mi]] = len(s.backend[k])
		}
		want[s.host()] = m
	}
	return waitServer(ctx, h, cfg, "the hub", func() (string, error) { return syncProblem(ctx, h, l, want) })
}

// waitServer polls problem until it says nothing is missing (""), the
// server under test exits or cfg.SyncTimeout passes.
func waitServer(ctx context.Context, h *hubProcess, cfg Config, server string, problem func() (string, error)) error {
	deadline := time.Now().Add(cfg.SyncTimeout)
	lastReport := time.Now()
	for {
		missing, err := problem()
		if err != nil {
			return err
		}
		if missing == "" {
			return nil
		}
		if e := h.exited(); e != nil {
			return e
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not sync within %s: %s", server, cfg.SyncTimeout, missing)
		}
		if time.Since(lastReport) > 10*time.Second {
			cfg.progress("waiting for %s to sync: %s", server, missing)
			lastReport = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// syncProblem says what is not synced yet, or "" when everything is. In
// the scale mode a service may also have endpoints in members that should
// not see it: a hub that does not scope its watches by the remote Secret's
// hub.federation/watch-namespaces shows each member every namespace of its
// API server (scale.go reports it).
func syncProblem(ctx context.Context, h *hubProcess, l *layout, want map[string]map[string]int) (string, error) {
	cs, err := h.clusters(ctx)
	if err != nil {
		return "", err
	}
	var notReady []string
	ready := map[string]bool{}
	for _, c := range cs {
		if c.State == "Ready" {
			ready[c.ID] = true
		} else {
			notReady = append(notReady, fmt.Sprintf("%s is %s (%s)", c.ID, c.State, c.Message))
		}
	}
	for _, id := range append([]string{homeID}, l.memberIDs...) {
		if !ready[id] && !slices.ContainsFunc(notReady, func(s string) bool { return strings.HasPrefix(s, id+" ") }) {
			notReady = append(notReady, id+" is not listed")
		}
	}
	if len(notReady) > 0 {
		return "clusters not Ready: " + strings.Join(notReady, "; "), nil
	}
	svcs, err := h.services(ctx)
	if err != nil {
		return "", err
	}
	got := map[string]map[string]int{}
	for _, s := range svcs {
		got[s.Hostname] = s.Endpoints
	}
	var wrong []string
	for host, members := range want {
		g, ok := got[host]
		switch {
		case !ok:
			wrong = append(wrong, host+" missing")
		case len(g) != len(members) && !(l.scale && len(g) > len(members)):
			wrong = append(wrong, fmt.Sprintf("%s has endpoints in %v, want %v", host, g, members))
		default:
			for m, n := range members {
				if g[m] != n {
					wrong = append(wrong, fmt.Sprintf("%s has %d endpoints in %s, want %d", host, g[m], m, n))
				}
			}
		}
	}
	if len(wrong) > 0 {
		slices.Sort(wrong)
		more := ""
		if len(wrong) > 5 {
			more = fmt.Sprintf(" and %d more", len(wrong)-5)
			wrong = wrong[:5]
		}
		return fmt.Sprintf("%d/%d services listed; %s%s", len(svcs), len(want), strings.Join(wrong, "; "), more), nil
	}
	return "", nil
}

// waitCDS waits until every stream holds every service's CDS cluster.
func waitCDS(ctx context.Context, f *fleet, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var lacking []int
		for i, s := range f.streams {
			if s.cdsClusters.Load() != int64(s.cdsWant) {
				lacking = append(lacking, i)
			}
		}
		if len(lacking) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d streams do not hold all their CDS clusters after %s:\n%s", len(lacking), timeout, f.describe(lacking, 20))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.failed:
			return f.firstErr
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// measureWrites adds one endpoint at a time to a watched service's
// EndpointSlice in one of its members and times its arrival at every stream
// that watches the service.
func measureWrites(ctx context.Context, cfg Config, l *layout, clients []kubernetes.Interface, f *fleet, h *hubProcess, sum *Summary) error {
	var watched []int
	for s, w := range l.watchers {
		if len(w) > 0 {
			watched = append(watched, s)
		}
	}
	if len(watched) == 0 && cfg.Writes > 0 {
		return errors.New("no service is watched by any stream")
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7772697465))
	rng.Shuffle(len(watched), func(i, j int) { watched[i], watched[j] = watched[j], watched[i] })
	var all []time.Duration
	var sizes []int // istiod: per (write, stream), the bytes of the response that brought the write
	for w := range cfg.Writes {
		svc := l.services[watched[w%len(watched)]]
		k := w % len(svc.members)
		slicesAPI, slice, addr, member, err := nextWrite(ctx, cfg, l, clients, svc, w)
		if err != nil {
			return err
		}
		watchers := l.watchers[watched[w%len(watched)]]
		if nw := l.memberNetwork(svc.members[k]); nw != "" {
			// Only the streams on the written member's network see the
			// address: the others get the member's gateway with a new weight
			// (mTLS clients: the grpc shape with --hub-arg=--mtls-mode=STRICT)
			// or nothing (plaintext clients). They are not timed; their
			// responses count in the hub's CPU.
			watchers = streamsOnNetwork(f, watchers, nw)
		}
		t := newWriteTarget(svc.cluster, svc.entry(), addr, len(f.streams), watchers)
		t.start = time.Now()
		f.target.Store(t)
		if _, err := slicesAPI.Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("write %d: updating EndpointSlice %s/%s-hub in %s: %w", w+1, svc.namespace, svc.name, member, err)
		}
		apiLatency := time.Since(t.start)
		timer := time.NewTimer(cfg.WriteTimeout)
		select {
		case <-t.done:
			timer.Stop()
		case <-timer.C:
			return missedWrite(cfg, f, h, t, watchers, fmt.Sprintf("write %d (endpoint %s added to %s in %s)", w+1, addr, svc.cluster, member))
		case <-f.failed:
			timer.Stop()
			return fmt.Errorf("write %d: %w", w+1, f.firstErr)
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
		f.target.Store(nil)
		lat, writeSizes, size := arrivals(t, watchers)
		sizes = append(sizes, writeSizes...)
		all = append(all, lat...)
		p := percentiles(lat)
		wr := WriteResult{
			Service: svc.name, Member: member, Address: addr, APIMs: ms(apiLatency),
			Watchers: len(watchers), Reached: len(lat), P50Ms: p.P50Ms, MaxMs: p.MaxMs,
		}
		if size > 0 {
			wr.ResponseBytes = size / int64(len(watchers))
		}
		sum.Writes = append(sum.Writes, wr)
		cfg.progress("write %d/%d: %s in %s reached %d/%d watchers: p50 %.1f ms, max %.1f ms", w+1, cfg.Writes, svc.name, member, len(lat), len(watchers), p.P50Ms, p.MaxMs)
		if err := writeGap(ctx, cfg); err != nil {
			return err
		}
	}
	sum.Convergence = percentiles(all)
	if len(sizes) > 0 {
		sum.ResponseBytes = minMax(sizes)
	}
	return nil
}

// streamsOnNetwork are the watchers whose stream is on network.
func streamsOnNetwork(f *fleet, watchers []int, network string) []int {
	var local []int
	for _, i := range watchers {
		if f.streams[i].network == network {
			local = append(local, i)
		}
	}
	return local
}

// missedWrite is the error of a write (what) that not every watcher
// received within cfg.WriteTimeout: how many did not, which ones, and the
// hub's exit if it exited.
func missedWrite(cfg Config, f *fleet, h *hubProcess, t *writeTarget, watchers []int, what string) error {
	var stragglers []int
	for _, i := range watchers {
		if t.arrived[i].Load() == 0 {
			stragglers = append(stragglers, i)
		}
	}
	err := fmt.Errorf("%s: %d of %d watching streams did not receive it within %s:\n%s",
		what, len(stragglers), len(watchers), cfg.WriteTimeout, f.describe(stragglers, 20))
	if e := h.exited(); e != nil {
		err = fmt.Errorf("%w\n%w", err, e)
	}
	return err
}

// arrivals are how long each watcher took to receive t's write, the sizes
// of the responses that brought it (where counted) and their total.
func arrivals(t *writeTarget, watchers []int) (lat []time.Duration, sizes []int, total int64) {
	for _, i := range watchers {
		lat = append(lat, time.Duration(t.arrived[i].Load()))
		if b := t.bytes[i].Load(); b > 0 {
			sizes = append(sizes, int(b))
			total += b
		}
	}
	return lat, sizes, total
}

// machine describes where the run happened.
func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), LoadAvg: loadAvg()}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				var kb float64
				fmt.Sscan(f[1], &kb)
				m.MemGiB = kb / (1 << 20)
			}
		}
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	return m
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// nextWrite reads the EndpointSlice the w-th measured write changes (of
// svc in its member w mod len(members)) and appends one ready endpoint at
// a new address to it; the caller times the update it then makes.
func nextWrite(ctx context.Context, cfg Config, l *layout, clients []kubernetes.Interface, svc *service, w int) (typeddiscoveryv1.EndpointSliceInterface, *discoveryv1.EndpointSlice, string, string, error) {
	k := w % len(svc.members)
	member := l.memberIDs[svc.members[k]]
	addr := address(cfg.Endpoints + l.written)
	l.written++
	slicesAPI := clients[svc.members[k]].DiscoveryV1().EndpointSlices(svc.namespace)
	slice, err := slicesAPI.Get(ctx, svc.name+"-hub", metav1.GetOptions{})
	if err != nil {
		return nil, nil, "", "", fmt.Errorf("write %d: reading EndpointSlice %s/%s-hub in %s: %w", w+1, svc.namespace, svc.name, member, err)
	}
	ep := discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		NodeName:   ptr.To("node-0"),
	}
	if pod := svc.backend[k][0].Pod; pod != "" { // a mesh pod: reached across networks through the gateway
		ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: svc.namespace, Name: pod}
	}
	slice.Endpoints = append(slice.Endpoints, ep)
	return slicesAPI, slice, addr, member, nil
}

// writeGap waits cfg.WriteGap after a measured write, or until ctx is done.
func writeGap(ctx context.Context, cfg Config) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(cfg.WriteGap):
		return nil
	}
}
