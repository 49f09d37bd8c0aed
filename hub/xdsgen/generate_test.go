package xdsgen

import (
	"fmt"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/feed"
)

// testIndex holds echo.demo in two members (west in two zones) and
// web.demo, port 80 only, in east.
func testIndex() *feed.Index {
	x := feed.NewIndex("cluster.local", nil)
	x.ReplaceCluster("west", []*clusters.Service{{
		Namespace: "demo", Name: "echo",
		Ports: []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}, {Name: "dns", Port: 53, Protocol: "UDP"}},
		Endpoints: []clusters.Endpoint{
			{Address: "10.0.0.1", Port: 8080, ServicePort: 7070, Region: "us-west", Zone: "a"},
			{Address: "10.0.0.2", Port: 8080, ServicePort: 7070, Region: "us-west", Zone: "b", Health: clusters.Draining},
			{Address: "10.0.0.3", Port: 8080, ServicePort: 7070, Region: "us-west", Zone: "a"},
		},
	}})
	x.ReplaceCluster("east", []*clusters.Service{
		{Namespace: "demo", Name: "echo", Ports: []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}},
			Endpoints: []clusters.Endpoint{{Address: "10.1.0.1", Port: 9090, ServicePort: 7070}}},
		{Namespace: "demo", Name: "web", Ports: []clusters.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}}},
	})
	return x
}

type validator interface{ ValidateAll() error }

func TestGeneratedResourcesAreValid(t *testing.T) {
	g := New(testIndex())
	types := map[string]func() proto.Message{
		resourcev3.ClusterType:  func() proto.Message { return &clusterv3.Cluster{} },
		resourcev3.EndpointType: func() proto.Message { return &endpointv3.ClusterLoadAssignment{} },
		resourcev3.ListenerType: func() proto.Message { return &listenerv3.Listener{} },
		resourcev3.RouteType:    func() proto.Message { return &routev3.RouteConfiguration{} },
	}
	for typeURL, newMsg := range types {
		res, err := g.Resources(typeURL, g.allNames(typeURL), View{Flavour: FlavourPlain})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range res {
			names = append(names, r.Name)
			msg := newMsg()
			if err := r.Any.UnmarshalTo(msg); err != nil {
				t.Fatalf("%s %s: %v", typeURL, r.Name, err)
			}
			validateDeep(t, typeURL+" "+r.Name, msg) // packed messages too (HCM, filters)
		}
		want := []string{"outbound|7070||echo.demo.svc.cluster.local", "outbound|80||web.demo.svc.cluster.local"}
		if typeURL == resourcev3.ListenerType || typeURL == resourcev3.RouteType {
			want = []string{"echo.demo.svc.cluster.local:7070", "web.demo.svc.cluster.local:80"}
		}
		if len(names) != len(want) || names[0] != want[0] || names[1] != want[1] {
			t.Errorf("%s wildcard names = %v; want %v (UDP ports are not served)", typeURL, names, want)
		}
	}
}

func TestLoadAssignmentLocalities(t *testing.T) {
	g := New(testIndex())
	res, err := g.Resources(resourcev3.EndpointType, []string{"outbound|7070||echo.demo.svc.cluster.local"}, View{Flavour: FlavourPlain})
	if err != nil || len(res) != 1 {
		t.Fatalf("resources = %v, %v", res, err)
	}
	var cla endpointv3.ClusterLoadAssignment
	if err := res[0].Any.UnmarshalTo(&cla); err != nil {
		t.Fatal(err)
	}
	type loc struct {
		member, region, zone string
		weight               uint32
		endpoints            int
	}
	want := []loc{{"east", "", "", 1, 1}, {"west", "us-west", "a", 2, 2}, {"west", "us-west", "b", 1, 1}}
	if len(cla.Endpoints) != len(want) {
		t.Fatalf("got %d localities; want %d", len(cla.Endpoints), len(want))
	}
	for i, l := range cla.Endpoints {
		got := loc{l.Locality.SubZone, l.Locality.Region, l.Locality.Zone, l.LoadBalancingWeight.GetValue(), len(l.LbEndpoints)}
		if got != want[i] {
			t.Errorf("locality %d = %+v; want %+v", i, got, want[i])
		}
		for _, ep := range l.LbEndpoints {
			if m := ep.Metadata.FilterMetadata[MetadataNamespace].Fields["cluster"].GetStringValue(); m != l.Locality.SubZone {
				t.Errorf("endpoint %v has hub.cluster %q in locality of %q", ep.GetEndpoint().GetAddress(), m, l.Locality.SubZone)
			}
		}
	}
	if h := cla.Endpoints[2].LbEndpoints[0].HealthStatus; h != corev3.HealthStatus_DRAINING {
		t.Errorf("terminating endpoint health = %v; want DRAINING", h)
	}
}

func TestListenerAndRouteForProxylessGRPC(t *testing.T) {
	g := New(testIndex())
	name := "echo.demo.svc.cluster.local:7070"
	lres, _ := g.Resources(resourcev3.ListenerType, []string{name}, View{Flavour: FlavourPlain})
	rres, _ := g.Resources(resourcev3.RouteType, []string{name}, View{Flavour: FlavourPlain})
	if len(lres) != 1 || len(rres) != 1 {
		t.Fatalf("listener %v route %v", lres, rres)
	}
	var l listenerv3.Listener
	_ = lres[0].Any.UnmarshalTo(&l)
	var hcm hcmv3.HttpConnectionManager
	if err := l.GetApiListener().GetApiListener().UnmarshalTo(&hcm); err != nil {
		t.Fatalf("api_listener is not an HCM: %v", err)
	}
	if hcm.GetRds().GetRouteConfigName() != name || hcm.GetRds().GetConfigSource().GetAds() == nil {
		t.Errorf("HCM rds = %v", hcm.GetRds())
	}
	if f := hcm.HttpFilters; len(f) == 0 || f[len(f)-1].Name != "envoy.filters.http.router" {
		t.Errorf("router filter must be last: %v", f)
	}
	var rc routev3.RouteConfiguration
	_ = rres[0].Any.UnmarshalTo(&rc)
	vh := rc.VirtualHosts[0]
	if len(vh.Domains) != 2 || vh.Domains[0] != "echo.demo.svc.cluster.local" || vh.Domains[1] != name {
		t.Errorf("domains = %v", vh.Domains)
	}
	if c := vh.Routes[0].GetRoute().GetCluster(); c != "outbound|7070||echo.demo.svc.cluster.local" {
		t.Errorf("route cluster = %q", c)
	}
}

func TestUnknownNamesAreAbsent(t *testing.T) {
	g := New(testIndex())
	for typeURL, names := range map[string][]string{
		resourcev3.ClusterType:  {"outbound|9999||echo.demo.svc.cluster.local", "inbound|7070||echo.demo.svc.cluster.local", "garbage", "outbound|x||h"},
		resourcev3.ListenerType: {"echo.demo.svc.cluster.local", "nohost.demo.svc.cluster.local:80", ":80", "echo.demo.svc.cluster.local:99999"},
	} {
		res, err := g.Resources(typeURL, names, View{Flavour: FlavourPlain})
		if err != nil || len(res) != 0 {
			t.Errorf("%s %v: got %v, %v; want nothing", typeURL, names, res, err)
		}
	}
}

func TestGeneratorCachesUntilInvalidated(t *testing.T) {
	x := testIndex()
	g := New(x)
	name := []string{"outbound|80||web.demo.svc.cluster.local"}
	a, _ := g.Resources(resourcev3.EndpointType, name, View{Flavour: FlavourPlain})
	b, _ := g.Resources(resourcev3.EndpointType, name, View{Flavour: FlavourPlain})
	if a[0] != b[0] {
		t.Errorf("same inputs generated twice; want the memoised resource")
	}
	x.UpdateService("east", clusters.ServiceKey{Namespace: "demo", Name: "web"}, &clusters.Service{
		Namespace: "demo", Name: "web", Ports: []clusters.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
		Endpoints: []clusters.Endpoint{{Address: "10.9.9.9", Port: 80, ServicePort: 80}},
	})
	g.Invalidate(map[string]struct{}{"web.demo.svc.cluster.local": {}})
	c, _ := g.Resources(resourcev3.EndpointType, name, View{Flavour: FlavourPlain})
	if c[0].Version == a[0].Version {
		t.Errorf("version unchanged after the endpoints changed")
	}
}

func TestParseName(t *testing.T) {
	for _, tc := range []struct {
		typeURL, name, host string
		port                int32
		ok                  bool
	}{
		{resourcev3.EndpointType, "outbound|80||a.b.svc.cluster.local", "a.b.svc.cluster.local", 80, true},
		{resourcev3.ClusterType, "outbound|65535||x", "x", 65535, true},
		{resourcev3.ClusterType, "outbound|80|v1|x", "", 0, false},
		{resourcev3.ClusterType, "outbound|80||x|y", "", 0, false},
		{resourcev3.ClusterType, "outbound|80||", "", 0, false},
		{resourcev3.ClusterType, "inbound|80||x", "", 0, false},
		{resourcev3.ClusterType, "outbound|0||x", "", 0, false},
		{resourcev3.ClusterType, "outbound|80|", "", 0, false},
		{resourcev3.ClusterType, "outbound|", "", 0, false},
		{resourcev3.ClusterType, "outbound|x||h", "", 0, false},
		{resourcev3.ListenerType, "a.b.svc.cluster.local:80", "a.b.svc.cluster.local", 80, true},
		{resourcev3.RouteType, ":80", "", 0, false},
		{resourcev3.SecretType, "outbound|80||x", "", 0, false},
	} {
		host, port, ok := ParseName(tc.typeURL, tc.name)
		if host != tc.host || port != tc.port || ok != tc.ok {
			t.Errorf("ParseName(%s, %q) = %q, %d, %v; want %q, %d, %v", tc.typeURL, tc.name, host, port, ok, tc.host, tc.port, tc.ok)
		}
	}
}

func TestGeneratorStampsStayBounded(t *testing.T) {
	g := New(feed.NewIndex("cluster.local", nil))
	for i := range maxGens + 100 {
		g.Invalidate(map[string]struct{}{fmt.Sprintf("h%d.ns.svc.cluster.local", i): {}})
	}
	if n := len(g.gens); n > maxGens {
		t.Fatalf("%d invalidation stamps kept; want at most %d", n, maxGens)
	}
	// A build that read a stamp before an invalidation is not cached, even
	// when the stamps were cleared in between.
	host := "late.ns.svc.cluster.local"
	before := g.genOf(host)
	g.Invalidate(map[string]struct{}{host: {}})
	for i := range maxGens {
		g.Invalidate(map[string]struct{}{fmt.Sprintf("x%d", i): {}})
	}
	if g.genOf(host) == before {
		t.Fatal("a pruned hostname's stamp equals one read before its invalidation")
	}
}
