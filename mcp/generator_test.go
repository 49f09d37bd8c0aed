package mcp

import (
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/hubmesh/hub/clusters"
)

// fakeIndex is a federated index in memory: hostname → member → view.
type fakeIndex struct {
	mu    sync.Mutex
	hosts map[string]map[string]*clusters.Service
}

func (x *fakeIndex) Hostnames() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	for h := range x.hosts {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

func (x *fakeIndex) Service(host string) map[string]*clusters.Service {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.hosts[host]
}

// set stores a member's view (nil: removes it) and returns the hostname.
func (x *fakeIndex) set(member string, svc *clusters.Service, ns, name string) string {
	x.mu.Lock()
	defer x.mu.Unlock()
	host := name + "." + ns + ".svc.cluster.local"
	if x.hosts == nil {
		x.hosts = map[string]map[string]*clusters.Service{}
	}
	if svc == nil {
		delete(x.hosts[host], member)
		if len(x.hosts[host]) == 0 {
			delete(x.hosts, host)
		}
		return host
	}
	if x.hosts[host] == nil {
		x.hosts[host] = map[string]*clusters.Service{}
	}
	x.hosts[host][member] = svc
	return host
}

func echoView(ns, name string, addrs ...string) *clusters.Service {
	s := &clusters.Service{Namespace: ns, Name: name, Ports: []clusters.ServicePort{{Name: "http", Port: 8080, Protocol: "TCP"}}}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, clusters.Endpoint{Address: a, Port: 8080, ServicePort: 8080, Region: "r", Zone: "z"})
	}
	return s
}

const seType = "networking.istio.io/v1/ServiceEntry"

// decode unwraps a set's resources: envelope metadata by name, and specs.
func decode(t *testing.T, set Set) (map[string]*mcpapi.Metadata, map[string]*networking.ServiceEntry) {
	t.Helper()
	metas, specs := map[string]*mcpapi.Metadata{}, map[string]*networking.ServiceEntry{}
	for _, a := range set.Resources {
		if a.TypeUrl != ResourceType {
			t.Fatalf("resource type %q, want %q", a.TypeUrl, ResourceType)
		}
		var r mcpapi.Resource
		if err := a.UnmarshalTo(&r); err != nil {
			t.Fatal(err)
		}
		if got := r.Body.GetTypeUrl(); got != "type.googleapis.com/istio.networking.v1alpha3.ServiceEntry" {
			t.Fatalf("body type %q", got)
		}
		var se networking.ServiceEntry
		if err := r.Body.UnmarshalTo(&se); err != nil {
			t.Fatal(err)
		}
		metas[r.Metadata.Name], specs[r.Metadata.Name] = r.Metadata, &se
	}
	return metas, specs
}

func TestGeneratorSetVersions(t *testing.T) {
	x := &fakeIndex{}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	g := New(x, Options{Now: func() time.Time { return now }})
	echo := x.set("west", echoView("demo", "echo", "10.0.0.1"), "demo", "echo")
	web := x.set("east", echoView("shop", "web", "10.9.0.1"), "shop", "web")

	s1, err := g.Set(seType, "")
	if err != nil {
		t.Fatal(err)
	}
	metas, specs := decode(t, s1)
	if len(specs) != 2 || specs["demo/hub-echo"] == nil || specs["shop/hub-web"] == nil {
		t.Fatalf("ServiceEntries %v, want demo/hub-echo and shop/hub-web", specs)
	}
	m := metas["demo/hub-echo"]
	if m.Version == "" || !m.CreateTime.AsTime().Equal(now) || m.Labels[LabelManagedBy] != ManagedBy {
		t.Errorf("metadata %v: want a version, create_time %v, label %s=%s", m, now, LabelManagedBy, ManagedBy)
	}

	// Asked again, and after a change that leaves the content as it is:
	// the same version, the same shared bytes.
	g.Invalidate(map[string]struct{}{echo: {}, web: {}})
	x.set("west", echoView("demo", "echo", "10.0.0.1"), "demo", "echo") // a new, equal view
	s2, _ := g.Set(seType, "")
	if s2.Version != s1.Version || s2.Resources[0] != s1.Resources[0] || s2.Resources[1] != s1.Resources[1] {
		t.Errorf("unchanged content: version %s → %s (resources shared: %v); want the same set", s1.Version, s2.Version, s2.Resources[0] == s1.Resources[0])
	}

	// An endpoint changes: that object's version and the set's change,
	// the other object is the same bytes, and create_time is kept.
	now = now.Add(time.Hour)
	x.set("west", echoView("demo", "echo", "10.0.0.1", "10.0.0.2"), "demo", "echo")
	g.Invalidate(map[string]struct{}{echo: {}})
	s3, _ := g.Set(seType, "")
	metas3, specs3 := decode(t, s3)
	if s3.Version == s2.Version || metas3["demo/hub-echo"].Version == m.Version {
		t.Errorf("endpoint added: set %s → %s, object %s → %s; want both to change", s2.Version, s3.Version, m.Version, metas3["demo/hub-echo"].Version)
	}
	if len(specs3["demo/hub-echo"].Endpoints) != 2 {
		t.Errorf("endpoints %v, want 2", specs3["demo/hub-echo"].Endpoints)
	}
	if !metas3["demo/hub-echo"].CreateTime.AsTime().Equal(m.CreateTime.AsTime()) {
		t.Errorf("create_time %v, want it kept (%v)", metas3["demo/hub-echo"].CreateTime.AsTime(), m.CreateTime.AsTime())
	}
	if s3.Resources[1] != s1.Resources[1] {
		t.Error("shop/hub-web was re-marshalled though it did not change")
	}

	// An invalidation without a change in the index: nothing moves.
	g.Invalidate(map[string]struct{}{echo: {}})
	if s4, _ := g.Set(seType, ""); s4.Version != s3.Version {
		t.Errorf("no change: version %s → %s", s3.Version, s4.Version)
	}

	// The Service opts out, then goes: its object goes from the set.
	optOut := echoView("demo", "echo", "10.0.0.1")
	optOut.NotExported = true
	x.set("west", optOut, "demo", "echo")
	g.Invalidate(map[string]struct{}{echo: {}})
	s5, _ := g.Set(seType, "")
	if _, specs5 := decode(t, s5); len(specs5) != 1 || specs5["shop/hub-web"] == nil {
		t.Errorf("after the opt-out: %v, want only shop/hub-web", specs5)
	}
	x.set("west", nil, "demo", "echo")
	x.set("east", nil, "shop", "web")
	g.Invalidate(map[string]struct{}{echo: {}, web: {}})
	if s6, _ := g.Set(seType, ""); len(s6.Resources) != 0 || s6.Version != emptySet.Version {
		t.Errorf("everything gone: %d resources, version %s; want an empty set", len(s6.Resources), s6.Version)
	}
}

func TestGeneratorEveryKind(t *testing.T) {
	x := &fakeIndex{}
	x.set("west", echoView("demo", "echo", "10.0.0.1"), "demo", "echo")
	g := New(x, Options{FederatedDomain: "mesh.example"})
	v1, err := g.Set(seType, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, specs := decode(t, v1); specs["demo/hub-echo"].GetHosts()[0] != "echo.demo.svc.mesh.example" {
		t.Errorf("hosts %v, want echo.demo.svc.mesh.example", specs["demo/hub-echo"].GetHosts())
	}
	// A pre-1.24 istiod asks for v1alpha3: the same resources.
	old, _ := g.Set("networking.istio.io/v1alpha3/ServiceEntry", "")
	if old.Version != v1.Version || len(old.Resources) != 1 || old.Resources[0] != v1.Resources[0] {
		t.Errorf("v1alpha3: %d resources version %s; want v1's", len(old.Resources), old.Version)
	}
	for _, typeURL := range IstiodTypes() {
		if typeURL == seType {
			continue
		}
		set, err := g.Set(typeURL, "")
		if err != nil || len(set.Resources) != 0 || set.Version == "" {
			t.Errorf("Set(%s) = %d resources, version %q, %v; want an empty list with a version", typeURL, len(set.Resources), set.Version, err)
		}
	}
	if _, err := g.Set("type.googleapis.com/envoy.config.cluster.v3.Cluster", ""); err == nil {
		t.Error("Set of an Envoy type: want an error")
	}
}

// The generated ServiceEntry's create_time is the oldest creation time of
// the Service among the members: the same from every generator (a
// restarted hub, another replica), whatever the clock says, so an object
// created later cannot win its host by age in istiod.
func TestGeneratorCreateTimeIsTheOldestServiceCreation(t *testing.T) {
	older := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	newer := older.Add(48 * time.Hour)
	x := &fakeIndex{}
	west := echoView("demo", "echo", "10.0.0.1")
	west.Created = newer
	x.set("west", west, "demo", "echo")

	createTime := func(g *Generator) (time.Time, string) {
		t.Helper()
		s, err := g.Set(seType, "")
		if err != nil {
			t.Fatal(err)
		}
		metas, _ := decode(t, s)
		m := metas["demo/hub-echo"]
		if m == nil {
			t.Fatalf("no demo/hub-echo in %v", metas)
		}
		return m.CreateTime.AsTime(), m.Version
	}
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g1 := New(x, Options{Now: func() time.Time { return clock }})
	got, v1 := createTime(g1)
	if !got.Equal(newer) {
		t.Fatalf("create_time %v, want the Service's creation %v", got, newer)
	}

	// Another hub (a restart, a replica) with another clock agrees.
	g2 := New(x, Options{Now: func() time.Time { return clock.Add(time.Hour) }})
	if got2, v2 := createTime(g2); !got2.Equal(got) || v2 != v1 {
		t.Errorf("second generator: create_time %v version %s; want %v %s", got2, v2, got, v1)
	}

	// A member with an older copy joins: the older time wins, with a new
	// version so that istiod takes it.
	east := echoView("demo", "echo", "10.1.0.1")
	east.Created = older
	host := x.set("east", east, "demo", "echo")
	g1.Invalidate(map[string]struct{}{host: {}})
	if got3, v3 := createTime(g1); !got3.Equal(older) || v3 == v1 {
		t.Errorf("after an older member joined: create_time %v version %s; want %v and a new version", got3, v3, older)
	}
}

// TestGeneratorExportTo: a view annotated hub.federation/export-to reaches
// the istiods of the members it names only, in a variant of its
// hostname's ServiceEntry; every other istiod shares the set without it.
func TestGeneratorExportTo(t *testing.T) {
	x := &fakeIndex{}
	g := New(x, Options{})
	echo := x.set("west", echoView("demo", "echo", "10.0.0.1"), "demo", "echo")
	east := echoView("demo", "echo", "10.0.0.2")
	east.ExportTo = []string{"north"}
	x.set("east", east, "demo", "echo")
	only := echoView("demo", "only", "10.0.0.3")
	only.ExportTo = []string{"north", "south"}
	onlyHost := x.set("east", only, "demo", "only")
	kept := echoView("demo", "kept", "10.0.0.4")
	kept.NotExported = true
	x.set("east", kept, "demo", "kept")

	endpoints := func(member string) map[string][]string {
		t.Helper()
		set, err := g.Set(seType, member)
		if err != nil {
			t.Fatal(err)
		}
		_, specs := decode(t, set)
		out := map[string][]string{}
		for name, se := range specs {
			for _, ep := range se.Endpoints {
				out[name] = append(out[name], ep.Address)
			}
			sort.Strings(out[name])
		}
		return out
	}
	shared := map[string][]string{"demo/hub-echo": {"10.0.0.1"}}
	for _, member := range []string{"", "west", "east", "unknown"} {
		if got := endpoints(member); !reflect.DeepEqual(got, shared) {
			t.Errorf("istiod of %q gets %v, want %v", member, got, shared)
		}
	}
	if got, want := endpoints("north"), map[string][]string{"demo/hub-echo": {"10.0.0.1", "10.0.0.2"}, "demo/hub-only": {"10.0.0.3"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("north's istiod gets %v, want %v", got, want)
	}
	if got, want := endpoints("south"), map[string][]string{"demo/hub-echo": {"10.0.0.1"}, "demo/hub-only": {"10.0.0.3"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("south's istiod gets %v, want %v", got, want)
	}
	if a, b := mustSet(t, g, "west"), mustSet(t, g, ""); a.Version != b.Version {
		t.Errorf("a member no export-to names gets version %s, the shared set is %s", a.Version, b.Version)
	}

	// The list dropped: every istiod gets it, and the variants go.
	only.ExportTo = nil
	x.set("east", only, "demo", "only")
	g.Invalidate(map[string]struct{}{onlyHost: {}, echo: {}})
	if got := endpoints("west"); len(got["demo/hub-only"]) != 1 {
		t.Errorf("west's istiod gets %v after the export-to list went", got)
	}
	if got := endpoints("south"); !reflect.DeepEqual(got, endpoints("")) {
		t.Errorf("south's istiod gets %v, the shared set %v", got, endpoints(""))
	}
}

func mustSet(t *testing.T, g *Generator, member string) Set {
	t.Helper()
	s, err := g.Set(seType, member)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
