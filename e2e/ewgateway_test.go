package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// The east-west gateway stand-in (role "ewgateway"): Envoy is not available
// here, so this small TCP passthrough plays Istio's east-west gateway
// (Gateway cross-network-gateway, port 15443, TLS AUTO_PASSTHROUGH). It
// reads the TLS ClientHello's server name without terminating TLS, looks it
// up in its routes (what istiod's SNI-DNAT clusters outbound_.<port>_._.<host>
// are on a real gateway), dials that backend in its own network and copies
// bytes both ways, the ClientHello included: mTLS stays end to end, the
// gateway never holds a key. Its stdout: "listening <addr>", then
// "route <sni> <backend>" per connection, or "refused <sni>: <why>".
const (
	gatewayListenEnv = "HUB_E2E_GATEWAY_LISTEN" // ip:port
	gatewayRoutesEnv = "HUB_E2E_GATEWAY_ROUTES" // <sni>=<ip:port>,...
)

func runEWGateway() {
	routes := map[string]string{}
	for r := range strings.SplitSeq(os.Getenv(gatewayRoutesEnv), ",") {
		if sni, addr, ok := strings.Cut(r, "="); ok {
			routes[sni] = addr
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
	for {
		c, err := lis.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			sni, hello, err := peekServerName(c)
			backend, ok := routes[sni]
			if err != nil || !ok {
				out.Lock()
				fmt.Printf("refused %q: %v (known: %v)\n", sni, err, ok)
				out.Unlock()
				return
			}
			b, err := net.DialTimeout("tcp", backend, 5*time.Second)
			if err != nil {
				out.Lock()
				fmt.Printf("refused %q: dialing %s: %v\n", sni, backend, err)
				out.Unlock()
				return
			}
			defer b.Close()
			out.Lock()
			fmt.Printf("route %s %s\n", sni, backend)
			out.Unlock()
			if _, err := b.Write(hello); err != nil {
				return
			}
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go pipe(b, c)
			go pipe(c, b)
			<-done
			<-done
		}()
	}
}

// peekServerName reads a TLS ClientHello from c and returns its server
// name and the bytes read (to be replayed to the backend). It lets
// crypto/tls parse the hello and stops the handshake there.
func peekServerName(c net.Conn) (string, []byte, error) {
	var read bytes.Buffer
	var sni string
	errStop := errors.New("hello read")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	err := tls.Server(recordingConn{Conn: c, r: io.TeeReader(c, &read)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni = h.ServerName
			return nil, errStop
		},
	}).HandshakeContext(context.Background())
	if !errors.Is(err, errStop) && sni == "" {
		return "", nil, fmt.Errorf("not a TLS ClientHello: %v", err)
	}
	return sni, read.Bytes(), nil
}

// recordingConn reads through r and never writes (the handshake is
// stopped before crypto/tls answers).
type recordingConn struct {
	net.Conn
	r io.Reader
}

func (c recordingConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c recordingConn) Write(p []byte) (int, error) { return len(p), nil }

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
