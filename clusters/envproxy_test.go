package clusters

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// envProxyChild marks the subprocess of TestMemberClientIgnoresEnvironmentProxy
// (net/http reads the proxy variables once per process, so the hub's
// environment is set in a child; TestMain starts no clusters there).
const envProxyChild = "HUB_TEST_ENV_PROXY_CHILD"

// TestMemberClientIgnoresEnvironmentProxy runs a member client in a process
// whose HTTPS_PROXY points at a proxy the dial guard allows: the member's
// server is a DNS name resolving into a denied range, which through the
// proxy would be resolved and connected by the proxy, out of the guard's
// sight. The member's client must not use the environment's proxy: it
// dials the server itself and the guard refuses it; the proxy sees nothing.
// (Go never proxies "localhost" itself; the absolute name "localhost." is.)
func TestMemberClientIgnoresEnvironmentProxy(t *testing.T) {
	if os.Getenv(envProxyChild) != "" {
		memberClientThroughEnvProxy(t)
		return
	}
	lis, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2 (a loopback address besides 127.0.0.1 is needed): %v", err)
	}
	defer lis.Close()
	var mu sync.Mutex
	var requests []string
	var wg sync.WaitGroup
	defer wg.Wait()
	defer lis.Close()
	wg.Go(func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(time.Minute))
				line, _ := bufio.NewReader(conn).ReadString('\n')
				mu.Lock()
				requests = append(requests, strings.TrimSpace(line))
				mu.Unlock()
				_, _ = conn.Write([]byte("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"))
			})
		}
	})
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemberClientIgnoresEnvironmentProxy$", "-test.count=1")
	cmd.Env = append(os.Environ(), envProxyChild+"=1",
		"HTTPS_PROXY=http://"+lis.Addr().String(), "https_proxy=http://"+lis.Addr().String(), "NO_PROXY=", "no_proxy=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("child: %v\n%s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(requests) > 0 {
		t.Errorf("the member's client went through the environment's proxy: %q", requests)
	}
}

// memberClientThroughEnvProxy is the child's half: a member at
// https://localhost.:<port> (a name, resolving to loopback, which is
// denied) must be refused by the dial guard.
func memberClientThroughEnvProxy(t *testing.T) {
	policy := KubeconfigPolicy{DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}}
	kc, err := policy.ParseKubeconfig([]byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://localhost.:6443
    insecure-skip-tls-verify: true
users:
- name: u
  user:
    token: t
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := newCluster("proxied", "", kc, WatchScope{}, clusterDeps{sink: newRecordingSink(), timeout: time.Minute, log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.api.conns.closeAll()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.api.readyz(ctx)
	// Dialled directly, the name resolves to loopback and the guard refuses
	// it, or (where no resolver knows the absolute name) it does not resolve.
	if err == nil || !strings.Contains(err.Error(), "refusing to connect to a member API server") && !strings.Contains(err.Error(), "lookup localhost.") {
		t.Errorf("readyz: %v; want the dial guard's refusal (or a failed lookup), not the proxy's answer", err)
	}
	if p := kc.Config.Proxy; p == nil {
		t.Error("the member's rest.Config leaves the proxy to client-go's default (the environment)")
	} else if u, err := p(&http.Request{URL: &url.URL{Scheme: "https", Host: "localhost.:6443"}}); u != nil || err != nil {
		t.Errorf("the member's proxy for %s is %v, %v; want none", kc.Server, u, err)
	}
}
