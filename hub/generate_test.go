package hub

import (
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
	g := newGenerator(testIndex())
	types := map[string]func() proto.Message{
		resourcev3.ClusterType:  func() proto.Message { return &clusterv3.Cluster{} },
		resourcev3.EndpointType: func() proto.Message { return &endpointv3.ClusterLoadAssignment{} },
		resourcev3.ListenerType: func() proto.Message { return &listenerv3.Listener{} },
		resourcev3.RouteType:    func() proto.Message { return &routev3.RouteConfiguration{} },
	}
	for typeURL, newMsg := range types {
		res, err := g.resources(typeURL, g.allNames(typeURL), flavourPlain)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range res {
			names = append(names, r.name)
			msg := newMsg()
			if err := r.any.UnmarshalTo(msg); err != nil {
				t.Fatalf("%s %s: %v", typeURL, r.name, err)
			}
			validateDeep(t, typeURL+" "+r.name, msg) // packed messages too (HCM, filters)
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
	g := newGenerator(testIndex())
	res, err := g.resources(resourcev3.EndpointType, []string{"outbound|7070||echo.demo.svc.cluster.local"}, flavourPlain)
	if err != nil || len(res) != 1 {
		t.Fatalf("resources = %v, %v", res, err)
	}
	var cla endpointv3.ClusterLoadAssignment
	if err := res[0].any.UnmarshalTo(&cla); err != nil {
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
	g := newGenerator(testIndex())
	name := "echo.demo.svc.cluster.local:7070"
	lres, _ := g.resources(resourcev3.ListenerType, []string{name}, flavourPlain)
	rres, _ := g.resources(resourcev3.RouteType, []string{name}, flavourPlain)
	if len(lres) != 1 || len(rres) != 1 {
		t.Fatalf("listener %v route %v", lres, rres)
	}
	var l listenerv3.Listener
	_ = lres[0].any.UnmarshalTo(&l)
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
	_ = rres[0].any.UnmarshalTo(&rc)
	vh := rc.VirtualHosts[0]
	if len(vh.Domains) != 2 || vh.Domains[0] != "echo.demo.svc.cluster.local" || vh.Domains[1] != name {
		t.Errorf("domains = %v", vh.Domains)
	}
	if c := vh.Routes[0].GetRoute().GetCluster(); c != "outbound|7070||echo.demo.svc.cluster.local" {
		t.Errorf("route cluster = %q", c)
	}
}

func TestUnknownNamesAreAbsent(t *testing.T) {
	g := newGenerator(testIndex())
	for typeURL, names := range map[string][]string{
		resourcev3.ClusterType:  {"outbound|9999||echo.demo.svc.cluster.local", "inbound|7070||echo.demo.svc.cluster.local", "garbage", "outbound|x||h"},
		resourcev3.ListenerType: {"echo.demo.svc.cluster.local", "nohost.demo.svc.cluster.local:80", ":80", "echo.demo.svc.cluster.local:99999"},
	} {
		res, err := g.resources(typeURL, names, flavourPlain)
		if err != nil || len(res) != 0 {
			t.Errorf("%s %v: got %v, %v; want nothing", typeURL, names, res, err)
		}
	}
}

func TestGeneratorCachesUntilInvalidated(t *testing.T) {
	x := testIndex()
	g := newGenerator(x)
	name := []string{"outbound|80||web.demo.svc.cluster.local"}
	a, _ := g.resources(resourcev3.EndpointType, name, flavourPlain)
	b, _ := g.resources(resourcev3.EndpointType, name, flavourPlain)
	if a[0] != b[0] {
		t.Errorf("same inputs generated twice; want the memoised resource")
	}
	x.UpdateService("east", clusters.ServiceKey{Namespace: "demo", Name: "web"}, &clusters.Service{
		Namespace: "demo", Name: "web", Ports: []clusters.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
		Endpoints: []clusters.Endpoint{{Address: "10.9.9.9", Port: 80, ServicePort: 80}},
	})
	g.invalidate(map[string]struct{}{"web.demo.svc.cluster.local": {}})
	c, _ := g.resources(resourcev3.EndpointType, name, flavourPlain)
	if c[0].version == a[0].version {
		t.Errorf("version unchanged after the endpoints changed")
	}
}
