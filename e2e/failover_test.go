package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/internal/localcluster"
)

// TestLocalityFailoverWithGRPCClients: echo runs in west and east. Real
// grpc-go xDS clients, one of each member, call it. With a distributed
// DestinationRule that has outlier detection (Istio's condition for
// locality failover), every call stays in the client's own member; the
// rule's failoverPriority naming east puts east first for both, without
// reconnecting; back to the default, west's backend stops and west's
// client moves to east (the next priority) with no call lost to the
// switch beyond those in flight. No client NACKs the Clusters, which now
// carry outlier detection. (A Stale member's demotion is shown with a live
// client in TestRotationAndOutageWithLiveClient.)
func TestLocalityFailoverWithGRPCClients(t *testing.T) {
	e := localcluster.Require(t, env)
	ip := dataPlaneIP(t)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ns := "fo-" + rand.String(5)
	root := "root-" + rand.String(5)
	for _, c := range []*localcluster.Cluster{home, west, east} {
		if err := localcluster.EnsureNamespace(ctx, client(t, c), ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := localcluster.EnsureNamespace(ctx, client(t, home), root); err != nil {
		t.Fatal(err)
	}
	westB, eastB := startBackend(t, ip, "west-a"), startBackend(t, ip, "east-a")
	const port = 7070
	for c, b := range map[*localcluster.Cluster]*backend{west: westB, east: eastB} {
		if err := localcluster.ApplyService(ctx, client(t, c), ns, "echo", "grpc", port,
			[]localcluster.Backend{{IP: b.addr.IP.String(), Port: int32(b.addr.Port)}}); err != nil {
			t.Fatal(err)
		}
	}
	installIstioCRDs(t, home)
	hubNS := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(hubNS).Create(ctx, localcluster.RemoteSecret(hubNS, "members", map[string][]byte{
		west.Name: west.Kubeconfig(), east.Name: east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	host := fmt.Sprintf("echo.%s.svc.cluster.local", ns)
	dyn, err := dynamic.NewForConfig(home.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	drs := dyn.Resource(schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}).Namespace(root)
	rule := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
		"metadata": map[string]any{"name": "echo-failover", "namespace": root, "labels": map[string]any{distribute.Label: "true"}},
		"spec": map[string]any{"host": host, "trafficPolicy": map[string]any{
			"outlierDetection": map[string]any{"consecutive5xxErrors": int64(1), "interval": "1s", "baseEjectionTime": "30s"},
		}},
	}}
	if rule, err = drs.Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := startHub(t, home, "--namespace", hubNS, "--root-namespace", root)
	eventually(t, 60*time.Second, func() error {
		if cl := h.clusters(t); cl[west.Name].State != "Ready" || cl[east.Name].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})

	target := fmt.Sprintf("xds:///%s:%d", host, port)
	fromWest := startXDSClient(t, h.xdsAddr, target, west.Name, ns)
	fromEast := startXDSClient(t, h.xdsAddr, target, east.Name, ns)
	onlyFrom := func(xc *xdsClient, who, backend string) {
		t.Helper()
		inARow := 0
		xc.drain()
		xc.waitFor(t, 60*time.Second, fmt.Sprintf("%s's client: 30 answers in a row from %s", who, backend), func(l clientLine) bool {
			if l.text == "ok "+backend {
				inARow++
			} else {
				inARow = 0
			}
			return inARow >= 30
		})
		requireOnly(t, xc, 100, backend)
	}
	onlyFrom(fromWest, "west", "west-a")
	onlyFrom(fromEast, "east", "east-a")

	// failoverPriority: a label=value entry ranks every client's localities
	// by whether they are east's.
	spec := rule.Object["spec"].(map[string]any)
	spec["trafficPolicy"].(map[string]any)["loadBalancer"] = map[string]any{"localityLbSetting": map[string]any{
		"failoverPriority": []any{"topology.istio.io/cluster=" + east.Name}}}
	if rule, err = drs.Update(ctx, rule, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	onlyFrom(fromWest, "west", "east-a")
	onlyFrom(fromEast, "east", "east-a")

	// Back to the default; then west's backend stops.
	delete(rule.Object["spec"].(map[string]any)["trafficPolicy"].(map[string]any), "loadBalancer")
	if _, err = drs.Update(ctx, rule, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	onlyFrom(fromWest, "west", "west-a")
	westB.stop()
	onlyFrom(fromWest, "west", "east-a")
	t.Logf("west's client: %d answers, %d failed calls (those in flight when west's backend stopped)", fromWest.oks.Load(), fromWest.errs.Load())

	// The hub's view: the rule is held back from member istiods (it names
	// a federated host) and the clients took its Clusters.
	var proxies api.List[api.Proxy]
	h.getJSON(t, "/api/v1/proxies", &proxies)
	for _, p := range proxies.Items {
		if !strings.Contains(p.ID, "client."+ns) {
			continue
		}
		for _, ts := range p.Types {
			if ts.Nacks > 0 {
				t.Errorf("proxy %s NACKed %s: %s", p.ID, ts.Type, ts.NackError)
			}
		}
	}
}
