package hub

import (
	"reflect"
	"testing"

	"github.com/hubmesh/hub/clusters"
)

func TestIndexReportsOnlyRealChanges(t *testing.T) {
	var changes [][]string
	x := NewIndex("cluster.local", func(h []string) { changes = append(changes, h) })
	svc := func(ip string) *clusters.Service {
		return &clusters.Service{Namespace: "ns", Name: "a", Endpoints: []clusters.Endpoint{{Address: ip, Port: 80, ServicePort: 80}}}
	}
	key := clusters.ServiceKey{Namespace: "ns", Name: "a"}
	x.ReplaceCluster("west", []*clusters.Service{svc("10.0.0.1")})
	x.UpdateService("west", key, svc("10.0.0.1")) // identical: no change
	x.UpdateService("west", key, svc("10.0.0.2"))
	x.ReplaceCluster("east", []*clusters.Service{svc("10.1.0.1")})
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
