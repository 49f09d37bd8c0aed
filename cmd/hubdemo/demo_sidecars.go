package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hubmesh/hub/internal/envoy"
	"github.com/hubmesh/hub/internal/istiod"
	"github.com/hubmesh/hub/internal/istiomod"
	"github.com/hubmesh/hub/internal/pilotagent"
)

// Beside the proxyless clients, each network runs a real Istio sidecar, as
// a member of the mesh runs one (docs/architecture.md §3.7): in one member
// of the network a real istiod (Istio's pilot-discovery) takes the
// federation from the hub over MCP on the hub's TLS port, and configures a
// real pilot-agent running Envoy, whose certificate comes from the hub's
// CA. The sidecar's app is a plain gRPC client (no xDS of its own) calling
// echo by the hub's federated name, echo.demo.svc.clusterset.local, on the
// sidecar's outbound listener (127.0.0.1:8080: no iptables, interception
// mode NONE); the sidecar reaches the proxyless echo backends of its own
// network directly and the other network's through its east-west gateway,
// over Istio mTLS, and the backends see the sidecar's SPIFFE ID.

// demoSidecarMembers are the members that run an istiod and a sidecar,
// one per network (demoNetworks).
var demoSidecarMembers = []string{"west", "east"}

// demoHubName is the demo's --tls-dns-names default, a DNS name on the
// hub's serving certificate: member istiods and istio-agents verify the
// hub by the first of those names, as they would verify its Service in a
// cluster.
const demoHubName = "hub.hub-system.svc"

// demoSidecarIP is the sidecar pod's address in a member (INSTANCE_IP, on
// its network namespace's loopback).
func demoSidecarIP(member string) string {
	for _, dc := range demoClusters {
		if dc.name == member {
			return dc.ipPrefix + "30"
		}
	}
	return ""
}

// istioBinaries are what the sidecars need beside Envoy.
type istioBinaries struct{ istiod, agent string }

// findIstioBinaries returns pilot-discovery and pilot-agent from
// $HUB_ISTIOD_BIN and $HUB_PILOT_AGENT_BIN (make demo builds and sets
// them), or why the demo runs without sidecars.
func findIstioBinaries() (istioBinaries, error) {
	b := istioBinaries{istiod: os.Getenv(istiomod.IstiodBinEnv), agent: os.Getenv(pilotagent.BinEnv)}
	for env, path := range map[string]string{istiomod.IstiodBinEnv: b.istiod, pilotagent.BinEnv: b.agent} {
		if path == "" {
			return b, fmt.Errorf("%s is not set (make demo builds Istio's binaries: e2e/interop/build-istiod.sh)", env)
		}
		if _, err := os.Stat(path); err != nil {
			return b, fmt.Errorf("%s: %w", env, err)
		}
	}
	if _, err := istiomod.EnvoyBootstrapTemplate(); err != nil {
		return b, err
	}
	return b, nil
}

// sidecarsConfig is what the sidecars need of the demo.
type sidecarsConfig struct {
	bins        istioBinaries
	hubTLS      string // the hub's TLS xDS, MCP and CA address (on loopback)
	hubName     string // a DNS name on the hub's serving certificate
	rootsPEM    []byte // our trust domain's roots
	trustDomain string
	restConfigs map[string]*rest.Config // the members' admin configs
	kubeconfigs map[string][]byte       // the same, as kubeconfigs (istiod's)
}

// demoSidecar is a running sidecar: its member's istiod, its pilot-agent
// (with Envoy) and its app.
type demoSidecar struct {
	istiod *istiod.Process
	agent  *pilotagent.Process
	app    *demoChild
}

// refreshToken replaces the sidecar's token every 6 hours (it lasts 12),
// as the kubelet refreshes a projected token, until ctx is done.
func (s *demoSidecar) refreshToken(ctx context.Context, c kubernetes.Interface, w demoWorkload) {
	tick := time.NewTicker(6 * time.Hour)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		token, err := pilotagent.Token(ctx, c, demoNamespace, w.sa)
		if err == nil {
			err = s.agent.SetToken(token)
		}
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "hubdemo: refreshing the token of %s (its certificate renews with the old one until it expires): %v\n", w.name, err)
		}
	}
}

// stop stops the app, the agent with its Envoy, and istiod.
func (s *demoSidecar) stop() {
	if s.app != nil {
		s.app.stop()
	}
	if s.agent != nil {
		s.agent.Stop()
	}
	if s.istiod != nil {
		s.istiod.Stop()
	}
}

// startDemoSidecar starts w's member istiod, its sidecar in w's network
// namespace (its xDS from that istiod and its certificate from the hub's
// CA, each through a relay on the namespace's loopback, run by relays
// until ctx is done) and, once Envoy holds echo's endpoints, the app
// calling through it. On error it stops what it started.
func startDemoSidecar(ctx context.Context, cfg workloadsConfig, w demoWorkload, relays func(net.Listener, string)) (_ *demoSidecar, err error) {
	sc := cfg.sidecars
	nw := demoNetworkOf(w.member)
	netns := cfg.netns[nw.name]
	s := &demoSidecar{}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	if err := istiod.InstallCRDs(ctx, sc.restConfigs[w.member]); err != nil {
		return nil, fmt.Errorf("the Istio CRDs in %s: %w", w.member, err)
	}
	dir := filepath.Join(cfg.dir, "istiod-"+w.member)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s.istiod, err = istiod.Start(ctx, istiod.Options{Bin: sc.bins.istiod, Dir: dir, Kubeconfig: sc.kubeconfigs[w.member],
		ConfigSources: []istiod.ConfigSource{{Address: "k8s://"}, istiod.TLSSource(sc.hubTLS, sc.rootsPEM, sc.hubName)},
		ClusterID:     w.member, TrustDomain: sc.trustDomain, Env: istiod.UpstreamEnvoyEnv})
	if err != nil {
		return nil, fmt.Errorf("%s's istiod: %w", w.member, err)
	}
	listen := func(target string) (string, error) {
		lis, err := netns.Listen("127.0.0.1:0")
		if err != nil {
			return "", err
		}
		relays(lis, target)
		return lis.Addr().String(), nil
	}
	istiodAddr, err := listen(s.istiod.XDSAddr)
	if err != nil {
		return nil, err
	}
	caAddr, err := listen(sc.hubTLS)
	if err != nil {
		return nil, err
	}
	token, err := pilotagent.Token(ctx, cfg.members[w.member], demoNamespace, w.sa)
	if err != nil {
		return nil, fmt.Errorf("the sidecar of %s: %w", w.member, err)
	}
	// Unix socket paths are limited to 108 bytes: a short name.
	agentDir, err := os.MkdirTemp(cfg.dir, w.name+"-")
	if err != nil {
		return nil, err
	}
	s.agent, err = pilotagent.Start(pilotagent.Options{Bin: sc.bins.agent, Dir: agentDir, Token: token, RootPEM: sc.rootsPEM,
		ClusterID: w.member, Namespace: demoNamespace, ServiceAccount: w.sa, PodName: w.name, PodIP: w.ip, TrustDomain: sc.trustDomain,
		HubAddr: caAddr, HubName: sc.hubName, Envoy: cfg.envoyBin,
		Proxy: &pilotagent.Proxy{Istiod: istiodAddr, Network: nw.name, Netns: netns.name, AdminPort: 15000,
			Labels: map[string]string{"app": w.name}}})
	if err != nil {
		return nil, fmt.Errorf("the sidecar of %s: %w", w.member, err)
	}
	logPath := s.agent.LogPath
	clusterName := fmt.Sprintf("outbound|%d||%s", demoEchoPort, cfg.sidecarHost)
	if err := waitSidecarEndpoints(ctx, s.agent, clusterName); err != nil {
		return nil, fmt.Errorf("the sidecar of %s (its log: %s): %w", w.member, logPath, err)
	}
	s.app, err = startDemoChild(netns, w.name, filepath.Join(cfg.dir, w.name+"-app.log"), []string{
		demoChildEnv + "=client", demoRateEnv + "=" + fmt.Sprint(demoClientRate),
		demoTargetEnv + "=" + net.JoinHostPort("127.0.0.1", fmt.Sprint(demoEchoPort)),
		demoAuthorityEnv + "=" + net.JoinHostPort(cfg.sidecarHost, fmt.Sprint(demoEchoPort)),
	}, true)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// waitSidecarEndpoints waits (two minutes at most) until the sidecar's
// Envoy holds a healthy endpoint of cluster.
func waitSidecarEndpoints(ctx context.Context, a *pilotagent.Process, cluster string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	last := "Envoy has not answered yet"
	for {
		if err := a.Exited(); err != nil {
			return err
		}
		if cs, err := a.Envoy.Clusters(ctx); err != nil {
			last = err.Error()
		} else if n := healthyHosts(cs, cluster); n > 0 {
			return nil
		} else {
			last = fmt.Sprintf("no healthy endpoint of %s yet", cluster)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func healthyHosts(cs []envoy.ClusterStatus, cluster string) int {
	n := 0
	for _, c := range cs {
		if c.Name == cluster {
			for _, h := range c.Hosts {
				if h.Healthy() {
					n++
				}
			}
		}
	}
	return n
}

// newSidecarsConfig collects what the sidecars need, or returns nil
// without Istio's binaries.
func newSidecarsConfig(bins *istioBinaries, ca *demoCA, hubTLS, hubName, trustDomain string, restConfigs map[string]*rest.Config, kubeconfigs map[string][]byte) *sidecarsConfig {
	if bins == nil {
		return nil
	}
	return &sidecarsConfig{bins: *bins, hubTLS: hubTLS, hubName: hubName, rootsPEM: ca.rootsPEM, trustDomain: trustDomain,
		restConfigs: restConfigs, kubeconfigs: kubeconfigs}
}

// clientsOf lists the client names of workloads (proxyless clients and
// sidecars), as the traffic view shows them.
func clientsOf(ws []demoWorkload) []string {
	var out []string
	for _, w := range ws {
		if w.role == "client" || w.role == "sidecar" {
			out = append(out, w.name)
		}
	}
	return out
}
