package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/hubproc"
	"github.com/hubmesh/hub/internal/istiod"
	"golang.org/x/sys/unix"
)

// hubProcess is the real hub binary running as our child (proc), or with
// --peer istiod the real istiod standing in its place (peer).
type hubProcess struct {
	peer     *istiod.Process
	proc     *hubproc.Process
	logPath  string
	adminURL string
	xdsAddr  string
	token    string
	http     *http.Client
}

// buildHub builds ./cmd/hub into dir and returns the binary's path and
// the source it was built from.
func buildHub(ctx context.Context, dir string) (string, string, error) {
	bin := filepath.Join(dir, "hub")
	// What the build saw: HEAD and any uncommitted changes under the
	// directories that make up the binary (others may be editing them).
	desc := "unknown revision (git unavailable)"
	if rev, err := exec.CommandContext(ctx, "git", "log", "-1", "--format=%h %cI").Output(); err == nil {
		desc = strings.TrimSpace(string(rev))
		if st, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--", "hub", "clusters", "api", "trust", "web", "cmd/hub", "internal").Output(); err == nil {
			if n := len(strings.Fields(strings.TrimSpace(string(st)))) / 2; n > 0 {
				desc += fmt.Sprintf(" + %d uncommitted paths under hub/ clusters/ api/ trust/ web/ cmd/hub/ internal/", n)
			}
		}
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/hubmesh/hub/cmd/hub")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("building the hub binary (go build github.com/hubmesh/hub/cmd/hub; run from inside the module or pass --hub-bin): %w\n%s", err, out.String())
	}
	return bin, desc, nil
}

// hubBuild describes a hub binary from its embedded build information:
// the VCS revision and time, and whether the working tree was modified.
func hubBuild(bin string) string {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	rev := settings["vcs.revision"]
	if rev == "" {
		return info.GoVersion + ", no VCS information"
	}
	out := rev[:min(len(rev), 12)] + " (" + settings["vcs.time"] + ")"
	if settings["vcs.modified"] == "true" {
		out += " + uncommitted changes"
	}
	return out + ", " + info.GoVersion
}

// startHub runs `hub serve` against the home cluster with every listener on
// a free loopback port and waits for its "hub listening" log line.
func startHub(ctx context.Context, bin, dir string, homeKubeconfig []byte, extra, env []string) (*hubProcess, error) {
	kubeconfig := filepath.Join(dir, "home.kubeconfig")
	if err := os.WriteFile(kubeconfig, homeKubeconfig, 0o600); err != nil {
		return nil, err
	}
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, err
	}
	tokenFile := filepath.Join(dir, "api-tokens")
	token := hex.EncodeToString(tok[:])
	if err := os.WriteFile(tokenFile, []byte(token+",hubbench,write\n"), 0o600); err != nil {
		return nil, err
	}
	proc, err := hubproc.Start(hubproc.Options{
		Bin: bin, Env: withGCTrace(append(os.Environ(), env...)), LogPath: filepath.Join(dir, "hub.log"),
		Args: append([]string{"serve",
			"--kubeconfig", kubeconfig, "--cluster-id", homeID, "--namespace", hubNamespace, "--remote-secrets-namespace", hubNamespace,
			"--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
			"--xds-tls-addr", "", "--bundle-addr", "",
			"--api-token-file", tokenFile,
		}, extra...),
	})
	if err != nil {
		return nil, err
	}
	return listened(ctx, proc, token)
}

// restart starts a stopped hub again, with the same binary, arguments
// (home kubeconfig, namespace, API token file), and environment, logging
// into logPath: it restores what it persisted in the home cluster as any
// restarted hub does. Its listeners get new ports.
func (h *hubProcess) restart(ctx context.Context, logPath string) (*hubProcess, error) {
	proc, err := h.proc.Restart(logPath)
	if err != nil {
		return nil, err
	}
	return listened(ctx, proc, h.token)
}

// listened waits up to two minutes for proc's admin and xDS listeners.
func listened(ctx context.Context, proc *hubproc.Process, token string) (*hubProcess, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	addrs, err := proc.Listening(ctx)
	if err == nil && (addrs["admin"] == "" || addrs["xds"] == "") {
		err = fmt.Errorf("the hub's \"hub listening\" line lacks admin or xds: %v", addrs)
	}
	if err != nil {
		_ = proc.Stop(15 * time.Second)
		return nil, err
	}
	return &hubProcess{
		proc: proc, logPath: proc.LogPath(), token: token, http: &http.Client{Timeout: 30 * time.Second},
		adminURL: "http://" + addrs["admin"], xdsAddr: addrs["xds"],
	}, nil
}

// withGCTrace adds gctrace=1 to GODEBUG (the last GODEBUG of env wins, as
// in exec), so that the hub's log has the live heap after every GC
// (liveHeap).
func withGCTrace(env []string) []string {
	godebug := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			godebug = v
		}
	}
	if godebug != "" {
		godebug += ","
	}
	return append(env, "GODEBUG="+godebug+"gctrace=1")
}

// gcLine is one GODEBUG=gctrace=1 line: "gc 12 @3.210s 2%: ... 40->41->20 MB,
// 42 MB goal, ...": the GC's number and the heap it found live, in MB
// (2^20 bytes; the runtime prints whole MB).
var gcLine = regexp.MustCompile(`^gc (\d+) @.* \d+->\d+->(\d+) MB`)

// lastGC is the number and live heap (MiB) of the last GC in the hub's log.
func (h *hubProcess) lastGC() (num, liveMiB int, err error) {
	f, err := os.Open(h.logPath)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		if m := gcLine.FindSubmatch(sc.Bytes()); m != nil {
			num, _ = strconv.Atoi(string(m[1]))
			liveMiB, _ = strconv.Atoi(string(m[2]))
		}
	}
	return num, liveMiB, sc.Err()
}

// liveHeap is the hub's live heap (MiB) as found by a GC that ends after
// the call: the hub has no endpoint that forces one, so we make it
// allocate by reading its API until the runtime collects (bounded by
// timeout).
func (h *hubProcess) liveHeap(ctx context.Context, timeout time.Duration) (int, error) {
	first, _, err := h.lastGC()
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(timeout)
	paths := []string{"/api/v1/proxies", "/api/v1/services", "/metrics"}
	if h.peer != nil {
		paths = []string{"/debug/syncz", "/debug/registryz", "/metrics"}
	}
	for i := 0; ; i++ {
		if _, err := h.get(ctx, paths[i%len(paths)]); err != nil {
			return 0, err
		}
		if i%10 != 9 {
			continue
		}
		num, live, err := h.lastGC()
		if err != nil {
			return 0, err
		}
		// A GC that ends after the call marked what the hub holds now.
		if num > first {
			return live, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the hub ran no GC within %s of reading its API (GODEBUG gctrace lines in %s)", timeout, h.logPath)
		}
	}
}

func (h *hubProcess) pid() int {
	if h.peer != nil {
		return h.peer.PID()
	}
	return h.proc.PID()
}

func (h *hubProcess) exited() error {
	if h.peer != nil {
		if err := h.peer.Exited(); err != nil {
			return fmt.Errorf("%w; log tail:\n%s", err, h.tail(30))
		}
		return nil
	}
	return h.proc.Exited()
}

// stop sends SIGTERM, then SIGKILL after 15 s, and waits.
func (h *hubProcess) stop() {
	if h.peer != nil {
		h.peer.Stop()
		return
	}
	_ = h.proc.Stop(15 * time.Second)
}

// tail returns the last n lines of the hub's (or istiod's) log.
func (h *hubProcess) tail(n int) string {
	data, err := os.ReadFile(h.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (h *hubProcess) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.adminURL+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := h.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(body))
	}
	return body, nil
}

func (h *hubProcess) clusters(ctx context.Context) ([]api.Cluster, error) {
	body, err := h.get(ctx, "/api/v1/clusters")
	if err != nil {
		return nil, err
	}
	var list api.List[api.Cluster]
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decoding /api/v1/clusters: %w", err)
	}
	return list.Items, nil
}

func (h *hubProcess) services(ctx context.Context) ([]api.Service, error) {
	body, err := h.get(ctx, "/api/v1/services")
	if err != nil {
		return nil, err
	}
	var list api.List[api.Service]
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decoding /api/v1/services: %w", err)
	}
	return list.Items, nil
}

// hubMetrics are the hub's own xDS counters and Go runtime gauges from
// /metrics (sizes in MiB).
type hubMetrics struct {
	Responses     map[string]float64 `json:"responses"` // hub_xds_responses_total by type
	Pushes        map[string]float64 `json:"pushes"`    // hub_xds_pushes_total by trigger
	Nacks         float64            `json:"nacks"`     // hub_xds_nacks_total, all types
	Streams       float64            `json:"streams"`   // hub_xds_connected_streams
	Goroutines    float64            `json:"goroutines"`
	HeapInuseMiB  float64            `json:"heapInuseMiB"`  // go_memstats_heap_inuse_bytes
	StackInuseMiB float64            `json:"stackInuseMiB"` // go_memstats_stack_inuse_bytes
	NextGCMiB     float64            `json:"nextGCMiB"`     // go_memstats_next_gc_bytes: the heap goal
	GoSysMiB      float64            `json:"goSysMiB"`      // go_memstats_sys_bytes: all memory the runtime holds
	GCs           float64            `json:"gcs"`           // go_gc_duration_seconds_count
	// EDSPushLatency is hub_xds_push_latency_seconds for
	// ClusterLoadAssignment: the hub's own share of a write's time, from
	// the member's change reaching the index to the response handed to
	// the stream.
	EDSPushLatency histogram `json:"edsPushLatency"`
}

// histogram is one Prometheus histogram series: cumulative counts by
// upper bound (seconds), with its sum and count.
type histogram struct {
	Buckets map[string]float64 `json:"buckets,omitempty"` // le → cumulative count
	Sum     float64            `json:"sum"`
	Count   float64            `json:"count"`
}

// since returns h minus an earlier reading of the same series.
func (h histogram) since(before histogram) histogram {
	d := histogram{Buckets: map[string]float64{}, Sum: h.Sum - before.Sum, Count: h.Count - before.Count}
	for le, n := range h.Buckets {
		d.Buckets[le] = n - before.Buckets[le]
	}
	return d
}

// quantile returns the upper bound (ms) of the bucket that holds the q
// quantile; -1 when that is +Inf or the histogram is empty.
func (h histogram) quantile(q float64) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for le, n := range h.Buckets {
		v, err := strconv.ParseFloat(le, 64)
		if err != nil {
			v = math.Inf(1)
		}
		bs = append(bs, bucket{v, n})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	for _, b := range bs {
		if b.n >= q*h.Count {
			if math.IsInf(b.le, 1) {
				return -1
			}
			return b.le * 1000
		}
	}
	return -1
}

func (m hubMetrics) total() float64 {
	t := 0.0
	for _, v := range m.Responses {
		t += v
	}
	return t
}

// metrics scrapes the hub's Prometheus text exposition for its xDS series.
func (h *hubProcess) metrics(ctx context.Context) (hubMetrics, error) {
	body, err := h.get(ctx, "/metrics")
	if err != nil {
		return hubMetrics{}, err
	}
	m := hubMetrics{Responses: map[string]float64{}, Pushes: map[string]float64{},
		EDSPushLatency: histogram{Buckets: map[string]float64{}}}
	const eds = `type="ClusterLoadAssignment"`
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		series, value := line[:i], line[i+1:]
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(series, "pilot_xds_pushes{"): // istiod (--peer)
			m.Responses[istiodPushType(label(series, "type"))] += v
		case strings.HasPrefix(series, "pilot_total_xds_rejects{"):
			m.Nacks += v
		case series == "pilot_xds" || strings.HasPrefix(series, "pilot_xds{"):
			m.Streams += v
		case strings.HasPrefix(series, "hub_xds_responses_total{"):
			m.Responses[label(series, "type")] += v
		case strings.HasPrefix(series, "hub_xds_pushes_total{"):
			m.Pushes[label(series, "trigger")] += v
		case strings.HasPrefix(series, "hub_xds_nacks_total{"):
			m.Nacks += v
		case series == "hub_xds_connected_streams":
			m.Streams = v
		case strings.HasPrefix(series, "hub_xds_push_latency_seconds_bucket{") && strings.Contains(series, eds):
			m.EDSPushLatency.Buckets[label(series, "le")] = v
		case strings.HasPrefix(series, "hub_xds_push_latency_seconds_sum{") && strings.Contains(series, eds):
			m.EDSPushLatency.Sum = v
		case strings.HasPrefix(series, "hub_xds_push_latency_seconds_count{") && strings.Contains(series, eds):
			m.EDSPushLatency.Count = v
		case series == "go_goroutines":
			m.Goroutines = v
		case series == "go_memstats_heap_inuse_bytes":
			m.HeapInuseMiB = v / (1 << 20)
		case series == "go_memstats_stack_inuse_bytes":
			m.StackInuseMiB = v / (1 << 20)
		case series == "go_memstats_next_gc_bytes":
			m.NextGCMiB = v / (1 << 20)
		case series == "go_memstats_sys_bytes":
			m.GoSysMiB = v / (1 << 20)
		case series == "go_gc_duration_seconds_count":
			m.GCs = v
		}
	}
	return m, nil
}

// istiodPushType names istiod's pilot_xds_pushes type label as the hub's
// hub_xds_responses_total does ("cds" → "Cluster"); send errors
// ("cds_senderr") and other types keep istiod's name.
func istiodPushType(t string) string {
	switch t {
	case "cds":
		return "Cluster"
	case "eds":
		return "ClusterLoadAssignment"
	case "lds":
		return "Listener"
	case "rds":
		return "RouteConfiguration"
	case "sds":
		return "Secret"
	}
	return t
}

// label returns a label's value from a series like name{a="x",b="y"}.
func label(series, name string) string {
	_, rest, ok := strings.Cut(series, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// ProcStats are a process's memory and CPU from /proc.
type ProcStats struct {
	RSSMiB     float64 `json:"rssMiB"`
	PeakRSSMiB float64 `json:"peakRssMiB"`
	CPUSeconds float64 `json:"cpuSeconds"` // on CPU since start: the process CPU clock, else utime + stime
	Threads    int     `json:"threads"`
}

// clockTicks is USER_HZ, the unit of utime/stime in /proc/<pid>/stat; it
// is 100 on every Linux architecture Go supports.
const clockTicks = 100

func procStats(pid int) (ProcStats, error) {
	var st ProcStats
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(val)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseFloat(f[0], 64)
		switch key {
		case "VmRSS":
			st.RSSMiB = n / 1024 // kB
		case "VmHWM":
			st.PeakRSSMiB = n / 1024
		case "Threads":
			st.Threads = int(n)
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	// Fields after the command name (which may hold spaces) in parentheses:
	// state is field 3, utime 14 and stime 15.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return st, fmt.Errorf("parsing /proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return st, fmt.Errorf("parsing /proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return st, fmt.Errorf("parsing /proc/%d/stat utime/stime %q %q", pid, f[11], f[12])
	}
	st.CPUSeconds = (utime + stime) / clockTicks
	if cpu, ok := processCPU(pid); ok {
		st.CPUSeconds = cpu.Seconds()
	}
	return st, nil
}

// processCPU reads pid's process CPU clock (clock_gettime of
// MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)): the nanoseconds all its
// threads ran, exited ones included, where utime and stime count 10 ms
// ticks; false when the kernel refuses it.
func processCPU(pid int) (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(^int32(pid)<<3|2, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
