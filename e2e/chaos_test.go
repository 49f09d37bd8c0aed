package e2e

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/trust"
)

// Recovery bounds the chaos suite holds the hub to (stated in docs/features.md).
const (
	// A member whose API server or etcd fails is reported Stale within
	// this (kube-apiserver drains ~10 s on SIGTERM; the health probe runs
	// every 10 s with a 5 s timeout).
	staleWithin = 35 * time.Second
	// A member that comes back is Ready, and follows new writes, within this.
	recoverWithin = 30 * time.Second
)

// fleet is a set of proxies that must never see an empty endpoint set and
// must keep every endpoint they had while something fails.
type fleet []*proxy

func (f fleet) expect(t *testing.T, timeout time.Duration, what string, want map[string]int) {
	t.Helper()
	eventually(t, timeout, func() error {
		for _, p := range f {
			s := p.snapshot()
			for name, n := range want {
				if s.Endpoints[name] != n {
					return fmt.Errorf("%s: a proxy has %d endpoints for %s; want %d", what, s.Endpoints[name], name, n)
				}
			}
		}
		return nil
	})
	f.noEmpty(t)
}

func (f fleet) noEmpty(t *testing.T) {
	t.Helper()
	for _, p := range f {
		if s := p.snapshot(); s.EmptyEDS != 0 {
			t.Fatalf("a proxy received %d empty endpoint pushes", s.EmptyEDS)
		}
	}
}

// holdsFor asserts that every proxy keeps want for the whole window: while
// a member is down its last endpoints must stay served, not just come back.
func (f fleet) holdsFor(t *testing.T, window time.Duration, want map[string]int) {
	t.Helper()
	deadline := time.Now().Add(window)
	for time.Now().Before(deadline) {
		for _, p := range f {
			s := p.snapshot()
			for name, n := range want {
				if s.Endpoints[name] != n {
					t.Fatalf("while failing: a proxy has %d endpoints for %s; want %d kept", s.Endpoints[name], name, n)
				}
			}
		}
		time.Sleep(200 * time.Millisecond) // sampling a window, not waiting for a condition
	}
	f.noEmpty(t)
}

func (h *hubProcess) clusterState(t *testing.T, timeout time.Duration, id, state string) api.Cluster {
	t.Helper()
	var c api.Cluster
	eventually(t, timeout, func() error {
		c = h.clusters(t)[id]
		if c.State != state {
			return fmt.Errorf("cluster %s is %s (%s); want %s", id, c.State, c.Message, state)
		}
		return nil
	})
	return c
}

func backends(n int, third byte) []localcluster.Backend {
	var out []localcluster.Backend
	for i := range n {
		out = append(out, localcluster.Backend{IP: fmt.Sprintf("198.18.%d.%d", third, i+1), Port: 8080})
	}
	return out
}

// TestChaosClusters breaks the clusters under a running hub with 20
// connected proxies: a member's API server is killed and restarted, the
// member's etcd is paused and resumed, the home API server is restarted.
// Each time the proxies keep every endpoint (no empty push), the state is
// reported, and the hub recovers within the stated bounds. The home and the
// failing member get their own etcd, so the rest of the suite is untouched.
func TestChaosClusters(t *testing.T) {
	e := localcluster.Require(t, env)
	west := e.Cluster("west")
	ctx := testContext(t)
	start := func(name string) *localcluster.Env {
		ce, err := localcluster.Start(ctx, localcluster.Options{Names: []string{name}, BinDir: os.Getenv("HUB_K8S_BIN_DIR")})
		if err != nil {
			t.Fatalf("starting chaos cluster %s: %v", name, err)
		}
		t.Cleanup(ce.Stop)
		return ce
	}
	homeEnv, memberEnv := start("chaos-home"), start("chaos-member")
	home, member := homeEnv.Cluster("chaos-home"), memberEnv.Cluster("chaos-member")
	app := "chaos-" + rand.String(5)
	edsMember := seedEcho(t, member, app, 3, 1)
	edsWest := seedEcho(t, west, app, 2, 2) // the same service in a healthy member (its own addresses)
	if edsMember != edsWest {
		t.Fatalf("names differ: %s %s", edsMember, edsWest)
	}
	eds := edsMember
	ns := hubNamespace(t, home)
	secrets := client(t, home).CoreV1().Secrets(ns)
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"chaos-member": member.Kubeconfig(), "west": west.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := startHub(t, home, "--namespace", ns, "--remote-cluster-timeout", "20s")
	var f fleet
	for range 20 {
		f = append(f, startProxy(t, []string{h.xdsAddr}, "west", eds))
	}
	f.expect(t, 30*time.Second, "start", map[string]int{eds: 5})

	t.Run("member API server killed and restarted", func(t *testing.T) {
		killed := time.Now()
		member.StopAPIServer()
		c := h.clusterState(t, staleWithin, "chaos-member", "Stale")
		t.Logf("Stale %s after the kill: %s", time.Since(killed).Round(100*time.Millisecond), c.Message)
		if w := h.clusters(t)["west"]; w.State != "Ready" {
			t.Errorf("west is %s while another member fails", w.State)
		}
		f.holdsFor(t, 3*time.Second, map[string]int{eds: 5})
		if err := member.StartAPIServer(); err != nil {
			t.Fatal(err)
		}
		if err := member.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		h.clusterState(t, recoverWithin, "chaos-member", "Ready")
		t.Logf("Ready %s after the API server came back", time.Since(back).Round(100*time.Millisecond))
		if err := localcluster.ApplyEndpoints(ctx, client(t, member), app, "echo", "http", backends(4, 1)); err != nil {
			t.Fatal(err)
		}
		f.expect(t, recoverWithin, "a write after the restart", map[string]int{eds: 6})
	})

	t.Run("member etcd paused", func(t *testing.T) {
		paused := time.Now()
		if err := memberEnv.PauseEtcd(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = memberEnv.ResumeEtcd() })
		c := h.clusterState(t, staleWithin, "chaos-member", "Stale")
		t.Logf("Stale %s after etcd paused: %s", time.Since(paused).Round(100*time.Millisecond), c.Message)
		f.holdsFor(t, 3*time.Second, map[string]int{eds: 6})
		if err := memberEnv.ResumeEtcd(); err != nil {
			t.Fatal(err)
		}
		resumed := time.Now()
		h.clusterState(t, recoverWithin, "chaos-member", "Ready")
		t.Logf("Ready %s after etcd resumed", time.Since(resumed).Round(100*time.Millisecond))
		if err := localcluster.ApplyEndpoints(ctx, client(t, member), app, "echo", "http", backends(3, 1)); err != nil {
			t.Fatal(err)
		}
		f.expect(t, recoverWithin, "a write after etcd resumed", map[string]int{eds: 5})
	})

	t.Run("home API server restarted", func(t *testing.T) {
		home.StopAPIServer()
		c := h.clusterState(t, staleWithin, "chaos-home", "Stale")
		t.Logf("home: %s", c.Message)
		if m := h.clusters(t)["chaos-member"]; m.State != "Ready" {
			t.Errorf("member is %s while the home API server is down", m.State)
		}
		f.holdsFor(t, 3*time.Second, map[string]int{eds: 5})
		if err := home.StartAPIServer(); err != nil {
			t.Fatal(err)
		}
		if err := home.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		h.clusterState(t, recoverWithin, "chaos-home", "Ready")
		t.Logf("home Ready %s after its API server came back", time.Since(back).Round(100*time.Millisecond))
		// The remote-secret watch resumed: a new key is acted on.
		s, err := client(t, home).CoreV1().Secrets(ns).Get(ctx, "members", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Data["late"] = []byte("not: [a kubeconfig")
		if _, err := client(t, home).CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.clusterState(t, recoverWithin, "late", "Invalid")
		f.expect(t, recoverWithin, "after the home restart", map[string]int{eds: 5})
	})
	if !h.ready() {
		t.Error("hub is not ready after the chaos")
	}
}

func (h *hubProcess) ready() bool {
	resp, err := http.Get(h.adminURL + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// bundleServer is a real SPIFFE bundle endpoint (go-spiffe's handler,
// https_web) for a peer trust domain that can be stopped and restarted on
// the same address.
type bundleServer struct {
	addr    string
	handler http.Handler
	cert    tls.Certificate
	srv     *http.Server
	done    chan struct{}
}

func (b *bundleServer) start(t *testing.T) {
	t.Helper()
	lis, err := net.Listen("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	b.addr = lis.Addr().String()
	b.srv = &http.Server{Handler: b.handler, TLSConfig: &tls.Config{Certificates: []tls.Certificate{b.cert}}, ReadHeaderTimeout: 5 * time.Second}
	b.done = make(chan struct{})
	go func() { defer close(b.done); _ = b.srv.ServeTLS(lis, "", "") }()
}

// startBundlePeer serves td's SPIFFE bundle (ca's root, sequence 1, a
// refresh hint of 10 s, the hub's floor) on loopback over https_web until the
// test ends; webCA is the CA its serving certificate chains to.
func startBundlePeer(t *testing.T, td spiffeid.TrustDomain, ca *trust.CA) (peer *bundleServer, webCA []byte) {
	t.Helper()
	bundle := spiffebundle.FromX509Authorities(td, []*x509.Certificate{ca.Cert})
	bundle.SetRefreshHint(10 * time.Second)
	bundle.SetSequenceNumber(1)
	handler, err := federation.NewHandler(td, bundle)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, webCA := webServingCert(t)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	peer = &bundleServer{addr: "127.0.0.1:0", handler: handler, cert: cert}
	peer.start(t)
	t.Cleanup(peer.stop)
	return peer, webCA
}

func (b *bundleServer) stop() {
	if b.srv != nil {
		_ = b.srv.Close()
		<-b.done
		b.srv = nil
	}
}

// TestChaosPeerBundleEndpointDown: a federated peer's bundle endpoint is
// down for three refresh intervals. The hub reports the peer Stale, keeps
// serving its last accepted roots the whole time, and is Ready again soon
// after the endpoint returns.
func TestChaosPeerBundleEndpointDown(t *testing.T) {
	t.Parallel()
	e := localcluster.Require(t, env)
	home := e.Cluster("primary")
	td := spiffeid.RequireTrustDomainFromString("peer-chaos.test")
	peerCA, err := trust.NewSelfSignedCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	peer, webCA := startBundlePeer(t, td, peerCA)

	ns := hubNamespace(t, home)
	h := startHub(t, home, "--namespace", ns, "--trust-domain", "local-chaos.test")
	body, _ := json.Marshal(api.PeerRequest{BundleEndpointURL: "https://" + peer.addr, Profile: "https_web", CABundle: string(webCA)})
	if code, resp := h.do(t, "PUT", "/api/v1/trustdomains/"+td.Name(), string(body)); code != 201 {
		t.Fatalf("PUT peer: %d %s", code, resp)
	}
	sum := sha256.Sum256(peerCA.Cert.Raw)
	want := hex.EncodeToString(sum[:])
	holdsRoots := func() error {
		st, err := h.findTrustDomain(t, td.Name())
		if err != nil {
			return err
		}
		if len(st.X509Authorities) != 1 || st.X509Authorities[0].SHA256 != want {
			return fmt.Errorf("peer authorities %+v; want the peer's root %s", st.X509Authorities, want)
		}
		if code, b := h.do(t, "GET", "/api/v1/trustdomains/"+td.Name()+"/bundle", ""); code != 200 || !strings.Contains(b, `"keys"`) {
			return fmt.Errorf("bundle: %d %s", code, b)
		}
		return nil
	}
	eventually(t, 30*time.Second, func() error {
		if st := h.trustDomain(t, td.Name()); st.State != "Ready" {
			return fmt.Errorf("peer is %s: %s", st.State, st.Message)
		}
		return holdsRoots()
	})

	down := time.Now()
	peer.stop()
	eventually(t, 25*time.Second, func() error {
		if st := h.trustDomain(t, td.Name()); st.State != "Stale" {
			return fmt.Errorf("peer is %s while its endpoint is down", st.State)
		}
		return nil
	})
	t.Logf("peer Stale %s after its endpoint went down", time.Since(down).Round(100*time.Millisecond))
	for time.Since(down) < 30*time.Second { // three refresh intervals, sampled
		if err := holdsRoots(); err != nil {
			t.Fatalf("while the peer is down: %v", err)
		}
		time.Sleep(time.Second)
	}
	peer.start(t)
	back := time.Now()
	// Errors back off 1 s doubling (with jitter); after 30 s down the next
	// attempt is at most ~32 s away.
	eventually(t, 45*time.Second, func() error {
		st := h.trustDomain(t, td.Name())
		if st.State != "Ready" {
			return fmt.Errorf("peer is %s: %s", st.State, st.Message)
		}
		return holdsRoots()
	})
	t.Logf("peer Ready %s after its endpoint came back", time.Since(back).Round(100*time.Millisecond))
}

// TestChaosHubRestartWith200Streams: the hub is restarted under 200
// connected proxies. Every proxy reconnects to the new process on the same
// address and ends up with byte-identical configuration, the new hub lists
// all 200 streams, and none ever receives an empty endpoint set.
func TestChaosHubRestartWith200Streams(t *testing.T) {
	t.Parallel()
	e := localcluster.Require(t, env)
	home, east := e.Cluster("primary"), e.Cluster("east")
	app := "restart-" + rand.String(5)
	eds := seedEcho(t, east, app, 4, 1)
	ns := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(testContext(t), localcluster.RemoteSecret(ns, "members", map[string][]byte{"east": east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := startHub(t, home, "--namespace", ns, "--shutdown-grace", "4s")
	addr := h.xdsAddr
	const n = 200
	var f fleet
	for range n {
		f = append(f, startProxy(t, []string{addr}, "east", eds))
	}
	f.expect(t, 60*time.Second, "before the restart", map[string]int{eds: 4})
	want := f[0].snapshot()

	restarted := time.Now()
	h.stop(t)
	// A proxy keeps what it holds across a reconnect, so holding the same
	// resources proves nothing by itself: count only responses that arrive
	// after the old process has exited (each new stream gets at least CDS
	// and EDS).
	responses := make([]int, len(f))
	for i, p := range f {
		responses[i] = p.snapshot().Responses
	}
	h2 := startHub(t, home, "--namespace", ns, "--xds-addr", addr)
	var reconnected time.Duration
	eventually(t, 120*time.Second, func() error {
		for i, p := range f {
			s := p.snapshot()
			if s.Responses < responses[i]+2 || !sameConfig(s, want, eds) {
				return fmt.Errorf("proxy %d: %d responses from the new hub, endpoints %v", i, s.Responses-responses[i], s.Endpoints)
			}
		}
		reconnected = time.Since(restarted)
		return nil
	})
	// What the assertion checks is the hub's own list: wait for it.
	eventually(t, 120*time.Second, func() error {
		var proxies api.List[api.Proxy]
		h2.getJSON(t, "/api/v1/proxies", &proxies)
		streams := 0 // one open stream per proxy (a proxy reconnects only after its stream ended)
		for _, p := range proxies.Items {
			if strings.HasSuffix(p.ID, ".chaos~chaos.svc.cluster.local") {
				streams++
			}
		}
		if streams != n {
			return fmt.Errorf("the new hub lists %d of the %d proxies", streams, n)
		}
		return nil
	})
	listed := time.Since(restarted)
	f.noEmpty(t)
	t.Logf("%d proxies back on the restarted hub with identical resources %s after SIGTERM, all listed by it after %s",
		n, reconnected.Round(100*time.Millisecond), listed.Round(100*time.Millisecond))
}
