package e2e

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/internal/envoy"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/trust"
)

// envoyBin is the real Envoy the tests run (HUB_ENVOY_BIN), or ends the
// test (see missing).
func envoyBin(t *testing.T) string {
	t.Helper()
	return binaryFromEnv(t, "HUB_ENVOY_BIN", "run internal/tools/envoy/install.sh (make test does) and set HUB_ENVOY_BIN to the path it prints")
}

// meshBackend is an echo workload of the mesh as an Istio sidecar would
// terminate it: HTTP and gRPC over mTLS with a certificate of the hub's
// CA, requiring a client certificate of our trust domain; both answer with
// the backend's name and the caller's SPIFFE ID.
type meshBackend struct {
	name       string
	http, grpc *net.TCPAddr
	stop       func()
}

func startMeshBackend(t *testing.T, ip, name string, svid *x509svid.SVID, bundle *spiffebundle.Bundle) *meshBackend {
	t.Helper()
	cfg := tlsconfig.MTLSServerConfig(svid, bundle, tlsconfig.AuthorizeMemberOf(bundle.TrustDomain()))
	httpLis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	grpcLis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	b := &meshBackend{name: name, http: httpLis.Addr().(*net.TCPAddr), grpc: grpcLis.Addr().(*net.TCPAddr)}
	httpCfg := cfg.Clone()
	// What Envoy offers (Istio's in-mesh ALPN), as a sidecar's inbound
	// accepts it. net/http closes a connection whose ALPN it has no
	// handler for: the handshake is done here and HTTP/1.1 served on it.
	httpCfg.NextProtos = []string{"istio", "http/1.1"}
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s peer=%s", name, r.Context().Value(peerKey{}))
	}), ConnContext: func(ctx context.Context, c net.Conn) context.Context {
		if pc, ok := c.(*peerConn); ok {
			return context.WithValue(ctx, peerKey{}, pc.peer)
		}
		return ctx
	}}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	testgrpc.RegisterTestServiceServer(gs, echoServer(name))
	var wg sync.WaitGroup
	wg.Go(func() { _ = hs.Serve(&handshakingListener{Listener: httpLis, cfg: httpCfg}) })
	wg.Go(func() { _ = gs.Serve(grpcLis) })
	var once sync.Once
	b.stop = func() {
		once.Do(func() {
			_ = hs.Close()
			gs.Stop()
			wg.Wait()
		})
	}
	t.Cleanup(b.stop)
	return b
}

type peerKey struct{}

// peerConn is a TLS connection, handshaken, with its peer's SPIFFE ID.
type peerConn struct {
	net.Conn
	peer string
}

// handshakingListener accepts TLS connections and completes their
// handshakes (failed ones are dropped).
type handshakingListener struct {
	net.Listener
	cfg *tls.Config
}

func (l *handshakingListener) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := tls.Server(raw, l.cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = c.HandshakeContext(ctx)
		cancel()
		if err != nil {
			raw.Close()
			continue
		}
		st := c.ConnectionState()
		return &peerConn{Conn: c, peer: peerURI(&st)}, nil
	}
}

func peerURI(st *tls.ConnectionState) string {
	if st == nil || len(st.PeerCertificates) == 0 || len(st.PeerCertificates[0].URIs) == 0 {
		return "-"
	}
	return st.PeerCertificates[0].URIs[0].String()
}

// envoyMesh is a hub with two members, west and east, each running the
// echo Service (HTTP on 8080, gRPC on 7070) on mesh pods, and a
// distributed DestinationRule with outlier detection (Istio's condition
// for locality failover).
type envoyMesh struct {
	h          *hubProcess
	td         spiffeid.TrustDomain
	ca         *trust.CA
	bundle     *spiffebundle.Bundle
	ns         string
	west, east *localcluster.Cluster
	backends   map[string]*meshBackend // by member
	kubeconfig string                  // the home cluster's, for istioctl
	rule       *unstructured.Unstructured
	rules      dynamic.ResourceInterface
	httpHost   string
	grpcHost   string
}

const (
	envoyHTTPPort = 8080
	envoyGRPCPort = 7070
)

func startEnvoyMesh(t *testing.T) *envoyMesh {
	t.Helper()
	e := localcluster.Require(t, env)
	ip := dataPlaneIP(t)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	m := &envoyMesh{td: spiffeid.RequireTrustDomainFromString("envoy.test"), ns: "envoy-" + rand.String(5), west: west, east: east,
		backends: map[string]*meshBackend{}}
	root := "root-" + rand.String(5)
	for _, c := range []*localcluster.Cluster{home, west, east} {
		if err := localcluster.EnsureNamespace(ctx, client(t, c), m.ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := localcluster.EnsureNamespace(ctx, client(t, home), root); err != nil {
		t.Fatal(err)
	}
	installIstioCRDs(t, home)
	m.httpHost = fmt.Sprintf("echo-http.%s.svc.cluster.local", m.ns)
	m.grpcHost = fmt.Sprintf("echo-grpc.%s.svc.cluster.local", m.ns)
	dyn, err := dynamic.NewForConfig(home.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	m.rules = dyn.Resource(schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}).Namespace(root)
	m.rule = &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
		"metadata": map[string]any{"name": "echo-http", "namespace": root, "labels": map[string]any{distribute.Label: "true"}},
		"spec": map[string]any{"host": m.httpHost, "trafficPolicy": map[string]any{
			// maxEjectionPercent: Envoy ejects no host past it (10% by
			// default: none of two), and without ejection it never fails
			// over, unlike grpc-go (docs/features.md: failover with Envoy).
			"outlierDetection": map[string]any{"consecutive5xxErrors": int64(1), "interval": "1s", "baseEjectionTime": "30s", "maxEjectionPercent": int64(100)},
		}},
	}}
	if m.rule, err = m.rules.Create(ctx, m.rule, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hubNS := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(hubNS).Create(ctx, localcluster.RemoteSecret(hubNS, "members", map[string][]byte{
		west.Name: west.Kubeconfig(), east.Name: east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m.h = startHub(t, home, "--namespace", hubNS, "--root-namespace", root, "--trust-domain", m.td.Name(), "--xds-tls-addr", "127.0.0.1:0")
	m.kubeconfig = filepath.Join(t.TempDir(), "home.kubeconfig")
	writeFile(t, m.kubeconfig, home.Kubeconfig())
	m.ca = hubCA(t, home, hubNS, m.td)
	m.bundle = m.h.bundle(t, m.td)
	for _, c := range []*localcluster.Cluster{west, east} {
		svid, err := m.ca.IssueWorkloadSVID(spiffeid.RequireFromPath(m.td, "/ns/"+m.ns+"/sa/echo"), c.Name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		b := startMeshBackend(t, ip, c.Name+"-echo", svid, m.bundle)
		m.backends[c.Name] = b
		kc := client(t, c)
		httpB := []localcluster.Backend{{IP: ip, Port: int32(b.http.Port), Pod: "echo-http-" + c.Name}}
		grpcB := []localcluster.Backend{{IP: ip, Port: int32(b.grpc.Port), Pod: "echo-grpc-" + c.Name}}
		meshPods(t, kc, m.ns, append(httpB, grpcB...))
		if err := localcluster.ApplyService(ctx, kc, m.ns, "echo-http", "http", envoyHTTPPort, httpB); err != nil {
			t.Fatal(err)
		}
		if err := localcluster.ApplyService(ctx, kc, m.ns, "echo-grpc", "grpc", envoyGRPCPort, grpcB); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, func() error {
		if cl := m.h.clusters(t); cl[west.Name].State != "Ready" || cl[east.Name].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})
	return m
}

// edgeEnvoy is a real Envoy fed by the hub over ADS, with two static
// listeners of its own (HTTP and gRPC, plaintext, on loopback) whose
// routes it takes from the hub (RDS over ADS).
type edgeEnvoy struct {
	p                  *envoy.Process
	id                 string
	httpAddr, grpcAddr string
}

type edgeOptions struct {
	name        string
	delta       bool
	mtls        bool // the hub's mTLS port with a workload certificate of the hub's CA; else plaintext
	nodeOnce    bool // set_node_on_first_message_only
	oversizedID bool // a node ID the hub refuses
	failover    bool // west's backends stop at the end
}

func (m *envoyMesh) startEdge(t *testing.T, o edgeOptions) *edgeEnvoy {
	t.Helper()
	dir := t.TempDir()
	id := "edge-" + o.name + "~" + m.ns
	if o.oversizedID {
		id = strings.Repeat("x", 2048)
	}
	httpPort, grpcPort := freeLoopbackPort(t), freeLoopbackPort(t)
	ads := envoy.ADS{
		NodeID: id, NodeCluster: "edge", Metadata: map[string]string{"CLUSTER_ID": m.west.Name, "NAMESPACE": m.ns},
		XDSAddr: m.h.xdsAddr, Delta: o.delta, SetNodeOnFirstMessageOnly: o.nodeOnce, LDS: true,
		StaticListeners: []*listenerv3.Listener{
			envoy.HTTPListener("http", "127.0.0.1", uint32(httpPort), fmt.Sprintf("%s:%d", m.httpHost, envoyHTTPPort), true),
			envoy.HTTPListener("grpc", "127.0.0.1", uint32(grpcPort), fmt.Sprintf("%s:%d", m.grpcHost, envoyGRPCPort), true),
		},
	}
	if o.mtls {
		ads.XDSAddr = m.h.addrs["xds-tls"]
		svid, err := m.ca.IssueWorkloadSVID(spiffeid.RequireFromPath(m.td, "/ns/"+m.ns+"/sa/edge"), m.west.Name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		certPEM, keyPEM, err := svid.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		var roots []byte
		for _, c := range m.bundle.X509Authorities() {
			roots = append(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
		ads.TLS = &envoy.TLSFiles{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"), CAFile: filepath.Join(dir, "roots.pem")}
		for f, b := range map[string][]byte{ads.TLS.CertFile: certPEM, ads.TLS.KeyFile: keyPEM, ads.TLS.CAFile: roots} {
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	bootstrap, err := ads.JSON()
	if err != nil {
		t.Fatal(err)
	}
	p, err := envoy.Start(testContext(t), envoy.Options{Bin: envoyBin(t), Bootstrap: bootstrap, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if stats, err := p.Stats(context.Background(), `sds|upstream_cx_connect_fail|update_rejected|warming|outlier|ssl\.(handshake|connection_error|fail)`); err == nil {
				t.Logf("envoy %s stats: %v", o.name, stats)
			}
			if b, err := p.Get(context.Background(), "/clusters"); err == nil {
				var lines []string
				for l := range strings.SplitSeq(string(b), "\n") {
					if strings.Contains(l, "echo-") && (strings.Contains(l, "health_flags") || strings.Contains(l, "priority") || strings.Contains(l, "outlier")) {
						lines = append(lines, l)
					}
				}
				t.Logf("envoy %s /clusters:\n%s", o.name, strings.Join(lines, "\n"))
			}
		}
		p.Stop()
		if t.Failed() {
			t.Logf("envoy %s log:\n%s", o.name, p.LogTail(60))
		}
	})
	return &edgeEnvoy{p: p, id: id, httpAddr: fmt.Sprintf("127.0.0.1:%d", httpPort), grpcAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort)}
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// stat is one of Envoy's counters or gauges (0 when absent).
func (e *edgeEnvoy) stat(t *testing.T, name string) uint64 {
	t.Helper()
	s, err := e.p.Stats(testContext(t), "^"+strings.ReplaceAll(name, ".", `\.`)+"$")
	if err != nil {
		t.Fatal(err)
	}
	return s[name]
}

// converged waits until the Envoy is ready, connected, holds every
// federated cluster with both members' endpoints, warms nothing and
// rejected nothing.
func (m *envoyMesh) converged(t *testing.T, e *edgeEnvoy, wantHosts int) {
	t.Helper()
	ctx := testContext(t)
	eventually(t, 60*time.Second, func() error {
		if err := e.p.WaitReady(ctx); err != nil {
			return err
		}
		stats, err := e.p.Stats(ctx, `^(control_plane\.connected_state|cluster_manager\.warming_clusters|cluster_manager\.cds\.update_(rejected|success)|listener_manager\.lds\.update_(rejected|success))$`)
		if err != nil {
			return err
		}
		if stats["control_plane.connected_state"] != 1 {
			return fmt.Errorf("not connected: %v", stats)
		}
		if stats["cluster_manager.cds.update_rejected"] != 0 || stats["listener_manager.lds.update_rejected"] != 0 {
			return fmt.Errorf("rejected: %v", stats)
		}
		if stats["cluster_manager.warming_clusters"] != 0 || stats["listener_manager.lds.update_success"] == 0 {
			return fmt.Errorf("warming or no LDS yet: %v", stats)
		}
		cls, err := e.p.Clusters(ctx)
		if err != nil {
			return err
		}
		for _, name := range []string{fmt.Sprintf("outbound|%d||%s", envoyHTTPPort, m.httpHost), fmt.Sprintf("outbound|%d||%s", envoyGRPCPort, m.grpcHost)} {
			hosts := -1
			for _, c := range cls {
				if c.Name == name {
					hosts = len(c.Hosts)
				}
			}
			if hosts != wantHosts {
				return fmt.Errorf("cluster %s has %d hosts; want %d", name, hosts, wantHosts)
			}
		}
		return nil
	})
	if n := e.stat(t, "cluster_manager.cds.update_rejected"); n != 0 {
		t.Errorf("CDS rejected %d times", n)
	}
}

// dynamicCluster returns the named dynamic active Cluster from Envoy's config dump.
func (e *edgeEnvoy) dynamicCluster(t *testing.T, name string) *clusterv3.Cluster {
	t.Helper()
	dump, err := e.p.ConfigDump(testContext(t), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range dump.GetConfigs() {
		cd := &adminv3.ClustersConfigDump{}
		if a.MessageIs(cd) {
			if err := a.UnmarshalTo(cd); err != nil {
				t.Fatal(err)
			}
			for _, dc := range cd.GetDynamicActiveClusters() {
				c := &clusterv3.Cluster{}
				if err := dc.GetCluster().UnmarshalTo(c); err != nil {
					t.Fatal(err)
				}
				if c.Name == name {
					return c
				}
			}
		}
	}
	return nil
}

// get sends one HTTP request through the Envoy's listener.
func (e *edgeEnvoy) get(host string) (string, error) {
	req, err := http.NewRequest("GET", "http://"+e.httpAddr+"/", nil)
	if err != nil {
		return "", err
	}
	req.Host = host
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	return string(body), err
}

// call makes one gRPC call through the Envoy's listener.
func (e *edgeEnvoy) call(ctx context.Context, host string) (*testgrpc.SimpleResponse, error) {
	conn, err := grpc.NewClient(e.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority(host))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return testgrpc.NewTestServiceClient(conn).UnaryCall(ctx, &testgrpc.SimpleRequest{})
}

// proxy returns the hub's status of the Envoy's stream.
func (m *envoyMesh) proxy(t *testing.T, id string) (api.Proxy, bool) {
	t.Helper()
	var proxies api.List[api.Proxy]
	m.h.getJSON(t, "/api/v1/proxies", &proxies)
	ids := make([]string, 0, len(proxies.Items))
	for _, p := range proxies.Items {
		if p.ID == id {
			return p, true
		}
		ids = append(ids, p.ID)
	}
	t.Logf("the hub lists %q", ids)
	return api.Proxy{}, false
}

// TestRealEnvoy: real Envoys (1.40, the PyPI build) fed by the hub over
// ADS, SotW and Delta, on the plaintext and the mTLS port. Each holds every
// federated cluster with both members' endpoints, rejects nothing, warms
// nothing once converged, and is listed ACKed by the hub's API. On the
// mTLS port: HTTP and gRPC through the Envoy's own listeners reach the
// backends over Istio mTLS (each backend sees the Envoy's SPIFFE ID, from
// the workload certificate the hub's SDS issued it); a DestinationRule
// change that alters the Cluster only is applied without the 15 s warming
// stall; and when west's backends stop, traffic fails over to east.
func TestRealEnvoy(t *testing.T) {
	envoyBin(t)
	istioctlBin(t)
	m := startEnvoyMesh(t)
	edgeID := spiffeid.RequireFromPath(m.td, "/ns/"+m.ns+"/sa/edge").String()
	for _, o := range []edgeOptions{
		{name: "sotw-plain"},
		{name: "delta-plain", delta: true},
		{name: "sotw-mtls", mtls: true, nodeOnce: true},
		{name: "delta-mtls", delta: true, mtls: true, nodeOnce: true, failover: true},
	} {
		t.Run(o.name, func(t *testing.T) {
			e := m.startEdge(t, o)
			m.converged(t, e, 2)
			var p api.Proxy
			eventually(t, 30*time.Second, func() error {
				var ok bool
				if p, ok = m.proxy(t, e.id); !ok {
					return fmt.Errorf("the hub does not list %s", e.id)
				}
				return nil
			})
			acked := map[string]bool{}
			for _, ts := range p.Types {
				acked[ts.Type] = ts.AckedVersion != ""
				if ts.Nacks > 0 {
					t.Errorf("%s NACKed %s: %s", e.id, ts.Type, ts.NackError)
				}
				if ts.AckedVersion == "" && (ts.Type == "CDS" || ts.Type == "EDS") {
					t.Errorf("%s has not ACKed %s", e.id, ts.Type)
				}
			}
			if !acked["CDS"] || !acked["EDS"] || !acked["LDS"] || !acked["RDS"] {
				t.Errorf("%s ACKed %v; want CDS, EDS, LDS and RDS", e.id, acked)
			}
			// istioctl proxy-status (the real one) lists it, every type SYNCED.
			eventually(t, 60*time.Second, func() error {
				rows, err := proxyStatus(t, m.kubeconfig, "--xds-address", m.h.xdsAddr, "--plaintext", "-v", "1")
				if err != nil {
					return err
				}
				if rows[e.id] == nil {
					return fmt.Errorf("istioctl lists %v; want %s", slices.Sorted(maps.Keys(rows)), e.id)
				}
				return rows[e.id].synced("CDS", "EDS", "LDS", "RDS")
			})
			if n := e.stat(t, "listener_manager.total_listeners_active"); n != 2 {
				t.Errorf("active listeners %d; want its own 2 (the hub sends Envoy none to skip)", n)
			}
			if !o.mtls {
				return
			}
			if p.Identity != edgeID {
				t.Errorf("hub sees identity %q; want %s", p.Identity, edgeID)
			}
			// HTTP and gRPC over Istio mTLS, staying in west (the Envoy's member).
			eventually(t, 30*time.Second, func() error {
				body, err := e.get(m.httpHost)
				if err != nil {
					return err
				}
				if want := "west-echo peer=" + edgeID; body != want {
					return fmt.Errorf("HTTP answer %q; want %q", body, want)
				}
				r, err := e.call(testContext(t), m.grpcHost)
				if err != nil {
					return err
				}
				if r.GetUsername() != edgeID {
					return fmt.Errorf("gRPC backend %s saw %q; want %s", r.GetServerId(), r.GetUsername(), edgeID)
				}
				return nil
			})

			// A DestinationRule change that alters the Cluster only: applied
			// at once, not after Envoy's 15 s warming timeout.
			cluster := fmt.Sprintf("outbound|%d||%s", envoyHTTPPort, m.httpHost)
			n := int64(2)
			if o.delta {
				n = 3
			}
			spec := m.rule.Object["spec"].(map[string]any)
			spec["trafficPolicy"].(map[string]any)["outlierDetection"].(map[string]any)["consecutive5xxErrors"] = n
			var err error
			if m.rule, err = m.rules.Update(testContext(t), m.rule, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			eventually(t, 30*time.Second, func() error {
				c := e.dynamicCluster(t, cluster)
				if got := c.GetOutlierDetection().GetConsecutive_5Xx().GetValue(); got != uint32(n) {
					return fmt.Errorf("active cluster's consecutive_5xx %d; want %d", got, n)
				}
				if w := e.stat(t, "cluster_manager.warming_clusters"); w != 0 {
					return fmt.Errorf("%d clusters warming", w)
				}
				return nil
			})
			took := time.Since(start)
			t.Logf("%s: DestinationRule change active on Envoy, nothing warming, %v after the update", o.name, took.Round(time.Millisecond))
			if took > 10*time.Second {
				t.Errorf("the Cluster change took %v: Envoy waited out its warming (15 s) for an assignment the hub did not resend", took)
			}
			if !o.failover {
				return
			}
			// West's backends stop: outlier detection ejects them and the
			// Envoy fails over to east, the next priority.
			m.backends[m.west.Name].stop()
			inARow, failed := 0, 0
			eventually(t, 60*time.Second, func() error {
				body, err := e.get(m.httpHost)
				if err != nil || !strings.HasPrefix(body, "east-echo ") {
					inARow, failed = 0, failed+1
					return fmt.Errorf("answer %q, %v", body, err)
				}
				if inARow++; inARow < 20 {
					return fmt.Errorf("%d answers from east in a row", inARow)
				}
				return nil
			})
			t.Logf("%s: failed over to east after %d failed requests", o.name, failed)
		})
	}
}

// TestEnvoyRefusedNode: an Envoy whose node the hub refuses (an ID over
// the 1 KiB limit) is told why, in its own log; the hub's API lists the
// refusal (GET /api/v1/proxies/refused) as the client got it; the hub
// keeps serving the Envoys beside it.
func TestEnvoyRefusedNode(t *testing.T) {
	envoyBin(t)
	m := startEnvoyMesh(t)
	good := m.startEdge(t, edgeOptions{name: "good", delta: true})
	m.converged(t, good, 2)
	bad := m.startEdge(t, edgeOptions{name: "bad", oversizedID: true})
	eventually(t, 30*time.Second, func() error {
		log, err := bad.p.Log()
		if err != nil {
			return err
		}
		if !strings.Contains(log, "node.id has 2048 bytes") {
			return fmt.Errorf("envoy log does not name the refusal yet:\n%s", tail(log, 10))
		}
		return nil
	})
	// The hub's API lists the refusal as the client got it.
	eventually(t, 10*time.Second, func() error {
		var refused api.List[api.RefusedStream]
		m.h.getJSON(t, "/api/v1/proxies/refused", &refused)
		for _, r := range refused.Items {
			if r.Code == "InvalidArgument" && strings.Contains(r.Message, "node.id has 2048 bytes") && len(r.ID) <= 256 && r.Address != "" {
				return nil
			}
		}
		return fmt.Errorf("the hub lists refusals %+v; want the oversized node's, InvalidArgument", refused.Items)
	})
	if n := good.stat(t, "control_plane.connected_state"); n != 1 {
		t.Errorf("the good Envoy's connected_state %d; want 1", n)
	}
	m.converged(t, good, 2)
}

// TestRealEnvoyThroughGateway: echo runs only in east, on another network
// than the Envoy's (west's). The hub sends the Envoy east's endpoints as
// east's east-west gateway, a real Envoy shaped as istiod builds an
// AUTO_PASSTHROUGH gateway (SNI and Istio's ALPN, TLS passed through), and
// never east's pod addresses; HTTP and gRPC through it reach east's
// backends over mTLS end to end, each backend seeing the Envoy's SPIFFE ID.
// A gateway that terminates TLS with another identity instead fails the
// Envoy's handshake: the hub sends the destination's identities exactly.
func TestRealEnvoyThroughGateway(t *testing.T) {
	bin := envoyBin(t)
	e := localcluster.Require(t, env)
	ip := dataPlaneIP(t)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	m := &envoyMesh{td: spiffeid.RequireTrustDomainFromString("envoygw.test"), ns: "envoygw-" + rand.String(5), west: west, east: east,
		backends: map[string]*meshBackend{}}
	m.httpHost = fmt.Sprintf("echo-http.%s.svc.cluster.local", m.ns)
	m.grpcHost = fmt.Sprintf("echo-grpc.%s.svc.cluster.local", m.ns)
	for _, c := range []*localcluster.Cluster{home, west, east} {
		if err := localcluster.EnsureNamespace(ctx, client(t, c), m.ns); err != nil {
			t.Fatal(err)
		}
	}
	labelNetwork(t, west, "net-west")
	labelNetwork(t, east, "net-east")
	gwPort := freeLoopbackPort(t)
	ec := client(t, east)
	gw := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istio-eastwestgateway-" + rand.String(4),
			Labels: map[string]string{"topology.istio.io/network": "net-east", "networking.istio.io/gatewayPort": fmt.Sprint(gwPort)}},
		Spec: corev1.ServiceSpec{ExternalIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "tls", Port: int32(gwPort), Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := ec.CoreV1().Services("istio-system").Create(ctx, gw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ec.CoreV1().Services("istio-system").Delete(context.Background(), gw.Name, metav1.DeleteOptions{})
	})
	hubNS := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(hubNS).Create(ctx, networkedSecret(hubNS, west, east), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	removeOnCleanup(t, client(t, west), fmt.Sprintf("hub-gateway-net-east-%d", gwPort))
	m.h = startHub(t, home, "--namespace", hubNS, "--trust-domain", m.td.Name(), "--xds-tls-addr", "127.0.0.1:0")
	m.ca = hubCA(t, home, hubNS, m.td)
	m.bundle = m.h.bundle(t, m.td)
	svid, err := m.ca.IssueWorkloadSVID(spiffeid.RequireFromPath(m.td, "/ns/"+m.ns+"/sa/echo"), east.Name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b := startMeshBackend(t, ip, "east-echo", svid, m.bundle)
	httpB := []localcluster.Backend{{IP: ip, Port: int32(b.http.Port), Pod: "echo-http-east"}}
	grpcB := []localcluster.Backend{{IP: ip, Port: int32(b.grpc.Port), Pod: "echo-grpc-east"}}
	meshPods(t, ec, m.ns, append(httpB, grpcB...))
	if err := localcluster.ApplyService(ctx, ec, m.ns, "echo-http", "http", envoyHTTPPort, httpB); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, ec, m.ns, "echo-grpc", "grpc", envoyGRPCPort, grpcB); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		cl := m.h.clusters(t)
		if w, e := cl[west.Name], cl[east.Name]; w.State != "Ready" || e.State != "Ready" || e.Network != "net-east" || len(e.Gateways) != 1 {
			return fmt.Errorf("members: west %+v; east %+v", w, e)
		}
		return nil
	})

	// East's gateway: a real Envoy, routing by SNI and ALPN to east's backends.
	gwEnvoy := startPassthroughGateway(t, bin, "", ip, gwPort, map[string]*net.TCPAddr{
		fmt.Sprintf("outbound_.%d_._.%s", envoyHTTPPort, m.httpHost): b.http,
		fmt.Sprintf("outbound_.%d_._.%s", envoyGRPCPort, m.grpcHost): b.grpc,
	})

	edge := m.startEdge(t, edgeOptions{name: "gw-delta", delta: true, mtls: true, nodeOnce: true})
	gwAddr := net.JoinHostPort(ip, fmt.Sprint(gwPort))
	eventually(t, 60*time.Second, func() error {
		cls, err := edge.p.Clusters(ctx)
		if err != nil {
			return err
		}
		for _, name := range []string{fmt.Sprintf("outbound|%d||%s", envoyHTTPPort, m.httpHost), fmt.Sprintf("outbound|%d||%s", envoyGRPCPort, m.grpcHost)} {
			var hosts []string
			for _, c := range cls {
				if c.Name == name {
					for _, h := range c.Hosts {
						hosts = append(hosts, h.Address)
					}
				}
			}
			if len(hosts) != 1 || hosts[0] != gwAddr {
				return fmt.Errorf("cluster %s has hosts %v; want only east's gateway %s", name, hosts, gwAddr)
			}
		}
		return nil
	})
	edgeID := spiffeid.RequireFromPath(m.td, "/ns/"+m.ns+"/sa/edge").String()
	eventually(t, 30*time.Second, func() error {
		body, err := edge.get(m.httpHost)
		if err != nil {
			return err
		}
		if want := "east-echo peer=" + edgeID; body != want {
			return fmt.Errorf("HTTP answer %q; want %q", body, want)
		}
		r, err := edge.call(ctx, m.grpcHost)
		if err != nil {
			return err
		}
		if r.GetUsername() != edgeID {
			return fmt.Errorf("gRPC backend %s saw %q; want %s", r.GetServerId(), r.GetUsername(), edgeID)
		}
		return nil
	})
	stats, err := gwEnvoy.Stats(ctx, `^tcp\..*downstream_cx_total$`)
	if err != nil {
		t.Fatal(err)
	}
	for _, sni := range []string{fmt.Sprintf("outbound_.%d_._.%s", envoyHTTPPort, m.httpHost), fmt.Sprintf("outbound_.%d_._.%s", envoyGRPCPort, m.grpcHost)} {
		if stats["tcp."+sni+".downstream_cx_total"] == 0 {
			t.Errorf("the gateway passed no connection for %s: %v", sni, stats)
		}
	}

	// An impostor takes the gateway's address and passes the connections
	// to a server of its own that terminates TLS with another identity of
	// our trust domain (a tenant's workload certificate). The Envoy
	// verifies the destination as the echo pods' service account, exactly:
	// the handshake fails and nothing reaches the impostor.
	if err := gwEnvoy.Stop(); err != nil {
		t.Fatal(err)
	}
	tenantSVID, err := m.ca.IssueWorkloadSVID(spiffeid.RequireFromPath(m.td, "/ns/"+m.ns+"/sa/tenant"), east.Name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	impostor := startMeshBackend(t, ip, "impostor", tenantSVID, m.bundle)
	impostorGW := startPassthroughGateway(t, bin, "", ip, gwPort, map[string]*net.TCPAddr{
		fmt.Sprintf("outbound_.%d_._.%s", envoyHTTPPort, m.httpHost): impostor.http,
	})
	httpCluster := fmt.Sprintf("outbound|%d||%s", envoyHTTPPort, m.httpHost)
	eventually(t, 30*time.Second, func() error {
		if body, err := edge.get(m.httpHost); err == nil {
			return fmt.Errorf("through the impostor the Envoy got %q; want the handshake refused", body)
		}
		st, err := edge.p.Stats(ctx, `ssl\.fail_verify_san$`)
		if err != nil {
			return err
		}
		for name, n := range st { // cluster.<name>.ssl.fail_verify_san, <name> maybe with Istio's ";"
			if n > 0 && strings.HasPrefix(name, "cluster."+httpCluster) {
				return nil
			}
		}
		return fmt.Errorf("no SAN verification failure counted on %s: %v", httpCluster, st)
	})
	if st, err := impostorGW.Stats(ctx, `^tcp\..*downstream_cx_total$`); err != nil || st["tcp.outbound_."+fmt.Sprint(envoyHTTPPort)+"_._."+m.httpHost+".downstream_cx_total"] == 0 {
		t.Errorf("the impostor's gateway passed no connection (%v, %v): the refusal was not the handshake's", st, err)
	}
}

// startPassthroughGateway runs a real Envoy as an east-west gateway on
// ip:port (envoy.PassthroughGateway, with extraALPN): each SNI of routes
// passed, TLS untouched, to its address; in the network namespace netns
// unless it is "". It stops with the test.
func startPassthroughGateway(t *testing.T, bin, netns, ip string, port int, routes map[string]*net.TCPAddr, extraALPN ...string) *envoy.Process {
	t.Helper()
	byCluster := map[string]string{}
	var clusters []*clusterv3.Cluster
	for _, sni := range slices.Sorted(maps.Keys(routes)) {
		name := fmt.Sprintf("to-%d", len(clusters))
		byCluster[sni] = name
		clusters = append(clusters, envoy.StaticCluster(name, routes[sni].IP.String(), uint32(routes[sni].Port)))
	}
	boot, err := envoy.Marshal(&bootstrapv3.Bootstrap{
		Admin: envoy.LoopbackAdmin(),
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: []*listenerv3.Listener{envoy.PassthroughGateway("eastwest", ip, uint32(port), byCluster, extraALPN...)},
			Clusters:  clusters,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := envoy.StartT(t, envoy.Options{Bin: bin, Bootstrap: boot, Netns: netns})
	if err := p.WaitReady(testContext(t)); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPilotAgentWithDNSCaptureKeepsOneStream: a real pilot-agent running a
// real Envoy (Istio's bootstrap template, DNS capture on) pointed at the
// hub: its xDS proxy adds NDS (istio.networking.nds.v1.NameTable), which
// the hub does not serve. The hub ignores it as istiod does (the proxy's
// unserved count), the Envoy's requests are answered (its Clusters ACKed)
// and the agent keeps one stream: the same stream, no reconnects.
func TestPilotAgentWithDNSCaptureKeepsOneStream(t *testing.T) {
	pilotAgentBin(t)
	bin := envoyBin(t)
	e := localcluster.Require(t, env)
	td := spiffeid.RequireTrustDomainFromString("agent-envoy.test")
	h := startAgentHub(t, e, td)
	ns := "agentenvoy-" + rand.String(5)
	a := startAgent(t, agentOptions{Member: e.Cluster("west"), Namespace: ns, ServiceAccount: "sidecar", HubAddr: h.addrs["xds-tls"],
		HubName: agentHubName, RootPEM: h.rootPEM, TrustDomain: td.Name(), Envoy: bin})
	var stream int64
	eventually(t, 90*time.Second, func() error {
		var proxies api.List[api.Proxy]
		h.getJSON(t, "/api/v1/proxies", &proxies)
		for _, p := range proxies.Items {
			if !strings.Contains(p.ID, a.Name) {
				continue
			}
			acked := false
			for _, ts := range p.Types {
				if ts.Nacks > 0 {
					t.Fatalf("the sidecar NACKed %s: %s", ts.Type, ts.NackError)
				}
				acked = acked || (ts.Type == "CDS" && ts.AckedVersion != "")
			}
			if p.Unserved == 0 || !acked {
				return fmt.Errorf("the sidecar's stream: %d unserved requests, CDS ACKed %v; types %+v", p.Unserved, acked, p.Types)
			}
			stream = p.Stream
			return nil
		}
		return fmt.Errorf("the hub lists no stream of %s", a.Name)
	})
	// The same single stream a while later (a stream the hub ended would be
	// reopened by the agent under a new number).
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		var proxies api.List[api.Proxy]
		h.getJSON(t, "/api/v1/proxies", &proxies)
		n := 0
		for _, p := range proxies.Items {
			if strings.Contains(p.ID, a.Name) {
				n++
				if p.Stream != stream {
					t.Fatalf("the sidecar's stream changed from %d to %d: the hub ended it", stream, p.Stream)
				}
			}
		}
		if n != 1 {
			t.Fatalf("%d streams of the sidecar; want 1", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if a.logContains("upstream terminated") || a.logContains("InvalidArgument") {
		t.Errorf("the agent's xDS proxy lost its upstream:\n%s", tail(func() string { b, _ := os.ReadFile(a.LogPath); return string(b) }(), 20))
	}
}
