package distribute

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/wait"
)

func TestHostGuard(t *testing.T) {
	g := HostGuard{FederatedDomain: "clusterset.local", DomainSuffix: "cluster.local",
		Federated: func(h string) bool { return h == "echo.demo.svc.cluster.local" },
		Hostnames: func() []string { return []string{"echo.demo.svc.cluster.local"} }}
	egress := func(hosts ...string) *networking.Sidecar {
		return &networking.Sidecar{Egress: []*networking.IstioEgressListener{{Hosts: hosts}}}
	}
	for _, c := range []struct {
		ns   string
		spec proto.Message
		ok   bool
	}{
		{"tenant", &networking.ServiceEntry{Hosts: []string{"echo.demo.svc.clusterset.local"}}, false},
		{"tenant", &networking.ServiceEntry{Hosts: []string{"api.example.com", "ECHO.demo.svc.ClusterSet.local."}}, false},
		{"tenant", &networking.ServiceEntry{Hosts: []string{"*.svc.clusterset.local"}}, false},
		{"tenant", &networking.ServiceEntry{Hosts: []string{"clusterset.local"}}, false},
		{"tenant", &networking.ServiceEntry{Hosts: []string{"*clusterset.local"}}, false},
		{"tenant", &networking.ServiceEntry{Hosts: []string{"*set.local"}}, false},
		{"tenant", &networking.ServiceEntry{Hosts: []string{"*-clusterset.local"}}, true}, // matches no host under it
		{"tenant", &networking.ServiceEntry{Hosts: []string{"*.example.com"}}, true},
		{"tenant", &networking.ServiceEntry{Hosts: []string{"api.example.com"}}, true},
		{"tenant", &networking.ServiceEntry{Hosts: []string{"notclusterset.local"}}, true},
		{"tenant", &networking.VirtualService{Hosts: []string{"echo.demo.svc.cluster.local"}}, false},
		{"demo", &networking.VirtualService{Hosts: []string{"echo"}}, false},                                                // short name in demo: the federated Service
		{"tenant", &networking.VirtualService{Hosts: []string{"echo"}}, true},                                               // echo.tenant.svc…: not federated
		{"tenant", &networking.VirtualService{Hosts: []string{"*"}}, false},                                                 // matches every host
		{"tenant", &networking.VirtualService{Hosts: []string{"*.local"}}, false},                                           // the federated domain and echo
		{"tenant", &networking.VirtualService{Hosts: []string{"*.demo.svc.cluster.local"}}, false},                          // echo
		{"tenant", &networking.VirtualService{Hosts: []string{"*.shop.svc.cluster.local"}}, true},                           // no federated host
		{"tenant", &networking.VirtualService{Hosts: []string{"*"}, Gateways: []string{"bookinfo-gateway"}}, true},          // ingress routes only
		{"tenant", &networking.VirtualService{Hosts: []string{"*"}, Gateways: []string{"bookinfo-gateway", "mesh"}}, false}, // and the mesh's
		{"tenant", &networking.DestinationRule{Host: "*.local"}, false},
		{"tenant", &networking.DestinationRule{Host: "*.example.com"}, true},
		{"tenant", &networking.ServiceEntry{Hosts: []string{"*"}}, false},
		{"tenant", &networking.DestinationRule{Host: "echo.demo.svc.clusterset.local"}, false},
		{"tenant", &networking.DestinationRule{Host: "echo.demo.svc.cluster.local"}, false},
		{"tenant", &networking.DestinationRule{Host: "web.shop.svc.cluster.local"}, true},
		{"tenant", egress("./*", "istio-system/*", "*/*"), true},
		{"tenant", egress("*/echo.demo.svc.clusterset.local"), false},
		{"tenant", egress("demo/*.clusterset.local"), false},
		{"tenant", &securityv1beta1.PeerAuthentication{}, true},
	} {
		if err := g.check(c.ns, c.spec); (err == nil) != c.ok {
			t.Errorf("%T %v in %s: err %v, want ok=%v", c.spec, c.spec, c.ns, err, c.ok)
		}
	}
}

var seGVR = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}

const seKind = "networking.istio.io/v1/ServiceEntry"

// Only objects of the allowed namespaces that name no host of the hub are
// distributed; the others are left out with a reason in Status and an
// Event. An object naming a Service that becomes federated later is left
// out once the Source checks again, and distributed again once the
// Service is no longer federated.
func TestDistributionIsAuthorized(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("home")
	dyn, kube := clients(t, home)
	installCRDs(t, dyn, "ServiceEntry")
	ctx := context.Background()
	allowed := testNamespace(t, kube, "root")
	tenant := testNamespace(t, kube, "tenant")
	var federated atomic.Value // string: the one federated host
	federated.Store("")
	s := runSourceWith(t, home, Options{Recheck: 50 * time.Millisecond, Namespaces: []string{allowed},
		Hosts: HostGuard{FederatedDomain: "clusterset.local", DomainSuffix: "cluster.local",
			Federated: func(h string) bool { return h == federated.Load().(string) }}})

	se := func(hosts ...string) map[string]any {
		h := make([]any, len(hosts))
		for i, x := range hosts {
			h[i] = x
		}
		return map[string]any{"hosts": h, "location": "MESH_EXTERNAL", "resolution": "DNS", "ports": []any{map[string]any{"number": int64(443), "name": "tls", "protocol": "TLS"}}}
	}
	create := func(ns, name string, spec map[string]any) {
		t.Helper()
		if _, err := dyn.Resource(seGVR).Namespace(ns).Create(ctx, istioObject(seGVR, "ServiceEntry", ns, name, true, spec), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(allowed, "external", se("api.example.com"))
	create(allowed, "claims-federated", se("echo.demo.svc.clusterset.local"))
	create(allowed, "names-local", se("echo.demo.svc.cluster.local"))
	create(tenant, "external", se("api.example.com"))

	reasons := func() map[string]string {
		out := map[string]string{}
		for _, r := range kindStatus(s.Status(), seKind).Rejected {
			if strings.HasPrefix(r.Object, allowed+"/") || strings.HasPrefix(r.Object, tenant+"/") {
				out[r.Object] = r.Reason
			}
		}
		return out
	}
	wantDistributed := func(names ...string) error {
		m, err := objectsOf(s, seKind, allowed)
		if err != nil {
			return err
		}
		if len(m) != len(names) {
			return fmt.Errorf("distributed %v, want %v", keys(m), names)
		}
		for _, n := range names {
			if _, ok := m[n]; !ok {
				return fmt.Errorf("distributed %v, want %v", keys(m), names)
			}
		}
		if other, _ := objectsOf(s, seKind, tenant); len(other) != 0 {
			return fmt.Errorf("objects of namespace %s distributed: %v", tenant, keys(other))
		}
		return nil
	}
	wait.Until(t, time.Minute, func() error {
		if err := wantDistributed("external", "names-local"); err != nil {
			return err
		}
		r := reasons()
		if r[allowed+"/claims-federated"] != ReasonHost || r[tenant+"/external"] != ReasonNamespace || len(r) != 2 {
			return fmt.Errorf("rejections %v", r)
		}
		return nil
	})
	for _, o := range []struct{ ns, name string }{{allowed, "claims-federated"}, {tenant, "external"}} {
		wait.Until(t, time.Minute, func() error {
			if n, err := rejections(ctx, kube, o.ns, o.name); err != nil || n != 1 {
				return fmt.Errorf("%s/%s: %d rejection Events (%v), want 1", o.ns, o.name, n, err)
			}
			return nil
		})
	}

	// echo.demo becomes federated: names-local is left out (one Event),
	// and distributed again when it is no longer federated.
	federated.Store("echo.demo.svc.cluster.local")
	wait.Until(t, time.Minute, func() error {
		if err := wantDistributed("external"); err != nil {
			return err
		}
		if n, err := rejections(ctx, kube, allowed, "names-local"); err != nil || n != 1 {
			return fmt.Errorf("%d rejection Events on names-local (%v), want 1", n, err)
		}
		return nil
	})
	federated.Store("")
	wait.Until(t, time.Minute, func() error { return wantDistributed("external", "names-local") })
	if n, _ := rejections(ctx, kube, allowed, "names-local"); n != 1 {
		t.Errorf("%d rejection Events on names-local, want 1 (each rejection reported once)", n)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestRulesHaveDestinationRulesOfFederatedHosts: a DestinationRule naming
// a federated host is not distributed, but Rules (what the hub's own xDS
// reads) has it, its status says so, and its edits and deletion are
// reported to OnChange.
func TestRulesHaveDestinationRulesOfFederatedHosts(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("home")
	dyn, kube := clients(t, home)
	installCRDs(t, dyn, "DestinationRule")
	ctx := context.Background()
	allowed := testNamespace(t, kube, "root")
	drGVR := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}
	const drKind = "networking.istio.io/v1/DestinationRule"
	var changes atomic.Int64
	s := runSourceWith(t, home, Options{Recheck: 50 * time.Millisecond, Namespaces: []string{allowed},
		Hosts: HostGuard{FederatedDomain: "clusterset.local", DomainSuffix: "cluster.local",
			Federated: func(h string) bool { return h == "echo.demo.svc.cluster.local" },
			Hostnames: func() []string { return []string{"echo.demo.svc.cluster.local"} }},
		OnChange: func(kind string) {
			if kind == drKind {
				changes.Add(1)
			}
		}})
	dr := func(host string, errors int64) map[string]any {
		return map[string]any{"host": host, "trafficPolicy": map[string]any{"outlierDetection": map[string]any{"consecutive5xxErrors": errors}}}
	}
	drs := dyn.Resource(drGVR).Namespace(allowed)
	if _, err := drs.Create(ctx, istioObject(drGVR, "DestinationRule", allowed, "external", true, dr("api.example.com", 1)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := drs.Create(ctx, istioObject(drGVR, "DestinationRule", allowed, "echo", true, dr("echo.demo.svc.cluster.local", 1)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rules := func() (map[string]int64, error) {
		objs, ready := s.Rules(drKind)
		if !ready {
			return nil, fmt.Errorf("not ready")
		}
		out := map[string]int64{}
		for _, o := range objs {
			if o.Namespace == allowed {
				out[o.Name] = int64(o.Spec.(*networking.DestinationRule).GetTrafficPolicy().GetOutlierDetection().GetConsecutive_5XxErrors().GetValue())
			}
		}
		return out, nil
	}
	wait.Until(t, time.Minute, func() error {
		distributed, err := objectsOf(s, drKind, allowed)
		if err != nil {
			return err
		}
		r, err := rules()
		if err != nil {
			return err
		}
		if _, ok := distributed["echo"]; ok || len(distributed) != 1 || len(r) != 2 {
			return fmt.Errorf("distributed %v, rules %v; want external distributed, both in rules", keys(distributed), r)
		}
		return nil
	})
	for _, rej := range kindStatus(s.Status(), drKind).Rejected {
		if rej.Object == allowed+"/echo" && !strings.Contains(rej.Message, "the hub's own xDS applies") {
			t.Errorf("status of the held-back rule: %q", rej.Message)
		}
	}
	before := changes.Load()
	u, err := drs.Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.Object["spec"] = dr("echo.demo.svc.cluster.local", 7)
	if _, err := drs.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		if r, err := rules(); err != nil || r["echo"] != 7 || changes.Load() == before {
			return fmt.Errorf("rules %v (%v), %d changes reported since the edit", r, err, changes.Load()-before)
		}
		return nil
	})
	before = changes.Load()
	if err := drs.Delete(ctx, "echo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		if r, err := rules(); err != nil || len(r) != 1 || changes.Load() == before {
			return fmt.Errorf("rules %v (%v), %d changes reported since the deletion", r, err, changes.Load()-before)
		}
		return nil
	})
}
