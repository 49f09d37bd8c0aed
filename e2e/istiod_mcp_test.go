package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/internal/istiod"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/xdstest"
)

// TestIstiodTakesFederationFromHub (issues 14, 21): a real istiod
// (pilot-discovery built from the Istio module of e2e/interop) runs against
// member east's API server with configSources [k8s://, xds://<hub>], the
// latter over SIMPLE TLS to the hub's mTLS port (see istiodTLSSource; the
// hub's plaintext port is off), while an anonymous CDS request on that same
// port is refused. The hub federates
// echo, a Service of two other members (the home cluster, a member too, and
// west); an xDS client of that istiod (Istio's adsc as a sidecar) receives
// the cluster outbound|8080||echo.<ns>.svc.clusterset.local with both
// members' backends; an EndpointSlice change in west reaches it through the
// hub and istiod; a PeerAuthentication labelled for distribution in the
// home cluster appears in istiod's /debug/configz and goes when the label
// goes; the hub restarted under istiod: istiod keeps its config while the
// hub is down and resyncs after; the Service removed in both members
// disappears from istiod.
func TestIstiodTakesFederationFromHub(t *testing.T) {
	istiodBin(t)
	adscBin(t) // skip (or fail in CI) before setting anything up
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ns := "mcp-" + rand.String(5)
	backends := map[*localcluster.Cluster][]localcluster.Backend{
		home: {{IP: "198.18.41.1", Port: 8080}},
		west: {{IP: "198.18.40.1", Port: 8080}},
	}
	for c, b := range backends {
		kc := client(t, c)
		if err := localcluster.EnsureNamespace(ctx, kc, ns); err != nil {
			t.Fatal(err)
		}
		if err := localcluster.ApplyService(ctx, kc, ns, "echo", "http", 8080, b); err != nil {
			t.Fatal(err)
		}
	}
	// west is in Istio network net-west (its istio-system namespace's label).
	wc := client(t, west)
	if _, err := wc.CoreV1().Namespaces().Get(ctx, "istio-system", metav1.GetOptions{}); err != nil {
		if err := localcluster.EnsureNamespace(ctx, wc, "istio-system"); err != nil {
			t.Fatal(err)
		}
	}
	sys, err := wc.CoreV1().Namespaces().Get(ctx, "istio-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sys.Labels == nil {
		sys.Labels = map[string]string{}
	}
	sys.Labels["topology.istio.io/network"] = "net-west"
	if _, err := wc.CoreV1().Namespaces().Update(ctx, sys, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	hubNS := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(hubNS).Create(ctx, localcluster.RemoteSecret(hubNS, "members", map[string][]byte{
		west.Name: west.Kubeconfig(), east.Name: east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("mcp.test")
	hubArgs := []string{"--namespace", hubNS, "--trust-domain", td.Name(), "--xds-addr", "", "--tls-dns-names", hubDNSName,
		"--distribute-namespaces", ns}
	h := startHub(t, home, append(hubArgs, "--xds-tls-addr", "127.0.0.1:0")...)
	tlsAddr := h.addrs["xds-tls"]
	eventually(t, 60*time.Second, func() error {
		if cl := h.clusters(t); cl[west.Name].State != "Ready" || cl[east.Name].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})

	installIstioCRDs(t, home) // the distributed policy is authored there
	rootsPEM := hubRootsPEM(t, h, td)
	p := startIstiod(t, east, istiodOptions{ConfigSources: []istiodConfigSource{{Address: "k8s://"}, istiodTLSSource(tlsAddr, rootsPEM)}})
	se := p.waitConfig(t, 2*time.Minute, "ServiceEntry/"+ns+"/hub-echo", false)
	// What istiod reads there is all an anonymous client gets: CDS is refused.
	anon := xdstest.DialSotW(t, tlsAddr, grpc.WithTransportCredentials(simpleTLS(t, rootsPEM, hubDNSName)))
	anon.Send(t, &discoveryv3.DiscoveryRequest{Node: nodeIn("anonymous", east.Name, nil), TypeUrl: resourcev3.ClusterType})
	anon.RefusedWithin(t, 30*time.Second, "an anonymous CDS stream on the port istiod reads its config from", codes.Unauthenticated)
	if se.Metadata.Labels["app.kubernetes.io/managed-by"] != "hub" {
		t.Errorf("the federated ServiceEntry in istiod has labels %v; want app.kubernetes.io/managed-by=hub", se.Metadata.Labels)
	}
	var spec struct {
		Endpoints []struct {
			Address, Network string
			Labels           map[string]string
		}
	}
	if err := json.Unmarshal(se.Spec, &spec); err != nil {
		t.Fatalf("the ServiceEntry's spec in configz: %v", err)
	}
	networks := map[string]string{}
	for _, ep := range spec.Endpoints {
		networks[ep.Labels["topology.istio.io/cluster"]+"="+ep.Address] = ep.Network
	}
	if want := map[string]string{west.Name + "=198.18.40.1": "net-west", home.Name + "=198.18.41.1": ""}; !maps.Equal(networks, want) {
		t.Errorf("ServiceEntry endpoints (member=address → network) %v; want %v", networks, want)
	}

	sidecar := startAdsc(t, "mcp-sidecar", "--plaintext", "--addr", p.XDSAddr, "--watch", "cds", "--follow",
		"--node-id", fmt.Sprintf("sidecar~198.18.0.9~client.%s~%s.svc.cluster.local", ns, ns), "--cluster-id", east.Name)
	cluster := fmt.Sprintf("outbound|8080||echo.%s.svc.clusterset.local", ns)
	hasEndpoints := func(want ...string) func(adscLine) bool {
		return func(l adscLine) bool {
			return l.Type == "eds" && l.Cluster == cluster && slices.Equal(l.Endpoints, want)
		}
	}
	sidecar.waitLine(t, 2*time.Minute, cluster+" with both members' backends", hasEndpoints("198.18.40.1:8080", "198.18.41.1:8080"))

	// The istiod is listed as a config subscriber, with its version; MCP
	// pushes are counted in bytes.
	var list struct{ Items []api.Proxy }
	h.getJSON(t, "/api/v1/proxies", &list)
	proxies := list.Items
	var istiod *api.Proxy
	for i := range proxies {
		if proxies[i].ConfigSubscriber {
			istiod = &proxies[i]
		}
	}
	if istiod == nil || istiod.IstioVersion == "" || len(istiod.Types) < 16 {
		t.Errorf("GET /api/v1/proxies lists no config subscriber with its Istio version and 16 types: %+v", proxies)
	}
	if v := metric(t, h, `hub_xds_response_bytes_total{type="MCP"}`); v == "" || v == "0" {
		t.Errorf("hub_xds_response_bytes_total{type=\"MCP\"} = %q", v)
	}

	// An EndpointSlice change in one member reaches istiod's client.
	mark := sidecar.mark()
	if err := localcluster.ApplyEndpoints(ctx, client(t, west), ns, "echo", "http",
		[]localcluster.Backend{{IP: "198.18.40.1", Port: 8080}, {IP: "198.18.40.2", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	sidecar.waitLineAfter(t, mark, time.Minute, cluster+" with west's new backend",
		hasEndpoints("198.18.40.1:8080", "198.18.40.2:8080", "198.18.41.1:8080"))

	// How long a member's write takes to reach istiod's client through the
	// hub and istiod (both debounce 100 ms): logged for the record, never
	// asserted (a slow machine must not fail the test).
	const writes = 20
	var took []time.Duration
	for i := range writes {
		ip := fmt.Sprintf("198.18.40.%d", 10+i)
		mark := sidecar.mark()
		start := time.Now()
		if err := localcluster.ApplyEndpoints(ctx, client(t, west), ns, "echo", "http", []localcluster.Backend{{IP: ip, Port: 8080}}); err != nil {
			t.Fatal(err)
		}
		sidecar.waitLineAfter(t, mark, time.Minute, cluster+" with "+ip, hasEndpoints(ip+":8080", "198.18.41.1:8080"))
		took = append(took, time.Since(start))
		time.Sleep(300 * time.Millisecond) // each write on a quiet mesh, as hubbench does
	}
	slices.Sort(took)
	t.Logf("EndpointSlice write → istiod's EDS to its sidecar, %d writes: p50 %s, p90 %s, max %s", writes,
		took[writes/2].Round(time.Millisecond), took[writes*9/10].Round(time.Millisecond), took[writes-1].Round(time.Millisecond))

	// Mesh-wide policy authored once in the home cluster (istiod runs in
	// east: it can have it only from the hub, which discovers the kind
	// within 30 s of its CRD).
	dc, err := dynamic.NewForConfig(home.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	paGVR := schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "peerauthentications"}
	pa := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "security.istio.io/v1",
		"kind":       "PeerAuthentication",
		"metadata":   map[string]any{"name": "strict", "namespace": ns, "labels": map[string]any{"hub.federation/distribute": "true"}},
		"spec":       map[string]any{"mtls": map[string]any{"mode": "STRICT"}},
	}}
	created, err := dc.Resource(paGVR).Namespace(ns).Create(ctx, pa, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating PeerAuthentication: %v", err)
	}
	t.Cleanup(func() { _ = dc.Resource(paGVR).Namespace(ns).Delete(ctx, "strict", metav1.DeleteOptions{}) })
	p.waitConfig(t, 2*time.Minute, "PeerAuthentication/"+ns+"/strict", false)
	var dist distribute.Status
	h.getJSON(t, "/api/v1/distribution", &dist)
	for _, k := range dist.Kinds {
		if k.Kind == "security.istio.io/v1/PeerAuthentication" && (!k.Ready || k.Objects != 1 || k.Served == "") {
			t.Errorf("GET /api/v1/distribution: %+v; want PeerAuthentication served, ready, 1 object", k)
		}
	}
	unlabelled := created.DeepCopy()
	unlabelled.SetLabels(nil)
	if _, err := dc.Resource(paGVR).Namespace(ns).Update(ctx, unlabelled, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("removing the distribution label: %v", err)
	}
	p.waitConfig(t, 2*time.Minute, "PeerAuthentication/"+ns+"/strict", true)

	// The hub restarted under istiod: istiod keeps its config while the hub
	// is down (its client still holds the endpoints), reconnects, and
	// resyncs what changed meanwhile.
	h.stop(t)
	if err := localcluster.ApplyEndpoints(ctx, client(t, west), ns, "echo", "http",
		[]localcluster.Backend{{IP: "198.18.40.3", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.configz(); err != nil {
		t.Fatalf("istiod while the hub is down: %v", err)
	}
	p.waitConfig(t, time.Second, "ServiceEntry/"+ns+"/hub-echo", false) // still there
	mark = sidecar.mark()
	startHub(t, home, append(hubArgs, "--xds-tls-addr", tlsAddr)...)
	sidecar.waitLineAfter(t, mark, 2*time.Minute, cluster+" resynced after the hub's restart",
		hasEndpoints("198.18.40.3:8080", "198.18.41.1:8080"))

	// The Service removed in both members goes from istiod.
	for c := range backends {
		if err := client(t, c).CoreV1().Services(ns).Delete(ctx, "echo", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p.waitConfig(t, 2*time.Minute, "ServiceEntry/"+ns+"/hub-echo", true)
}

// hubDNSName is the name on the hub's serving certificate (--tls-dns-names)
// that istiod checks; it is never resolved (see istiodTLSSource).
const hubDNSName = "hub.hub-system.svc"

// istiodTLSSource is the config source of an istiod that reads the hub over
// SIMPLE TLS, as docs/operating.md recommends: istiod (pilot/pkg/bootstrap/
// configcontroller.go, getTransportCredentials) dials the address's host and
// verifies the hub's certificate against caCertificates (inline PEM only; or
// credentialName, a Secret of istiod's namespace with ca.crt) for the name
// in sni, else the address's host, and then requires a DNS SAN among
// subjectAltNames. The test dials the loopback address, so sni carries the
// name the certificate is checked for and no resolver is involved.
func istiodTLSSource(addr string, rootsPEM []byte) istiodConfigSource {
	return istiod.TLSSource(addr, rootsPEM, hubDNSName)
}

// TestIstiodTakesFederationOverPlaintext: the plaintext port, for in-cluster
// use, still serves istiod's config source: the federated ServiceEntry
// reaches a real istiod reading xds://<hub --xds-addr>.
func TestIstiodTakesFederationOverPlaintext(t *testing.T) {
	istiodBin(t)
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, east := e.Cluster("primary"), e.Cluster("east")
	ns := "mcpplain-" + rand.String(5)
	kc := client(t, home)
	if err := localcluster.EnsureNamespace(ctx, kc, ns); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, kc, ns, "echo", "http", 8080, []localcluster.Backend{{IP: "198.18.42.1", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	// A Service offered to east only (hub.federation/export-to): istiod's
	// config-source client names no member, so it gets the set every
	// member gets, without it.
	if err := localcluster.ApplyService(ctx, kc, ns, "limited", "http", 8080, []localcluster.Backend{{IP: "198.18.42.2", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	limited, err := kc.CoreV1().Services(ns).Get(ctx, "limited", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	limited.Annotations = map[string]string{"hub.federation/export-to": east.Name}
	if _, err := kc.CoreV1().Services(ns).Update(ctx, limited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := startHub(t, home, "--namespace", hubNamespace(t, home), "--trust-domain", "mcpplain.test")
	p := startIstiod(t, east, istiodOptions{ConfigSources: []istiodConfigSource{{Address: "k8s://"}, {Address: "xds://" + h.xdsAddr}}})
	se := p.waitConfig(t, 2*time.Minute, "ServiceEntry/"+ns+"/hub-echo", false)
	if !strings.Contains(string(se.Spec), "198.18.42.1") {
		t.Errorf("the ServiceEntry istiod took over plaintext: %s; want endpoint 198.18.42.1", se.Spec)
	}
	list, err := p.configz()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list {
		if c.Key() == "ServiceEntry/"+ns+"/hub-limited" {
			t.Errorf("an istiod that names no member took %s, offered to %s only", c.Key(), east.Name)
		}
	}
	// Offered to every member, it arrives.
	if limited, err = kc.CoreV1().Services(ns).Get(ctx, "limited", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	limited.Annotations = nil
	if _, err := kc.CoreV1().Services(ns).Update(ctx, limited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p.waitConfig(t, time.Minute, "ServiceEntry/"+ns+"/hub-limited", false)
}
