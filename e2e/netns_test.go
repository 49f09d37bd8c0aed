package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

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
