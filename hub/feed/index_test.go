package feed

import (
	"maps"
	"reflect"
	"slices"
	"testing"

	"github.com/hubmesh/hub/clusters"
)

func TestIndexReportsOnlyRealChanges(t *testing.T) {
	feed := NewChanges(0, 0)
	var changes [][]string
	reported := func() { // what the index reported since the last call
		if b := feed.take(); len(b.Hosts) > 0 {
			changes = append(changes, slices.Sorted(maps.Keys(b.Hosts)))
		}
	}
	x := NewIndex("cluster.local", feed)
	svc := func(ip string) *clusters.Service {
		return &clusters.Service{Namespace: "ns", Name: "a", Endpoints: []clusters.Endpoint{{Address: ip, Port: 80, ServicePort: 80}}}
	}
	key := clusters.ServiceKey{Namespace: "ns", Name: "a"}
	x.ReplaceCluster("west", []*clusters.Service{svc("10.0.0.1")})
	reported()
	x.UpdateService("west", key, svc("10.0.0.1")) // identical: no change
	reported()
	x.UpdateService("west", key, svc("10.0.0.2"))
	reported()
	x.ReplaceCluster("east", []*clusters.Service{svc("10.1.0.1")})
	reported()
	want := [][]string{{"a.ns.svc.cluster.local"}, {"a.ns.svc.cluster.local"}, {"a.ns.svc.cluster.local"}}
	if !reflect.DeepEqual(changes, want) {
		t.Fatalf("changes = %v; want %v", changes, want)
	}
	if m := x.Service("a.ns.svc.cluster.local"); len(m) != 2 {
		t.Fatalf("members = %v; want west and east", m)
	}
	x.RemoveCluster("west")
	if m := x.Service("a.ns.svc.cluster.local"); len(m) != 1 || m["east"] == nil {
		t.Fatalf("after removing west: %v", m)
	}
	x.ReplaceCluster("east", nil)
	if hs := x.Hostnames(); len(hs) != 0 {
		t.Fatalf("hostnames after every member left: %v", hs)
	}
}

// Has: a hostname is federated while some member offers it; a Service
// every member keeps home (hub.federation/export: "false") is not.
func TestIndexHas(t *testing.T) {
	x := NewIndex("cluster.local", nil)
	home := &clusters.Service{Namespace: "ns", Name: "a", NotExported: true}
	x.ReplaceCluster("west", []*clusters.Service{home})
	if x.Has("a.ns.svc.cluster.local") {
		t.Error("a Service kept home everywhere is federated")
	}
	x.ReplaceCluster("east", []*clusters.Service{{Namespace: "ns", Name: "a"}})
	if !x.Has("a.ns.svc.cluster.local") {
		t.Error("a Service east offers is not federated")
	}
	if x.Has("b.ns.svc.cluster.local") {
		t.Error("an unknown Service is federated")
	}
}

// TestMemberStateDemotesAndNotifies: a member that turns Stale,
// Unreachable or TimedOut is demoted and every hostname it serves changes;
// a change that stays on the same side reports nothing; recovery and
// removal undo it. The member's network is what its views say.
func TestMemberStateDemotesAndNotifies(t *testing.T) {
	feed := NewChanges(0, 0)
	hosts := func() []string { return slices.Sorted(maps.Keys(feed.take().Hosts)) }
	x := NewIndex("cluster.local", feed)
	x.ReplaceCluster("west", []*clusters.Service{{Namespace: "ns", Name: "a", Network: "net-a"}, {Namespace: "ns", Name: "b", Network: "net-a"}})
	x.ReplaceCluster("east", []*clusters.Service{{Namespace: "ns", Name: "c"}})
	hosts()
	if got := x.MemberNetwork("west"); got != "net-a" {
		t.Errorf("MemberNetwork(west) = %q", got)
	}
	x.MemberState("west", clusters.StateReady)
	if got := hosts(); len(got) != 0 {
		t.Errorf("Ready reported %v", got)
	}
	x.MemberState("west", clusters.StateStale)
	if got, want := hosts(), []string{"a.ns.svc.cluster.local", "b.ns.svc.cluster.local"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Stale reported %v; want %v", got, want)
	}
	if st, ok := x.Demoted("west"); !ok || st != clusters.StateStale {
		t.Errorf("Demoted(west) = %s, %v", st, ok)
	}
	x.MemberState("west", clusters.StateUnreachable)
	if got := hosts(); len(got) != 0 {
		t.Errorf("Stale → Unreachable reported %v", got)
	}
	x.MemberState("west", clusters.StateReady)
	if got := hosts(); len(got) != 2 {
		t.Errorf("recovery reported %v", got)
	}
	x.MemberState("east", clusters.StateTimedOut)
	x.RemoveCluster("east")
	if _, ok := x.Demoted("east"); ok {
		t.Error("a removed member stays demoted")
	}
}

// TestNetworkGatewaysFromEveryMember: a network's gateways are those of
// every member on it, and a change of one member's gateways reports the
// hostnames of every member on its network (their endpoints may go
// through it), also when the member goes.
func TestNetworkGatewaysFromEveryMember(t *testing.T) {
	feed := NewChanges(0, 0)
	hosts := func() []string { return slices.Sorted(maps.Keys(feed.take().Hosts)) }
	x := NewIndex("cluster.local", feed)
	gw := []clusters.Gateway{{Address: "203.0.113.50", Port: 15443}}
	x.ReplaceCluster("plain", []*clusters.Service{{Namespace: "ns", Name: "echo", Network: "net-x"}})
	x.ReplaceCluster("gw", []*clusters.Service{{Namespace: "ns", Name: "other", Network: "net-x", Gateways: gw}})
	x.ReplaceCluster("far", []*clusters.Service{{Namespace: "ns", Name: "far", Network: "net-y"}})
	hosts()
	if got := x.NetworkGateways("net-x"); !slices.Equal(got, gw) {
		t.Errorf("NetworkGateways(net-x) = %v", got)
	}
	if got := x.NetworkGateways("net-y"); len(got) != 0 {
		t.Errorf("NetworkGateways(net-y) = %v", got)
	}
	x.ReplaceCluster("gw", []*clusters.Service{{Namespace: "ns", Name: "other", Network: "net-x"}})
	if got, want := hosts(), []string{"echo.ns.svc.cluster.local", "other.ns.svc.cluster.local"}; !slices.Equal(got, want) {
		t.Errorf("gateway gone reported %v; want %v", got, want)
	}
	x.ReplaceCluster("gw", []*clusters.Service{{Namespace: "ns", Name: "other", Network: "net-x", Gateways: gw}})
	hosts()
	x.RemoveCluster("gw")
	if got, want := hosts(), []string{"echo.ns.svc.cluster.local", "other.ns.svc.cluster.local"}; !slices.Equal(got, want) {
		t.Errorf("member with the gateway removed reported %v; want %v", got, want)
	}
	if got := x.NetworkGateways("net-x"); len(got) != 0 {
		t.Errorf("NetworkGateways(net-x) after removal = %v", got)
	}
}
