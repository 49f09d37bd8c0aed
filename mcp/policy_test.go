package mcp

import (
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"

	"github.com/hubmesh/hub/distribute"
)

// fakePolicy is a distribute.Source in memory.
type fakePolicy struct {
	mu       sync.Mutex
	objects  map[string][]distribute.Object
	complete map[string]bool
}

func (p *fakePolicy) Objects(kind string) ([]distribute.Object, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.objects[kind], p.complete[kind]
}

func (p *fakePolicy) put(kind string, complete bool, objs ...distribute.Object) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.objects[kind], p.complete[kind] = objs, complete
}

const paKind = "security.istio.io/v1/PeerAuthentication"

func strict(ns, name, version string) distribute.Object {
	return distribute.Object{Kind: paKind, Namespace: ns, Name: name, Version: version, CreationTimestamp: time.Unix(100, 0),
		Labels: map[string]string{"hub.federation/distribute": "true"}, Annotations: map[string]string{"note": "x"},
		Spec: &securityv1beta1.PeerAuthentication{Mtls: &securityv1beta1.PeerAuthentication_MutualTLS{Mode: securityv1beta1.PeerAuthentication_MutualTLS_STRICT}}}
}

// Distributed objects are served unchanged under their kind, whatever
// version of it istiod asks for; the set's version changes exactly when an
// object does; while the kind is not complete the last complete list is
// served (an empty one would make istiod delete them); distributed
// ServiceEntries go with the federated ones.
func TestDistributedObjects(t *testing.T) {
	p := &fakePolicy{objects: map[string][]distribute.Object{}, complete: map[string]bool{}}
	g := New(&fakeIndex{}, Options{Policy: p})
	p.put(paKind, true, strict("istio-system", "default", "v1"), strict("a", "pa", "v1"))
	s1, err := g.Set(paKind, "")
	if err != nil || len(s1.Resources) != 2 {
		t.Fatalf("Set = %d resources, %v; want 2", len(s1.Resources), err)
	}
	var res mcpapi.Resource
	if err := s1.Resources[0].UnmarshalTo(&res); err != nil {
		t.Fatal(err)
	}
	var pa securityv1beta1.PeerAuthentication
	if err := res.Body.UnmarshalTo(&pa); err != nil {
		t.Fatal(err)
	}
	if md := res.Metadata; md.Name != "a/pa" || md.Version != "v1" || md.Labels["hub.federation/distribute"] != "true" || md.Annotations["note"] != "x" || !md.CreateTime.AsTime().Equal(time.Unix(100, 0)) {
		t.Errorf("metadata %+v", md)
	}
	if !proto.Equal(&pa, strict("", "", "").Spec) {
		t.Errorf("body %v", &pa)
	}
	if s, _ := g.Set("security.istio.io/v1beta1/PeerAuthentication", ""); s.Version != s1.Version {
		t.Errorf("another version of the kind gets set %s; want %s", s.Version, s1.Version)
	}
	if s, _ := g.Set(paKind, ""); s.Version != s1.Version || s.Resources[0] != s1.Resources[0] {
		t.Error("the same objects gave a new set or new bytes")
	}
	p.put(paKind, false) // e.g. the watch is re-syncing
	if s, _ := g.Set(paKind, ""); s.Version != s1.Version {
		t.Error("an incomplete kind did not keep its last list")
	}
	p.put(paKind, true, strict("a", "pa", "v2"))
	if s, _ := g.Set(paKind, ""); s.Version == s1.Version || len(s.Resources) != 1 {
		t.Errorf("after an edit and a removal: %d resources, version %s", len(s.Resources), s.Version)
	}
	if s, _ := g.Set("security.istio.io/v1/AuthorizationPolicy", ""); len(s.Resources) != 0 {
		t.Error("a kind with no objects is not empty")
	}
	seKind := "networking.istio.io/v1/ServiceEntry"
	p.put(seKind, true, distribute.Object{Kind: seKind, Namespace: "a", Name: "ext", Version: "v1", Spec: &networking.ServiceEntry{Hosts: []string{"ext.example.com"}}})
	if s, _ := g.Set(seKind, ""); len(s.Resources) != 1 {
		t.Errorf("a distributed ServiceEntry with no federated ones: %d resources", len(s.Resources))
	}
}
