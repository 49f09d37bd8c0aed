package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/hubmesh/hub/internal/envoy"
	"github.com/hubmesh/hub/internal/hubproc"
	"github.com/hubmesh/hub/internal/localcluster"
)

// The demo is a live federation to watch and poke: three real local
// clusters (primary is home; west and east are members registered with
// remote Secrets), sample Services, and the hub binary on them (hub.go).
// As root it also
// runs real traffic (demo_workloads.go): gRPC backends answering with their
// member's name, registered in each member's EndpointSlices, and grpc-go
// xds:/// clients calling them through the hub, all with certificates from
// the hub's CA, in a network namespace of the demo (demo_netns.go). A
// scripted churn keeps the hub pushing (demo_churn.go), the clients' split
// across members is printed once a second, and the demo prints what to try.

// demoCluster is one cluster of the demo, on one of its networks.
type demoCluster struct{ name, region, zone, ipPrefix, network string }

// demoClusters are the clusters the demo starts; the first is home.
// Backends of member n have addresses ipPrefix+"10", +"11", ...
var demoClusters = []demoCluster{
	{"primary", "eu-central", "eu-central-1a", "198.18.1.", "net-main"},
	{"west", "us-west", "us-west-2b", "198.18.2.", "net-main"},
	{"east", "us-east", "us-east-1c", "198.18.3.", "net-east"},
}

// demoNetwork is one of the demo's Istio networks: its workloads run in a
// network namespace of their own, and the other network reaches them only
// through its east-west gateway (a real Envoy, startDemoGateway), on gatewayIP:15443
// (the two namespaces' ends of the veth pair joining them).
type demoNetwork struct{ name, gatewayIP string }

// demoNetworks are the demo's networks; the first one's namespace also
// holds the relay to the hub and the veth pair to the demo's own.
var demoNetworks = []demoNetwork{
	{"net-main", "198.19.253.1"},
	{"net-east", "198.19.253.2"},
}

// demoGatewayPort is Istio's east-west gateway port.
const demoGatewayPort = 15443

// The member whose echo backends the churn scales, and the one the demo
// suggests pausing.
const (
	demoChurnMember = "west"
	demoPauseMember = "east"
)

// echoBackends are the echo backends of a cluster: one, and in the churned
// member a second one that the churn adds and removes. Each is a pod of
// the mesh (seedDemoMeshPods), named as its workload.
func echoBackends(dc demoCluster) []localcluster.Backend {
	node := dc.name + "-node-1"
	b := []localcluster.Backend{{IP: dc.ipPrefix + "10", Port: demoEchoPort, Node: node, Pod: "echo-" + dc.name + "-1"}}
	if dc.name == demoChurnMember {
		b = append(b, localcluster.Backend{IP: dc.ipPrefix + "11", Port: demoEchoPort, Node: node, Pod: "echo-" + dc.name + "-2"})
	}
	return b
}

// demo starts the clusters, registers the members, starts the network
// namespace (when it can), runs the hub binary and, once it listens, the
// workloads and the churn, until ctx is done (or the hub exits). Everything it started is
// stopped and removed when it returns, also when starting fails (but for
// its work directory with the logs, when it failed). Stopped
// (ctx done: Ctrl-C, SIGTERM) while starting, it returns nil: what was cut
// short did not fail.
func demo(ctx context.Context, cfg config, opts options) (err error) {
	parent, starting := ctx, true
	defer func() {
		if starting && err != nil && parent.Err() != nil {
			fmt.Fprintln(os.Stderr, "hubdemo: stopped while starting")
			err = nil
		}
	}()
	work, err := os.MkdirTemp("", "hub-demo-")
	if err != nil {
		return fmt.Errorf("creating the demo's work directory: %w", err)
	}
	defer func() {
		if err != nil && parent.Err() == nil { // failed, not stopped: keep what tells why
			fmt.Fprintf(os.Stderr, "hubdemo: failed; the hub's log and the workloads' logs are kept in %s\n", work)
			return
		}
		os.RemoveAll(work)
	}()
	// The terminal is for the demo's own lines; the hub and the demo log
	// to files.
	log, closeLog, err := demoLogger(filepath.Join(work, "demo.log"))
	if err != nil {
		return err
	}
	defer closeLog()

	binDir, err := checkDemoPrerequisites(ctx, cfg, opts)
	if err != nil {
		return err
	}
	env, err := startDemoClusters(ctx, binDir, work)
	if err != nil {
		return err
	}
	defer env.Stop()
	members, err := setUpDemoClusters(ctx, env, cfg, work)
	if err != nil {
		return err
	}
	cfg.kubeconfig = filepath.Join(work, demoClusters[0].name+".kubeconfig")

	var traffic demoTraffic
	if opts.traffic {
		if traffic, err = prepareDemoTraffic(ctx, cfg); err != nil {
			return err
		}
		if traffic.netns != nil {
			defer removeDemoNetworks(traffic.netns)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The hub is in a process group of its own: Ctrl-C reaches the demo,
	// which stops it.
	hub, err := hubproc.Start(hubproc.Options{Bin: opts.hubBin, Args: cfg.serveArgs(opts.hubArgs), LogPath: filepath.Join(work, "hub.log"), OwnGroup: true})
	if err != nil {
		return fmt.Errorf("%w (make demo builds it, or give --hub-bin)", err)
	}
	hubStopped := false
	defer func() {
		if !hubStopped {
			_ = hub.Stop(hubStopWait)
		}
	}()
	addrs, err := hub.Listening(ctx)
	if err != nil {
		return err
	}
	starting = false
	run := demoRun{cfg: cfg, env: env, members: members, work: work, traffic: traffic, hub: hub, addrs: addrs,
		adminURL: demoAdminURL(cfg, addrs)}
	sidecars := traffic.netns != nil && traffic.istioBins != nil && (cfg.mtlsMode == "STRICT" || cfg.mtlsMode == "PERMISSIVE")
	printDemoBanner(os.Stdout, cfg, env, binDir, work, run.adminURL, addrs, hub, traffic.netns != nil, sidecars)
	err = runDemoParts(ctx, cancel, run, opts.churn, log)
	hubStopped = true // runDemoParts stopped it, or it had exited
	return err
}

// demoTraffic is what the demo's real traffic runs with.
type demoTraffic struct {
	netns     map[string]*demoNetns // by network; nil: no real traffic
	envoyBin  string                // the east-west gateways' and the sidecars' Envoy
	istioBins *istioBinaries        // the sidecars' istiod and pilot-agent; nil: no sidecars
}

// demoRun is what the demo has started by the time the hub listens, which
// its parts beside the hub (the workloads and the churn) run with.
type demoRun struct {
	cfg      config
	env      *localcluster.Env
	members  map[string]kubernetes.Interface // a client per cluster
	work     string                          // the demo's work directory
	traffic  demoTraffic
	hub      *hubproc.Process
	addrs    map[string]string // the hub's listeners' addresses, by name
	adminURL string
}

// checkDemoPrerequisites fails early on what would fail the demo after the
// clusters have started: a listener's port taken, the hub binary not built.
// It returns the directory of the kube-apiserver and etcd binaries.
func checkDemoPrerequisites(ctx context.Context, cfg config, opts options) (binDir string, err error) {
	// The hub's listeners default to fixed ports: one taken fails now, not
	// after the clusters have started; so does a hub binary not built.
	if err := demoPortsFree(cfg); err != nil {
		return "", err
	}
	if _, err := os.Stat(opts.hubBin); err != nil {
		return "", fmt.Errorf("the hub binary (make demo builds it, or give --hub-bin): %w", err)
	}
	binDir, err = localcluster.BinDir(ctx)
	if err != nil {
		return "", fmt.Errorf("kube-apiserver and etcd binaries: %w", err)
	}
	return binDir, nil
}

// startDemoClusters starts the demo's local clusters (demoClusters) under
// work/clusters, with the binaries in binDir.
func startDemoClusters(ctx context.Context, binDir, work string) (*localcluster.Env, error) {
	names := make([]string, len(demoClusters))
	for i, c := range demoClusters {
		names[i] = c.name
	}
	fmt.Fprintln(os.Stderr, "starting local clusters...")
	clustersDir := filepath.Join(work, "clusters")
	if err := os.MkdirAll(clustersDir, 0o700); err != nil {
		return nil, err
	}
	env, err := localcluster.Start(ctx, localcluster.Options{Names: names, BinDir: binDir, Dir: clustersDir})
	if err != nil {
		return nil, fmt.Errorf("starting local clusters: %w", err)
	}
	return env, nil
}

// prepareDemoTraffic finds Envoy and the Istio binaries and creates the
// networks' namespaces for real traffic. What the demo cannot have (no
// root, no sidecar binaries, namespaces that cannot be created) it goes
// without, saying why; only a missing Envoy fails it. The caller removes
// the namespaces (removeDemoNetworks).
func prepareDemoTraffic(ctx context.Context, cfg config) (demoTraffic, error) {
	var t demoTraffic
	ok, why := canRunNetns()
	if !ok {
		fmt.Fprintf(os.Stderr, "no real traffic: %s (the demo needs root and iproute2 for its network namespace); the sample endpoints are made-up addresses\n", why)
		return t, nil
	}
	var err error
	if t.envoyBin, err = envoy.Binary(); err != nil {
		return t, fmt.Errorf("the networks' east-west gateways are real Envoys: %w", err)
	}
	if bins, err := findIstioBinaries(); err != nil {
		fmt.Fprintf(os.Stderr, "no Istio sidecars: %v\n", err)
	} else if cfg.tlsDNSNames == "" {
		fmt.Fprintln(os.Stderr, "no Istio sidecars: --tls-dns-names is empty (their istiod and agent verify the hub by name)")
	} else {
		t.istioBins = &bins
	}
	// Root is not always enough (a container without CAP_NET_ADMIN,
	// another demo holding the veth address): the demo then runs as
	// without root, saying why.
	if t.netns, err = newDemoNetworks(ctx); err != nil {
		t.netns = nil
		fmt.Fprintf(os.Stderr, "no real traffic: creating the demo's network namespaces: %v; the sample endpoints are made-up addresses\n", err)
	}
	return t, nil
}

// demoAdminURL is the base URL of the hub's admin listener, whose address
// is addrs["admin"]: https when it has a certificate.
func demoAdminURL(cfg config, addrs map[string]string) string {
	if cfg.adminTLSCert != "" {
		return "https://" + addrs["admin"]
	}
	return "http://" + addrs["admin"]
}

// removeDemoNetworks removes the networks' namespaces, reporting what it
// cannot remove.
func removeDemoNetworks(netns map[string]*demoNetns) {
	for _, n := range netns {
		if err := n.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "removing the network namespace %s: %v\n", n.name, err)
		}
	}
}

// runDemoParts runs the parts beside the hub (the workloads, with network
// namespaces, and the churn, if asked for) until ctx is done, a part fails
// (which cancels ctx) or the hub exits. It then stops the hub if it still
// runs, waits for the parts and returns the hub's and the parts' errors.
func runDemoParts(ctx context.Context, cancel context.CancelFunc, run demoRun, churn bool, log *slog.Logger) error {
	// The parts beside the hub; one failing stops the demo.
	var (
		parts   sync.WaitGroup
		partsMu sync.Mutex
		partErr error
	)
	fail := func(what string, err error) {
		if ctx.Err() != nil {
			return // the demo is stopping: the part was cut short, it did not fail
		}
		partsMu.Lock()
		partErr = errors.Join(partErr, fmt.Errorf("%s: %w", what, err))
		partsMu.Unlock()
		cancel()
	}
	if run.traffic.netns != nil {
		parts.Go(func() { runDemoWorkloads(ctx, run, fail) })
	}
	if churn {
		for _, dc := range demoClusters {
			if dc.name == demoChurnMember {
				parts.Go(func() {
					runChurn(ctx, run.members[dc.name], dc.name, demoNamespace, "echo", "grpc", echoBackends(dc), log)
				})
			}
		}
	}
	var hubErr error
	select {
	case <-ctx.Done(): // stopped, or a part failed
		hubErr = run.hub.Stop(hubStopWait)
	case <-run.hub.Done():
		hubErr = run.hub.Exited()
	}
	cancel()
	parts.Wait()
	if run.traffic.netns != nil {
		fmt.Fprintln(os.Stderr, "hubdemo: stopping the clusters and removing the network namespaces")
	} else {
		fmt.Fprintln(os.Stderr, "hubdemo: stopping the clusters")
	}
	return errors.Join(hubErr, partErr)
}

// runDemoWorkloads runs the demo's workloads (runWorkloads) until ctx is
// done, with certificates from the hub's CA in the mTLS modes STRICT and
// PERMISSIVE, and with Istio sidecars when they can run. What fails is
// reported to fail.
func runDemoWorkloads(ctx context.Context, run demoRun, fail func(what string, err error)) {
	cfg, addrs := run.cfg, run.addrs
	if addrs["xds"] == "" {
		fail("workloads", errors.New("they read xDS from the hub's plaintext --xds-addr, which is disabled"))
		return
	}
	var ca *demoCA
	if cfg.mtlsMode == "STRICT" || cfg.mtlsMode == "PERMISSIVE" {
		if addrs["xds-tls"] == "" {
			fail("workloads", errors.New("their certificates come from the hub's CA on --xds-tls-addr, which is disabled"))
			return
		}
		var err error
		home := run.env.Cluster(demoClusters[0].name)
		if ca, err = newDemoCA(ctx, run.adminURL, home.AdminToken(), cfg.trustDomain, addrs["xds-tls"]); err != nil {
			fail("workloads", err)
			return
		}
		defer ca.Close()
	}
	memberIDs := make([]string, len(demoClusters))
	restConfigs, kubeconfigs := map[string]*rest.Config{}, map[string][]byte{}
	for i, dc := range demoClusters {
		memberIDs[i] = dc.name
		restConfigs[dc.name], kubeconfigs[dc.name] = run.env.Cluster(dc.name).RESTConfig(), run.env.Cluster(dc.name).Kubeconfig()
	}
	var sidecars *sidecarsConfig
	if ca != nil {
		sidecars = newSidecarsConfig(run.traffic.istioBins, ca, addrs["xds-tls"], strings.Split(cfg.tlsDNSNames, ",")[0], cfg.trustDomain, restConfigs, kubeconfigs)
	}
	err := runWorkloads(ctx, workloadsConfig{
		netns: run.traffic.netns, workloads: demoWorkloads(sidecars != nil), hubXDS: addrs["xds"], envoyBin: run.traffic.envoyBin, ca: ca,
		sidecars: sidecars, members: run.members, dir: filepath.Join(run.work, "workloads"), memberIDs: memberIDs, out: os.Stdout,
		host:        fmt.Sprintf("echo.%s.svc.%s", demoNamespace, cfg.domainSuffix),
		sidecarHost: fmt.Sprintf("echo.%s.svc.%s", demoNamespace, cfg.federatedDomain),
	})
	if err != nil {
		fail("workloads", err)
	}
}

// orDisabled is a listener's address for the banner, "(disabled)" when
// its flag is empty.
func orDisabled(addr string) string {
	if addr == "" {
		return "(disabled)"
	}
	return addr
}

// demoPortsFree checks that every listener's address can be bound now
// (a port left 0 always can), naming the flag that moves one that cannot.
func demoPortsFree(cfg config) error {
	for _, l := range []struct{ flag, addr string }{
		{"admin-addr", cfg.adminAddr}, {"xds-addr", cfg.xdsAddr}, {"xds-tls-addr", cfg.xdsTLSAddr}, {"bundle-addr", cfg.bundleAddr},
	} {
		if l.addr == "" {
			continue
		}
		lis, err := net.Listen("tcp", l.addr)
		if err != nil {
			return fmt.Errorf("--%s %s cannot be used (%w); choose another address, e.g. --%s 127.0.0.1:0 (the banner prints the one taken)", l.flag, l.addr, err, l.flag)
		}
		lis.Close()
	}
	return nil
}

// demoWorkloads are the demo's backends (one per member at
// <ipPrefix>10, and the churned member's second one), proxyless clients
// (one per member) and, with sidecars, a sidecar per network
// (demoSidecarMembers, at <ipPrefix>30).
func demoWorkloads(sidecars bool) []demoWorkload {
	var ws []demoWorkload
	for _, dc := range demoClusters {
		for _, b := range echoBackends(dc) {
			ws = append(ws, demoWorkload{role: "server", name: b.Pod, member: dc.name, ip: b.IP, sa: "echo"})
		}
	}
	for _, dc := range demoClusters {
		ws = append(ws, demoWorkload{role: "client", name: dc.name + "-1", member: dc.name, sa: "client"})
	}
	if sidecars {
		for _, m := range demoSidecarMembers {
			ws = append(ws, demoWorkload{role: "sidecar", name: m + "-sidecar", member: m, ip: demoSidecarIP(m), sa: "sidecar"})
		}
	}
	return ws
}

// setUpDemoClusters seeds every cluster, registers the members with remote
// Secrets in the home cluster, distributes echo's failover rule
// (demoFailoverRule), and writes into work each cluster's kubeconfig and
// each member's remote Secret (for re-registering it). It returns a client
// per cluster.
func setUpDemoClusters(ctx context.Context, env *localcluster.Env, cfg config, work string) (map[string]kubernetes.Interface, error) {
	clients := map[string]kubernetes.Interface{}
	for _, dc := range demoClusters {
		c, err := kubernetes.NewForConfig(env.Cluster(dc.name).RESTConfig())
		if err != nil {
			return nil, fmt.Errorf("client of %s: %w", dc.name, err)
		}
		clients[dc.name] = c
	}
	homeClient := clients[demoClusters[0].name]
	for _, ns := range []string{cfg.namespace, cfg.secretsNamespace, cfg.rootNamespace} {
		if err := localcluster.EnsureNamespace(ctx, homeClient, ns); err != nil {
			return nil, err
		}
	}
	for i, dc := range demoClusters {
		c := env.Cluster(dc.name)
		if err := seedDemo(ctx, clients[dc.name], dc); err != nil {
			return nil, fmt.Errorf("seeding %s: %w", dc.name, err)
		}
		if err := os.WriteFile(filepath.Join(work, dc.name+".kubeconfig"), c.Kubeconfig(), 0o600); err != nil {
			return nil, err
		}
		if i == 0 {
			continue
		}
		secret := localcluster.RemoteSecret(cfg.secretsNamespace, "istio-remote-secret-"+dc.name, map[string][]byte{dc.name: c.Kubeconfig()})
		// The operator who registers the member confirms its network
		// (else the hub would not use its gateways).
		secret.Annotations = map[string]string{"hub.federation/network": dc.network}
		if _, err := homeClient.CoreV1().Secrets(cfg.secretsNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("registering %s: %w", dc.name, err)
		}
		secret.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}
		manifest, err := yaml.Marshal(secret)
		if err != nil {
			return nil, fmt.Errorf("writing %s's remote Secret: %w", dc.name, err)
		}
		if err := os.WriteFile(filepath.Join(work, dc.name+"-remote-secret.yaml"), manifest, 0o600); err != nil {
			return nil, err
		}
	}
	host := fmt.Sprintf("echo.%s.svc.%s", demoNamespace, cfg.domainSuffix)
	if err := applyDemoFailoverRule(ctx, env.Cluster(demoClusters[0].name).RESTConfig(), cfg.rootNamespace, host); err != nil {
		return nil, err
	}
	return clients, nil
}

// seedDemo creates a node with topology labels, the demo namespace with the
// workloads' ServiceAccounts, two sample services: echo (in every
// cluster, with the demo's backends) and a per-cluster one whose endpoint
// is a made-up address, and the cluster's network and gateway
// (seedDemoNetwork).
func seedDemo(ctx context.Context, c kubernetes.Interface, dc demoCluster) error {
	if err := localcluster.EnsureNamespace(ctx, c, demoNamespace); err != nil {
		return err
	}
	for _, sa := range []string{"echo", "client"} {
		if _, err := c.CoreV1().ServiceAccounts(demoNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating ServiceAccount %s/%s: %w", demoNamespace, sa, err)
		}
	}
	node := dc.name + "-node-1"
	if err := localcluster.ApplyNode(ctx, c, node, dc.region, dc.zone); err != nil {
		return err
	}
	if err := localcluster.ApplyService(ctx, c, demoNamespace, "echo", "grpc", demoEchoPort, echoBackends(dc)); err != nil {
		return err
	}
	if err := seedDemoNetwork(ctx, c, dc); err != nil {
		return err
	}
	return localcluster.ApplyService(ctx, c, demoNamespace, dc.name+"-api", "http", 80,
		[]localcluster.Backend{{IP: dc.ipPrefix + "20", Port: 8000, Node: node}})
}

// printDemoBanner prints the URLs, credentials and things to try.
func printDemoBanner(w io.Writer, cfg config, env *localcluster.Env, binDir, work, adminURL string, addrs map[string]string, hub *hubproc.Process, traffic, sidecars bool) {
	home := env.Cluster(demoClusters[0].name)
	kubectl := filepath.Join(binDir, "kubectl") + " --kubeconfig " + filepath.Join(work, home.Name+".kubeconfig")
	fmt.Fprintf(w, `
hubdemo is running (Ctrl-C stops everything)
  dashboard:          %s/
  admin token:        %s   (sign in with it; also: curl -H "Authorization: Bearer <token>" %s/api/v1/clusters)
  readiness:          %s/readyz
  ADS (plaintext):    %s   e.g. xds:///echo.%s.svc.%s:%d from a grpc-go client
  ADS/SDS/CA (mTLS):  %s   SPIFFE bundle endpoint: https://%s (trust domain %s, mTLS mode %s)
  home cluster:       %s get secrets -n %s
  kubeconfigs:        %s/{%s,%s,%s}.kubeconfig
  hub:                %s (pid %d; Ctrl-C stops it with the rest)
  hub log:            %s
  demo log:           %s
`, adminURL, home.AdminToken(), adminURL, adminURL, orDisabled(addrs["xds"]), demoNamespace, cfg.domainSuffix, demoEchoPort,
		orDisabled(addrs["xds-tls"]), orDisabled(addrs["bundle"]), cfg.trustDomain, cfg.mtlsMode, kubectl, cfg.secretsNamespace,
		work, demoClusters[0].name, demoClusters[1].name, demoClusters[2].name,
		strings.Join(hub.Args(), " "), hub.PID(), hub.LogPath(), filepath.Join(work, "demo.log"))
	for _, dc := range demoClusters {
		fmt.Fprintf(w, "  API server %-8s pid %d, %s\n", dc.name+":", env.Cluster(dc.name).APIServerPID(), env.Cluster(dc.name).Server())
	}
	var nets []string
	for _, nw := range demoNetworks {
		var ms []string
		for _, dc := range demoClusters {
			if dc.network == nw.name {
				ms = append(ms, dc.name)
			}
		}
		nets = append(nets, fmt.Sprintf("%s (%s; gateway %s:%d)", nw.name, strings.Join(ms, ", "), nw.gatewayIP, demoGatewayPort))
	}
	fmt.Fprintf(w, "  networks:           %s\n", strings.Join(nets, "; "))
	if traffic {
		fmt.Fprintf(w, "  workloads:          echo backends in every member and one xds:/// client per member (mTLS mode %s), each network's in a network namespace of its own; logs in %s\n",
			cfg.mtlsMode, filepath.Join(work, "workloads"))
	}
	if sidecars {
		var names []string
		for _, m := range demoSidecarMembers {
			names = append(names, fmt.Sprintf("%s-sidecar (%s)", m, demoNetworkOf(m).name))
		}
		fmt.Fprintf(w, "  Istio sidecars:     %s: real pilot-agents running Envoy %s, configured by their member's istiod (reading the federation from the hub over MCP), calling echo.%s.svc.%s\n",
			strings.Join(names, ", "), envoy.Version, demoNamespace, cfg.federatedDomain)
	}
	pid := strconv.Itoa(env.Cluster(demoPauseMember).APIServerPID())
	if traffic {
		fmt.Fprint(w, "\nThings to try (the \"traffic\" lines show how each client's calls split across the members):")
	} else {
		fmt.Fprint(w, "\nThings to try (no workloads run: watch the dashboard's clusters and services):")
	}
	fmt.Fprintf(w, `
  The DestinationRule %[6]s/%[7]s (outlier detection: Istio's locality failover) keeps each
  client's calls in its own member while that member is healthy.
  1. Freeze %[1]s's API server: on the dashboard %[1]s turns Stale within ~15 s and is demoted: its
     endpoints go behind the healthy members', so %[1]s's client moves to the next priority, the
     members of the other network, through that network's east-west gateway (the others keep
     calling their own member); it comes back when %[1]s recovers:
       kill -STOP %[2]s        and later:   kill -CONT %[2]s
  2. Remove member %[1]s: its endpoints are withdrawn and its client's calls move to the others:
       %[3]s -n %[4]s delete secret istio-remote-secret-%[1]s
  3. Register it again:
       %[3]s apply -f %[5]s
  4. Delete the rule: every client spreads its calls over all members (Istio's default):
       %[3]s -n %[6]s delete destinationrule %[7]s
`, demoPauseMember, pid, kubectl, cfg.secretsNamespace, filepath.Join(work, demoPauseMember+"-remote-secret.yaml"), cfg.rootNamespace, demoFailoverRule)
	fmt.Fprintln(w)
}

// demoLogger is the demo's own JSON logger (the churn's lines), writing to
// path, also used by client-go.
func demoLogger(path string) (*slog.Logger, func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the demo's log: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(f, nil))
	slog.SetDefault(log)
	klog.SetSlogLogger(log)
	return log, func() { f.Close() }, nil
}
