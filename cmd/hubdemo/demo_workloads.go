package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/internal/envoy"
	"github.com/hubmesh/hub/internal/workload"
)

// demoWorkload is one backend ("server") or client of the demo, pretending
// to run in member as ServiceAccount demo/<sa>.
type demoWorkload struct {
	role   string // "server", "client" (proxyless) or "sidecar" (demo_sidecars.go)
	name   string // its pod name, e.g. echo-west-1, west-1 (clients) or west-sidecar
	member string
	ip     string // server and sidecar: its address on the namespace's loopback
	sa     string
}

// Where the demo's workloads are and what they call.
const (
	demoNamespace  = "demo"
	demoEchoPort   = 8080 // the echo Service's port and every backend's
	demoClientRate = 50   // calls per second of each client
)

// workloadsConfig is what runWorkloads needs.
type workloadsConfig struct {
	netns       map[string]*demoNetns // by network (demoNetworks)
	workloads   []demoWorkload
	hubXDS      string          // the hub's plaintext xDS address (on loopback)
	envoyBin    string          // Envoy, which runs the east-west gateways and the sidecars
	ca          *demoCA         // nil: plaintext workloads
	sidecars    *sidecarsConfig // nil: no sidecars (their workloads are left out)
	members     map[string]kubernetes.Interface
	dir         string    // where certificates, bootstraps and logs go
	host        string    // the echo Service's hostname, which the proxyless clients call
	sidecarHost string    // echo's federated hostname, which the sidecars call
	memberIDs   []string  // members in display order, for the traffic view
	out         io.Writer // the traffic view's lines
}

// runWorkloads runs the demo's workloads in the network namespace until
// ctx is done: the relay from the namespace to the hub's xDS port, each
// workload's certificate (from the hub's CA) and bootstrap, the backends,
// the clients, and the traffic view that prints how each client's calls
// split across members once a second. When ctx is done (or starting
// fails) it stops every child and goroutine it started before returning.
func runWorkloads(ctx context.Context, cfg workloadsConfig) (err error) {
	// On return: the children stop (deferred below), then ctx is
	// cancelled, then the goroutines are waited for.
	ctx, cancel := context.WithCancel(ctx)
	var parts sync.WaitGroup
	defer parts.Wait()
	defer cancel()

	xdsAddrs, gateways, err := startRelaysAndGateways(ctx, cfg, &parts)
	defer func() { // the last started first, as deferring each Stop would
		for i := len(gateways) - 1; i >= 0; i-- {
			_ = gateways[i].Stop()
		}
	}()
	if err != nil {
		return err
	}

	view := newTrafficView(cfg.memberIDs, clientsOf(cfg.workloads))
	var children []*demoChild
	defer func() {
		for _, c := range children {
			c.stop()
		}
	}()
	for _, w := range cfg.workloads {
		if w.role == "sidecar" {
			// In the background: a sidecar waits for its istiod and
			// Envoy, the proxyless workloads need not.
			parts.Go(func() { runDemoSidecar(ctx, cfg, w, view, &parts) })
			continue
		}
		c, err := startProxylessWorkload(ctx, cfg, w, xdsAddrs, &parts)
		if err != nil {
			return err
		}
		children = append(children, c)
		if w.role == "client" {
			parts.Go(func() { followClient(c, view) })
		}
	}
	parts.Go(func() { view.run(ctx, cfg.out) })
	<-ctx.Done()
	return nil
}

// startRelaysAndGateways starts, in each network's namespace, the relay to
// the hub's xDS port on the namespace's own loopback (reachable from its
// workloads alone, see demo_netns.go) and the network's east-west gateway
// (demo_networks.go). It returns the relays' addresses by network and the
// gateways it started, also when it fails: the caller stops them.
func startRelaysAndGateways(ctx context.Context, cfg workloadsConfig, parts *sync.WaitGroup) (xdsAddrs map[string]string, gateways []*envoy.Process, err error) {
	xdsAddrs = map[string]string{}
	for _, nw := range demoNetworks {
		netns := cfg.netns[nw.name]
		lis, err := netns.Listen("127.0.0.1:0")
		if err != nil {
			return nil, gateways, err
		}
		parts.Go(func() { relay(ctx, lis, cfg.hubXDS) })
		xdsAddrs[nw.name] = lis.Addr().String()
		gw, err := startDemoGateway(ctx, cfg, nw)
		if err != nil {
			return nil, gateways, err
		}
		gateways = append(gateways, gw)
	}
	return xdsAddrs, gateways, nil
}

// runDemoSidecar starts a sidecar workload and, until ctx is done, follows
// its app's calls in view and keeps its token fresh; then it stops it. A
// sidecar that cannot start (ctx not done) is reported and shown as exited.
func runDemoSidecar(ctx context.Context, cfg workloadsConfig, w demoWorkload, view *trafficView, parts *sync.WaitGroup) {
	s, err := startDemoSidecar(ctx, cfg, w, func(lis net.Listener, target string) {
		parts.Go(func() { relay(ctx, lis, target) })
	})
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "hubdemo: %s: %v\n", w.name, err)
			view.exited(w.name)
		}
		return
	}
	parts.Go(func() { followClient(s.app, view) })
	s.refreshToken(ctx, cfg.members[w.member], w)
	s.stop()
}

// startProxylessWorkload starts a proxyless backend or client in its
// network's namespace, after writing into its own directory under cfg.dir
// its certificate from the hub's CA (when there is one; renewed in the
// background) and its gRPC xDS bootstrap, pointing at its network's relay
// in xdsAddrs.
func startProxylessWorkload(ctx context.Context, cfg workloadsConfig, w demoWorkload, xdsAddrs map[string]string, parts *sync.WaitGroup) (*demoChild, error) {
	dir := filepath.Join(cfg.dir, w.name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	refresh := 15 * time.Minute
	if cfg.ca != nil {
		issue := func(ctx context.Context) (validity, error) {
			return cfg.ca.issue(ctx, cfg.members[w.member], w.member, demoNamespace, w.sa, dir)
		}
		v, err := issueWithRetry(ctx, issue, func(err error) {
			fmt.Fprintf(os.Stderr, "hubdemo: the certificate of %s (retrying): %v\n", w.name, err)
		})
		if err != nil {
			return nil, err
		}
		refresh = v.refreshInterval()
		parts.Go(func() {
			renewCertificate(ctx, v, issue, func(err error) {
				fmt.Fprintf(os.Stderr, "hubdemo: renewing the certificate of %s: %v\n", w.name, err)
			})
		})
	}
	nodeIP := demoVethNsIP.String()
	if w.ip != "" {
		nodeIP = w.ip
	}
	nodeID := workload.NodeID(nodeIP, w.name, demoNamespace)
	network := demoNetworkOf(w.member).name
	bootstrap, err := writeDemoBootstrap(dir, xdsAddrs[network], nodeID, w.member, demoNamespace, cfg.ca != nil, refresh)
	if err != nil {
		return nil, err
	}
	env := []string{demoChildEnv + "=" + w.role, "GRPC_XDS_BOOTSTRAP=" + bootstrap}
	if w.role == "server" {
		env = append(env, demoListenEnv+"="+net.JoinHostPort(w.ip, strconv.Itoa(demoEchoPort)), demoMemberEnv+"="+w.member)
	} else {
		env = append(env, demoTargetEnv+"="+fmt.Sprintf("xds:///%s:%d", cfg.host, demoEchoPort), demoRateEnv+"="+strconv.Itoa(demoClientRate),
			"GRPC_EXPERIMENTAL_XDS_SNI=true") // Istio's SNI, on which the gateways route (gRFC A101)
	}
	return startDemoChild(cfg.netns[network], w.name, filepath.Join(dir, w.role+".log"), env, w.role == "client")
}

// startDemoGateway runs a network's east-west gateway in its namespace: a
// real Envoy shaped as istiod builds an AUTO_PASSTHROUGH gateway and as
// deploy/eastwest-proxyless-alpn.yaml leaves it (envoy.PassthroughGateway
// with h2; the demo's backends are proxyless servers, which require the
// mesh's mTLS themselves): Istio's SNIs of the echo Service (by its
// cluster.local name, which the proxyless clients call, and its federated
// name, which the sidecars call), with Istio's mTLS ALPNs or h2, passed
// without terminating TLS to the backends of the network's members. A refused connection shows as the calling client's
// error. The caller stops it (ctx bounds only its start).
func startDemoGateway(ctx context.Context, cfg workloadsConfig, nw demoNetwork) (*envoy.Process, error) {
	routes := map[string]string{}
	for _, host := range []string{cfg.host, cfg.sidecarHost} {
		sni := xdsgen.SNI(host, demoEchoPort)
		if sni == "" {
			return nil, fmt.Errorf("the echo Service's hostname %q is too long for a server name", host)
		}
		routes[sni] = "echo"
	}
	echo := &clusterv3.Cluster{Name: "echo", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout: durationpb.New(time.Second), LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: "echo",
			Endpoints: []*endpointv3.LocalityLbEndpoints{{}}}}
	for _, dc := range demoClusters {
		if dc.network == nw.name {
			for _, b := range echoBackends(dc) {
				echo.LoadAssignment.Endpoints[0].LbEndpoints = append(echo.LoadAssignment.Endpoints[0].LbEndpoints, &endpointv3.LbEndpoint{
					HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: envoy.SocketAddress(b.IP, uint32(b.Port))}}})
			}
		}
	}
	boot, err := envoy.Marshal(&bootstrapv3.Bootstrap{
		Admin: envoy.LoopbackAdmin(),
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: []*listenerv3.Listener{envoy.PassthroughGateway("eastwest", nw.gatewayIP, demoGatewayPort, routes, "h2")},
			Clusters:  []*clusterv3.Cluster{echo},
		},
	})
	if err != nil {
		return nil, err
	}
	p, err := envoy.Start(ctx, envoy.Options{Bin: cfg.envoyBin, Bootstrap: boot, Dir: filepath.Join(cfg.dir, "gateway-"+nw.name),
		Netns: cfg.netns[nw.name].name})
	if err != nil {
		return nil, fmt.Errorf("the east-west gateway of %s: %w", nw.name, err)
	}
	if err := p.WaitReady(ctx); err != nil {
		_ = p.Stop()
		return nil, fmt.Errorf("the east-west gateway of %s: %w", nw.name, err)
	}
	return p, nil
}

// issueWithRetry issues a workload's certificate, retrying for two minutes
// while the hub does not know the member yet (it has just started). Each
// new error is reported to failed.
func issueWithRetry(ctx context.Context, issue func(context.Context) (validity, error), failed func(error)) (validity, error) {
	deadline := time.Now().Add(2 * time.Minute)
	var last string
	for {
		v, err := issue(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return v, err
		}
		if err.Error() != last {
			last = err.Error()
			failed(err)
		}
		select {
		case <-ctx.Done():
			return validity{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// renewCertificate keeps a workload's certificate fresh as istio-agent
// does, until ctx ends: it asks again half-way through the current one's
// lifetime and, after a failure (reported to failed), again after a tenth
// of that lifetime (at most 10 s) until it succeeds.
func renewCertificate(ctx context.Context, v validity, issue func(context.Context) (validity, error), failed func(error)) {
	next := v.renewAt()
	for {
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		nv, err := issue(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failed(err)
			next = time.Now().Add(min(10*time.Second, max(10*time.Millisecond, v.notAfter.Sub(v.issued)/10)))
			continue
		}
		v = nv
		next = v.renewAt()
	}
}

// demoChild is a workload: this binary in a hidden role (demo_child.go),
// run inside the namespace. It dies with the demo (Pdeathsig) and is
// stopped by closing its stdin.
type demoChild struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser // clients only
	done   chan struct{}
	once   sync.Once
}

// startDemoChild starts a workload with env added to ours; its stderr (and
// stdout, unless pipeStdout) goes to logPath.
func startDemoChild(netns *demoNetns, name, logPath string, env []string, pipeStdout bool) (*demoChild, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("locating the demo binary: %w", err)
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := netns.Command(self)
	cmd.Env = append(os.Environ(), env...)
	// Its own process group: Ctrl-C reaches the demo, which stops it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = logFile
	c := &demoChild{name: name, cmd: cmd, done: make(chan struct{})}
	if pipeStdout {
		if c.stdout, err = cmd.StdoutPipe(); err != nil {
			logFile.Close()
			return nil, err
		}
	} else {
		cmd.Stdout = logFile
	}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		logFile.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting workload %s: %w", name, err)
	}
	go func() { // owned by the child: ends when the process does
		_ = cmd.Wait()
		logFile.Close()
		close(c.done)
	}()
	return c, nil
}

// readStats calls fn with every report of a client child until it exits.
func (c *demoChild) readStats(fn func(demoStats)) {
	sc := bufio.NewScanner(c.stdout)
	for sc.Scan() {
		var s demoStats
		if json.Unmarshal(sc.Bytes(), &s) == nil {
			fn(s)
		}
	}
}

// followClient feeds a client's reports to the view until the client's
// output ends (it exited, or is being stopped), then marks it exited there.
func followClient(c *demoChild, view *trafficView) {
	c.readStats(func(s demoStats) { view.update(c.name, s) })
	view.exited(c.name)
}

// stop closes the child's stdin and waits for it to exit, killing it
// after five seconds.
func (c *demoChild) stop() {
	c.once.Do(func() {
		c.stdin.Close()
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
}

// trafficView keeps the newest report of each client and prints them as
// one line a second:
//
//	traffic 15:04:05  client west-1: primary 25% west 50% east 25% (50 calls/s, 0 errors, 100% mTLS) | client east-1: ...
type trafficView struct {
	members []string // in display order
	clients []string // in display order
	mu      sync.Mutex
	latest  map[string]demoStats
	gone    map[string]bool // clients whose process has exited
	fresh   bool            // a report (or an exit) arrived since the last line
}

func newTrafficView(members, clients []string) *trafficView {
	return &trafficView{members: members, clients: clients, latest: map[string]demoStats{}, gone: map[string]bool{}}
}

// exited marks a client whose process ended: its last report no longer
// stands for what it does.
func (v *trafficView) exited(client string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gone[client] = true
	v.fresh = true
}

func (v *trafficView) update(client string, s demoStats) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.latest[client] = s
	v.fresh = true
}

// run prints a line every second with news until ctx is done.
func (v *trafficView) run(ctx context.Context, out io.Writer) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if ctx.Err() != nil { // stopping: the clients exit, not worth a line
				return
			}
			if line := v.line(now); line != "" {
				fmt.Fprintln(out, line)
			}
		}
	}
}

// line is the traffic line for now, or "" when no client reported since
// the last one.
func (v *trafficView) line(now time.Time) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.fresh {
		return ""
	}
	v.fresh = false
	parts := make([]string, 0, len(v.clients))
	for _, client := range v.clients {
		if v.gone[client] {
			parts = append(parts, "client "+client+": exited (see its log)")
		} else if s, ok := v.latest[client]; ok {
			parts = append(parts, formatStats(client, s, v.members))
		}
	}
	return "traffic " + now.Format("15:04:05") + "  " + strings.Join(parts, " | ")
}

// formatStats is one client's part of a traffic line: the share of its
// successful calls each member answered, then its calls and errors.
func formatStats(client string, s demoStats, members []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "client %s:", client)
	ok := s.Calls - s.Errors
	shown := map[string]bool{}
	share := func(m string) {
		pct := 0
		if ok > 0 {
			pct = (s.ByMember[m]*100 + ok/2) / ok
		}
		fmt.Fprintf(&b, " %s %d%%", m, pct)
		shown[m] = true
	}
	for _, m := range members {
		share(m)
	}
	for _, m := range slices.Sorted(maps.Keys(s.ByMember)) {
		if !shown[m] {
			share(m)
		}
	}
	fmt.Fprintf(&b, " (%d calls/s, %d errors", s.Calls, s.Errors)
	if ok > 0 {
		fmt.Fprintf(&b, ", %d%% mTLS", (s.MTLS*100+ok/2)/ok)
	}
	if s.LastError != "" {
		msg := s.LastError
		if len(msg) > 80 {
			msg = msg[:80] + "…"
		}
		fmt.Fprintf(&b, ": %s", msg)
	}
	b.WriteString(")")
	return b.String()
}
