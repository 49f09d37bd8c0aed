package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/localcluster"
)

// labelNetwork puts a member's istio-system namespace on an Istio network
// until the test ends.
func labelNetwork(t *testing.T, c *localcluster.Cluster, network string) {
	t.Helper()
	ctx := testContext(t)
	kc := client(t, c)
	if err := localcluster.EnsureNamespace(ctx, kc, "istio-system"); err != nil {
		t.Fatal(err)
	}
	set := func(v string) error {
		ns, err := kc.CoreV1().Namespaces().Get(context.Background(), "istio-system", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		if v == "" {
			delete(ns.Labels, "topology.istio.io/network")
		} else {
			ns.Labels["topology.istio.io/network"] = v
		}
		_, err = kc.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{})
		return err
	}
	if err := set(network); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = set("") })
}

// meshPods creates pods labelled security.istio.io/tlsMode=istio (as
// Istio's injection labels them; no kubelet runs them) for the backends
// that name one, running as ServiceAccount echoServiceAccount: the
// identity their servers present, which the hub's clients verify.
func meshPods(t *testing.T, kc kubernetes.Interface, ns string, backends []localcluster.Backend, plain ...string) {
	t.Helper()
	ctx := testContext(t)
	for _, name := range []string{"default", echoServiceAccount} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, b := range backends {
		if b.Pod == "" || slices.Contains(plain, b.Pod) {
			continue
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: b.Pod, Labels: map[string]string{"security.istio.io/tlsMode": "istio"}},
			Spec: corev1.PodSpec{AutomountServiceAccountToken: new(false), ServiceAccountName: echoServiceAccount,
				Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}},
		}
		if _, err := kc.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// echoServiceAccount is the ServiceAccount meshPods' pods run as: their
// servers present spiffe://<td>/ns/<ns>/sa/echo.
const echoServiceAccount = "echo"

// TestIstiodRoutesAcrossNetworksThroughGateways: west and east are on two
// Istio networks; east's east-west gateway is a labelled Service. An
// unmodified istiod in west, taking federation from the hub over MCP,
// sends its sidecar (Istio's adsc, on net-west) west's own endpoints
// directly and east's as east's gateway, weighted by the mTLS endpoints it
// stands for, with none of east's pod addresses (the plaintext one is left
// out): it learnt the gateway from the Service the hub wrote into west.
//
// A tenant of east labels a Service of its own namespace (which sorts
// before istio-system) as a gateway of net-east: the hub refuses it (the
// reason in the API, an Event on the remote Secret), it never displaces
// the real gateway, and its address reaches neither west's written
// Service nor istiod's EDS.
func TestIstiodRoutesAcrossNetworksThroughGateways(t *testing.T) {
	istiodBin(t)
	adscBin(t)
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ns := "net-" + rand.String(5)
	labelNetwork(t, west, "net-west")
	labelNetwork(t, east, "net-east")
	backends := map[*localcluster.Cluster][]localcluster.Backend{
		west: {{IP: "198.18.50.1", Port: 8080, Pod: "echo-w1"}},
		east: {{IP: "198.18.51.1", Port: 8080, Pod: "echo-e1"}, {IP: "198.18.51.2", Port: 8080, Pod: "echo-e2"}, {IP: "198.18.51.3", Port: 8080, Pod: "echo-plain"}},
	}
	for c, b := range backends {
		kc := client(t, c)
		if err := localcluster.EnsureNamespace(ctx, kc, ns); err != nil {
			t.Fatal(err)
		}
		meshPods(t, kc, ns, b, "echo-plain")
		if err := localcluster.ApplyClusterIPService(ctx, kc, ns, "echo", "http", 8080, b); err != nil {
			t.Fatal(err)
		}
	}
	// east's east-west gateway, as Istio's gen-eastwest-gateway.sh makes it
	// (here with an external IP that nothing ever dials).
	ec := client(t, east)
	gw := eastWestGatewayService(t, ec, "istio-eastwestgateway-"+rand.String(4), "net-east", "198.19.60.7", nil)
	const tenantIP = "198.19.60.66"
	tenant := "aaa-tenant-" + rand.String(4)
	if err := localcluster.EnsureNamespace(ctx, ec, tenant); err != nil {
		t.Fatal(err)
	}
	impostor := gw.DeepCopy()
	impostor.Namespace, impostor.Name, impostor.Spec.ExternalIPs = tenant, "eastwest", []string{tenantIP}
	if _, err := ec.CoreV1().Services(tenant).Create(ctx, impostor, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec.CoreV1().Namespaces().Delete(context.Background(), tenant, metav1.DeleteOptions{}) })
	hubNS := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(hubNS).Create(ctx, networkedSecret(hubNS, west, east), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const written = "hub-gateway-net-east-15443"
	removeOnCleanup(t, client(t, west), written) // registered first: runs after the hub stopped
	h := startHub(t, home, "--namespace", hubNS, "--trust-domain", "net.test", "--xds-addr", "", "--tls-dns-names", hubDNSName,
		"--xds-tls-addr", "127.0.0.1:0")
	eventually(t, 60*time.Second, func() error {
		cl := h.clusters(t)
		w, e := cl[west.Name], cl[east.Name]
		if w.State != "Ready" || e.State != "Ready" || e.Network != "net-east" || len(e.Gateways) != 1 || !slices.Contains(w.GatewayServices, written) {
			return fmt.Errorf("members: west %+v; east %+v", w, e)
		}
		return nil
	})
	east0 := h.clusters(t)[east.Name]
	if g := east0.Gateways[0]; g.Address != "198.19.60.7" {
		t.Errorf("east's gateway is %+v; want the istio-system one, 198.19.60.7", g)
	}
	wantRefusal := "service " + tenant + "/eastwest: namespace " + tenant + " may not hold gateways"
	if !slices.ContainsFunc(east0.GatewaysRefused, func(r string) bool { return strings.HasPrefix(r, wantRefusal) }) || east0.GatewaysRefusedCount < 1 {
		t.Errorf("east's refused gateways %q (%d); want %q", east0.GatewaysRefused, east0.GatewaysRefusedCount, wantRefusal)
	}
	eventually(t, 30*time.Second, func() error {
		evs, err := client(t, home).CoreV1().Events(hubNS).List(ctx, metav1.ListOptions{FieldSelector: "reason=GatewayRefused"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name == "members" && strings.Contains(ev.Message, wantRefusal) {
				return nil
			}
		}
		return fmt.Errorf("no GatewayRefused Event on the remote Secret naming %s (%d events)", tenant, len(evs.Items))
	})
	// The refusal's new paths (API, cluster page, hub log) carry no credentials.
	var eastJSON json.RawMessage
	h.getJSON(t, "/api/v1/clusters/"+east.Name, &eastJSON)
	where := dashboardPages(t, h.adminURL, home.AdminToken(), "/clusters/"+east.Name)
	where["GET /api/v1/clusters/"+east.Name] = string(eastJSON)
	logData, err := os.ReadFile(h.logPath)
	if err != nil {
		t.Fatal(err)
	}
	where["hub log"] = string(logData)
	for name, text := range where {
		requireNoSecrets(t, name, text, home, west, east)
		if name != "hub log" && !strings.Contains(text, "may not hold gateways") {
			t.Errorf("%s does not show the gateway refusal", name)
		}
	}
	ws, err := client(t, west).CoreV1().Services("istio-system").Get(ctx, written, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ws.Spec.ExternalIPs, []string{"198.19.60.7"}) {
		t.Errorf("west's %s has external IPs %v; want only east's real gateway", written, ws.Spec.ExternalIPs)
	}

	rootsPEM := hubRootsPEM(t, h, spiffeid.RequireTrustDomainFromString("net.test"))
	p := startIstiod(t, west, istiodOptions{ConfigSources: []istiodConfigSource{{Address: "k8s://"}, istiodTLSSource(h.addrs["xds-tls"], rootsPEM)}})
	p.waitConfig(t, 2*time.Minute, "ServiceEntry/"+ns+"/hub-echo", false)
	sidecar := startAdsc(t, "net-sidecar", "--plaintext", "--addr", p.XDSAddr, "--watch", "cds", "--follow", "--network", "net-west",
		"--node-id", fmt.Sprintf("sidecar~198.18.0.9~client.%s~%s.svc.cluster.local", ns, ns), "--cluster-id", west.Name)
	cluster := fmt.Sprintf("outbound|8080||echo.%s.svc.clusterset.local", ns)
	line := sidecar.waitLine(t, 2*time.Minute, cluster+" split for net-west", func(l adscLine) bool {
		return l.Type == "eds" && l.Cluster == cluster && slices.Equal(l.Endpoints, []string{"198.18.50.1:8080", "198.19.60.7:15443"})
	})
	if w := line.Weights["198.19.60.7:15443"]; w != 2 {
		t.Errorf("istiod's weight for east's gateway = %d; want 2 (east's two mTLS endpoints): %+v", w, line)
	}
	if !slices.Contains(line.MTLS, "198.19.60.7:15443") {
		t.Errorf("istiod's gateway endpoint lacks tlsMode istio: %+v", line)
	}
	t.Logf("istiod's EDS for %s on net-west: endpoints %v, weights %v, mTLS %v", cluster, line.Endpoints, line.Weights, line.MTLS)
}

// eastWestGatewayService creates a network's east-west gateway Service in
// kc's istio-system, as Istio's gen-eastwest-gateway.sh makes it: labelled
// with the network, port 15443, ip as its external IP, with annotations
// (e.g. clusters.AnnotationProxylessALPN). It is removed when the test ends.
func eastWestGatewayService(t *testing.T, kc kubernetes.Interface, name, network, ip string, annotations map[string]string) *corev1.Service {
	t.Helper()
	gw := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: name, Labels: map[string]string{"topology.istio.io/network": network},
			Annotations: annotations},
		Spec: corev1.ServiceSpec{ExternalIPs: []string{ip}, Ports: []corev1.ServicePort{{Name: "tls", Port: 15443, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := kc.CoreV1().Services("istio-system").Create(testContext(t), gw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.CoreV1().Services("istio-system").Delete(context.Background(), gw.Name, metav1.DeleteOptions{})
	})
	return gw
}

// removeOnCleanup deletes a Service the hub writes into istio-system when
// the test ends; call it before starting the hub, so that it runs after
// the hub stopped (else the hub would write it again).
func removeOnCleanup(t *testing.T, kc kubernetes.Interface, name string) {
	t.Helper()
	t.Cleanup(func() {
		_ = kc.CoreV1().Services("istio-system").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// TestProxylessGRPCAcrossNetworks: two networks as two network namespaces.
// The server (grpc-go, xDS server credentials, member east) listens on a
// workload address of network B that the client's network A has no route
// to; east's east-west gateway (a real Envoy in B, shaped as istiod builds
// an AUTO_PASSTHROUGH gateway and as deploy/eastwest-proxyless-alpn.yaml
// leaves it) is
// the only way in. A grpc-go xDS client in member west (network A, from its
// member: no NETWORK in its bootstrap) calls it over mTLS through the
// gateway: the hub sent it the gateway, not B's address, and Istio's SNI,
// on which the gateway routed without terminating TLS; the server saw the
// client's SPIFFE ID.
//
// A gateway that terminates TLS with another identity of our trust domain
// instead fails the client's handshake: the hub sends the destination's
// identity exactly (its mesh pods' service account).
func TestProxylessGRPCAcrossNetworks(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ctx := testContext(t)
	ip := dataPlaneIP(t)
	const (
		hostSide   = "198.19.61.1" // network A's end of the veth: the hub's xDS address, reachable from B
		gatewayIP  = "198.19.61.2" // B's end: its east-west gateway, reachable from A
		workloadIP = "198.18.61.1" // on B's loopback: no route from A
	)
	netB := newNetnsNetwork(t, "nb", hostSide, gatewayIP, workloadIP)
	labelNetwork(t, west, "net-west")
	labelNetwork(t, east, "net-east")
	app := "xnet-" + rand.String(5)
	for _, c := range []*localcluster.Cluster{west, east} {
		if err := localcluster.EnsureNamespace(ctx, client(t, c), app); err != nil {
			t.Fatal(err)
		}
	}
	hubNS := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(hubNS).Create(ctx, networkedSecret(hubNS, west, east), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("xnet.test")
	removeOnCleanup(t, client(t, west), "hub-gateway-net-east-15443")
	h := startHub(t, home, "--namespace", hubNS, "--trust-domain", td.Name(), "--mtls-mode", "STRICT", "--xds-addr", net.JoinHostPort(hostSide, "0"))
	ca := hubCA(t, home, hubNS, td)
	var roots []byte
	for _, c := range h.bundle(t, td).X509Authorities() {
		roots = append(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	serverID := spiffeid.RequireFromPath(td, "/ns/"+app+"/sa/echo")
	clientID := spiffeid.RequireFromPath(td, "/ns/"+app+"/sa/caller")

	srv := netB.startChild(t, "xdsserver", serverListenEnv+"="+net.JoinHostPort(workloadIP, "0"), serverIDEnv+"=east",
		"GRPC_XDS_BOOTSTRAP="+workloadFiles(t, ca, roots, serverID, east.Name, workloadIP, h.xdsAddr))
	backendAddr := strings.TrimPrefix(srv.waitLine(t, 30*time.Second, "listening "), "listening ")
	_, portText, _ := net.SplitHostPort(backendAddr)
	port, _ := strconv.Atoi(portText)
	backends := []localcluster.Backend{{IP: workloadIP, Port: int32(port), Pod: "echo-0"}}
	meshPods(t, client(t, east), app, backends)
	if err := localcluster.ApplyService(ctx, client(t, east), app, "echo", "grpc", 7070, backends); err != nil {
		t.Fatal(err)
	}
	srv.waitLine(t, 60*time.Second, "serving")

	sni := "outbound_.7070_._.echo." + app + ".svc.cluster.local"
	backendTCP, err := net.ResolveTCPAddr("tcp", backendAddr)
	if err != nil {
		t.Fatal(err)
	}
	// B's gateway: a real Envoy as istiod builds it and as
	// deploy/eastwest-proxyless-alpn.yaml leaves it (h2 beside Istio's
	// ALPNs; B's servers are proxyless).
	gw := startPassthroughGateway(t, envoyBin(t), netB.name, gatewayIP, 15443, map[string]*net.TCPAddr{sni: backendTCP}, "h2")
	// It admits proxyless gRPC (h2), and says so.
	eastWestGatewayService(t, client(t, east), "istio-eastwestgateway-"+rand.String(4), "net-east", gatewayIP,
		map[string]string{clusters.AnnotationProxylessALPN: "true"})

	// Network A has no route to B's workloads.
	if c, err := net.DialTimeout("tcp", backendAddr, 2*time.Second); err == nil {
		c.Close()
		t.Fatalf("network A reaches %s directly: the two networks are not separate", backendAddr)
	}

	target := fmt.Sprintf("xds:///echo.%s.svc.cluster.local:7070", app)
	caller := startChild(t, "xdsclient", clientTargetEnv+"="+target, clientCredsEnv+"=xds", "GRPC_EXPERIMENTAL_XDS_SNI=true",
		"GRPC_XDS_BOOTSTRAP="+workloadFiles(t, ca, roots, clientID, west.Name, ip, h.xdsAddr))
	if got, want := caller.waitLine(t, 90*time.Second, "ok "), "ok east peer="+clientID.String(); got != want {
		t.Fatalf("client on network A: %q; want %q", got, want)
	}
	srv.waitLine(t, 10*time.Second, "call peer="+clientID.String())
	if st, err := gw.Stats(ctx, `^tcp\..*downstream_cx_total$`); err != nil || st["tcp."+sni+".downstream_cx_total"] == 0 {
		t.Errorf("the gateway passed no connection for %s: %v %v", sni, st, err)
	}

	// What the hub sent the client: east's gateway, not east's address.
	proxyID := "sidecar~" + ip + "~caller." + app + "~" + app + ".svc.cluster.local"
	_, body := h.do(t, "GET", "/api/v1/proxies/"+url.PathEscape(proxyID)+"/config", "")
	if !strings.Contains(body, gatewayIP) || strings.Contains(body, workloadIP) {
		t.Errorf("the client's config holds the gateway %s: %v, east's address %s: %v; want only the gateway",
			gatewayIP, strings.Contains(body, gatewayIP), workloadIP, strings.Contains(body, workloadIP))
	}
	if !strings.Contains(body, "spiffe://"+td.Name()+"/ns/"+app+"/sa/"+echoServiceAccount) {
		t.Errorf("the client's config does not name east's echo identity exactly: %s", body)
	}
	noNacks(t, h, app)

	// An impostor takes the gateway's address and passes the SNI to a
	// server of its own that terminates TLS with a tenant's identity of our
	// trust domain. The client verifies east's echo identity exactly: the
	// call fails in the handshake and never succeeds.
	if err := gw.Stop(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(gatewayIP, "15443"), time.Second); err == nil {
			c.Close()
			return fmt.Errorf("the gateway still listens")
		}
		return nil
	})
	tenant, err := ca.IssueWorkloadSVID(spiffeid.RequireFromPath(td, "/ns/"+app+"/sa/tenant"), east.Name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bundle := h.bundle(t, td)
	impostor, err := tls.Listen("tcp", net.JoinHostPort(hostSide, "0"), tlsconfig.MTLSServerConfig(tenant, bundle, tlsconfig.AuthorizeAny()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { impostor.Close() })
	var handshakes atomic.Int64
	go func() {
		for {
			c, err := impostor.Accept()
			if err != nil {
				return
			}
			if err := c.(*tls.Conn).Handshake(); err == nil {
				handshakes.Add(1)
			}
			c.Close()
		}
	}()
	startPassthroughGateway(t, envoyBin(t), netB.name, gatewayIP, 15443, map[string]*net.TCPAddr{sni: impostor.Addr().(*net.TCPAddr)}, "h2")
	fooled := startChild(t, "xdsclient", clientTargetEnv+"="+target, clientCredsEnv+"=xds", "GRPC_EXPERIMENTAL_XDS_SNI=true",
		"GRPC_XDS_BOOTSTRAP="+workloadFiles(t, ca, roots, clientID, west.Name, ip, h.xdsAddr))
	// Its first calls may end before its config arrives (deadline, no
	// endpoint yet): wait for the handshake's refusal.
	deadline := time.Now().Add(90 * time.Second)
	for l := fooled.waitLine(t, 90*time.Second, "err "); !strings.Contains(l, "handshake"); l = fooled.waitLine(t, time.Until(deadline), "err ") {
		if time.Now().After(deadline) {
			t.Fatalf("through the impostor the client got %q; want a failed handshake", l)
		}
	}
	if n := fooled.oks.Load(); n != 0 {
		t.Errorf("the client called through the impostor %d times", n)
	}
	if n := handshakes.Load(); n != 0 {
		t.Errorf("%d TLS handshakes completed with the impostor", n)
	}
}

// networkedSecret is the remote Secret of west and east that confirms
// their networks (hub.federation/network), as the operator who registers
// them says: without it the hub uses neither member's gateways.
func networkedSecret(ns string, west, east *localcluster.Cluster) *corev1.Secret {
	s := localcluster.RemoteSecret(ns, "members", map[string][]byte{west.Name: west.Kubeconfig(), east.Name: east.Kubeconfig()})
	s.Annotations = map[string]string{"hub.federation/network": west.Name + "=net-west," + east.Name + "=net-east"}
	return s
}
