package hub

import (
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"

	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub/authz"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/internal/xdstest"
)

// fakeRules is a RuleSource the test fills.
type fakeRules struct {
	mu    sync.Mutex
	ready bool
	objs  map[string][]distribute.Object
	notes map[string][]distribute.Note
}

func (f *fakeRules) Rules(kind string) ([]distribute.Object, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.objs[kind], f.ready
}

func (f *fakeRules) SetNotes(kind string, notes []distribute.Note) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notes[kind] = notes
}

func (f *fakeRules) set(ready bool, kind string, objs ...distribute.Object) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ready = ready
	f.objs[kind] = objs
}

// serverNode is a proxyless gRPC server's node in ns with labels.
func serverNode(id, ns string, labels map[string]any) *corev3.Node {
	md, _ := structpb.NewStruct(map[string]any{"GENERATOR": "grpc", "NAMESPACE": ns, "LABELS": labels})
	return &corev3.Node{Id: id, Metadata: md}
}

// rbacFilters names the HTTP filters of an inbound listener response.
func rbacFilters(t *testing.T, r *discoveryv3.DiscoveryResponse) []string {
	t.Helper()
	if len(r.Resources) != 1 {
		t.Fatalf("%d listeners; want 1", len(r.Resources))
	}
	var l listenerv3.Listener
	if err := r.Resources[0].UnmarshalTo(&l); err != nil {
		t.Fatal(err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
	}
	return names
}

// TestPolicyEditReachesOnlyTheServersItSelects: two proxyless gRPC
// servers, in two namespaces, ask for their inbound listeners. Nothing is
// sent before the policies are read (a listener without them would serve
// unprotected, and a whole-state LDS response without it would remove it
// from the server); once read, both get theirs; an AuthorizationPolicy of
// one namespace re-evaluates that namespace's server only (the counter
// says one), which gets the RBAC filter; the other gets nothing.
func TestPolicyEditReachesOnlyTheServersItSelects(t *testing.T) {
	rules := &fakeRules{objs: map[string][]distribute.Object{}, notes: map[string][]distribute.Note{}}
	h, addr, _ := serveHub(t, Options{Rules: rules, RootNamespace: "istio-system"})
	name := xdsgen.InboundListenerPrefix + "0.0.0.0:8080"
	servers := map[string]*xdstest.SotW{}
	for _, ns := range []string{"app", "other"} {
		c := xdstest.DialSotW(t, addr)
		c.Send(t, &discoveryv3.DiscoveryRequest{Node: serverNode("sidecar~10.0.0.1~s."+ns+"~"+ns+".svc.cluster.local", ns, map[string]any{"app": "echo"}),
			TypeUrl: resourcev3.ListenerType, ResourceNames: []string{name}})
		servers[ns] = c
	}
	for ns, c := range servers {
		xdstest.Barrier(t, c, ns+": before the policies are read")
	}
	rules.set(true, authz.AuthorizationPolicyKind)
	rules.set(true, authz.PeerAuthenticationKind)
	h.changes.ConfigChanged(authz.AuthorizationPolicyKind)
	for ns, c := range servers {
		r := c.ExpectType(t, resourcev3.ListenerType, ns+": once the policies are read")
		if got := rbacFilters(t, r); len(got) != 1 || got[0] != "envoy.filters.http.router" {
			t.Fatalf("%s: filters %v; want the router alone", ns, got)
		}
		c.Send(t, ack(resourcev3.ListenerType, []string{name}, r))
	}

	updates := func() float64 {
		var m dto.Metric
		if err := h.watcher.policyServers.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	before := updates()
	rules.set(true, authz.AuthorizationPolicyKind, distribute.Object{Kind: authz.AuthorizationPolicyKind, Namespace: "app", Name: "only-alice", Version: "1",
		CreationTimestamp: time.Unix(1, 0), Spec: &securityv1beta1.AuthorizationPolicy{
			Selector: &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "echo"}},
			Rules:    []*securityv1beta1.Rule{{From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{Principals: []string{"cluster.local/ns/app/sa/alice"}}}}}},
		}})
	h.changes.ConfigChanged(authz.AuthorizationPolicyKind)
	r := servers["app"].ExpectType(t, resourcev3.ListenerType, "app's server after the policy")
	if got := rbacFilters(t, r); len(got) != 2 || got[0] != xdsgen.RBACFilterName {
		t.Fatalf("app: filters %v; want the ALLOW RBAC filter, then the router", got)
	}
	servers["app"].Send(t, ack(resourcev3.ListenerType, []string{name}, r))
	xdstest.Barrier(t, servers["other"], "other's server, which the policy does not select")
	if n := updates() - before; n != 1 {
		t.Errorf("the policy re-evaluated %v servers; want 1", n)
	}
	var proxies []xdsstatus.Proxy
	for _, p := range h.Proxies() {
		if p.Server != nil {
			proxies = append(proxies, p)
		}
	}
	if len(proxies) != 2 {
		t.Fatalf("%d proxies show a server; want 2", len(proxies))
	}
	for _, p := range proxies {
		allow := p.Server.Policies.Allow
		if want := p.Server.Workload.Namespace == "app"; (len(allow) == 1 && allow[0] == "app/only-alice") != want {
			t.Errorf("%s: ALLOW %v", p.Server.Workload.Namespace, allow)
		}
		if len(p.Server.Listeners) != 1 || p.Server.Listeners[0].Mode != authz.Disable {
			t.Errorf("%s: listeners %+v", p.Server.Workload.Namespace, p.Server.Listeners)
		}
	}
}
