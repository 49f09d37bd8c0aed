package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/hubmesh/hub/internal/ewgateway"
)

// The east-west gateway stand-in (role "ewgateway"; package ewgateway:
// Envoy is not available here) listens on gatewayListenEnv and routes by
// SNI to the backends of gatewayRoutesEnv, without terminating TLS. Its
// stdout: "listening <addr>", then "route <sni> <backend>" per connection,
// or "refused <sni>: <why>".
const (
	gatewayListenEnv = "HUB_E2E_GATEWAY_LISTEN" // ip:port
	gatewayRoutesEnv = "HUB_E2E_GATEWAY_ROUTES" // <sni>=<ip:port>,...
)

func runEWGateway() {
	routes := map[string][]string{}
	for r := range strings.SplitSeq(os.Getenv(gatewayRoutesEnv), ",") {
		if sni, addr, ok := strings.Cut(r, "="); ok {
			routes[sni] = append(routes[sni], addr)
		}
	}
	lis, err := net.Listen("tcp", os.Getenv(gatewayListenEnv))
	if err != nil {
		fmt.Printf("fatal %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("listening %s\n", lis.Addr())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	var out sync.Mutex
	g := &ewgateway.Gateway{Routes: routes,
		Routed: func(sni, backend string) {
			out.Lock()
			defer out.Unlock()
			fmt.Printf("route %s %s\n", sni, backend)
		},
		Refused: func(sni string, err error) {
			out.Lock()
			defer out.Unlock()
			fmt.Printf("refused %q: %s\n", sni, strings.ReplaceAll(err.Error(), "\n", " "))
		},
	}
	g.Serve(context.Background(), lis)
	os.Exit(1)
}

// netnsNetwork is a second network for a test: a network namespace whose
// loopback carries workload addresses nothing outside can route to, joined
// to the test's namespace by a veth pair whose two ends (a /30) are the
// only addresses either side reaches of the other.
type netnsNetwork struct {
	name       string
	hostIP, ip string // this namespace's end of the veth, and the network's
}

// newNetnsNetwork creates the namespace hub-e2e-<tag>-<pid> with lo up and
// carrying workloadIPs, and a veth pair hostIP/30 ↔ ip/30, removed when the
// test ends. It skips outside a namespace of its own (root and ip needed).
func newNetnsNetwork(t *testing.T, tag, hostIP, ip string, workloadIPs ...string) *netnsNetwork {
	t.Helper()
	if os.Geteuid() != 0 || os.Getenv("HUB_TEST_DATAPLANE_IP") == "" {
		missing(t, "a second network needs root and the test's own network namespace (make test)")
	}
	n := &netnsNetwork{name: fmt.Sprintf("hub-e2e-%s-%d", tag, os.Getpid()), hostIP: hostIP, ip: ip}
	link := fmt.Sprintf("he%s%d", tag, os.Getpid()%100000)
	if len(link) > 15 {
		link = link[:15]
	}
	ipCmd := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ipCmd("netns", "add", n.name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", link).Run()
		_ = exec.Command("ip", "netns", "del", n.name).Run()
	})
	ipCmd("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", n.name)
	ipCmd("addr", "add", hostIP+"/30", "dev", link)
	ipCmd("link", "set", link, "up")
	ipCmd("-n", n.name, "link", "set", "lo", "up")
	ipCmd("-n", n.name, "addr", "add", ip+"/30", "dev", "eth0")
	ipCmd("-n", n.name, "link", "set", "eth0", "up")
	for _, a := range workloadIPs {
		ipCmd("-n", n.name, "addr", "add", a+"/32", "dev", "lo")
	}
	return n
}

// startChildIn is startChild for a child inside the network's namespace.
func (n *netnsNetwork) startChild(t *testing.T, role string, env ...string) *child {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return startCommand(t, role, exec.Command("ip", "netns", "exec", n.name, self, "-test.run=^$"), env...)
}
