package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
)

// installServiceExportCRD installs the ServiceExport CRD in a cluster.
func installServiceExportCRD(t *testing.T, c *localcluster.Cluster) dynamic.Interface {
	t.Helper()
	dc, err := localcluster.InstallServiceExportCRD(testContext(t), c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return dc
}

// TestExportModes: what each member federates, and to whom, applied to
// the hub's own xDS (real grpc-go xds:/// clients, one per member) on real
// API servers. With --export-mode=serviceexport a Service is federated
// only with a ServiceExport of the same name: a member without the CRD
// exports nothing (and says so), the ServiceExport's creation and deletion
// move the other member's endpoints in and out, and a member's own proxies
// always get its own endpoints. In mode all, hub.federation/export: "false"
// keeps a Service home and hub.federation/export-to offers it to the
// members named only.
func TestExportModes(t *testing.T) {
	e := localcluster.Require(t, env)
	ip := dataPlaneIP(t)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	westClient, eastClient := client(t, west), client(t, east)
	ns := "export-" + rand.String(5)
	for _, c := range []*localcluster.Cluster{west, east} {
		if err := localcluster.EnsureNamespace(ctx, client(t, c), ns); err != nil {
			t.Fatal(err)
		}
	}
	westB, eastB := startBackend(t, ip, "west-1"), startBackend(t, ip, "east-1")
	const port = 7070
	for c, b := range map[*localcluster.Cluster]*backend{west: westB, east: eastB} {
		if err := localcluster.ApplyService(ctx, client(t, c), ns, "echo", "grpc", port, []localcluster.Backend{{IP: b.addr.IP.String(), Port: int32(b.addr.Port)}}); err != nil {
			t.Fatal(err)
		}
	}
	eastDyn := installServiceExportCRD(t, east)
	host := "echo." + ns + ".svc.cluster.local"
	target := fmt.Sprintf("xds:///%s:%d", host, port)
	register := func(t *testing.T) string {
		hubNS := hubNamespace(t, home)
		s := localcluster.RemoteSecret(hubNS, "members", map[string][]byte{west.Name: west.Kubeconfig(), east.Name: east.Kubeconfig()})
		if _, err := client(t, home).CoreV1().Secrets(hubNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return hubNS
	}
	// answers waits until the client's answers come from want only, every
	// one of them among 30 in a row, and returns when that run began.
	answers := func(t *testing.T, xc *xdsClient, want ...string) time.Time {
		t.Helper()
		var run []clientLine
		xc.waitFor(t, 60*time.Second, "answers from "+strings.Join(want, " and ")+" only", func(l clientLine) bool {
			name, ok := strings.CutPrefix(l.text, "ok ")
			if !ok || !slices.Contains(want, name) {
				run = run[:0]
				return false
			}
			run = append(run, l)
			if len(run) < 30 {
				return false
			}
			for _, w := range want {
				if !slices.ContainsFunc(run, func(r clientLine) bool { return r.text == "ok "+w }) {
					return false
				}
			}
			return true
		})
		return run[0].at
	}
	exports := func(t *testing.T, h *hubProcess) map[string]api.ServiceExport {
		var list struct{ Items []api.Service }
		h.getJSON(t, "/api/v1/services", &list)
		for _, s := range list.Items {
			if s.Hostname == host {
				return s.Exports
			}
		}
		return nil
	}

	t.Run("serviceexport", func(t *testing.T) {
		hubNS := register(t)
		h := startHub(t, home, "--namespace", hubNS, "--export-mode", "serviceexport", "--debounce-after", "100ms")
		fromWest := startXDSClient(t, h.xdsAddr, target, west.Name, ns)
		fromEast := startXDSClient(t, h.xdsAddr, target, east.Name, ns)
		// Nothing is exported: each member's proxies get their own only.
		answers(t, fromWest, "west-1")
		answers(t, fromEast, "east-1")
		ex := exports(t, h)
		if w := ex[west.Name]; w.Exported || !strings.Contains(w.Reason, "CRD is absent") {
			t.Errorf("west (no CRD) export = %+v; want not exported, the CRD named", w)
		}
		if e := ex[east.Name]; e.Exported || !strings.Contains(e.Reason, "no ServiceExport") {
			t.Errorf("east export = %+v; want not exported for want of a ServiceExport", e)
		}

		// east exports echo: west's proxies get east's endpoint too.
		se := localcluster.ServiceExport(ns, "echo")
		created := time.Now()
		if _, err := eastDyn.Resource(localcluster.ServiceExportGVR).Namespace(ns).Create(ctx, se, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		first := fromWest.waitFor(t, 60*time.Second, "an answer from east-1", func(l clientLine) bool { return l.text == "ok east-1" })
		answers(t, fromWest, "west-1", "east-1")
		t.Logf("ServiceExport created → hub's EDS push to west's client %s after, its first answer from east %s after (the push waits for the hub's adaptive debounce: members just synced)",
			edsSentAt(t, h, west.Name).Sub(created).Round(time.Millisecond), first.at.Sub(created).Round(time.Millisecond))
		answers(t, fromEast, "east-1") // west still exports nothing

		// Deleted: east's endpoint leaves west's proxies again.
		deleted := time.Now()
		if err := eastDyn.Resource(localcluster.ServiceExportGVR).Namespace(ns).Delete(ctx, "echo", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		answers(t, fromWest, "west-1")
		t.Logf("ServiceExport deleted → hub's EDS push to west's client %s after", edsSentAt(t, h, west.Name).Sub(deleted).Round(time.Millisecond))
	})

	t.Run("labels-and-export-to", func(t *testing.T) {
		hubNS := register(t)
		h := startHub(t, home, "--namespace", hubNS, "--debounce-after", "100ms")
		fromWest := startXDSClient(t, h.xdsAddr, target, west.Name, ns)
		fromEast := startXDSClient(t, h.xdsAddr, target, east.Name, ns)
		answers(t, fromWest, "west-1", "east-1")
		answers(t, fromEast, "west-1", "east-1")

		// west keeps echo home: east's proxies lose it, west's keep it.
		svc, err := westClient.CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if svc.Labels == nil {
			svc.Labels = map[string]string{}
		}
		svc.Labels["hub.federation/export"] = "false"
		if _, err := westClient.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		answers(t, fromEast, "east-1")
		answers(t, fromWest, "west-1", "east-1")

		// east offers echo to the home cluster only: west's proxies lose
		// east's endpoint; west's own stays theirs.
		esvc, err := eastClient.CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if esvc.Annotations == nil {
			esvc.Annotations = map[string]string{}
		}
		esvc.Annotations["hub.federation/export-to"] = home.Name
		if _, err := eastClient.CoreV1().Services(ns).Update(ctx, esvc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		answers(t, fromWest, "west-1")
		answers(t, fromEast, "east-1")
		// Why west's proxies do not get east's endpoint, in the API.
		var forWest struct{ Items []api.Service }
		h.getJSON(t, "/api/v1/services?member="+west.Name, &forWest)
		for _, s := range forWest.Items {
			if s.Hostname == host && (s.Routed == nil || !*s.Routed || !strings.Contains(s.Withheld[east.Name], "exported to "+home.Name+" only")) {
				t.Errorf("services?member=%s: routed %v, withheld %v; want routed (its own), east withheld as exported to %s only", west.Name, s.Routed, s.Withheld, home.Name)
			}
		}
		// Per member, what it exports and imports.
		var westC, eastC api.Cluster
		h.getJSON(t, "/api/v1/clusters/"+west.Name, &westC)
		h.getJSON(t, "/api/v1/clusters/"+east.Name, &eastC)
		if westC.Exchange == nil || westC.Exchange.NotExported < 1 || eastC.Exchange == nil || eastC.Exchange.ExportedToSome < 1 {
			t.Errorf("exchange: west %+v, east %+v; want west keeping echo home, east exporting it to some", westC.Exchange, eastC.Exchange)
		}
		ex := exports(t, h)
		if e := ex[east.Name]; !e.Exported || strings.Join(e.ExportTo, ",") != home.Name {
			t.Errorf("east export = %+v; want exported to %s only", e, home.Name)
		}
		if w := ex[west.Name]; w.Exported || !strings.Contains(w.Reason, "hub.federation/export") {
			t.Errorf("west export = %+v; want not exported, the label named", w)
		}
		// Adding west to the list gives west's proxies east's endpoint back.
		if esvc, err = eastClient.CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		esvc.Annotations["hub.federation/export-to"] = home.Name + "," + west.Name
		if _, err := eastClient.CoreV1().Services(ns).Update(ctx, esvc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		answers(t, fromWest, "west-1", "east-1")
	})
}

// edsSentAt is when the hub last sent EDS to the proxy of member.
func edsSentAt(t *testing.T, h *hubProcess, member string) time.Time {
	t.Helper()
	var list struct{ Items []api.Proxy }
	h.getJSON(t, "/api/v1/proxies", &list)
	for _, p := range list.Items {
		if p.Cluster != member {
			continue
		}
		for _, ty := range p.Types {
			if ty.Type == "EDS" && ty.SentAt != nil {
				return *ty.SentAt
			}
		}
	}
	t.Fatalf("no proxy of %s has been sent EDS", member)
	return time.Time{}
}
