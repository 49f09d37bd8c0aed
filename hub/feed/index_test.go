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
