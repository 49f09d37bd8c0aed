package main

// The scale mode (--apiservers N below --members): many member IDs on a
// few real API servers, each ID registered as a distinct cluster would be,
// and the figures an operator of a large mesh asks about (issue 24).
//
//   - Layout (layout.go, placeScale): member i is registered against API
//     server i mod N and watches namespace team-<i / N> there; its
//     namespace holds --services-per-member services of
//     --endpoints-per-service endpoints. The members with the same team
//     index are on N different API servers and serve the same hostnames.
//   - Registration (createScaleSecrets): one remote Secret per member ID,
//     each with a kubeconfig carrying its own client certificate and the
//     annotation hub.federation/watch-namespaces: team-<t>, so the hub
//     runs its own client, informers and state per ID. A hub that ignores
//     the annotation sees every namespace of the API server in every
//     member: the run still works (heavier) and says so.
//   - Figures (ScaleSummary): hub start → every member Ready (and how many
//     were Ready by 15, 30 and 60 s), the same after a restart of the hub
//     (which serves its persisted views at once), steady and peak RSS,
//     live heap per member and per endpoint, idle CPU, one write's
//     convergence for each shape (the run's --shape, then --also-shapes,
//     each with --streams new streams) and the response times of the REST
//     API and the dashboard.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
)

// annotationWatchNamespaces scopes what the hub watches in the members of
// a remote Secret (docs/features.md "Scoped watching").
const annotationWatchNamespaces = "hub.federation/watch-namespaces"

// ScaleSummary is what the scale mode measured.
type ScaleSummary struct {
	// APIServers are the member API servers' names; MembersPerAPIServer
	// the most member IDs on one of them.
	APIServers          []string `json:"apiServers"`
	MembersPerAPIServer int      `json:"membersPerApiServer"`
	// SecretsSeconds is how long registering every member took (one
	// client certificate and one remote Secret each).
	SecretsSeconds float64 `json:"secretsSeconds"`

	// Start is hub start → every member Ready.
	Start ReadyTimeline `json:"start"`

	// WatchScoped: every service had endpoints in exactly the members of
	// its team, so the hub honoured hub.federation/watch-namespaces;
	// MembersPerService is, over the services, how many members the hub
	// listed endpoints in. WatchScopes counts the members' watchScope from
	// /api/v1/clusters ("" where the hub does not report it) and
	// ObjectsPerMember the most objects one member's informers held, by
	// kind (where the hub reports it).
	WatchScoped       bool           `json:"watchScoped"`
	MembersPerService MinMax         `json:"membersPerService"`
	WatchScopes       map[string]int `json:"watchScopes"`
	ObjectsPerMember  map[string]int `json:"objectsPerMember,omitempty"`

	// ViewsPersisted members had their view written into the home
	// cluster (hub_member_view_writes_total) ViewsPersistedSeconds after
	// every member was synced; the restart restores them.
	ViewsPersisted        int     `json:"viewsPersisted"`
	ViewsPersistedSeconds float64 `json:"viewsPersistedSeconds"`

	// Idle is the hub's CPU over IdleWindow with nothing changing, after
	// every member is Ready and its view persisted, and no stream open.
	Idle IdleStats `json:"idle"`
	// Memory is the hub's memory then.
	Memory MemoryStats `json:"memory"`
	// HubLogBytesAtReady is the size of the hub's log once every member
	// was Ready (GODEBUG=gctrace=1 lines included).
	HubLogBytesAtReady int64 `json:"hubLogBytesAtReady"`

	// API are the response times of the REST API and the dashboard, taken
	// while the streams of the run's shape are connected.
	API []APITiming `json:"api"`
	// Shapes are the figures of --also-shapes (the run's own shape is the
	// main summary's).
	Shapes []ShapeResult `json:"shapes,omitempty"`

	// Restart is a stop and start of the hub with the same arguments and
	// home cluster, after everything else.
	Restart       RestartStats `json:"restart"`
	RestartHubLog string       `json:"restartHubLog,omitempty"`
}

// ReadyTimeline is a hub's way from start to every member Ready, from
// polling /api/v1/clusters.
type ReadyTimeline struct {
	// AllReadySeconds: hub process start → every member (and the home
	// cluster) Ready.
	AllReadySeconds float64 `json:"allReadySeconds"`
	// ReadyBy15s, 30s and 60s count the members first seen Ready by then.
	ReadyBy15s int `json:"readyBy15s"`
	ReadyBy30s int `json:"readyBy30s"`
	ReadyBy60s int `json:"readyBy60s"`
	// MemberReady spreads, over the members, the time each was first seen
	// Ready.
	MemberReady Percentiles `json:"memberReady"`
	// AllServingSeconds: start → every member listed with all its
	// services, Ready or Stale (serving a persisted view).
	AllServingSeconds float64 `json:"allServingSeconds"`
	// FirstAnswerSeconds is when /api/v1/clusters first answered,
	// AllListedSeconds when it first listed every member, and
	// ListedStates the members' states then (after a restart, Stale ones
	// serve their persisted views).
	FirstAnswerSeconds float64        `json:"firstAnswerSeconds"`
	AllListedSeconds   float64        `json:"allListedSeconds"`
	ListedStates       map[string]int `json:"listedStates"`
	Polls              int            `json:"polls"`
}

// IdleStats is the hub's CPU over a quiet window.
type IdleStats struct {
	WindowSeconds float64 `json:"windowSeconds"`
	CPUSeconds    float64 `json:"cpuSeconds"`
	// CPUPercent is of one core.
	CPUPercent float64 `json:"cpuPercent"`
	// LogBytes is how much the hub logged meanwhile.
	LogBytes int64 `json:"logBytes"`
}

// MemoryStats is the hub's memory once every member is Ready.
type MemoryStats struct {
	// SteadyRSSMiB is the RSS after the idle window, PeakRSSMiB the peak
	// so far (VmHWM: sync included).
	SteadyRSSMiB float64 `json:"steadyRssMiB"`
	PeakRSSMiB   float64 `json:"peakRssMiB"`
	// LiveHeapMiB is the live heap a GC found (GODEBUG=gctrace=1),
	// HeapInuseMiB go_memstats_heap_inuse_bytes at the same time.
	LiveHeapMiB  int     `json:"liveHeapMiB"`
	HeapInuseMiB float64 `json:"heapInuseMiB"`
	// Per member and per endpoint (all of the hub divided, home included).
	RSSPerMemberKiB          float64 `json:"rssPerMemberKiB"`
	LiveHeapPerMemberKiB     float64 `json:"liveHeapPerMemberKiB"`
	LiveHeapPerEndpointBytes float64 `json:"liveHeapPerEndpointBytes"`
	Goroutines               float64 `json:"goroutines"`
	GoroutinesPerMember      float64 `json:"goroutinesPerMember"`
	Threads                  int     `json:"threads"`
	OpenFiles                int     `json:"openFiles"`
	Sockets                  int     `json:"sockets"`
	// HeapProfile is the path of the hub's heap profile, or
	// HeapProfileNote says why there is none.
	HeapProfile     string `json:"heapProfile,omitempty"`
	HeapProfileNote string `json:"heapProfileNote,omitempty"`
}

// APITiming is the response time of one REST path or dashboard page.
type APITiming struct {
	What  string      `json:"what"`
	Path  string      `json:"path"`
	Bytes int         `json:"bytes"`
	Time  Percentiles `json:"time"`
}

// ShapeResult is one extra shape of the scale mode: its own streams, cold
// connect and writes.
type ShapeResult struct {
	Shape              string      `json:"shape"`
	Streams            int         `json:"streams"`
	ColdConnectSeconds float64     `json:"coldConnectSeconds"`
	StreamConnect      Percentiles `json:"streamConnect"`
	ConnectResponses   int64       `json:"connectResponses"`
	Convergence        Percentiles `json:"convergence"`
	Writes             int         `json:"writes"`
	// Unreached counts (write, watching stream) pairs that never saw the
	// write (the run fails first; kept for the JSON).
	Unreached        int     `json:"unreached"`
	Resends          int64   `json:"resends"`
	HubCPUPerWriteMs float64 `json:"hubCpuPerWriteMs"`
	// HeapPerStreamKiB: live heap after connect minus before, ÷ streams.
	HeapPerStreamKiB float64 `json:"heapPerStreamKiB"`
	RSSMiB           float64 `json:"rssMiB"`
	PeakRSSMiB       float64 `json:"peakRssMiB"`
}

// RestartStats is the hub's restart.
type RestartStats struct {
	// StopSeconds is SIGTERM → exit.
	StopSeconds float64       `json:"stopSeconds"`
	Timeline    ReadyTimeline `json:"timeline"`
	// RestoredViews counts the members the restarted hub served from
	// their persisted views until they synced (its log's "serving the
	// persisted view until the member syncs" lines).
	RestoredViews int `json:"restoredViews"`
	// ViewsRejected is hub_member_view_rejected_total after the restart.
	ViewsRejected float64 `json:"viewsRejected"`
	RSSMiB        float64 `json:"rssMiB"`
	PeakRSSMiB    float64 `json:"peakRssMiB"`
}

// createScaleSecrets registers every member ID with its own remote Secret
// hubbench-<id>: a kubeconfig for its API server with a client certificate
// of its own, and hub.federation/watch-namespaces naming its namespace.
func createScaleSecrets(ctx context.Context, cfg Config, l *layout, env *localcluster.Env, home kubernetes.Interface) (seconds float64, err error) {
	start := time.Now()
	secrets := home.CoreV1().Secrets(hubNamespace)
	for i, id := range l.memberIDs {
		kubeconfig, err := env.Cluster(l.servers[l.server[i]]).NewCertKubeconfig()
		if err != nil {
			return 0, fmt.Errorf("member %s: issuing its client certificate: %w", id, err)
		}
		secret := localcluster.RemoteSecret(hubNamespace, "hubbench-"+id, map[string][]byte{id: kubeconfig})
		if !cfg.Unscoped {
			secret.Annotations = map[string]string{annotationWatchNamespaces: l.namespace[i]}
		}
		if _, err := secrets.Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			return 0, fmt.Errorf("member %s: creating its remote Secret: %w", id, err)
		}
		if n := i + 1; n%100 == 0 && n < len(l.memberIDs) {
			cfg.progress("registered %d/%d members", n, len(l.memberIDs))
		}
	}
	seconds = time.Since(start).Seconds()
	cfg.progress("registered %d members (a remote Secret, client certificate and namespace each) in %.1fs", len(l.memberIDs), seconds)
	return seconds, nil
}

// memberState is a cluster of /api/v1/clusters, as far as the scale mode
// reads it (decoded on its own: fields the hub may not have yet are
// simply empty).
type memberState struct {
	ID         string         `json:"id"`
	State      string         `json:"state"`
	Message    string         `json:"message"`
	Services   int            `json:"services"`
	Endpoints  int            `json:"endpoints"`
	WatchScope string         `json:"watchScope"`
	Objects    map[string]int `json:"objects"`
}

func (h *hubProcess) memberStates(ctx context.Context) ([]memberState, error) {
	body, err := h.get(ctx, "/api/v1/clusters")
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []memberState `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decoding /api/v1/clusters: %w", err)
	}
	return list.Items, nil
}

// readyPoll is how often readyTimeline asks.
const readyPoll = 250 * time.Millisecond

// readyTimeline polls /api/v1/clusters from the hub's start until every
// member and the home cluster are Ready (at most cfg.SyncTimeout after
// start).
func readyTimeline(ctx context.Context, h *hubProcess, cfg Config, l *layout, start time.Time) (ReadyTimeline, error) {
	var tl ReadyTimeline
	readyAt := map[string]time.Duration{}
	servingAt := map[string]time.Duration{}
	members := map[string]bool{}
	for _, id := range l.memberIDs {
		members[id] = true
	}
	lastReport := time.Now()
	for {
		cs, err := h.memberStates(ctx)
		now := time.Since(start)
		if err != nil {
			return tl, err
		}
		tl.Polls++
		homeReady := false
		states := map[string]int{}
		listed := 0
		for _, c := range cs {
			if c.ID == homeID {
				homeReady = c.State == "Ready"
				continue
			}
			if !members[c.ID] {
				continue
			}
			states[c.State]++
			listed++
			if _, ok := readyAt[c.ID]; !ok && c.State == "Ready" {
				readyAt[c.ID] = now
			}
			if _, ok := servingAt[c.ID]; !ok && (c.State == "Ready" || c.State == "Stale") && c.Services >= cfg.ServicesPerMember {
				servingAt[c.ID] = now
			}
		}
		if tl.Polls == 1 {
			tl.FirstAnswerSeconds = now.Seconds()
		}
		if tl.ListedStates == nil && listed == len(members) {
			tl.AllListedSeconds, tl.ListedStates = now.Seconds(), states
		}
		if homeReady && len(readyAt) == len(members) {
			tl.AllReadySeconds = now.Seconds()
			break
		}
		if e := h.exited(); e != nil {
			return tl, e
		}
		if now > cfg.SyncTimeout {
			return tl, fmt.Errorf("%d of %d members Ready %s after the hub started (states now: %v; home Ready: %t)", len(readyAt), len(members), cfg.SyncTimeout, states, homeReady)
		}
		if time.Since(lastReport) > 10*time.Second {
			cfg.progress("%d/%d members Ready after %.0fs (now %v)", len(readyAt), len(members), now.Seconds(), states)
			lastReport = time.Now()
		}
		select {
		case <-ctx.Done():
			return tl, ctx.Err()
		case <-time.After(readyPoll):
		}
	}
	var all []time.Duration
	for _, d := range readyAt {
		all = append(all, d)
		for _, by := range []struct {
			n *int
			d time.Duration
		}{{&tl.ReadyBy15s, 15 * time.Second}, {&tl.ReadyBy30s, 30 * time.Second}, {&tl.ReadyBy60s, 60 * time.Second}} {
			if d <= by.d {
				*by.n++
			}
		}
	}
	tl.MemberReady = percentiles(all)
	if len(servingAt) == len(members) {
		tl.AllServingSeconds = slices.Max(slices.Collect(maps.Values(servingAt))).Seconds()
	}
	return tl, nil
}

// measureSteady takes the figures of a hub whose members are all Ready:
// its watch scope, the persisted views it writes, then idle CPU and
// memory.
func measureSteady(ctx context.Context, cfg Config, l *layout, h *hubProcess, work string, sc *ScaleSummary) error {
	syncedAt := time.Now()
	for i := range l.memberIDs {
		if l.server[i] == 0 {
			sc.MembersPerAPIServer++
		}
	}
	if fi, err := os.Stat(h.logPath); err == nil {
		sc.HubLogBytesAtReady = fi.Size()
	}
	if err := measureWatchScope(ctx, cfg, l, h, sc); err != nil {
		return err
	}

	// The persisted views, written by the leader within seconds of a
	// member's sync; the restart restores them, and the idle window is
	// quiet only once they are written.
	if err := waitViewsPersisted(ctx, cfg, l, h, sc); err != nil {
		return err
	}
	sc.ViewsPersistedSeconds = math.Round(time.Since(syncedAt).Seconds()*100) / 100

	// Idle CPU.
	cpu1, window, err := measureIdle(ctx, cfg, h, sc)
	if err != nil {
		return err
	}

	// Memory.
	if err := measureMemory(ctx, cfg, l, h, work, cpu1, sc); err != nil {
		return err
	}
	m := &sc.Memory
	cfg.progress("hub idle: %.1f%% of a core over %.0fs; RSS %.0f MiB (peak %.0f), live heap %d MiB (%.0f KiB per member, %.0f bytes per endpoint), %.0f goroutines, %d sockets",
		sc.Idle.CPUPercent, window, m.SteadyRSSMiB, m.PeakRSSMiB, m.LiveHeapMiB, m.LiveHeapPerMemberKiB, m.LiveHeapPerEndpointBytes, m.Goroutines, m.Sockets)
	return nil
}

// measureWatchScope records what each member watches (/api/v1/clusters:
// its watch scope and objects) and whether the hub scopes its watches:
// every service listed with endpoints in just its own members.
func measureWatchScope(ctx context.Context, cfg Config, l *layout, h *hubProcess, sc *ScaleSummary) error {
	cs, err := h.memberStates(ctx)
	if err != nil {
		return err
	}
	sc.WatchScopes = map[string]int{}
	for _, c := range cs {
		if c.ID == homeID {
			continue
		}
		scope := c.WatchScope
		if strings.HasPrefix(scope, "namespaces team-") {
			scope = "namespaces team-…" // one per team
		}
		sc.WatchScopes[scope]++
		for kind, n := range c.Objects {
			if sc.ObjectsPerMember == nil {
				sc.ObjectsPerMember = map[string]int{}
			}
			sc.ObjectsPerMember[kind] = max(sc.ObjectsPerMember[kind], n)
		}
	}
	svcs, err := h.services(ctx)
	if err != nil {
		return err
	}
	want := map[string]int{}
	for _, s := range l.services {
		want[s.host()] = len(s.members)
	}
	sc.WatchScoped = true
	var spread []int
	for _, s := range svcs {
		w, ok := want[s.Hostname]
		if !ok {
			continue
		}
		spread = append(spread, len(s.Endpoints))
		if len(s.Endpoints) != w {
			sc.WatchScoped = false
		}
	}
	if len(spread) > 0 {
		sc.MembersPerService = *minMax(spread)
	}
	if !sc.WatchScoped && !cfg.Unscoped {
		cfg.progress("the hub does not scope its watches by %s: services have endpoints in %d–%d members, want their team's %d", annotationWatchNamespaces, sc.MembersPerService.Min, sc.MembersPerService.Max, cfg.APIServers)
	}
	return nil
}

// waitViewsPersisted waits until the hub has persisted every member's
// view in the home cluster, or goes on after 3 minutes and a second per
// member; it records how many it persisted.
func waitViewsPersisted(ctx context.Context, cfg Config, l *layout, h *hubProcess, sc *ScaleSummary) error {
	cfg.progress("waiting for the hub to persist every member's view in the home cluster")
	// The hub writes them one at a time through its home client (at the
	// client's rate limit): allow a second per member beyond 3 minutes.
	wait := 3*time.Minute + time.Duration(len(l.memberIDs))*time.Second
	deadline := time.Now().Add(wait)
	lastReport := time.Now()
	for {
		n, err := h.persistedViews(ctx)
		if err != nil {
			return err
		}
		sc.ViewsPersisted = n
		if n >= len(l.memberIDs) {
			return nil
		}
		if time.Since(lastReport) > 2*time.Second {
			cfg.progress("%d/%d member views persisted", n, len(l.memberIDs))
			lastReport = time.Now()
		}
		if time.Now().After(deadline) {
			cfg.progress("only %d of %d member views persisted after %s; going on", n, len(l.memberIDs), wait)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// measureIdle records the hub's CPU and log growth over cfg.IdleWindow.
// It returns the hub's process figures at the window's end and the
// window's length in seconds.
func measureIdle(ctx context.Context, cfg Config, h *hubProcess, sc *ScaleSummary) (ProcStats, float64, error) {
	cfg.progress("measuring the hub's idle CPU over %s", cfg.IdleWindow)
	logBefore := fileSize(h.logPath)
	cpu0, err := procStats(h.pid())
	if err != nil {
		return ProcStats{}, 0, fmt.Errorf("reading the hub's /proc: %w", err)
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return ProcStats{}, 0, ctx.Err()
	case <-time.After(cfg.IdleWindow):
	}
	cpu1, err := procStats(h.pid())
	if err != nil {
		return ProcStats{}, 0, fmt.Errorf("reading the hub's /proc: %w", err)
	}
	window := time.Since(t0).Seconds()
	sc.Idle = IdleStats{WindowSeconds: math.Round(window*100) / 100, CPUSeconds: cpu1.CPUSeconds - cpu0.CPUSeconds, LogBytes: fileSize(h.logPath) - logBefore}
	if window > 0 {
		sc.Idle.CPUPercent = math.Round(sc.Idle.CPUSeconds/window*1000) / 10
	}
	return cpu1, window, nil
}

// measureMemory records the hub's memory at rest: its RSS and threads
// (from st, its process figures), live heap, goroutines and open files,
// per member and per endpoint where that says something, and a heap
// profile.
func measureMemory(ctx context.Context, cfg Config, l *layout, h *hubProcess, work string, st ProcStats, sc *ScaleSummary) error {
	m := &sc.Memory
	m.SteadyRSSMiB, m.PeakRSSMiB, m.Threads = st.RSSMiB, st.PeakRSSMiB, st.Threads
	heap, err := h.heapNow(ctx)
	if err != nil {
		return err
	}
	m.LiveHeapMiB, m.HeapInuseMiB = heap.liveMiB, math.Round(heap.inuseMiB*10)/10
	metrics, err := h.metrics(ctx)
	if err != nil {
		return err
	}
	members := float64(len(l.memberIDs))
	m.Goroutines = metrics.Goroutines
	m.GoroutinesPerMember = math.Round(metrics.Goroutines/members*10) / 10
	m.RSSPerMemberKiB = math.Round(m.SteadyRSSMiB*1024/members*10) / 10
	m.LiveHeapPerMemberKiB = math.Round(float64(m.LiveHeapMiB)*1024/members*10) / 10
	if cfg.Endpoints > 0 {
		m.LiveHeapPerEndpointBytes = math.Round(float64(m.LiveHeapMiB) * (1 << 20) / float64(cfg.Endpoints))
	}
	m.OpenFiles, m.Sockets = openFiles(h.pid())
	m.HeapProfile, m.HeapProfileNote = h.heapProfile(ctx, cfg, work)
	return nil
}

// persistedViews counts the members whose view the hub has written into
// the home cluster (hub_member_view_writes_total ≥ 1).
func (h *hubProcess) persistedViews(ctx context.Context) (int, error) {
	body, err := h.get(ctx, "/metrics")
	if err != nil {
		return 0, err
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "hub_member_view_writes_total{") || label(line, "cluster") == homeID {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil && v >= 1 {
			n++
		}
	}
	return n, sc.Err()
}

// metricSum is the sum of a metric's series in the hub's /metrics.
func (h *hubProcess) metricSum(ctx context.Context, name string) (float64, error) {
	body, err := h.get(ctx, "/metrics")
	if err != nil {
		return 0, err
	}
	total := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' || !(strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ")) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
		}
	}
	return total, nil
}

// countLogLines counts the lines of a log that contain s.
func countLogLines(path, s string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			n++
		}
	}
	return n
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// openFiles counts a process's open file descriptors and, of them, sockets.
func openFiles(pid int) (files, sockets int) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0
	}
	for _, e := range entries {
		files++
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(target, "socket:") {
			sockets++
		}
	}
	return files, sockets
}

// heapProfile saves the hub's heap profile into the work directory if the
// hub serves one (/debug/pprof/heap on its admin port); otherwise it says
// why there is none.
func (h *hubProcess) heapProfile(ctx context.Context, cfg Config, work string) (path, note string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.adminURL+"/debug/pprof/heap", nil)
	if err != nil {
		return "", err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := noRedirects(h.http).Do(req)
	if err != nil {
		return "", "GET /debug/pprof/heap: " + err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", "GET /debug/pprof/heap: " + err.Error()
	}
	if resp.StatusCode != http.StatusOK || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		return "", fmt.Sprintf("the hub serves no heap profile (GET /debug/pprof/heap on its admin port: %s)", resp.Status)
	}
	if cfg.WorkDir == "" {
		return "", fmt.Sprintf("the hub served a heap profile (%d bytes); pass --work-dir to keep it", len(body))
	}
	path = filepath.Join(work, "hub-heap.pprof")
	if err := os.WriteFile(path, body, 0o644); err != nil {
		return "", err.Error()
	}
	return path, ""
}

func noRedirects(c *http.Client) *http.Client {
	return &http.Client{Timeout: c.Timeout, Transport: c.Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// measureAPI times cfg.APISamples fetches of each REST path and dashboard
// page an operator of a large mesh opens: the clusters and services of the
// REST API (there is no overview route in /api/v1; the dashboard's
// overview reads the clusters, services and proxies) and the dashboard's
// overview and cluster list, signed in with the API token.
func measureAPI(ctx context.Context, cfg Config, h *hubProcess) ([]APITiming, error) {
	cookie, err := h.signIn(ctx)
	if err != nil {
		return nil, err
	}
	var out []APITiming
	for _, p := range []struct{ what, path, cookie string }{
		{"REST cluster list", "/api/v1/clusters", ""},
		{"REST services (the overview's data)", "/api/v1/services", ""},
		{"dashboard overview", "/", cookie},
		{"dashboard cluster list", "/clusters", cookie},
	} {
		t := APITiming{What: p.what, Path: p.path}
		var times []time.Duration
		for range cfg.APISamples {
			start := time.Now()
			n, err := h.fetch(ctx, p.path, p.cookie)
			if err != nil {
				return nil, err
			}
			times = append(times, time.Since(start))
			t.Bytes = n
		}
		t.Time = percentiles(times)
		out = append(out, t)
		cfg.progress("GET %s (%s, %d KiB): p50 %.1f ms, p99 %.1f ms over %d", p.path, p.what, t.Bytes>>10, t.Time.P50Ms, t.Time.P99Ms, t.Time.N)
	}
	return out, nil
}

// signIn signs in to the dashboard with the API token and returns the
// session cookie.
func (h *hubProcess) signIn(ctx context.Context) (string, error) {
	form := url.Values{"token": {h.token}, "next": {"/"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.adminURL+"/signin", strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := noRedirects(h.http).Do(req)
	if err != nil {
		return "", fmt.Errorf("signing in to the dashboard: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	for _, c := range resp.Cookies() {
		if c.Name == "hub_session" && c.Value != "" {
			return c.Name + "=" + c.Value, nil
		}
	}
	return "", fmt.Errorf("signing in to the dashboard: %s and no session cookie", resp.Status)
}

// fetch GETs a path, with the API token or, for the dashboard, a session
// cookie, and returns the size of the body; anything but 200 is an error.
func (h *hubProcess) fetch(ctx context.Context, path, cookie string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.adminURL+path, nil)
	if err != nil {
		return 0, err
	}
	if cookie != "" {
		req.Header.Set("Cookie", cookie)
	} else {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	resp, err := noRedirects(h.http).Do(req)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return int(n), nil
}

// measureShape measures one more shape of the scale mode: --streams new
// streams of that shape connect, then --writes writes, each timed at the
// streams that watch the written service.
func measureShape(ctx context.Context, cfg Config, shape string, l *layout, clients []kubernetes.Interface, h *hubProcess) (ShapeResult, error) {
	c, err := cfg.forShape(shape)
	if err != nil {
		return ShapeResult{}, err
	}
	r := ShapeResult{Shape: shape, Streams: c.Streams, Writes: c.Writes}
	l.assignWatchers(c)
	if err := waitNoStreams(ctx, h); err != nil { // those of the shape before
		return r, err
	}
	heapBefore, err := h.heapNow(ctx)
	if err != nil {
		return r, err
	}
	f := newFleet(ctx, h.xdsAddr, c, l)
	defer f.close()
	c.progress("%s shape: opening %d streams, %s", shape, c.Streams, c.shapeText())
	start := time.Now()
	if err := f.connect(c.ConnectConcurrency, c.ConnectTimeout, c.progress); err != nil {
		if e := h.exited(); e != nil {
			return r, e
		}
		return r, fmt.Errorf("%s shape: %w", shape, err)
	}
	r.ColdConnectSeconds = time.Since(start).Seconds()
	var per []time.Duration
	for _, s := range f.streams {
		per = append(per, time.Unix(0, s.readyAt.Load()).Sub(s.dialAt))
	}
	r.StreamConnect = percentiles(per)
	if err := waitCDS(ctx, f, c.ConnectTimeout); err != nil {
		return r, fmt.Errorf("%s shape: %w", shape, err)
	}
	r.ConnectResponses, _ = f.totals()
	c.progress("%s shape: all %d streams hold their config after %.2fs", shape, c.Streams, r.ColdConnectSeconds)
	heapAfter, err := h.heapNow(ctx)
	if err != nil {
		return r, err
	}
	r.HeapPerStreamKiB = heapPerStream(heapBefore, heapAfter, c.Streams).LivePerStreamKiB
	cpu0, err := procStats(h.pid())
	if err != nil {
		return r, fmt.Errorf("reading the hub's /proc: %w", err)
	}
	var scratch Summary
	if err := measureWrites(ctx, c, l, clients, f, h, &scratch); err != nil {
		return r, fmt.Errorf("%s shape: %w", shape, err)
	}
	cpu1, err := procStats(h.pid())
	if err != nil {
		return r, fmt.Errorf("reading the hub's /proc: %w", err)
	}
	r.Convergence = scratch.Convergence
	for _, w := range scratch.Writes {
		r.Unreached += w.Watchers - w.Reached
	}
	_, r.Resends = f.totals()
	if c.Writes > 0 {
		r.HubCPUPerWriteMs = math.Round((cpu1.CPUSeconds-cpu0.CPUSeconds)/float64(c.Writes)*1e4) / 10
	}
	r.RSSMiB, r.PeakRSSMiB = cpu1.RSSMiB, cpu1.PeakRSSMiB
	c.progress("%s shape: convergence p50 %.1f ms, p99 %.1f ms over %d (write, stream) pairs", shape, r.Convergence.P50Ms, r.Convergence.P99Ms, r.Convergence.N)
	return r, nil
}

// waitNoStreams waits (up to 30 s) until the hub has seen every stream
// we closed end (hub_xds_connected_streams 0).
func waitNoStreams(ctx context.Context, h *hubProcess) error {
	for deadline := time.Now().Add(30 * time.Second); ; {
		m, err := h.metrics(ctx)
		if err != nil {
			return err
		}
		if m.Streams == 0 || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// measureRestart stops the hub (SIGTERM) and starts it again with the same
// arguments and home cluster, then times it to every member Ready. It
// returns the running hub: the new one, or the old one (stopped) when the
// new one did not start.
func measureRestart(ctx context.Context, cfg Config, l *layout, h *hubProcess, sc *ScaleSummary) (*hubProcess, error) {
	if err := waitNoStreams(ctx, h); err != nil {
		return h, err
	}
	cfg.progress("restarting the hub (SIGTERM, then the same command again)")
	t0 := time.Now()
	h.stop()
	sc.Restart.StopSeconds = math.Round(time.Since(t0).Seconds()*100) / 100
	start := time.Now()
	n, err := h.restart(ctx, strings.TrimSuffix(h.logPath, ".log")+"-restart.log")
	if err != nil {
		return h, fmt.Errorf("restarting the hub: %w", err)
	}
	if sc.Restart.Timeline, err = readyTimeline(ctx, n, cfg, l, start); err != nil {
		return n, fmt.Errorf("after the restart: %w", err)
	}
	tl := sc.Restart.Timeline
	cfg.progress("restarted hub: all members listed after %.1fs (%v), all serving their services after %.1fs, all Ready after %.1fs",
		tl.AllListedSeconds, tl.ListedStates, tl.AllServingSeconds, tl.AllReadySeconds)
	if sc.Restart.ViewsRejected, err = n.metricSum(ctx, "hub_member_view_rejected_total"); err != nil {
		return n, err
	}
	sc.Restart.RestoredViews = countLogLines(n.logPath, "serving the persisted view until the member syncs")
	st, err := procStats(n.pid())
	if err != nil {
		return n, fmt.Errorf("reading the hub's /proc: %w", err)
	}
	sc.Restart.RSSMiB, sc.Restart.PeakRSSMiB = st.RSSMiB, st.PeakRSSMiB
	return n, nil
}

// problems are the scale mode's correctness failures.
func (sc *ScaleSummary) problems() []string {
	var out []string
	for _, r := range sc.Shapes {
		if r.Unreached > 0 {
			out = append(out, fmt.Sprintf("%s shape: %d (write, watching stream) pairs never saw the write", r.Shape, r.Unreached))
		}
		if r.Resends > 0 {
			out = append(out, fmt.Sprintf("%s shape: %d responses were resent although no stream ever NACKed", r.Shape, r.Resends))
		}
	}
	if sc.Restart.ViewsRejected > 0 {
		out = append(out, fmt.Sprintf("the restarted hub refused %v persisted member views (hub_member_view_rejected_total)", sc.Restart.ViewsRejected))
	}
	return out
}

// writeText prints the scale mode's figures; main is the run's own shape.
func (sc *ScaleSummary) writeText(p func(string, ...any), s *Summary) {
	c := s.Config
	teams := (c.Members + c.APIServers - 1) / c.APIServers
	p("")
	p("scale:    %d member IDs over %d API servers (%s; up to %d IDs each), each ID with its own remote Secret, client certificate and namespace (team-000…%s),",
		c.Members, c.APIServers, strings.Join(abbreviate(sc.APIServers, 4), " "), sc.MembersPerAPIServer, teamNamespace(teams-1))
	p("          %d services × %d endpoints per member: %d Services and EndpointSlices, %d endpoints; %d hostnames, each in up to %d members; registered in %.1fs",
		c.ServicesPerMember, c.EndpointsPerService, c.Members*c.ServicesPerMember, c.Endpoints, c.Services, c.APIServers, sc.SecretsSeconds)
	scoped := "NOT honoured (the hub watches every namespace of a member's API server)"
	switch {
	case c.Unscoped:
		scoped = "not set (--watch-scope=false: every member watches every namespace of its API server)"
	case sc.WatchScoped:
		scoped = "honoured"
	}
	p("  watch-namespaces          %s: services have endpoints in %d–%d members (want %d); members' watch scope %v; objects per member ≤ %v",
		scoped, sc.MembersPerService.Min, sc.MembersPerService.Max, c.APIServers, sc.WatchScopes, sc.ObjectsPerMember)
	tl := sc.Start
	p("  start → all Ready         %8.1f s    (%d members; Ready by 15 s: %d, by 30 s: %d, by 60 s: %d; per member p50 %.1f s, p99 %.1f s; all serving their services after %.1f s)",
		tl.AllReadySeconds, c.Members, tl.ReadyBy15s, tl.ReadyBy30s, tl.ReadyBy60s, tl.MemberReady.P50Ms/1000, tl.MemberReady.P99Ms/1000, tl.AllServingSeconds)
	p("  views persisted           %8d      (of %d, %.1f s after all were synced)", sc.ViewsPersisted, c.Members, sc.ViewsPersistedSeconds)
	p("  idle CPU                  %8.1f %%    of one core over %.0f s with nothing changing and no stream (%.2f s CPU; the hub logged %d bytes meanwhile, %d KiB in all by the time every member was Ready)",
		sc.Idle.CPUPercent, sc.Idle.WindowSeconds, sc.Idle.CPUSeconds, sc.Idle.LogBytes, sc.HubLogBytesAtReady>>10)
	m := sc.Memory
	p("  RSS steady / peak         %8.0f / %.0f MiB (%.0f KiB per member)", m.SteadyRSSMiB, m.PeakRSSMiB, m.RSSPerMemberKiB)
	p("  live heap                 %8d MiB  (%.0f KiB per member, %.0f bytes per endpoint; heap in use %.0f MiB)", m.LiveHeapMiB, m.LiveHeapPerMemberKiB, m.LiveHeapPerEndpointBytes, m.HeapInuseMiB)
	p("  goroutines                %8.0f      (%.1f per member; %d threads, %d open files of which %d sockets)", m.Goroutines, m.GoroutinesPerMember, m.Threads, m.OpenFiles, m.Sockets)
	if m.HeapProfile != "" {
		p("  heap profile              %s", m.HeapProfile)
	} else {
		p("  heap profile              none: %s", m.HeapProfileNote)
	}
	p("  responses (%d fetches each, with the %s streams connected):", c.APISamples, s.Shape)
	for _, a := range sc.API {
		p("    GET %-22s p50 %7.1f ms, p99 %7.1f ms, max %7.1f ms  (%s, %d KiB)", a.Path, a.Time.P50Ms, a.Time.P99Ms, a.Time.MaxMs, a.What, a.Bytes>>10)
	}
	p("  one write → streams:")
	p("    shape   streams  cold connect   p50 ms   p99 ms   max ms   pairs   hub CPU/write   heap/stream")
	p("    %-6s  %7d  %10.2f s  %7.1f  %7.1f  %7.1f  %6d  %11.1f ms  %8.1f KiB", s.Shape, c.Streams, s.ColdConnectSeconds, s.Convergence.P50Ms, s.Convergence.P99Ms, s.Convergence.MaxMs, s.Convergence.N, s.HubCPUPerWriteMs, s.Heap.LivePerStreamKiB)
	for _, r := range sc.Shapes {
		p("    %-6s  %7d  %10.2f s  %7.1f  %7.1f  %7.1f  %6d  %11.1f ms  %8.1f KiB", r.Shape, r.Streams, r.ColdConnectSeconds, r.Convergence.P50Ms, r.Convergence.P99Ms, r.Convergence.MaxMs, r.Convergence.N, r.HubCPUPerWriteMs, r.HeapPerStreamKiB)
	}
	rs := sc.Restart
	rt := rs.Timeline
	p("  restart → all Ready       %8.1f s    (stopped in %.1f s; %d members served from their persisted views, %v refused; all listed after %.1f s as %v; all serving their services after %.1f s; Ready by 15 s: %d, 30 s: %d, 60 s: %d; per member p50 %.1f s, p99 %.1f s; RSS %.0f MiB, peak %.0f)",
		rt.AllReadySeconds, rs.StopSeconds, rs.RestoredViews, rs.ViewsRejected, rt.AllListedSeconds, rt.ListedStates, rt.AllServingSeconds,
		rt.ReadyBy15s, rt.ReadyBy30s, rt.ReadyBy60s, rt.MemberReady.P50Ms/1000, rt.MemberReady.P99Ms/1000, rs.RSSMiB, rs.PeakRSSMiB)
	if sc.RestartHubLog != "" {
		p("  restarted hub's log       %s", sc.RestartHubLog)
	}
}

// abbreviate keeps the first and last n/2 names of a long list.
func abbreviate(names []string, n int) []string {
	if len(names) <= n {
		return names
	}
	return append(append(slices.Clone(names[:n/2]), "…"), names[len(names)-n/2:]...)
}
