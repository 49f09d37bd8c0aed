package xdsgen

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/feed"
)

// networkIndex holds echo.demo in three members on three networks: west
// (net-a, no gateway), east (net-b, one gateway; two mTLS endpoints and a
// plaintext one), south (net-c, no gateway); and solo.demo in west alone.
func networkIndex() *feed.Index {
	x := feed.NewIndex("cluster.local", nil)
	port := []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}}
	x.ReplaceCluster("west", []*clusters.Service{
		{Namespace: "demo", Name: "echo", Network: "net-a", Ports: port, Endpoints: []clusters.Endpoint{
			{Address: "10.0.0.1", Port: 8080, ServicePort: 7070, MTLS: true},
		}},
		{Namespace: "demo", Name: "solo", Network: "net-a", Ports: port, Endpoints: []clusters.Endpoint{
			{Address: "10.0.0.9", Port: 8080, ServicePort: 7070, MTLS: true},
		}},
	})
	eastGW := []clusters.Gateway{{Address: "203.0.113.10", Port: 15443, Source: "service istio-system/eastwest", Proxyless: true}}
	x.ReplaceCluster("east", []*clusters.Service{
		{Namespace: "demo", Name: "echo", Network: "net-b", Gateways: eastGW, Ports: port, Endpoints: []clusters.Endpoint{
			{Address: "10.1.0.1", Port: 8080, ServicePort: 7070, Zone: "z1", MTLS: true},
			{Address: "10.1.0.2", Port: 8080, ServicePort: 7070, Zone: "z1", MTLS: true},
			{Address: "10.1.0.3", Port: 8080, ServicePort: 7070, Zone: "z1"}, // plaintext
		}},
	})
	x.ReplaceCluster("south", []*clusters.Service{
		{Namespace: "demo", Name: "echo", Network: "net-c", Ports: port, Endpoints: []clusters.Endpoint{
			{Address: "10.2.0.1", Port: 8080, ServicePort: 7070, MTLS: true},
		}},
	})
	return x
}

// shape prints an assignment as "member/priority/weight: addr:port×weight[tls] ..." per locality.
func shape(cla *endpointv3.ClusterLoadAssignment) string {
	var out []string
	for _, l := range cla.Endpoints {
		var eps []string
		for _, ep := range l.LbEndpoints {
			sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
			e := fmt.Sprintf("%s:%d×%d", sa.GetAddress(), sa.GetPortValue(), ep.GetLoadBalancingWeight().GetValue())
			if ep.GetMetadata().GetFilterMetadata()[transportSocketMatch].GetFields()[tlsModeKey].GetStringValue() == tlsModeIstio {
				e += "[tls]"
			}
			eps = append(eps, e)
		}
		out = append(out, fmt.Sprintf("%s/p%d/w%d: %s", l.Locality.SubZone, l.Priority, l.LoadBalancingWeight.GetValue(), strings.Join(eps, " ")))
	}
	return strings.Join(out, "; ")
}

func assignmentFor(t *testing.T, g *Generator, name string, v View) (*Resource, *endpointv3.ClusterLoadAssignment) {
	t.Helper()
	res, err := g.Resources(resourcev3.EndpointType, []string{name}, v)
	if err != nil || len(res) != 1 {
		t.Fatalf("EDS %s for %+v = %v, %v", name, v, res, err)
	}
	cla := unpack(t, res[0], &endpointv3.ClusterLoadAssignment{})
	if err := cla.ValidateAll(); err != nil {
		t.Fatalf("invalid assignment: %v", err)
	}
	return res[0], cla
}

// TestSplitHorizonEndpoints follows istiod's EndpointsByNetworkFilter: a
// client gets its own network's endpoints directly, another network's
// mTLS endpoints as that network's gateway with their summed weight
// (tlsMode istio), and nothing of a network that has no gateway or of
// plaintext endpoints across networks.
func TestSplitHorizonEndpoints(t *testing.T) {
	g := strictGenerator(t, networkIndex())
	const echo = "outbound|7070||echo.demo.svc.cluster.local"
	for _, tc := range []struct {
		network, want string
	}{
		{"net-a", "east/p0/w2: 203.0.113.10:15443×2[tls]; west/p0/w1: 10.0.0.1:8080×1[tls]"},
		{"net-b", "east/p0/w3: 10.1.0.1:8080×1[tls] 10.1.0.2:8080×1[tls] 10.1.0.3:8080×1"},
		{"net-c", "east/p0/w2: 203.0.113.10:15443×2[tls]; south/p0/w1: 10.2.0.1:8080×1[tls]"},
		// No network: Istio's IsSameOrEmpty reaches gateway-less networks
		// directly, and a network with a gateway through it.
		{"", "east/p0/w2: 203.0.113.10:15443×2[tls]; south/p0/w1: 10.2.0.1:8080×1[tls]; west/p0/w1: 10.0.0.1:8080×1[tls]"},
	} {
		_, cla := assignmentFor(t, g, echo, View{Network: tc.network, Flavour: FlavourGRPC})
		if got := shape(cla); got != tc.want {
			t.Errorf("network %q:\n got %s\nwant %s", tc.network, got, tc.want)
		}
	}
	// A client without Istio mTLS cannot pass a gateway (it routes on the
	// SNI of Istio's mTLS): it gets no endpoint of another network.
	_, cla := assignmentFor(t, g, echo, View{Network: "net-a"})
	if got, want := shape(cla), "west/p0/w1: 10.0.0.1:8080×1[tls]"; got != want {
		t.Errorf("plaintext client on net-a:\n got %s\nwant %s", got, want)
	}
	// A plaintext client without a network reaches every network directly
	// (Istio's IsSameOrEmpty), gateway or not.
	_, cla = assignmentFor(t, g, echo, View{})
	if got := shape(cla); !strings.Contains(got, "10.1.0.1:8080") || strings.Contains(got, "203.0.113.10") {
		t.Errorf("plaintext client without a network: %s", got)
	}
}

// TestProxylessClientsUseOnlyGatewaysThatAdmitThem: a gateway that does
// not say it admits proxyless gRPC (as istiod builds one, matching Istio's
// mTLS ALPNs only) reaches an Envoy client of another network, while a
// proxyless client there gets none of its network's endpoints, rather
// than a gateway that would close its connections; of two gateways it gets
// the one that admits it.
func TestProxylessClientsUseOnlyGatewaysThatAdmitThem(t *testing.T) {
	x := networkIndex()
	istioGW := clusters.Gateway{Address: "203.0.113.10", Port: 15443, Source: "service istio-system/eastwest"}
	east := func(gws ...clusters.Gateway) {
		x.ReplaceCluster("east", []*clusters.Service{
			{Namespace: "demo", Name: "echo", Network: "net-b", Gateways: gws, Ports: []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}},
				Endpoints: []clusters.Endpoint{{Address: "10.1.0.1", Port: 8080, ServicePort: 7070, Zone: "z1", MTLS: true}}},
		})
	}
	east(istioGW)
	g := strictGenerator(t, x)
	const echo = "outbound|7070||echo.demo.svc.cluster.local"
	for _, tc := range []struct {
		flavour Flavour
		want    string
	}{
		{FlavourEnvoy, "east/p0/w1: 203.0.113.10:15443×1[tls]; west/p0/w1: 10.0.0.1:8080×1[tls]"},
		{FlavourGRPC, "west/p0/w1: 10.0.0.1:8080×1[tls]"},
	} {
		if _, cla := assignmentFor(t, g, echo, View{Network: "net-a", Flavour: tc.flavour}); shape(cla) != tc.want {
			t.Errorf("%v client on net-a, east's gateway not admitting proxyless:\n got %s\nwant %s", tc.flavour, shape(cla), tc.want)
		}
	}
	grpcGW := clusters.Gateway{Address: "203.0.113.11", Port: 15443, Source: "service istio-system/eastwest-grpc", Proxyless: true}
	east(istioGW, grpcGW)
	g.Invalidate(map[string]struct{}{"echo.demo.svc.cluster.local": {}})
	if _, cla := assignmentFor(t, g, echo, View{Network: "net-a", Flavour: FlavourGRPC}); shape(cla) != "east/p0/w1: 203.0.113.11:15443×1[tls]; west/p0/w1: 10.0.0.1:8080×1[tls]" {
		t.Errorf("proxyless client on net-a, one of east's gateways admitting it: %s", shape(cla))
	}
	if _, cla := assignmentFor(t, g, echo, View{Network: "net-a", Flavour: FlavourEnvoy}); !strings.Contains(shape(cla), "203.0.113.10") || !strings.Contains(shape(cla), "203.0.113.11") {
		t.Errorf("Envoy client on net-a: %s; want both gateways", shape(cla))
	}
	// East's own gateway does not admit it, another member's on east's
	// network does: the proxyless client goes through that one, an Envoy
	// through east's own.
	east(istioGW)
	x.ReplaceCluster("east2", []*clusters.Service{{Namespace: "demo", Name: "other", Network: "net-b", Gateways: []clusters.Gateway{grpcGW},
		Ports: []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}}}})
	g.Invalidate(map[string]struct{}{"echo.demo.svc.cluster.local": {}})
	if _, cla := assignmentFor(t, g, echo, View{Network: "net-a", Flavour: FlavourGRPC}); shape(cla) != "east/p0/w1: 203.0.113.11:15443×1[tls]; west/p0/w1: 10.0.0.1:8080×1[tls]" {
		t.Errorf("proxyless client on net-a, the network's other gateway admitting it: %s", shape(cla))
	}
	if _, cla := assignmentFor(t, g, echo, View{Network: "net-a", Flavour: FlavourEnvoy}); shape(cla) != "east/p0/w1: 203.0.113.10:15443×1[tls]; west/p0/w1: 10.0.0.1:8080×1[tls]" {
		t.Errorf("Envoy client on net-a, east's own gateway: %s", shape(cla))
	}
}

// TestSplitHorizonCacheKeepsViewsApart: whichever client asks first, a
// client without a network (east through its gateway, as istiod's
// forceGateway) and one on east's network (east directly) get their own.
func TestSplitHorizonCacheKeepsViewsApart(t *testing.T) {
	const echo = "outbound|7070||echo.demo.svc.cluster.local"
	none := View{Flavour: FlavourGRPC}
	own := View{Network: "net-b", Flavour: FlavourGRPC}
	for _, order := range [][]View{{none, own}, {own, none}} {
		g := strictGenerator(t, networkIndex())
		got := map[View]string{}
		for _, v := range order {
			_, cla := assignmentFor(t, g, echo, v)
			got[v] = shape(cla)
		}
		if !strings.Contains(got[none], "203.0.113.10:15443") || strings.Contains(got[none], "10.1.0.1") {
			t.Errorf("order %v: the client without a network got %s", order, got[none])
		}
		if !strings.Contains(got[own], "10.1.0.3:8080") || strings.Contains(got[own], "203.0.113.10") {
			t.Errorf("order %v: the client on east's network got %s", order, got[own])
		}
	}
}

// TestSplitHorizonSharesUnsplitAssignments: a service whose endpoints a
// client's network does not change is one resource for every client, and
// the variants of a split service are marshalled once each.
func TestSplitHorizonSharesUnsplitAssignments(t *testing.T) {
	g := strictGenerator(t, networkIndex())
	const solo = "outbound|7070||solo.demo.svc.cluster.local"
	direct, _ := assignmentFor(t, g, solo, View{Network: "net-a"})
	if r, _ := assignmentFor(t, g, solo, View{Network: "net-a", Flavour: FlavourGRPC}); r != direct {
		t.Error("solo for its own network is not the shared assignment")
	}
	// Other networks cannot reach west (no gateway): they get none of it.
	if _, cla := assignmentFor(t, g, solo, View{Network: "net-b", Flavour: FlavourGRPC}); len(cla.Endpoints) != 0 {
		t.Errorf("solo for net-b: %s", shape(cla))
	}
	const echo = "outbound|7070||echo.demo.svc.cluster.local"
	a1, _ := assignmentFor(t, g, echo, View{Network: "net-a", Flavour: FlavourGRPC})
	a2, _ := assignmentFor(t, g, echo, View{Network: "net-a", Flavour: FlavourGRPC})
	b, _ := assignmentFor(t, g, echo, View{Network: "net-b", Flavour: FlavourGRPC})
	if a1 != a2 {
		t.Error("echo for net-a was marshalled twice")
	}
	if a1.Version == b.Version {
		t.Error("echo for net-a and net-b are the same")
	}
	set, err := g.All(resourcev3.EndpointType, View{Network: "net-b", Flavour: FlavourGRPC})
	if err != nil || !slices.Contains(set.Resources, b) {
		t.Errorf("the wildcard set for net-b does not share echo's assignment: %v", err)
	}
}

// TestUnhealthyMembersAreDemoted: a Stale member's localities go to
// priority 1 behind the healthy ones, stay at 0 when nothing else is left,
// and come back when it recovers; the flag turns it off.
func TestUnhealthyMembersAreDemoted(t *testing.T) {
	x := networkIndex()
	g := strictGenerator(t, x)
	const echo = "outbound|7070||echo.demo.svc.cluster.local"
	const solo = "outbound|7070||solo.demo.svc.cluster.local"
	x.MemberState("south", clusters.StateStale)
	x.MemberState("west", clusters.StateReady)
	mtlsC := View{Network: "net-c", Flavour: FlavourGRPC}
	_, cla := assignmentFor(t, g, echo, mtlsC)
	if got, want := shape(cla), "east/p0/w2: 203.0.113.10:15443×2[tls]; south/p1/w1: 10.2.0.1:8080×1[tls]"; got != want {
		t.Errorf("south Stale:\n got %s\nwant %s", got, want)
	}
	x.MemberState("west", clusters.StateUnreachable)
	g.Invalidate(map[string]struct{}{"solo.demo.svc.cluster.local": {}, "echo.demo.svc.cluster.local": {}})
	if _, cla := assignmentFor(t, g, solo, View{}); cla.Endpoints[0].Priority != 0 {
		t.Errorf("the only member was demoted: %s", shape(cla))
	}
	x.MemberState("south", clusters.StateReady)
	g.Invalidate(map[string]struct{}{"echo.demo.svc.cluster.local": {}})
	_, cla = assignmentFor(t, g, echo, mtlsC)
	if got, want := shape(cla), "east/p0/w2: 203.0.113.10:15443×2[tls]; south/p0/w1: 10.2.0.1:8080×1[tls]"; got != want {
		t.Errorf("south recovered:\n got %s\nwant %s", got, want)
	}

	off := strictGenerator(t, x)
	off.SetDemoteUnhealthy(false)
	x.MemberState("south", clusters.StateTimedOut)
	if _, cla := assignmentFor(t, off, echo, mtlsC); strings.Contains(shape(cla), "/p1/") {
		t.Errorf("demotion off, yet: %s", shape(cla))
	}
}

// TestMTLSClustersCarryIstioSNI: a gRPC client's Cluster under STRICT
// sends Istio's SNI for the service port (outbound_.<port>_._.<host>), on
// which an east-west gateway routes without terminating TLS.
func TestMTLSClustersCarryIstioSNI(t *testing.T) {
	g := mtlsGenerator(t, MTLSStrict)
	res, err := g.Resources(resourcev3.ClusterType, []string{"outbound|7070||echo.demo.svc.cluster.local"}, View{Flavour: FlavourGRPC})
	if err != nil || len(res) != 1 {
		t.Fatalf("CDS = %v, %v", res, err)
	}
	c := unpack(t, res[0], &clusterv3.Cluster{})
	tlsCtx := unpack(t, &Resource{Name: "tls", Any: c.GetTransportSocket().GetTypedConfig()}, &tlsv3.UpstreamTlsContext{})
	if got, want := tlsCtx.GetSni(), "outbound_.7070_._.echo.demo.svc.cluster.local"; got != want {
		t.Errorf("SNI = %q; want %q", got, want)
	}
}

// places is a fixed Places: members west (net-a) and east (net-b),
// endpoints in region r1 zone z1 only.
type places struct{}

func (places) MemberNetwork(m string) string {
	return map[string]string{"west": "net-a", "east": "net-b"}[m]
}
func (places) KnownNetwork(n string) bool { return n == "net-a" || n == "net-b" }
func (places) KnownMember(m string) bool  { return m == "west" || m == "east" }
func (places) KnownLocality(r, z string) (string, string) {
	if r != "r1" {
		return feed.UnknownLocality, ""
	}
	if z != "z1" {
		return r, feed.UnknownLocality
	}
	return r, z
}

// TestViewOfNetwork: NETWORK from the node, else the member's; a network
// no member is on is OtherNetwork, whatever its name; a region, zone or
// member nothing is in is not kept either.
func TestViewOfNetwork(t *testing.T) {
	node := func(nw, region, zone string) *corev3.Node {
		return &corev3.Node{Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NETWORK": structpb.NewStringValue(nw)}},
			Locality: &corev3.Locality{Region: region, Zone: zone}}
	}
	for _, tc := range []struct{ claimed, member, want string }{
		{"net-b", "west", "net-b"}, {"", "west", "net-a"}, {"", "", ""},
		{"made-up-1", "west", OtherNetwork}, {"made-up-2", "", OtherNetwork},
	} {
		if got := ViewOf(node(tc.claimed, "", ""), tc.member, places{}).Network; got != tc.want {
			t.Errorf("NETWORK %q, member %q: network %q; want %q", tc.claimed, tc.member, got, tc.want)
		}
	}
	for _, tc := range []struct {
		region, zone, member string
		want                 Locality
	}{
		{"r1", "z1", "west", Locality{"r1", "z1", "west"}},
		{"r1", "z7", "east", Locality{"r1", feed.UnknownLocality, "east"}},
		{"made-up", "z1", "made-up", Locality{feed.UnknownLocality, "", ""}},
	} {
		if got := ViewOf(node("", tc.region, tc.zone), tc.member, places{}).Locality; got != tc.want {
			t.Errorf("%s/%s of %s: locality %+v; want %+v", tc.region, tc.zone, tc.member, got, tc.want)
		}
	}
}

// TestSharedGatewayListedOnce: two members on one network share its
// gateway; a client on another network gets the gateway once (grpc-go
// NACKs an address listed twice), in the better-placed locality, weighted
// by every endpoint it stands for.
func TestSharedGatewayListedOnce(t *testing.T) {
	x := networkIndex()
	port := []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}}
	x.ReplaceCluster("east2", []*clusters.Service{
		{Namespace: "demo", Name: "echo", Network: "net-b", Ports: port, Endpoints: []clusters.Endpoint{
			{Address: "10.3.0.1", Port: 8080, ServicePort: 7070, MTLS: true},
			{Address: "10.3.0.2", Port: 8080, ServicePort: 7070, MTLS: true},
			{Address: "10.3.0.3", Port: 8080, ServicePort: 7070, MTLS: true},
		}},
	})
	g := strictGenerator(t, x)
	const echo = "outbound|7070||echo.demo.svc.cluster.local"
	_, cla := assignmentFor(t, g, echo, View{Network: "net-a", Flavour: FlavourGRPC})
	if got, want := shape(cla), "east/p0/w5: 203.0.113.10:15443×5[tls]; west/p0/w1: 10.0.0.1:8080×1[tls]"; got != want {
		t.Errorf("shared gateway:\n got %s\nwant %s", got, want)
	}
	// Two gateways each: every locality gives up its weight once.
	x.ReplaceCluster("east", []*clusters.Service{{Namespace: "demo", Name: "echo", Network: "net-b", Ports: port,
		Gateways:  []clusters.Gateway{{Address: "203.0.113.10", Port: 15443, Proxyless: true}, {Address: "203.0.113.11", Port: 15443, Proxyless: true}},
		Endpoints: []clusters.Endpoint{{Address: "10.1.0.1", Port: 8080, ServicePort: 7070, MTLS: true}, {Address: "10.1.0.2", Port: 8080, ServicePort: 7070, MTLS: true}}}})
	g.Invalidate(map[string]struct{}{"echo.demo.svc.cluster.local": {}})
	_, cla = assignmentFor(t, g, echo, View{Network: "net-a", Flavour: FlavourGRPC})
	if got, want := shape(cla), "east/p0/w5: 203.0.113.10:15443×5[tls] 203.0.113.11:15443×5[tls]; west/p0/w1: 10.0.0.1:8080×1[tls]"; got != want {
		t.Errorf("two shared gateways:\n got %s\nwant %s", got, want)
	}
	x.MemberState("east", clusters.StateStale) // east2's listing is the better one now
	g.Invalidate(map[string]struct{}{"echo.demo.svc.cluster.local": {}})
	_, cla = assignmentFor(t, g, echo, View{Network: "net-a", Flavour: FlavourGRPC})
	if got, want := shape(cla), "east2/p0/w5: 203.0.113.10:15443×5[tls] 203.0.113.11:15443×5[tls]; west/p0/w1: 10.0.0.1:8080×1[tls]"; got != want {
		t.Errorf("shared gateway, east demoted:\n got %s\nwant %s", got, want)
	}
}

// TestGatewayOfAnotherMemberOfTheNetwork: a member without a gateway of
// its own, alone in its service on its network, is reached through the
// gateway of another member of that network (istiod's network gateways).
func TestGatewayOfAnotherMemberOfTheNetwork(t *testing.T) {
	x := feed.NewIndex("cluster.local", nil)
	port := []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}}
	x.ReplaceCluster("plain", []*clusters.Service{{Namespace: "demo", Name: "echo", Network: "net-x", Ports: port,
		Endpoints: []clusters.Endpoint{{Address: "10.9.0.1", Port: 8080, ServicePort: 7070, MTLS: true}}}})
	x.ReplaceCluster("gw", []*clusters.Service{{Namespace: "demo", Name: "other", Network: "net-x", Ports: port,
		Gateways: []clusters.Gateway{{Address: "203.0.113.50", Port: 15443, Proxyless: true}}}})
	x.ReplaceCluster("client", []*clusters.Service{{Namespace: "demo", Name: "c", Network: "net-y", Ports: port}})
	g := strictGenerator(t, x)
	_, cla := assignmentFor(t, g, "outbound|7070||echo.demo.svc.cluster.local", View{Network: "net-y", Flavour: FlavourGRPC})
	if got, want := shape(cla), "plain/p0/w1: 203.0.113.50:15443×1[tls]"; got != want {
		t.Errorf("through the network's gateway:\n got %s\nwant %s", got, want)
	}
}

// strictGenerator is a Generator of x in the mesh-wide mode STRICT: its
// proxyless clients (FlavourGRPC) speak Istio mTLS to every service.
func strictGenerator(t *testing.T, x *feed.Index) *Generator {
	t.Helper()
	g := New(x)
	if err := g.SetMTLS(MTLSStrict, fakeRoots{}, "istio-system"); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestIstioEndpointMetadata: a mesh pod's endpoint carries istiod's
// istio.workload (its workload with the member appended) and tlsMode; a
// gateway standing for a member's endpoints ";;;;<member>"; an endpoint
// whose workload is not known neither; hub.cluster stays on every one.
func TestIstioEndpointMetadata(t *testing.T) {
	x := networkIndex()
	x.ReplaceCluster("west", []*clusters.Service{{Namespace: "demo", Name: "echo", Network: "net-a",
		Ports: []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}}, Endpoints: []clusters.Endpoint{
			{Address: "10.0.0.1", Port: 8080, ServicePort: 7070, MTLS: true, Workload: "echo-v1;demo;echo;v1"},
			{Address: "10.0.0.2", Port: 8080, ServicePort: 7070, MTLS: true, Workload: "echo-v2;demo;echo;v2"},
			{Address: "10.0.0.3", Port: 8080, ServicePort: 7070},
		}}})
	g := strictGenerator(t, x)
	got := map[string]string{}
	for _, network := range []string{"net-a", "net-c"} { // net-c reaches east through its gateway
		_, cla := assignmentFor(t, g, "outbound|7070||echo.demo.svc.cluster.local", View{Network: network, Flavour: FlavourGRPC})
		for _, l := range cla.Endpoints {
			for _, ep := range l.LbEndpoints {
				md := ep.GetMetadata().GetFilterMetadata()
				if md[MetadataNamespace].GetFields()["cluster"].GetStringValue() != l.Locality.SubZone {
					t.Errorf("%s lacks hub.cluster %s", ep.GetEndpoint().GetAddress().GetSocketAddress().GetAddress(), l.Locality.SubZone)
				}
				got[ep.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()] = md["istio"].GetFields()["workload"].GetStringValue() +
					" " + md[transportSocketMatch].GetFields()[tlsModeKey].GetStringValue()
			}
		}
	}
	want := map[string]string{
		"10.0.0.1":     "echo-v1;demo;echo;v1;west istio",
		"10.0.0.2":     "echo-v2;demo;echo;v2;west istio",
		"10.0.0.3":     " ",
		"203.0.113.10": ";;;;east istio",
		"10.2.0.1":     " istio", // south's mesh pod whose workload is not known
	}
	for addr, w := range want {
		if got[addr] != w {
			t.Errorf("%s: istio.workload and tlsMode %q; want %q", addr, got[addr], w)
		}
	}
}
