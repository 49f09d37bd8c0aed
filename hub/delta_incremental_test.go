package hub

import (
	"fmt"
	"maps"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/internal/wait"
	"github.com/hubmesh/hub/internal/xdstest"
)

// deltaCLAs decodes a Delta response's ClusterLoadAssignments: name → first endpoint address.
func deltaCLAs(t *testing.T, r *discoveryv3.DeltaDiscoveryResponse) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, res := range r.Resources {
		var cla endpointv3.ClusterLoadAssignment
		if err := res.GetResource().UnmarshalTo(&cla); err != nil {
			t.Fatal(err)
		}
		if cla.ClusterName != res.Name {
			t.Fatalf("resource %q carries the assignment of %q", res.Name, cla.ClusterName)
		}
		out[res.Name] = cla.GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetAddress()
	}
	return out
}

// A Delta EDS stream holding two clusters' endpoints gets, after one of
// them changes, only that one; a newly subscribed name is answered with
// just that name; a removed service is reported removed; an unsubscribed
// name is no longer sent. ACKs keep the stream's subscriber, so pushes
// evaluate only the changed hostnames' names.
func TestDeltaEDSCarriesOnlyWhatChanged(t *testing.T) {
	h, _ := startHub(t)
	h.index.ReplaceCluster("west", []*clusters.Service{namedService("a", "10.0.0.1"), namedService("b", "10.0.1.1"), namedService("c", "10.0.2.1")})
	a, b, c := "outbound|7070||a.demo.svc.cluster.local", "outbound|7070||b.demo.svc.cluster.local", "outbound|7070||c.demo.svc.cluster.local"
	cl := xdstest.DialDelta(t, h.addrForTest)
	cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, Node: &corev3.Node{Id: "sidecar~10.0.0.9~client.demo~demo.svc.cluster.local"}, ResourceNamesSubscribe: []string{a, b}})
	first := cl.Expect(t, "a Delta response")
	if got := deltaCLAs(t, first); len(got) != 2 || got[a] != "10.0.0.1" || got[b] != "10.0.1.1" || len(first.RemovedResources) != 0 {
		t.Fatalf("first response = %v, removed %v; want a and b", got, first.RemovedResources)
	}
	cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: first.Nonce})
	cl.None(t, time.Second, "after the ACK")
	sub := edsSubscriber(t, h)
	if sub == nil || !sub.persistent {
		t.Fatalf("the Delta EDS subscription by name has subscriber %+v; want a persistent one", sub)
	}

	// b changes: only b is sent, nothing is removed.
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "b"}, namedService("b", "10.0.1.2"))
	second := cl.Expect(t, "a Delta response")
	if got := deltaCLAs(t, second); len(got) != 1 || got[b] != "10.0.1.2" || len(second.RemovedResources) != 0 {
		t.Fatalf("response after b changed = %v, removed %v; want only b", got, second.RemovedResources)
	}
	cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: second.Nonce})
	waitHolds(t, h, map[string]string{a: "10.0.0.1", b: "10.0.1.2"})
	if got := edsSubscriber(t, h); got != sub {
		t.Fatal("an ACK replaced the stream's Delta subscriber")
	}

	// c is subscribed too: only c is sent.
	cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: second.Nonce, ResourceNamesSubscribe: []string{c}})
	third := cl.Expect(t, "a Delta response")
	if got := deltaCLAs(t, third); len(got) != 1 || got[c] != "10.0.2.1" || len(third.RemovedResources) != 0 {
		t.Fatalf("response to the new name = %v, removed %v; want only c", got, third.RemovedResources)
	}
	cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: third.Nonce})
	waitHolds(t, h, map[string]string{a: "10.0.0.1", b: "10.0.1.2", c: "10.0.2.1"})

	// a goes away: it is reported removed, and nothing is sent.
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "a"}, nil)
	fourth := cl.Expect(t, "a Delta response")
	if len(fourth.Resources) != 0 || len(fourth.RemovedResources) != 1 || fourth.RemovedResources[0] != a {
		t.Fatalf("response after a was deleted = %v, removed %v; want only a removed", deltaCLAs(t, fourth), fourth.RemovedResources)
	}
	cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: fourth.Nonce})
	waitHolds(t, h, map[string]string{b: "10.0.1.2", c: "10.0.2.1"})

	// a comes back: it is sent again.
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "a"}, namedService("a", "10.0.0.3"))
	fifth := cl.Expect(t, "a Delta response")
	if got := deltaCLAs(t, fifth); len(got) != 1 || got[a] != "10.0.0.3" || len(fifth.RemovedResources) != 0 {
		t.Fatalf("response after a came back = %v, removed %v; want only a", got, fifth.RemovedResources)
	}

	// b is unsubscribed: a change to it sends nothing; c still gets its own.
	cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: fifth.Nonce, ResourceNamesUnsubscribe: []string{b}})
	cl.None(t, time.Second, "after unsubscribing b")
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "b"}, namedService("b", "10.0.1.3"))
	cl.None(t, time.Second, "after a change to an unsubscribed name")
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "c"}, namedService("c", "10.0.2.2"))
	if got := deltaCLAs(t, cl.Expect(t, "a Delta response")); len(got) != 1 || got[c] != "10.0.2.2" {
		t.Fatalf("response after c changed = %v; want only c", got)
	}
}

// edsSubscriber returns the single stream's kept EDS subscriber, if any.
func edsSubscriber(t *testing.T, h *testHub) *subscriber {
	t.Helper()
	h.proxies.mu.Lock()
	defer h.proxies.mu.Unlock()
	w := h.watcher
	w.mu.Lock()
	defer w.mu.Unlock()
	var found *subscriber
	for c := range h.proxies.streams {
		if s := c.rec.subs[resourcev3.EndpointType]; s != nil {
			if found != nil {
				t.Fatal("more than one stream has an EDS subscriber")
			}
			found = s
		}
	}
	return found
}

// An endpoint change leaves the wildcard set of clusters as it was built
// (the same shared slice, not rebuilt); a new port rebuilds it.
func TestWildcardSetIsCheckedNotRebuilt(t *testing.T) {
	h, err := New(Options{DomainSuffix: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	h.index.ReplaceCluster("west", []*clusters.Service{namedService("a", "10.0.0.1"), namedService("b", "10.0.1.1")})
	before, err := h.gen.All(resourcev3.ClusterType, xdsgen.View{})
	if err != nil || len(before.Resources) != 2 {
		t.Fatalf("clusters: %d, %v; want 2", len(before.Resources), err)
	}
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "b"}, namedService("b", "10.0.1.2"))
	h.gen.Invalidate(map[string]struct{}{"b.demo.svc.cluster.local": {}})
	after, err := h.gen.All(resourcev3.ClusterType, xdsgen.View{})
	if err != nil || &after.Resources[0] != &before.Resources[0] || after.Version != before.Version {
		t.Fatalf("after an endpoint change the cluster set was rebuilt (%v)", err)
	}
	eds, err := h.gen.All(resourcev3.EndpointType, xdsgen.View{})
	if err != nil || len(eds.Resources) != 2 {
		t.Fatalf("endpoints: %d, %v; want 2", len(eds.Resources), err)
	}
	svc := namedService("b", "10.0.1.2")
	svc.Ports = append(svc.Ports, clusters.ServicePort{Name: "http", Port: 8080, Protocol: "TCP"})
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "b"}, svc)
	h.gen.Invalidate(map[string]struct{}{"b.demo.svc.cluster.local": {}})
	grown, err := h.gen.All(resourcev3.ClusterType, xdsgen.View{})
	if err != nil || len(grown.Resources) != 3 || grown.Version == before.Version {
		t.Fatalf("after a new port: %d clusters, version changed %v, %v; want 3 and a new version", len(grown.Resources), grown.Version != before.Version, err)
	}
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "a"}, nil)
	h.gen.Invalidate(map[string]struct{}{"a.demo.svc.cluster.local": {}})
	if shrunk, err := h.gen.All(resourcev3.ClusterType, xdsgen.View{}); err != nil || len(shrunk.Resources) != 2 {
		t.Fatalf("after a service went away: %d clusters, %v; want 2", len(shrunk.Resources), err)
	}
}

// A subscriber indexes its names by hostname and recognises the same
// subscription in any order, names that are no hostname's included.
func TestSubscriberNames(t *testing.T) {
	a1, a2, b := "outbound|80||a.demo.svc.cluster.local", "outbound|81||a.demo.svc.cluster.local", "outbound|80||b.demo.svc.cluster.local"
	odd := "not a cluster name"
	set := func(names ...string) map[string]struct{} {
		m := map[string]struct{}{}
		for _, n := range names {
			m[n] = struct{}{}
		}
		return m
	}
	s := newSubscriber(resourcev3.EndpointType, set(b, odd, a2, a1), false, true)
	s.requested = digestOf([]string{b, odd, a2, a1})
	if got := s.namesOf("a.demo.svc.cluster.local"); len(got) != 2 || len(s.list) != 4 || got[0] != a1 || got[1] != a2 {
		t.Errorf("names of a = %v", got)
	}
	if got := s.namesOf("b.demo.svc.cluster.local"); len(got) != 1 || got[0] != b {
		t.Errorf("names of b = %v", got)
	}
	for _, n := range []string{a1, a2, b, odd} {
		if !s.has(n) {
			t.Errorf("has(%q) = false", n)
		}
	}
	if s.has("outbound|82||a.demo.svc.cluster.local") || s.has("other") {
		t.Error("has reports a name that is not subscribed")
	}
	if !s.sameNames(set(a1, a2, b, odd), []string{b, odd, a2, a1}, false) || !s.sameNames(set(a1, a2, b, odd), []string{odd, a1, b, a2}, false) {
		t.Error("the same names are not recognised")
	}
	if s.sameNames(set(a1, a2, b, "other"), []string{a1, a2, b, "other"}, false) || s.sameNames(set(a1, a2, b), []string{a1, a2, b}, false) || s.sameNames(set(a1, a2, b, odd), nil, true) {
		t.Error("other names are taken for the same")
	}
}

// Streams subscribed to the same names share one name index; a change
// reaches each of them, also after one of them has gone.
func TestSameSubscriptionsShareOneIndex(t *testing.T) {
	h, _ := startHub(t)
	h.index.ReplaceCluster("west", []*clusters.Service{namedService("a", "10.0.0.1"), namedService("b", "10.0.1.1")})
	a, b := "outbound|7070||a.demo.svc.cluster.local", "outbound|7070||b.demo.svc.cluster.local"
	one, two := xdstest.DialDelta(t, h.addrForTest), xdstest.DialDelta(t, h.addrForTest)
	for i, cl := range []*xdstest.Delta{one, two} {
		cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, Node: &corev3.Node{Id: fmt.Sprintf("proxy-%d", i)}, ResourceNamesSubscribe: []string{b, a}[i:]})
		if i == 1 {
			cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{b}})
		}
	}
	for _, cl := range []*xdstest.Delta{one, two} {
		got := map[string]string{}
		for len(got) < 2 {
			r := cl.Expect(t, "a Delta response")
			maps.Copy(got, deltaCLAs(t, r))
			cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: r.Nonce})
		}
	}
	h.watcher.mu.Lock()
	indexes := len(h.watcher.index.indexes)
	h.watcher.mu.Unlock()
	if indexes != 1 {
		t.Fatalf("two streams subscribed to the same names use %d indexes; want 1", indexes)
	}
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "b"}, namedService("b", "10.0.1.2"))
	for _, cl := range []*xdstest.Delta{one, two} {
		r := cl.Expect(t, "a Delta response")
		if got := deltaCLAs(t, r); len(got) != 1 || got[b] != "10.0.1.2" {
			t.Fatalf("after b changed: %v; want only b", got)
		}
		cl.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: r.Nonce})
	}
	one.CloseSend(t)
	wait.Until(t, 10*time.Second, func() error {
		if n := len(h.Proxies()); n != 2 { // two and the helper's own stream
			return fmt.Errorf("%d streams", n)
		}
		return nil
	})
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "a"}, namedService("a", "10.0.0.2"))
	if got := deltaCLAs(t, two.Expect(t, "a Delta response")); len(got) != 1 || got[a] != "10.0.0.2" {
		t.Fatalf("after the other stream closed and a changed: %v; want only a", got)
	}
}
