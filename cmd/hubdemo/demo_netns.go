package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hubmesh/hub/internal/tcpproxy"
	"golang.org/x/sys/unix"
)

// The demo's workloads (gRPC backends and clients) run in a network
// namespace of their own: member API servers refuse loopback addresses in
// EndpointSlices (docs/architecture.md §5), so each backend gets an address from the
// benchmark range 198.18.0.0/15 on the namespace's loopback. A veth pair
// joins the namespace to the network namespace the demo runs in (the host's,
// or a test's); the hub, the clusters and the dashboard stay on loopback. The
// workloads reach the hub's plaintext xDS port through a relay whose
// listener is opened inside their namespace, on its loopback: no other
// network namespace, and so no other host, can connect to it (a listener on
// the host side of the veth could be reached from the LAN: Linux accepts a
// packet for any local address on any interface, so a neighbour routing
// 198.19.254.1 via this host would reach the hub's xDS port). The demo
// touches only the namespace and the veth pair it created.
const (
	// demoNetnsPrefix names the demo's namespaces: hub-demo-<pid of the
	// demo>, and hub-demo-<pid>-<network> for its other networks'.
	demoNetnsPrefix = "hub-demo-"
	// demoVethPrefix names the host side of the veth pair: hubdemo<pid>
	// (at most 14 characters; interface names are limited to 15).
	demoVethPrefix = "hubdemo"
)

// The veth pair's /30, chosen away from 198.18.0.1 (the address
// internal/localcluster/netns.sh gives the test namespace) and from the
// backends' 198.18.<n>.0/24 addresses.
var (
	demoVethHostIP = net.IPv4(198, 19, 254, 1)
	demoVethNsIP   = net.IPv4(198, 19, 254, 2)
)

const demoVethPrefixLen = 30

// demoNetns is the demo's network namespace and veth pair.
type demoNetns struct {
	name     string // the namespace, as `ip netns` knows it
	hostLink string // host side of the veth pair (the other side is eth0 in the namespace); "" for another network's

	closed    chan struct{} // closed by Close; see do
	closeOnce sync.Once
}

// demoNetnsOf returns the namespace and veth pair of the demo with that
// process ID (this one's, or an earlier demo's left behind).
func demoNetnsOf(pid int) *demoNetns {
	id := strconv.Itoa(pid)
	return &demoNetns{name: demoNetnsPrefix + id, hostLink: demoVethPrefix + id, closed: make(chan struct{})}
}

// canRunNetns reports whether the demo can create a network namespace, and
// why not when it cannot.
func canRunNetns() (bool, string) {
	if os.Geteuid() != 0 {
		return false, "not root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return false, "no iproute2 (ip) on PATH"
	}
	return true, ""
}

// newDemoNetns removes namespaces left behind by earlier demos that
// crashed, then creates this demo's namespace with its loopback up and
// carrying addrs, and the veth pair. On error everything it created is
// removed again.
func newDemoNetns(ctx context.Context, addrs []string) (_ *demoNetns, err error) {
	removeStaleDemoNetns(ctx)
	if owner := interfaceWith(demoVethHostIP); owner != "" {
		return nil, fmt.Errorf("%s is already on interface %s (another demo running?)", demoVethHostIP, owner)
	}
	n := demoNetnsOf(os.Getpid())
	if err := ipCmd(ctx, "netns", "add", n.name); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	hostAddr := fmt.Sprintf("%s/%d", demoVethHostIP, demoVethPrefixLen)
	nsAddr := fmt.Sprintf("%s/%d", demoVethNsIP, demoVethPrefixLen)
	steps := [][]string{
		{"link", "add", n.hostLink, "type", "veth", "peer", "name", "eth0", "netns", n.name},
		{"addr", "add", hostAddr, "dev", n.hostLink},
		{"link", "set", n.hostLink, "up"},
		{"-n", n.name, "link", "set", "lo", "up"},
		{"-n", n.name, "addr", "add", nsAddr, "dev", "eth0"},
		{"-n", n.name, "link", "set", "eth0", "up"},
	}
	for _, a := range addrs {
		steps = append(steps, []string{"-n", n.name, "addr", "add", a + "/32", "dev", "lo"})
	}
	for _, args := range steps {
		if err := ipCmd(ctx, args...); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Listen opens a TCP listener on addr inside the namespace (e.g.
// 127.0.0.1:0 for its loopback): only processes in the namespace can
// connect to it, while this process accepts and serves its connections.
func (n *demoNetns) Listen(addr string) (net.Listener, error) {
	var lis net.Listener
	err := n.do(func() (err error) {
		lis, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s in the network namespace %s: %w", addr, n.name, err)
	}
	return lis, nil
}

// do runs fn on an OS thread that joined the namespace, then moves the
// thread back to the network namespace it came from and hands it back to
// the Go scheduler. A socket keeps the namespace it was made in, whichever
// thread uses it later.
//
// The thread must not end: the demo's clusters and workloads are started
// with Pdeathsig, which Linux sends when the *thread* that forked a child
// exits, and any thread of the runtime may have forked one. A goroutine
// that ends while locked to its thread ends that thread (and so killed the
// demo's API servers mid-run). Should the way back fail, the thread stays
// locked, off the scheduler, until the namespace is closed.
func (n *demoNetns) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening this thread's network namespace: %w", err)
			return
		}
		defer home.Close()
		target, err := os.Open(filepath.Join(netnsDir, n.name))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("joining the network namespace %s: %w", n.name, err)
			return
		}
		fnErr := fn()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(fnErr, fmt.Errorf("leaving the network namespace %s: %w", n.name, err))
			<-n.closed // still locked: no other goroutine runs in the namespace
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// netnsDir is where `ip netns add` binds its namespaces.
const netnsDir = "/run/netns"

// Command returns a command that runs name with args inside the namespace.
func (n *demoNetns) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.name, name}, args...)...)
}

// Close removes the veth pair and the namespace. It runs on a fresh
// context: it must also work while the demo is being stopped.
func (n *demoNetns) Close() error {
	n.closeOnce.Do(func() { close(n.closed) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	// Deleting one end deletes both; the namespace itself goes away
	// asynchronously in the kernel, so its veth is not left to it.
	if n.hostLink != "" && linkExists(n.hostLink) {
		errs = append(errs, ipCmd(ctx, "link", "del", n.hostLink))
	}
	errs = append(errs, ipCmd(ctx, "netns", "del", n.name))
	return errors.Join(errs...)
}

// removeStaleDemoNetns removes the namespaces (and veth pairs) of earlier
// demos whose process is gone, e.g. after a SIGKILL. A namespace whose
// demo process still runs, and every other namespace, are left alone.
func removeStaleDemoNetns(ctx context.Context) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, demoNetnsPrefix)
		if !ok {
			continue
		}
		pidText, network, _ := strings.Cut(rest, "-") // hub-demo-<pid>[-<network>]
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		stale := demoNetnsOf(pid)
		if network != "" { // another network's: no veth pair to the host
			stale = &demoNetns{name: name, closed: make(chan struct{})}
		}
		if err := stale.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "removing the network namespace %s of an earlier demo: %v\n", name, err)
		} else {
			fmt.Fprintf(os.Stderr, "removed the network namespace %s of an earlier demo (process %d is gone)\n", name, pid)
		}
	}
}

// processAlive reports whether a process with that ID exists.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// interfaceWith returns the name of the interface holding ip, or "".
func interfaceWith(ip net.IP) string {
	ifaces, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, iface := range ifaces {
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.Equal(ip) {
				return iface.Name
			}
		}
	}
	return ""
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// ipCmd runs `ip args...` and returns its error output as the error.
func ipCmd(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "ip", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// relay forwards every TCP connection accepted on lis to target until ctx
// is done; then it closes lis and every open connection and returns when
// all its goroutines have ended. The workloads in the namespace reach the
// hub's xDS port on loopback through it (lis from demoNetns.Listen).
func relay(ctx context.Context, lis net.Listener, target string) {
	tcpproxy.Serve(ctx, lis, func(ctx context.Context, _ net.Conn) net.Conn {
		var d net.Dialer
		out, err := d.DialContext(ctx, "tcp", target)
		if err != nil {
			return nil
		}
		return out
	})
}
