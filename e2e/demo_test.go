package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/chromium"
)

// demoRun is a running demo (cmd/hubdemo) and what it printed.
type demoRun struct {
	cmd     *exec.Cmd
	done    chan struct{}
	exitErr error

	mu      sync.Mutex
	banner  []string                  // every line before the first traffic line
	traffic chan map[string]trafficOf // parsed traffic lines, newest dropped when unread
}

// trafficOf is one client's part of a demo traffic line.
type trafficOf struct {
	calls, errors, mtlsPct int
	share                  map[string]int // member → % of successful calls
}

var (
	trafficClientRE = regexp.MustCompile(`client (\S+):((?: \S+ \d+%)*) \((\d+) calls/s, (\d+) errors(?:, (\d+)% mTLS)?`)
	trafficShareRE  = regexp.MustCompile(`(\S+) (\d+)%`)
)

// parseTraffic parses a demo traffic line into each client's figures.
func parseTraffic(line string) map[string]trafficOf {
	out := map[string]trafficOf{}
	for _, m := range trafficClientRE.FindAllStringSubmatch(line, -1) {
		tr := trafficOf{share: map[string]int{}}
		tr.calls, _ = strconv.Atoi(m[3])
		tr.errors, _ = strconv.Atoi(m[4])
		tr.mtlsPct, _ = strconv.Atoi(m[5])
		for _, s := range trafficShareRE.FindAllStringSubmatch(m[2], -1) {
			tr.share[s[1]], _ = strconv.Atoi(s[2])
		}
		out[m[1]] = tr
	}
	return out
}

// reached is the members with a share of a client's calls.
func (tr trafficOf) reached() []string {
	var ms []string
	for m, pct := range tr.share {
		if pct > 0 {
			ms = append(ms, m)
		}
	}
	return ms
}

// bannerValue returns the rest of the first banner line starting with
// prefix (after trimming), e.g. "dashboard:".
func (d *demoRun) bannerValue(t *testing.T, prefix string) string {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range d.banner {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), prefix); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("the demo printed no line %q:\n%s", prefix, strings.Join(d.banner, "\n"))
	return ""
}

// nextTraffic returns the next traffic line the demo prints.
func (d *demoRun) nextTraffic(t *testing.T, timeout time.Duration) map[string]trafficOf {
	t.Helper()
	select {
	case tr, ok := <-d.traffic:
		if !ok {
			<-d.done // exitErr is set before done closes
			t.Fatalf("the demo exited (%v)", d.exitErr)
		}
		return tr
	case <-time.After(timeout):
		t.Fatalf("the demo printed no traffic line within %s", timeout)
		return nil
	}
}

// drainTraffic discards the traffic lines printed so far.
func (d *demoRun) drainTraffic() {
	for {
		select {
		case <-d.traffic:
		default:
			return
		}
	}
}

// TestDemo drives the demo itself, as a newcomer runs it (the real
// hubdemo binary running the real hub binary, its own three real clusters, its network namespace inside the
// test's, real Chromium): its grpc-go clients' calls succeed over mTLS, and
// so do its real Istio sidecars' (pilot-agent and Envoy configured by a
// real istiod in west and in east), each reaching the other network's
// members through that network's real Envoy gateway;
// east is on a network of its own (a network namespace the others reach
// only through its east-west gateway, and the other way round); the
// dashboard shows three members
// Ready and their workloads as connected proxies in the overview's
// picture; each client's calls stay in its own member (the demo's
// DestinationRule); freezing a member's API server (SIGSTOP) turns it
// Stale in the picture without a reload and moves its client's calls to
// the other members (demoted) while every call keeps succeeding; on
// SIGTERM the demo exits 0 and leaves no network namespace, hub, workload
// or API server behind.
func TestDemo(t *testing.T) {
	if os.Geteuid() != 0 {
		msg := "the demo's workloads need root for their network namespace; run through `make test`"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg + " (skipping outside CI; in CI this fails)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("the demo's workloads need iproute2: %v", err)
	}
	istiodBin(t) // the demo's sidecars need istiod, pilot-agent and Envoy
	pilotAgentBin(t)
	envoyBin(t)
	bctx := chromium.Start(t)
	dir := chromium.Artifacts(t)
	d := startDemo(t)

	// Traffic flows: every client's calls succeed over mTLS, and stay in
	// the client's own member (the demo's DestinationRule turns on
	// locality failover); the sidecars' calls cross networks.
	// (The sidecars start after their member's istiod and Envoy: minutes
	// on a loaded machine.)
	waitTraffic(t, d, 5*time.Minute, "every client's calls succeeding in its own member", func(tr map[string]trafficOf) error {
		return trafficStaysHome(tr, "")
	})

	adminURL := strings.TrimSuffix(d.bannerValue(t, "dashboard:"), "/")
	token, _, _ := strings.Cut(d.bannerValue(t, "admin token:"), " ")
	h := &hubProcess{adminURL: adminURL, token: token}
	eventually(t, 60*time.Second, func() error {
		cl := h.clusters(t)
		for _, id := range []string{"primary", "west", "east"} {
			if cl[id].State != "Ready" {
				return fmt.Errorf("member %s is %q; want Ready (%+v)", id, cl[id].State, cl)
			}
		}
		return nil
	})
	// Two networks: east alone on net-east, each with its gateway.
	eventually(t, 60*time.Second, func() error {
		cl := h.clusters(t)
		for id, nw := range demoNetworkOf {
			if c := cl[id]; c.Network != nw || len(c.Gateways) != 1 {
				return fmt.Errorf("member %s: network %q, gateways %v; want %s and its gateway", id, c.Network, c.Gateways, nw)
			}
		}
		return nil
	})
	var proxies api.List[api.Proxy]
	h.getJSON(t, "/api/v1/proxies", &proxies)
	// 4 backends and 3 clients, one stream each.
	if len(proxies.Items) < 7 {
		t.Errorf("%d proxies connected; want the demo's 4 backends and 3 clients", len(proxies.Items))
	}

	chromium.Do(t, bctx, "sign in", chromedp.Navigate(adminURL+"/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SetValue(chromedp.ID("token"), token), chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.CSS("#members-total")))
	chromium.WaitText(t, bctx, "#live-status", "Live", 10*time.Second)
	// The picture: three members Ready, each with its workloads as
	// connected proxyless gRPC proxies (west: 2 backends and a client).
	waitSelector(t, bctx, `svg#federation[data-members="3"]`, 30*time.Second)
	for id, n := range map[string]int{"primary": 2, "west": 3, "east": 2} {
		waitSelector(t, bctx, fmt.Sprintf(`svg#federation g.member[data-cluster=%q][data-state="Ready"]`, id), 60*time.Second)
		waitSelector(t, bctx, fmt.Sprintf(`svg#federation g.proxies[data-cluster=%q][data-count="%d"][data-grpc="%d"]`, id, n, n), 60*time.Second)
	}
	// The hub's CA certifies each sidecar (its own identity, demo/sidecar)
	// beside the members' proxyless workloads (demo/echo, demo/client).
	for id, n := range map[string]int{"primary": 2, "west": 3, "east": 3} {
		waitSelector(t, bctx, fmt.Sprintf(`svg#federation g.member[data-cluster=%q][data-certified="%d"]`, id, n), 60*time.Second)
	}
	// The picture draws the networks and their gateways.
	for id, nw := range demoNetworkOf {
		waitSelector(t, bctx, fmt.Sprintf(`svg#federation g.member[data-cluster=%q][data-network=%q][data-gateways="1"]`, id, nw), 30*time.Second)
	}
	waitSelector(t, bctx, `ul.fed-networks li.network[data-network="net-east"][data-members="1"]`, 10*time.Second)
	waitSelector(t, bctx, `ul.fed-networks li.network[data-network="net-main"][data-members="2"]`, 10*time.Second)
	chromium.Screenshot(t, bctx, dir, "01-overview-traffic")

	// Freeze east's API server: east turns Stale on the overview without
	// a reload, and the calls keep succeeding and reaching the members
	// (east's backends too: a Stale member keeps serving its endpoints).
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[int](`window.__noReload = 1`)); err != nil {
		t.Fatal(err)
	}
	eastPID := apiServerPID(t, d, "east")
	if err := syscall.Kill(eastPID, syscall.SIGSTOP); err != nil {
		t.Fatalf("freezing east's API server: %v", err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(eastPID, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	waitSelector(t, bctx, `svg#federation g.member[data-cluster="east"][data-state="Stale"]`, 90*time.Second)
	waitSelector(t, bctx, `svg#federation g.member[data-cluster="east"][data-demoted="true"]`, 30*time.Second)
	chromium.WaitText(t, bctx, "ul.states", "Stale 1", 10*time.Second)
	requireNoReload(t, bctx)
	if st := h.clusters(t)["east"].State; st != "Stale" {
		t.Errorf("the API says east is %q; want Stale", st)
	}
	chromium.Screenshot(t, bctx, dir, "02-overview-east-stale")
	// East is demoted: its client moves to the next priority, the members
	// of the other network, which its namespace reaches only through
	// net-main's east-west gateway; the others stay home; no call fails.
	d.drainTraffic()
	waitTraffic(t, d, time.Minute, "east's client moved off Stale east, the others at home", func(tr map[string]trafficOf) error {
		return trafficStaysHome(tr, "east")
	})
	for range 5 {
		if err := trafficStaysHome(d.nextTraffic(t, time.Minute), "east"); err != nil {
			t.Fatalf("with east Stale: %v", err)
		}
	}
	t.Logf("traffic with east Stale: %v", d.nextTraffic(t, time.Minute))
	chromium.Do(t, bctx, "open clusters", chromedp.Navigate(adminURL+"/clusters"), chromedp.WaitVisible(chromedp.CSS(`tr[data-cluster="east"]`)))
	chromium.WaitText(t, bctx, `tr[data-cluster="east"]`, "Stale", 10*time.Second)
	chromium.Screenshot(t, bctx, dir, "03-clusters-east-stale")
	resume()

	// SIGTERM: a clean exit, nothing left behind.
	pids := []int{apiServerPID(t, d, "primary"), apiServerPID(t, d, "west"), eastPID}
	netns := fmt.Sprintf("hub-demo-%d", d.cmd.Process.Pid)
	workDir := filepath.Dir(d.bannerValue(t, "hub log:"))
	if out, err := exec.Command("ip", "netns", "list").Output(); err != nil || !strings.Contains(string(out), netns) {
		t.Errorf("the demo's network namespace %s is not listed while it runs: %q %v", netns, out, err)
	}
	d.stop(t)
	if out, err := exec.Command("ip", "netns", "list").Output(); err != nil || strings.Contains(string(out), netns) {
		t.Errorf("after SIGTERM the network namespace %s is still there (or unreadable): %q %v", netns, out, err)
	}
	for _, pid := range pids {
		if running(pid) {
			t.Errorf("after SIGTERM API server process %d still runs", pid)
		}
	}
	if left := processesMentioning(workDir); len(left) > 0 {
		t.Errorf("after SIGTERM processes of the demo's hub or workloads still run: %v", left)
	}
	if _, err := os.Stat(workDir); !os.IsNotExist(err) {
		t.Errorf("after SIGTERM the demo's work directory %s is still there (%v)", workDir, err)
	}
	t.Logf("screenshots in %s", dir)
}

// waitSelector waits until an element matches sel, without reloading.
func waitSelector(t *testing.T, ctx context.Context, sel string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		found, err := chromedp.Run(tctx, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%q) !== null`, sel)))
		cancel()
		if err == nil && found {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("no element %s within %s", sel, timeout)
}

// trafficFlows checks that a traffic line has wantClients clients whose
// calls all succeeded over mTLS and reached at least minMembers members.
// waitTraffic waits for a traffic line that ok accepts.
func waitTraffic(t *testing.T, d *demoRun, timeout time.Duration, what string, ok func(map[string]trafficOf) error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	err := errors.New("no traffic line yet")
	for time.Now().Before(deadline) {
		tr := d.nextTraffic(t, time.Until(deadline)+10*time.Second)
		if err = ok(tr); err == nil {
			t.Logf("traffic, %s: %v", what, tr)
			return
		}
	}
	t.Fatalf("no traffic line within %s shows %s; the last: %v", timeout, what, err)
}

// demoNetworkOf is each demo member's network.
var demoNetworkOf = map[string]string{"primary": "net-main", "west": "net-main", "east": "net-east"}

// trafficStaysHome checks a traffic line of the demo's three proxyless
// clients and two sidecars: all calls succeed over mTLS; each proxyless
// client's calls all reach its own member (client "<member>-1"), but for
// the demoted member's client, whose calls reach none of its own member's
// backends and at least one other member; each sidecar ("<member>-sidecar",
// configured by its member's istiod, whose federated host has no locality
// rule) reaches a member of the other network, through that network's
// gateway.
func trafficStaysHome(tr map[string]trafficOf, demoted string) error {
	if err := trafficFlows(tr, 5, 1); err != nil {
		return err
	}
	for name, c := range tr {
		if member, ok := strings.CutSuffix(name, "-sidecar"); ok {
			crossed := false
			for _, m := range c.reached() {
				crossed = crossed || demoNetworkOf[m] != demoNetworkOf[member]
			}
			if !crossed {
				return fmt.Errorf("sidecar %s reached %v; want a member of another network too", name, c.share)
			}
			continue
		}
		home := strings.TrimSuffix(name, "-1")
		switch {
		case home == demoted && (c.share[home] > 0 || len(c.reached()) == 0):
			return fmt.Errorf("client %s of demoted %s reached %v; want only other members", name, home, c.share)
		case home != demoted && c.share[home] != 100:
			return fmt.Errorf("client %s reached %v; want only its own member %s", name, c.share, home)
		}
	}
	return nil
}

func trafficFlows(tr map[string]trafficOf, wantClients, minMembers int) error {
	if len(tr) != wantClients {
		return fmt.Errorf("%d clients reported; want %d: %v", len(tr), wantClients, tr)
	}
	for name, c := range tr {
		switch {
		case c.calls == 0 || c.errors > 0:
			return fmt.Errorf("client %s: %d calls, %d errors; want calls, none failing", name, c.calls, c.errors)
		case c.mtlsPct != 100:
			return fmt.Errorf("client %s: %d%% of its calls over mTLS; want all", name, c.mtlsPct)
		case len(c.reached()) < minMembers:
			return fmt.Errorf("client %s reached %v; want at least %d members", name, c.reached(), minMembers)
		}
	}
	return nil
}

// startDemo builds the demo and runs it on the hub binary with every
// listener on a free loopback port, and waits until it printed its banner.
func startDemo(t *testing.T) *demoRun {
	t.Helper()
	demoBin := filepath.Join(binsDir, "hubdemo")
	if out, err := exec.Command("go", "build", "-o", demoBin, "github.com/hubmesh/hub/cmd/hubdemo").CombinedOutput(); err != nil {
		t.Fatalf("building the demo: %v\n%s", err, out)
	}
	stderrPath := filepath.Join(t.TempDir(), "demo.stderr")
	stderr, err := os.Create(stderrPath)
	if err != nil {
		t.Fatal(err)
	}
	d := &demoRun{done: make(chan struct{}), traffic: make(chan map[string]trafficOf, 600)}
	d.cmd = exec.Command(demoBin, "--hub-bin", hubBin, "--admin-addr", "127.0.0.1:0", "--xds-addr", "127.0.0.1:0",
		"--xds-tls-addr", "127.0.0.1:0", "--bundle-addr", "127.0.0.1:0")
	d.cmd.Stderr = stderr
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("starting the demo: %v", err)
	}
	bannerDone := make(chan struct{})
	var readers sync.WaitGroup
	readers.Go(func() {
		defer close(d.traffic)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		inBanner := true
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "traffic ") {
				if inBanner {
					inBanner = false
					close(bannerDone)
				}
				select {
				case d.traffic <- parseTraffic(line):
				default:
				}
				continue
			}
			if inBanner {
				d.mu.Lock()
				d.banner = append(d.banner, line)
				d.mu.Unlock()
			}
		}
		if inBanner {
			close(bannerDone)
		}
	})
	go func() {
		d.exitErr = d.cmd.Wait()
		readers.Wait()
		stderr.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		d.stop(t)
		if t.Failed() {
			data, _ := os.ReadFile(stderrPath)
			d.mu.Lock()
			t.Logf("demo stdout (banner):\n%s\ndemo stderr:\n%s", strings.Join(d.banner, "\n"), tail(string(data), 40))
			d.mu.Unlock()
		}
	})
	t.Cleanup(func() { // runs first: the hub's log is removed with the demo
		if !t.Failed() {
			return
		}
		d.mu.Lock()
		var logPath string
		for _, l := range d.banner {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "hub log:"); ok {
				logPath = strings.TrimSpace(rest)
			}
		}
		d.mu.Unlock()
		if data, err := os.ReadFile(logPath); err == nil {
			t.Logf("hub log:\n%s", tail(string(data), 60))
		}
		select {
		case <-d.done: // it failed on its own and kept its work directory
			if d.exitErr != nil && logPath != "" {
				os.RemoveAll(filepath.Dir(logPath))
			}
		default: // still running: stopped below, it removes its files
		}
	})
	select {
	case <-bannerDone:
	case <-d.done:
		t.Fatalf("the demo exited before any traffic: %v", d.exitErr)
	case <-time.After(5 * time.Minute):
		t.Fatal("the demo printed no traffic within 5 minutes")
	}
	return d
}

// stop sends SIGTERM and waits for the demo to exit 0.
func (d *demoRun) stop(t *testing.T) {
	t.Helper()
	select {
	case <-d.done:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		if d.exitErr != nil {
			t.Errorf("the demo did not exit cleanly on SIGTERM: %v", d.exitErr)
		}
	case <-time.After(2 * time.Minute):
		_ = d.cmd.Process.Kill()
		<-d.done
		t.Errorf("the demo did not stop within 2 minutes of SIGTERM")
	}
}

// apiServerPID reads a cluster's API server PID from the demo's banner
// ("API server east:    pid 123, https://...").
func apiServerPID(t *testing.T, d *demoRun, cluster string) int {
	t.Helper()
	v := d.bannerValue(t, "API server "+cluster+":")
	var pid int
	if _, err := fmt.Sscanf(v, "pid %d,", &pid); err != nil || pid <= 0 {
		t.Fatalf("no API server PID in %q: %v", v, err)
	}
	return pid
}

// running reports whether a process runs (a zombie does not).
func running(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// processesMentioning lists running processes whose command line or
// environment contains s (the demo's workloads carry its work directory in
// GRPC_XDS_BOOTSTRAP).
func processesMentioning(s string) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || !running(pid) {
			continue
		}
		for _, f := range []string{"cmdline", "environ"} {
			data, err := os.ReadFile(filepath.Join("/proc", e.Name(), f))
			if err == nil && strings.Contains(string(data), s) {
				cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				out = append(out, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
				break
			}
		}
	}
	return out
}
