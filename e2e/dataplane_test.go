package e2e

// A real Istio data plane across two members on two networks (issue 44):
// in each member a real istiod (the e2e build) takes the federation from
// the hub over MCP; real sidecars (pilot-agent running Envoy 1.40 from
// PyPI) and a real east-west gateway (pilot-agent `proxy router`,
// configured by its member's istiod from Istio's cross-network Gateway)
// carry the calls; every certificate comes from the hub's CA.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/deploy"
	"github.com/hubmesh/hub/internal/envoy"
	"github.com/hubmesh/hub/internal/istiod"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/workload"
)

// The application behind a sidecar (role "meshapp"): plaintext HTTP and
// gRPC on loopback addresses, as an app container in a pod with an Istio
// sidecar listens. Both answer with the server's ID and the caller's
// SPIFFE ID as the sidecar forwards it (X-Forwarded-Client-Cert, which
// istiod's inbound listener sets from the verified client certificate).
// Its stdout: "listening", then "call peer=<id>" per gRPC call.
const (
	meshAppHTTPEnv = "HUB_E2E_MESHAPP_HTTP" // ip:port
	meshAppGRPCEnv = "HUB_E2E_MESHAPP_GRPC" // ip:port
)

func runMeshApp() {
	fail := func(err error) {
		fmt.Printf("fatal %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	id := os.Getenv(serverIDEnv)
	httpLis, err := net.Listen("tcp", os.Getenv(meshAppHTTPEnv))
	if err != nil {
		fail(err)
	}
	grpcLis, err := net.Listen("tcp", os.Getenv(meshAppGRPCEnv))
	if err != nil {
		fail(err)
	}
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s peer=%s", id, workload.XFCCURI(r.Header.Get("X-Forwarded-Client-Cert")))
	})}
	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, echoServer(id))
	go func() { _ = hs.Serve(httpLis) }()
	go func() { _ = gs.Serve(grpcLis) }()
	fmt.Println("listening")
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

var (
	sidecarsGVR     = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "sidecars"}
	gatewaysGVR     = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "gateways"}
	envoyFiltersGVR = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1alpha3", Resource: "envoyfilters"}
)

// applyIstioObject creates an Istio config object in c, removed when the
// test ends.
func applyIstioObject(t *testing.T, c *localcluster.Cluster, gvr schema.GroupVersionResource, kind, ns, name string, spec map[string]any) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.Group + "/" + gvr.Version, "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec,
	}}
	if _, err := dyn.Resource(gvr).Namespace(ns).Create(testContext(t), u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating %s %s/%s in %s: %v", kind, ns, name, c.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = dyn.Resource(gvr).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// applyManifest creates the one object of a YAML manifest in c (in the
// namespace it names), removed when the test ends.
func applyManifest(t *testing.T, c *localcluster.Cluster, gvr schema.GroupVersionResource, manifest []byte) {
	t.Helper()
	var obj map[string]any
	if err := yaml.Unmarshal(manifest, &obj); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	applyIstioObject(t, c, gvr, u.GetKind(), u.GetNamespace(), u.GetName(), obj["spec"].(map[string]any))
}

// TestSidecarsAcrossNetworksThroughRealGateway: west (network A, the test's
// own network namespace) and east (network B, a namespace of its own that
// A reaches only at the gateway's address) each run a real istiod fed by
// the hub over TLS. A real sidecar in west calls echo, which runs only in
// east behind a real sidecar, by the hub's federated host
// echo.<ns>.svc.clusterset.local, over HTTP and gRPC: west's istiod sends
// it east's endpoints as east's gateway (learnt from the Service the hub
// wrote into west), and east's real gateway, configured by east's istiod
// from Istio's cross-network Gateway (AUTO_PASSTHROUGH), passes the mTLS
// connection by SNI and ALPN to east's sidecar, which hands the app the
// caller's SPIFFE ID from the hub's CA. Neither istiod's proxies NACK.
//
// Proxyless gRPC and the same real gateway: istiod's chains admit only
// Istio's mTLS ALPNs and grpc-go offers h2. Until east's gateway Service
// says it admits proxyless gRPC (hub.federation/proxyless-alpn), the hub
// sends a hub-fed grpc-go client in west none of east's endpoints and
// says why (API, metric); annotated without deploy/eastwest-proxyless-alpn.yaml,
// the real gateway refuses the client (no_filter_chain_match); with it
// applied in east its calls cross, and a client of another ALPN is still
// refused.
func TestSidecarsAcrossNetworksThroughRealGateway(t *testing.T) {
	istiodBin(t)
	pilotAgentBin(t)
	bin := envoyBin(t)
	e := localcluster.Require(t, env)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ctx := testContext(t)
	const (
		hostSide    = "198.19.62.1" // A's end of the veth: the hub and east's istiod listen here
		gatewayIP   = "198.19.62.2" // B's end: east's east-west gateway
		workloadIP  = "198.18.62.1" // on B's loopback: east's echo pod, no route from A
		proxylessIP = "198.18.62.2" // on B's loopback: east's proxyless gRPC server
		westIP      = "198.18.63.1" // on A's loopback: west's own echo pod
		httpPort    = 18080
		grpcPort    = 17070
	)
	netB := newNetnsNetwork(t, "dp", hostSide, gatewayIP, workloadIP, proxylessIP)
	addLoopbackIP(t, westIP)
	labelNetwork(t, west, "net-west")
	labelNetwork(t, east, "net-east")
	ns := "dataplane-" + rand.String(5)
	td := spiffeid.RequireTrustDomainFromString("dataplane.test")
	for _, c := range []*localcluster.Cluster{west, east} {
		if err := localcluster.EnsureNamespace(ctx, client(t, c), ns); err != nil {
			t.Fatal(err)
		}
	}

	// east: echo's pod (the app and its sidecar share workloadIP's
	// namespace, as containers share a pod's), its Services and east's
	// gateway Service.
	ec := client(t, east)
	httpB := []localcluster.Backend{{IP: workloadIP, Port: httpPort, Pod: "echo-east"}}
	grpcB := []localcluster.Backend{{IP: workloadIP, Port: grpcPort, Pod: "echo-east"}}
	runningPod(t, ec, ns, "echo-east", echoServiceAccount, workloadIP, map[string]string{"app": "echo", "security.istio.io/tlsMode": "istio"})
	if err := localcluster.ApplyClusterIPService(ctx, ec, ns, "echo", "http", httpPort, httpB); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyClusterIPService(ctx, ec, ns, "echo-grpc", "grpc", grpcPort, grpcB); err != nil {
		t.Fatal(err)
	}
	eastWestGatewayService(t, ec, "istio-eastwestgateway", "net-east", gatewayIP, nil)

	hubNS := hubNamespace(t, home)
	// East's gateway runs in istio-system, as Istio installs it: its
	// member may assert identities of the root namespace.
	members := networkedSecret(hubNS, west, east)
	members.Annotations[clusters.AnnotationAllowRootNamespaceIdentities] = "true"
	if _, err := client(t, home).CoreV1().Secrets(hubNS).Create(ctx, members, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	removeOnCleanup(t, client(t, west), "hub-gateway-net-east-15443")
	h := startHub(t, home, "--namespace", hubNS, "--trust-domain", td.Name(), "--tls-dns-names", hubDNSName, "--mtls-mode", "STRICT",
		"--xds-tls-addr", net.JoinHostPort(hostSide, "0"), "--xds-addr", net.JoinHostPort(hostSide, "0"))
	eventually(t, 60*time.Second, func() error {
		cl := h.clusters(t)
		if w, e := cl[west.Name], cl[east.Name]; w.State != "Ready" || e.State != "Ready" || len(e.Gateways) != 1 {
			return fmt.Errorf("members: west %+v; east %+v", w, e)
		}
		return nil
	})
	rootsPEM := hubRootsPEM(t, h, td)
	sources := []istiodConfigSource{{Address: "k8s://"}, istiodTLSSource(h.addrs["xds-tls"], rootsPEM)}
	westIstiod := startIstiod(t, west, istiodOptions{ConfigSources: sources, TrustDomain: td.Name(), Env: istiod.UpstreamEnvoyEnv})
	eastIstiod := startIstiod(t, east, istiodOptions{ConfigSources: sources, TrustDomain: td.Name(), Host: hostSide, Env: istiod.UpstreamEnvoyEnv})
	host := "echo." + ns + ".svc.clusterset.local"
	grpcHost := "echo-grpc." + ns + ".svc.clusterset.local"
	westIstiod.waitConfig(t, 2*time.Minute, "ServiceEntry/"+ns+"/hub-echo", false)
	eastIstiod.waitConfig(t, 2*time.Minute, "ServiceEntry/"+ns+"/hub-echo-grpc", false)

	// Where the proxies listen without iptables: east's sidecar takes
	// inbound calls on the pod's address and hands them to the app on
	// loopback; west's sidecar offers echo on 127.0.0.1 and sees only its
	// own namespace.
	applyIstioObject(t, east, sidecarsGVR, "Sidecar", ns, "echo", map[string]any{
		"workloadSelector": map[string]any{"labels": map[string]any{"app": "echo"}},
		"ingress": []any{
			map[string]any{"port": map[string]any{"number": httpPort, "protocol": "HTTP", "name": "http"}, "defaultEndpoint": "127.0.0.1:9080", "captureMode": "NONE"},
			map[string]any{"port": map[string]any{"number": grpcPort, "protocol": "GRPC", "name": "grpc"}, "defaultEndpoint": "127.0.0.1:9070", "captureMode": "NONE"},
		},
		"egress": []any{map[string]any{"hosts": []any{"istio-system/*"}}},
	})
	applyIstioObject(t, west, sidecarsGVR, "Sidecar", ns, "caller", map[string]any{
		"workloadSelector": map[string]any{"labels": map[string]any{"app": "caller"}},
		"egress":           []any{map[string]any{"hosts": []any{"./*"}}},
	})
	// Istio's samples/multicluster/expose-services.yaml.
	applyIstioObject(t, east, gatewaysGVR, "Gateway", "istio-system", "cross-network-gateway", map[string]any{
		"selector": map[string]any{"istio": "eastwestgateway"},
		"servers": []any{map[string]any{
			"port":  map[string]any{"number": 15443, "name": "tls", "protocol": "TLS"},
			"tls":   map[string]any{"mode": "AUTO_PASSTHROUGH"},
			"hosts": []any{"*.local"},
		}},
	})

	app := netB.startChild(t, "meshapp", meshAppHTTPEnv+"=127.0.0.1:9080", meshAppGRPCEnv+"=127.0.0.1:9070", serverIDEnv+"=east")
	app.waitLine(t, 30*time.Second, "listening")
	agent := func(member *localcluster.Cluster, namespace, pod, sa, podIP string, p *dataPlaneProxy) *agentProcess {
		p.Istiod = map[*localcluster.Cluster]string{west: westIstiod.XDSAddr, east: eastIstiod.XDSAddr}[member]
		return launchAgent(t, agentOptions{Member: member, Namespace: namespace, ServiceAccount: sa, PodName: pod, PodIP: podIP,
			HubAddr: h.addrs["xds-tls"], HubName: hubDNSName, RootPEM: rootsPEM, TrustDomain: td.Name(), Envoy: bin, Proxy: p})
	}
	server := agent(east, ns, "echo-east", echoServiceAccount, workloadIP, &dataPlaneProxy{Network: "net-east", Netns: netB.name, AdminPort: 15000})
	gateway := agent(east, "istio-system", "istio-eastwestgateway-0", "istio-eastwestgateway", gatewayIP, &dataPlaneProxy{Router: true, Network: "net-east", Netns: netB.name,
		Labels: map[string]string{"istio": "eastwestgateway", "topology.istio.io/network": "net-east"}, AdminPort: 25000,
		Stats: []string{"listener."}})
	caller := agent(west, ns, "caller-0", "caller", dataPlaneIP(t), &dataPlaneProxy{Network: "net-west", AdminPort: 21000,
		Stats: []string{"cluster.outbound|"}})

	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, a := range []*agentProcess{server, gateway, caller} {
			dumpProxy(t, a, ns)
		}
	})

	for _, a := range []*agentProcess{server, gateway, caller} {
		waitProxyReady(t, a)
	}

	callerID := spiffeid.RequireFromPath(td, "/ns/"+ns+"/sa/caller").String()
	eventually(t, 90*time.Second, func() error {
		body, err := getVia(ctx, httpPort, host)
		if err != nil {
			return fmt.Errorf("HTTP through west's sidecar: %w", err)
		}
		if want := "east peer=" + callerID; body != want {
			return fmt.Errorf("HTTP through west's sidecar: %q; want %q", body, want)
		}
		return nil
	})
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority(fmt.Sprintf("%s:%d", grpcHost, grpcPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually(t, 60*time.Second, func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err := testgrpc.NewTestServiceClient(conn).UnaryCall(cctx, &testgrpc.SimpleRequest{})
		if err != nil {
			return err
		}
		if r.GetServerId() != "east" || r.GetUsername() != callerID {
			return fmt.Errorf("gRPC through west's sidecar reached %q as %q; want east as %s", r.GetServerId(), r.GetUsername(), callerID)
		}
		return nil
	})

	// The gateway passed both by SNI to east's pod, and nobody NACKed.
	for _, sni := range []string{fmt.Sprintf("outbound_.%d_._.%s", httpPort, host), fmt.Sprintf("outbound_.%d_._.%s", grpcPort, grpcHost)} {
		if n := hostCounter(t, gateway, sni, "cx_total"); n == 0 {
			t.Errorf("east's gateway opened no connection to %s's endpoints", sni)
		}
	}
	for _, a := range []*agentProcess{server, gateway, caller} {
		st, err := a.Envoy.Stats(ctx, `update_rejected$`)
		if err != nil {
			t.Fatal(err)
		}
		for name, n := range st {
			if n > 0 {
				t.Errorf("%s: %s = %d", a.Name, name, n)
			}
		}
		// The counters exist (a check that finds none proves nothing):
		// CDS, LDS and every cluster's EDS.
		var eds int
		for name := range st {
			if strings.HasPrefix(name, "cluster.outbound") {
				eds++
			}
		}
		if _, cds := st["cluster_manager.cds.update_rejected"]; !cds || eds == 0 {
			t.Errorf("%s keeps no CDS (%v) or EDS (%d clusters) update_rejected counters: %v", a.Name, cds, eds, st)
		}
		if _, lds := st["listener_manager.lds.update_rejected"]; !lds {
			t.Errorf("%s keeps no LDS update_rejected counter", a.Name)
		}
	}

	// Measured (logged, never a condition): calls through west's sidecar,
	// east's real gateway and east's sidecar, 4 at a time for 3 s.
	t.Logf("measured: sidecar HTTP through the real gateway: %s", loadRun(ctx, 4, 3*time.Second, func(ctx context.Context) error {
		_, err := getVia(ctx, httpPort, host)
		return err
	}))
	grpcClient := testgrpc.NewTestServiceClient(conn)
	t.Logf("measured: sidecar gRPC through the real gateway: %s", loadRun(ctx, 4, 3*time.Second, func(ctx context.Context) error {
		_, err := grpcClient.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		return err
	}))

	// Proxyless gRPC through the same real gateway: a hub-fed grpc-go
	// client in west calls a hub-fed grpc-go server in east by its
	// cluster.local name; the hub sends the client east's gateway.
	ca := hubCA(t, home, hubNS, td)
	serverID := spiffeid.RequireFromPath(td, "/ns/"+ns+"/sa/"+echoServiceAccount)
	pl := netB.startChild(t, "xdsserver", serverListenEnv+"="+net.JoinHostPort(proxylessIP, "0"), serverIDEnv+"=east-proxyless",
		"GRPC_XDS_BOOTSTRAP="+workloadFiles(t, ca, rootsPEM, serverID, east.Name, proxylessIP, h.xdsAddr))
	_, plPort, _ := net.SplitHostPort(strings.TrimPrefix(pl.waitLine(t, 30*time.Second, "listening "), "listening "))
	port, _ := strconv.Atoi(plPort)
	runningPod(t, ec, ns, "echo-proxyless", echoServiceAccount, proxylessIP, map[string]string{"app": "echo-proxyless", "security.istio.io/tlsMode": "istio"})
	if err := localcluster.ApplyClusterIPService(ctx, ec, ns, "echo-proxyless", "grpc", 7070,
		[]localcluster.Backend{{IP: proxylessIP, Port: int32(port), Pod: "echo-proxyless"}}); err != nil {
		t.Fatal(err)
	}
	pl.waitLine(t, 60*time.Second, "serving")
	target := fmt.Sprintf("xds:///echo-proxyless.%s.svc.cluster.local:7070", ns)
	plSNI := "outbound_.7070_._.echo-proxyless." + ns + ".svc.cluster.local"
	refused := func() uint64 {
		st, err := gateway.Envoy.Stats(ctx, `^listener\.0\.0\.0\.0_15443\.no_filter_chain_match$`)
		if err != nil {
			t.Fatal(err)
		}
		return st["listener.0.0.0.0_15443.no_filter_chain_match"]
	}
	// As istiod builds the gateway (its chain for the SNI in place),
	// grpc-go's h2 matches no chain: its connections are closed, counted
	// as no_filter_chain_match.
	eventually(t, 60*time.Second, func() error {
		alpns, found := gatewayChainALPNs(t, gateway, plSNI)
		if !found {
			return fmt.Errorf("east's gateway has no 15443 chain for %s yet", plSNI)
		}
		if slices.Contains(alpns, "h2") {
			t.Fatalf("istiod's chain for %s already lists h2: %v", plSNI, alpns)
		}
		return nil
	})
	before := refused()
	plCaller := startChild(t, "xdsclient", clientTargetEnv+"="+target, clientCredsEnv+"=xds", "GRPC_EXPERIMENTAL_XDS_SNI=true", clientLoadEnv+"=3s",
		"GRPC_XDS_BOOTSTRAP="+workloadFiles(t, ca, rootsPEM, spiffeid.RequireFromPath(td, "/ns/"+ns+"/sa/caller"), west.Name, dataPlaneIP(t), h.xdsAddr))
	// No gateway of east's network says it admits proxyless gRPC: the hub
	// sends the proxyless client none of east's endpoints (rather than a
	// gateway that would close its connections), and says so in the API
	// and a metric.
	eventually(t, 60*time.Second, func() error {
		c := h.clusters(t)[east.Name]
		if c.ProxylessWithheld == 0 || c.ProxylessWithheld <= c.CrossNetworkWithheld {
			return fmt.Errorf("east: %d endpoints withheld from proxyless clients, %d from all; want more from proxyless", c.ProxylessWithheld, c.CrossNetworkWithheld)
		}
		if m := metric(t, h, `hub_cluster_cross_network_withheld_endpoints{clients="proxyless",cluster="`+east.Name+`"}`); m != strconv.Itoa(c.ProxylessWithheld) {
			return fmt.Errorf("metric of east's endpoints withheld from proxyless clients: %q; want %d", m, c.ProxylessWithheld)
		}
		if plCaller.errs.Load() == 0 {
			return errors.New("the proxyless client has not failed a call yet")
		}
		return nil
	})
	if n, r := plCaller.oks.Load(), refused(); n > 0 || r != before {
		t.Fatalf("without a gateway admitting it, grpc-go made %d calls and the gateway refused %d connections; want none", n, r-before)
	}

	// East's gateway Service says it admits proxyless gRPC, but istiod's
	// chains do not match h2 yet: the hub sends the gateway, which closes
	// grpc-go's connections (no_filter_chain_match). This is why the
	// annotation follows the EnvoyFilter, never precedes it.
	gwSvc, err := ec.CoreV1().Services("istio-system").Get(ctx, "istio-eastwestgateway", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gwSvc.Annotations = map[string]string{clusters.AnnotationProxylessALPN: "true"}
	if _, err := ec.CoreV1().Services("istio-system").Update(ctx, gwSvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, func() error {
		if n := plCaller.oks.Load(); n > 0 {
			t.Fatalf("grpc-go crossed istiod's gateway %d times without the EnvoyFilter", n)
		}
		if refused() == before {
			return errors.New("the gateway has not refused grpc-go's connection yet")
		}
		return nil
	})
	if c := h.clusters(t)[east.Name]; c.ProxylessWithheld != c.CrossNetworkWithheld || len(c.Gateways) != 1 || !c.Gateways[0].Proxyless {
		t.Errorf("east with its gateway annotated: %d endpoints withheld from proxyless clients, %d from all, gateways %+v", c.ProxylessWithheld, c.CrossNetworkWithheld, c.Gateways)
	}

	// deploy/eastwest-proxyless-alpn.yaml, applied in east: the gateway's
	// chains also admit h2, and grpc-go's calls cross, the server seeing
	// the client's SPIFFE ID.
	applyManifest(t, east, envoyFiltersGVR, deploy.EastWestProxylessALPN)
	if got, want := plCaller.waitLine(t, 90*time.Second, "ok "), "ok east-proxyless peer="+callerID; got != want {
		t.Fatalf("proxyless client in west: %q; want %q", got, want)
	}
	pl.waitLine(t, 10*time.Second, "call peer="+callerID)
	t.Logf("measured: proxyless gRPC through the real gateway: %s", strings.TrimPrefix(plCaller.waitLine(t, 30*time.Second, "load "), "load "))
	if alpns, _ := gatewayChainALPNs(t, gateway, plSNI); !slices.Contains(alpns, "h2") || !slices.Contains(alpns, "istio") {
		t.Errorf("east's gateway matches %s on ALPNs %v; want Istio's and h2", plSNI, alpns)
	}
	// A TLS client offering an ALPN in neither list is still refused.
	before = refused()
	for _, alpn := range []string{"http/1.1", "h2"} {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(gatewayIP, "15443"),
			&tls.Config{ServerName: plSNI, NextProtos: []string{alpn}, MinVersion: tls.VersionTLS13,
				InsecureSkipVerify: true}) // the refusal is the gateway's, before any certificate
		if conn != nil {
			conn.Close()
		}
		if passed := err == nil; passed != (alpn == "h2") {
			t.Errorf("a TLS client offering %s to east's gateway: %v", alpn, err)
		}
	}
	if n := refused() - before; n != 1 {
		t.Errorf("east's gateway refused %d connections for want of a chain; want 1 (the http/1.1 one)", n)
	}

	// An impostor in east's pod: a sidecar with another identity of our
	// trust domain (a tenant's service account) takes the pod's address
	// and terminates the mTLS the gateway passes. West's sidecar verifies
	// east's echo identity exactly (the ServiceEntry's subjectAltNames,
	// from the hub): the handshake fails and no call reaches the app.
	echoCluster := fmt.Sprintf("outbound|%d||%s", httpPort, host)
	server.stop(t)
	impostor := agent(east, ns, "echo-east", "tenant", workloadIP, &dataPlaneProxy{Network: "net-east", Netns: netB.name, AdminPort: 15000})
	waitProxyReady(t, impostor)
	eventually(t, 60*time.Second, func() error {
		if body, err := getVia(ctx, httpPort, host); err == nil {
			return fmt.Errorf("through the impostor west's sidecar got %q; want the handshake refused", body)
		}
		st, err := caller.Envoy.Stats(ctx, `ssl\.fail_verify_san$`)
		if err != nil {
			return err
		}
		for name, n := range st {
			if n > 0 && strings.HasPrefix(name, "cluster."+echoCluster) {
				return nil
			}
		}
		return fmt.Errorf("no SAN verification failure counted on %s: %v", echoCluster, st)
	})
	if n := hostCounter(t, impostor, fmt.Sprintf("inbound|%d||", httpPort), "rq_total"); n != 0 {
		t.Errorf("the impostor's sidecar passed %d requests to the app", n)
	}
	impostor.stop(t)
	server = agent(east, ns, "echo-east", echoServiceAccount, workloadIP, &dataPlaneProxy{Network: "net-east", Netns: netB.name, AdminPort: 15000})
	waitProxyReady(t, server)
	eventually(t, 60*time.Second, func() error {
		_, err := getVia(ctx, httpPort, host)
		return err
	})

	// Failover: echo also runs in west, behind its own sidecar. Calls
	// reach both members; when east's backend stops (its endpoint no
	// longer ready, as the kubelet reports a stopped pod) every call is
	// answered by west once the hub, west's istiod and the sidecar have
	// the change; when east is removed from the mesh its endpoints leave
	// west's sidecar.
	wc := client(t, west)
	runningPod(t, wc, ns, "echo-west", echoServiceAccount, westIP, map[string]string{"app": "echo", "security.istio.io/tlsMode": "istio"})
	if err := localcluster.ApplyClusterIPService(ctx, wc, ns, "echo", "http", httpPort,
		[]localcluster.Backend{{IP: westIP, Port: httpPort, Pod: "echo-west"}}); err != nil {
		t.Fatal(err)
	}
	applyIstioObject(t, west, sidecarsGVR, "Sidecar", ns, "echo", map[string]any{
		"workloadSelector": map[string]any{"labels": map[string]any{"app": "echo"}},
		"ingress": []any{map[string]any{"port": map[string]any{"number": httpPort, "protocol": "HTTP", "name": "http"},
			"defaultEndpoint": "127.0.0.1:9081", "captureMode": "NONE"}},
		"egress": []any{map[string]any{"hosts": []any{"istio-system/*"}}},
	})
	westApp := startChild(t, "meshapp", meshAppHTTPEnv+"=127.0.0.1:9081", meshAppGRPCEnv+"=127.0.0.1:0", serverIDEnv+"=west")
	westApp.waitLine(t, 30*time.Second, "listening")
	westServer := agent(west, ns, "echo-west", echoServiceAccount, westIP, &dataPlaneProxy{Network: "net-west", AdminPort: 22000})
	waitProxyReady(t, westServer)
	gwHost := net.JoinHostPort(gatewayIP, "15443")
	westHost := net.JoinHostPort(westIP, fmt.Sprint(httpPort))
	waitHosts(t, caller, echoCluster, westHost, gwHost)
	eventually(t, 30*time.Second, func() error {
		got := map[string]int{}
		for range 20 {
			body, err := getVia(ctx, httpPort, host)
			if err != nil {
				return err
			}
			got[strings.Fields(body)[0]]++
		}
		if got["west"] == 0 || got["east"] == 0 {
			return fmt.Errorf("20 calls reached %v; want both members", got)
		}
		return nil
	})

	// Measured: a Service change in east reaching west's sidecar (hub →
	// west's istiod → sidecar: the gateway's weight, east's mTLS
	// endpoints, goes 1 → 2 → 1) beside the same change in west reaching
	// it through west's istiod alone (west's own Service: 1 → 2 → 1 hosts).
	runningPod(t, ec, ns, "echo-east-2", echoServiceAccount, "198.18.62.9", map[string]string{"app": "echo", "security.istio.io/tlsMode": "istio"})
	runningPod(t, wc, ns, "echo-west-2", echoServiceAccount, "198.18.63.9", map[string]string{"app": "echo", "security.istio.io/tlsMode": "istio"})
	westB := []localcluster.Backend{{IP: westIP, Port: httpPort, Pod: "echo-west"}}
	localCluster := fmt.Sprintf("outbound|%d||echo.%s.svc.cluster.local", httpPort, ns)
	var federated, local []time.Duration
	for range 5 {
		federated = append(federated, converge(t, caller, echoCluster, func() {
			if err := localcluster.ApplyEndpoints(ctx, ec, ns, "echo", "http", append(httpB, localcluster.Backend{IP: "198.18.62.9", Port: httpPort, Pod: "echo-east-2"})); err != nil {
				t.Fatal(err)
			}
		}, func(hs []envoy.HostStatus) bool { return hostWeight(hs, gwHost) == 2 }))
		federated = append(federated, converge(t, caller, echoCluster, func() {
			if err := localcluster.ApplyEndpoints(ctx, ec, ns, "echo", "http", httpB); err != nil {
				t.Fatal(err)
			}
		}, func(hs []envoy.HostStatus) bool { return hostWeight(hs, gwHost) == 1 }))
		local = append(local, converge(t, caller, localCluster, func() {
			if err := localcluster.ApplyEndpoints(ctx, wc, ns, "echo", "http", append(westB, localcluster.Backend{IP: "198.18.63.9", Port: httpPort, Pod: "echo-west-2"})); err != nil {
				t.Fatal(err)
			}
		}, func(hs []envoy.HostStatus) bool { return len(hs) == 2 }))
		local = append(local, converge(t, caller, localCluster, func() {
			if err := localcluster.ApplyEndpoints(ctx, wc, ns, "echo", "http", westB); err != nil {
				t.Fatal(err)
			}
		}, func(hs []envoy.HostStatus) bool { return len(hs) == 1 }))
	}
	slices.Sort(federated)
	slices.Sort(local)
	t.Logf("measured: an EndpointSlice write → west's sidecar, 10 writes each: across members via the hub p50 %v max %v; in west via west's istiod alone p50 %v max %v",
		federated[len(federated)/2], federated[len(federated)-1], local[len(local)/2], local[len(local)-1])

	start := time.Now()
	if err := localcluster.ApplyClusterIPService(ctx, ec, ns, "echo", "http", httpPort,
		[]localcluster.Backend{{IP: workloadIP, Port: httpPort, Pod: "echo-east", NotReady: true}}); err != nil {
		t.Fatal(err)
	}
	_ = app.stdin.Close() // east's app stops
	waitHosts(t, caller, echoCluster, westHost)
	t.Logf("east's endpoint not ready → gone from west's sidecar in %v (hub → west's istiod → sidecar)", time.Since(start).Round(time.Millisecond))
	for range 20 {
		if body, err := getVia(ctx, httpPort, host); err != nil || !strings.HasPrefix(body, "west ") {
			t.Fatalf("with east's backend stopped, a call got %q, %v; want west's answer", body, err)
		}
	}

	// East's endpoint is ready again (its app stays stopped: only what
	// west's sidecar holds is checked); then east leaves the mesh (its key
	// removed from the remote Secret): its endpoints leave west's sidecar.
	if err := localcluster.ApplyClusterIPService(ctx, ec, ns, "echo", "http", httpPort, httpB); err != nil {
		t.Fatal(err)
	}
	waitHosts(t, caller, echoCluster, westHost, gwHost)
	sc := client(t, home).CoreV1().Secrets(hubNS)
	cur, err := sc.Get(ctx, members.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(cur.Data, east.Name)
	start = time.Now()
	if _, err := sc.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHosts(t, caller, echoCluster, westHost)
	t.Logf("east removed from the remote Secret → its endpoints gone from west's sidecar in %v", time.Since(start).Round(time.Millisecond))
}

// converge runs write and returns how long until cond holds for a proxy's
// cluster's hosts, polling its admin API every 5 ms.
func converge(t *testing.T, a *agentProcess, cluster string, write func(), cond func([]envoy.HostStatus) bool) time.Duration {
	t.Helper()
	start := time.Now()
	write()
	deadline := start.Add(60 * time.Second)
	for {
		cls, err := a.Envoy.Clusters(testContext(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cls {
			if c.Name == cluster && cond(c.Hosts) {
				return time.Since(start).Round(time.Millisecond)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's %s did not converge within 60s: %+v", a.Name, cluster, cls)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// hostWeight is the load-balancing weight of host addr, 0 when absent.
func hostWeight(hs []envoy.HostStatus, addr string) uint32 {
	for _, h := range hs {
		if h.Address == addr {
			return h.Weight
		}
	}
	return 0
}

// addLoopbackIP adds ip to this network namespace's loopback until the
// test ends (the test runs in a namespace of its own: make test).
func addLoopbackIP(t *testing.T, ip string) {
	t.Helper()
	if os.Geteuid() != 0 || os.Getenv("HUB_TEST_DATAPLANE_IP") == "" {
		missing(t, "another workload address needs root and the test's own network namespace (make test)")
	}
	if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip addr add %s: %v: %s", ip, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", ip+"/32", "dev", "lo").Run() })
}

// waitProxyReady waits until a data-plane proxy's Envoy is ready (/ready:
// its listeners and clusters from istiod applied).
func waitProxyReady(t *testing.T, a *agentProcess) {
	t.Helper()
	eventually(t, 2*time.Minute, func() error {
		if !a.alive() {
			t.Fatalf("%s: %v", a.Name, a.Exited())
		}
		body, err := a.Envoy.Get(testContext(t), "/ready")
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(body)) != "LIVE" {
			return fmt.Errorf("%s: %s", a.Name, body)
		}
		return nil
	})
}

// waitHosts waits until a proxy's cluster has exactly the hosts named.
func waitHosts(t *testing.T, a *agentProcess, cluster string, want ...string) {
	t.Helper()
	slices.Sort(want)
	eventually(t, 60*time.Second, func() error {
		cls, err := a.Envoy.Clusters(testContext(t))
		if err != nil {
			return err
		}
		var hosts []string
		for _, c := range cls {
			if c.Name == cluster {
				for _, h := range c.Hosts {
					hosts = append(hosts, h.Address)
				}
			}
		}
		slices.Sort(hosts)
		if !slices.Equal(hosts, want) {
			return fmt.Errorf("%s's %s has hosts %v; want %v", a.Name, cluster, hosts, want)
		}
		return nil
	})
}

// getVia sends GET / with Host host to the sidecar's outbound listener on
// 127.0.0.1:port and returns the body of a 200 answer.
func getVia(ctx context.Context, port int, host string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	if err != nil {
		return "", err
	}
	req.Host = host
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%d %s", resp.StatusCode, body)
	}
	return string(body), nil
}

// gatewayChainALPNs is the ALPN list a gateway's 15443 filter chain for sni
// matches on, from its config dump; found is false when it has no such
// chain.
func gatewayChainALPNs(t *testing.T, gw *agentProcess, sni string) (alpns []string, found bool) {
	t.Helper()
	dump, err := gw.Envoy.ConfigDump(testContext(t), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range dump.GetConfigs() {
		var ls adminv3.ListenersConfigDump
		if c.UnmarshalTo(&ls) != nil {
			continue
		}
		for _, dl := range ls.GetDynamicListeners() {
			var l listenerv3.Listener
			if dl.GetActiveState().GetListener().UnmarshalTo(&l) != nil || l.GetName() != "0.0.0.0_15443" {
				continue
			}
			for _, fc := range l.GetFilterChains() {
				if slices.Contains(fc.GetFilterChainMatch().GetServerNames(), sni) {
					return fc.GetFilterChainMatch().GetApplicationProtocols(), true
				}
			}
		}
	}
	return nil, false
}

// hostCounter sums a host counter (e.g. cx_total) over a cluster's hosts
// in an Envoy's /clusters: per-cluster statistics are not kept by Istio's
// bootstrap (its stats_matcher), per-host ones always are.
func hostCounter(t *testing.T, a *agentProcess, cluster, counter string) uint64 {
	t.Helper()
	cls, err := a.Envoy.ClustersProto(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range cls.GetClusterStatuses() {
		if c.GetName() != cluster {
			continue
		}
		for _, h := range c.GetHostStatuses() {
			for _, m := range h.GetStats() {
				if m.GetName() == counter {
					n += m.GetValue()
				}
			}
		}
	}
	return n
}

// runningPod creates a pod as the kubelet would show it running at ip
// (status.podIP), with labels, as ServiceAccount sa (created if missing):
// what istiod reads of a sidecar's own pod and of its endpoints' pods.
// No kubelet runs it; the test runs its containers.
func runningPod(t *testing.T, kc kubernetes.Interface, ns, name, sa, ip string, labels map[string]string) {
	t.Helper()
	ctx := testContext(t)
	if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod, err := kc.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{AutomountServiceAccountToken: new(false), ServiceAccountName: sa,
			Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := kc.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// dumpProxy logs what a failed test needs of a data-plane proxy's Envoy:
// its hosts of clusters naming ns, its listeners and its connection
// statistics.
func dumpProxy(t *testing.T, a *agentProcess, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := a.Envoy.Get(ctx, "/clusters")
	if err != nil {
		t.Logf("%s: %v", a.Name, err)
		return
	}
	var lines []string
	for l := range strings.SplitSeq(string(body), "\n") {
		if strings.Contains(l, ns) && (strings.Contains(l, "::cx_") || strings.Contains(l, "health_flags") || strings.Contains(l, "rq_error")) {
			lines = append(lines, l)
		}
	}
	listeners, _ := a.Envoy.Get(ctx, "/listeners")
	stats, _ := a.Envoy.Get(ctx, "/stats?filter=(ssl|downstream_cx|no_filter_chain|upstream_cx_connect_fail|upstream_cx_total)")
	var st []string
	for l := range strings.SplitSeq(string(stats), "\n") {
		if !strings.HasSuffix(l, ": 0") {
			st = append(st, l)
		}
	}
	t.Logf("%s clusters:\n%s\nlisteners:\n%s\nstats:\n%s", a.Name, strings.Join(lines, "\n"), listeners, strings.Join(st, "\n"))
}
