package main

import (
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// The messages below have the shape of the hub's (hub/xdsgen/generate.go).

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var ads = &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}

func edsCluster(t *testing.T, name, service string) []byte {
	return marshal(t, &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads, ServiceName: service},
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
	})
}

func cla(t *testing.T, name string) []byte {
	return marshal(t, &endpointv3.ClusterLoadAssignment{ClusterName: name})
}

func apiListener(t *testing.T, name, route string) []byte {
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{ConfigSource: ads, RouteConfigName: route}}})
	if err != nil {
		t.Fatal(err)
	}
	return marshal(t, &listenerv3.Listener{Name: name, ApiListener: &listenerv3.ApiListener{ApiListener: hcm}})
}

func routeConfig(t *testing.T, name string, vhosts map[string][]string) []byte {
	rc := &routev3.RouteConfiguration{Name: name}
	for cluster, domains := range vhosts {
		rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{Name: cluster, Domains: domains, Routes: []*routev3.Route{{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}},
		}}})
	}
	return marshal(t, rc)
}

func TestEDSServiceName(t *testing.T) {
	if got := edsServiceName(edsCluster(t, "outbound|80||a", "outbound|80||a")); got != "outbound|80||a" {
		t.Errorf("EDS cluster with its own service name: %q", got)
	}
	if got := edsServiceName(edsCluster(t, "c", "eds-name")); got != "eds-name" {
		t.Errorf("EDS cluster with another service name: %q", got)
	}
	if got := edsServiceName(edsCluster(t, "c", "")); got != "c" {
		t.Errorf("EDS cluster without a service name: %q, want its name", got)
	}
	static := marshal(t, &clusterv3.Cluster{Name: "s", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}})
	if got := edsServiceName(static); got != "" {
		t.Errorf("STATIC cluster: %q, want none", got)
	}
}

// expectChanges checks the subscription changes a client asks for now.
func expectChanges(t *testing.T, c *client, want map[string][]string) {
	t.Helper()
	got := map[string][]string{}
	var order []string
	for _, ch := range c.changes() {
		order = append(order, ch.typeURL)
		if ch.sub.wildcard {
			got[ch.typeURL] = []string{"*"}
		} else {
			got[ch.typeURL] = ch.sub.names
		}
	}
	if len(got) != len(want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
	for typeURL, names := range want {
		if !slices.Equal(got[typeURL], names) {
			t.Fatalf("changes %v, want %v", got, want)
		}
	}
	if !slices.IsSortedFunc(order, func(a, b string) int {
		return slices.Index(subscriptionOrder, a) - slices.Index(subscriptionOrder, b)
	}) {
		t.Errorf("changes in order %v, want LDS, RDS, CDS, EDS order", order)
	}
}

func TestEnvoyShape(t *testing.T) {
	a, b, k := "outbound|80||a", "outbound|80||b", "outbound|443||kubernetes.default.svc.cluster.local"
	bench := map[string]bool{a: true, b: true, "outbound|80||c": true}
	c := newClient(shapeEnvoy, false, nil, bench, bench)
	// CDS wildcard alone until CDS answers.
	expectChanges(t, c, map[string][]string{resourcev3.ClusterType: {"*"}})
	expectChanges(t, c, nil)
	if err := c.applySotW(resourcev3.ClusterType, [][]byte{edsCluster(t, a, a), edsCluster(t, b, b), edsCluster(t, k, k)}); err != nil {
		t.Fatal(err)
	}
	// EDS for every EDS cluster CDS returned, the non-benchmark one too.
	expectChanges(t, c, map[string][]string{resourcev3.EndpointType: {k, a, b}}) // sorted
	if c.cdsHeld != 2 {
		t.Errorf("%d benchmark clusters held, want 2", c.cdsHeld)
	}
	if err := c.applySotW(resourcev3.EndpointType, [][]byte{cla(t, a), cla(t, b)}); err != nil {
		t.Fatal(err)
	}
	// An incremental EDS response (only a) keeps b.
	if err := c.applySotW(resourcev3.EndpointType, [][]byte{cla(t, a)}); err != nil {
		t.Fatal(err)
	}
	if c.edsHeld != 2 {
		t.Errorf("%d EDS resources held after an incremental response, want 2", c.edsHeld)
	}
	// CDS changes: c appears, b goes. EDS follows, b's assignment is dropped.
	cc := "outbound|80||c"
	if err := c.applySotW(resourcev3.ClusterType, [][]byte{edsCluster(t, a, a), edsCluster(t, cc, cc), edsCluster(t, k, k)}); err != nil {
		t.Fatal(err)
	}
	changes := c.changes()
	if len(changes) != 1 || changes[0].typeURL != resourcev3.EndpointType ||
		!slices.Equal(changes[0].added, []string{cc}) || !slices.Equal(changes[0].removed, []string{b}) || changes[0].first {
		t.Fatalf("after the CDS change: %+v, want EDS +%s -%s", changes, cc, b)
	}
	if _, ok := c.held[resourcev3.EndpointType][b]; ok || c.edsHeld != 1 {
		t.Errorf("EDS of %s still held (%d held) after unsubscribing it", b, c.edsHeld)
	}
}

func TestGRPCShape(t *testing.T) {
	host := "svc-00001.bench.svc.cluster.local"
	lis := host + ":80"
	cluster := "outbound|80||" + host
	c := newClient(shapeGRPC, true, []string{lis}, map[string]bool{cluster: true}, map[string]bool{cluster: true})
	expectChanges(t, c, map[string][]string{resourcev3.ListenerType: {lis}})
	// A listener nobody asked for is ignored.
	if err := c.applySotW(resourcev3.ListenerType, [][]byte{apiListener(t, lis, lis), apiListener(t, "other:80", "other:80")}); err != nil {
		t.Fatal(err)
	}
	expectChanges(t, c, map[string][]string{resourcev3.RouteType: {lis}})
	if err := c.applySotW(resourcev3.RouteType, [][]byte{routeConfig(t, lis, map[string][]string{
		cluster: {host, lis}, "wrong": {"*"},
	})}); err != nil {
		t.Fatal(err)
	}
	expectChanges(t, c, map[string][]string{resourcev3.ClusterType: {cluster}})
	if err := c.applySotW(resourcev3.ClusterType, [][]byte{edsCluster(t, cluster, cluster)}); err != nil {
		t.Fatal(err)
	}
	expectChanges(t, c, map[string][]string{resourcev3.EndpointType: {cluster}})
	if err := c.applySotW(resourcev3.EndpointType, [][]byte{cla(t, cluster)}); err != nil {
		t.Fatal(err)
	}
	expectChanges(t, c, nil)
	if c.edsHeld != 1 || c.cdsHeld != 1 {
		t.Errorf("holds %d EDS and %d CDS resources, want 1 and 1", c.edsHeld, c.cdsHeld)
	}
	// Delta: the same resource version again is a resend.
	if resend, err := c.put(resourcev3.EndpointType, cluster, "v1", cla(t, cluster)); err != nil || resend {
		t.Fatalf("first put: resend %v, %v", resend, err)
	}
	if resend, _ := c.put(resourcev3.EndpointType, cluster, "v1", cla(t, cluster)); !resend {
		t.Error("the same version twice is not counted as a resend")
	}
}

func TestBestVirtualHost(t *testing.T) {
	vhs := []vhost{
		{domains: []string{"*"}, clusters: []string{"any"}},
		{domains: []string{"a.example.com:80"}, clusters: []string{"exact"}},
		{domains: []string{"*.example.com:80"}, clusters: []string{"suffix"}},
		{domains: []string{"b.*"}, clusters: []string{"prefix"}},
	}
	for authority, want := range map[string]string{
		"a.example.com:80": "exact", "c.example.com:80": "suffix", "b.other:80": "prefix", "z:1": "any",
	} {
		if got := bestVirtualHost(authority, vhs); got == nil || got.clusters[0] != want {
			t.Errorf("%s: %v, want %s", authority, got, want)
		}
	}
	if got := bestVirtualHost("x", vhs[1:2]); got != nil {
		t.Errorf("no match: %v", got)
	}
}

func TestValidateShapes(t *testing.T) {
	for _, tc := range []struct {
		shape    string
		per      int
		cds      string
		wantErr  bool
		shapeOut string
		perOut   int
		cdsOut   string
	}{
		{"", 0, "", false, shapeNamed, 50, cdsWildcard},
		{shapeNamed, 0, cdsNamed, false, shapeNamed, 50, cdsNamed},
		{"", allServices, "", false, shapeEnvoy, 0, cdsWildcard},
		{shapeEnvoy, 0, "", false, shapeEnvoy, 0, cdsWildcard},
		{shapeGRPC, 0, "", false, shapeGRPC, 1, cdsNamed},
		{shapeGRPC, 3, "", false, shapeGRPC, 3, cdsNamed},
		{shapeEnvoy, 5, "", true, "", 0, ""},
		{shapeEnvoy, 0, cdsNamed, true, "", 0, ""},
		{shapeGRPC, 0, cdsWildcard, true, "", 0, ""},
		{shapeGRPC, allServices, "", true, "", 0, ""},
		{"istio", 0, "", true, "", 0, ""},
	} {
		cfg := defaultConfig()
		cfg.Shape, cfg.ServicesPerStream, cfg.CDS = tc.shape, tc.per, tc.cds
		err := cfg.validate()
		if tc.wantErr {
			if err == nil {
				t.Errorf("%+v: no error", tc)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", tc, err)
			continue
		}
		if cfg.Shape != tc.shapeOut || cfg.ServicesPerStream != tc.perOut || cfg.CDS != tc.cdsOut {
			t.Errorf("%+v: got shape %s, %d per stream, CDS %s", tc, cfg.Shape, cfg.ServicesPerStream, cfg.CDS)
		}
	}
}

func TestValidateBulk(t *testing.T) {
	for _, tc := range []struct {
		shape   string
		bulk    int
		writers int
		wantErr bool
	}{
		{shapeEnvoy, 0, 8, false},
		{shapeNamed, 0, 0, false}, // no bulk phase: the writers do not matter
		{shapeEnvoy, 5, 2, false},
		{shapeEnvoy, -1, 8, true},
		{shapeEnvoy, 5, 0, true},
		{shapeNamed, 5, 2, true},
		{shapeGRPC, 5, 2, true},
		{shapeEnvoy, maxAddresses, 8, true},
	} {
		cfg := defaultConfig()
		cfg.Shape, cfg.Bulk, cfg.BulkWriters = tc.shape, tc.bulk, tc.writers
		if err := cfg.validate(); (err != nil) != tc.wantErr {
			t.Errorf("%+v: error %v", tc, err)
		}
	}
}

func TestBulkLayout(t *testing.T) {
	cfg := defaultConfig()
	cfg.Members, cfg.Services, cfg.Endpoints, cfg.Streams, cfg.Writes, cfg.Bulk = 3, 4, 40, 2, 3, 5
	cfg.Shape = shapeEnvoy
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	l := newLayout(cfg)
	if len(l.bulk) != 5 {
		t.Fatalf("%d bulk services, want 5", len(l.bulk))
	}
	seen := map[string]bool{}
	for _, s := range l.services {
		for _, b := range s.backend {
			for _, e := range b {
				seen[e.IP] = true
			}
		}
	}
	for w := range cfg.Writes {
		seen[address(cfg.Endpoints+w)] = true
	}
	for i, s := range l.bulk {
		if s.endpoints() != 10 || len(s.members) != 2 || s.members[0] == s.members[1] {
			t.Errorf("bulk service %d: %d endpoints in members %v, want 10 in 2 distinct", i, s.endpoints(), s.members)
		}
		for _, b := range s.backend {
			for _, e := range b {
				if seen[e.IP] {
					t.Errorf("bulk service %d reuses address %s", i, e.IP)
				}
				seen[e.IP] = true
			}
		}
	}
}

// claEndpoints counts what a full decode counts, also with metadata and
// several localities, and never panics on a truncated assignment.
func TestCLAEndpoints(t *testing.T) {
	ep := func(addr string) *endpointv3.LbEndpoint {
		return &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: addr}}},
			}},
			Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": {Fields: map[string]*structpb.Value{"workload": structpb.NewStringValue("w")}}}},
		}
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: "outbound|80||a.b.svc", Endpoints: []*endpointv3.LocalityLbEndpoints{
		{Locality: &corev3.Locality{Region: "r1"}, LbEndpoints: []*endpointv3.LbEndpoint{ep("10.0.0.1"), ep("10.0.0.2"), ep("10.0.0.3")}},
		{Locality: &corev3.Locality{Region: "r2"}, LbEndpoints: []*endpointv3.LbEndpoint{ep("10.0.1.1"), ep("10.0.1.2")}},
		{Locality: &corev3.Locality{Region: "r3"}},
	}}
	b, err := proto.Marshal(cla)
	if err != nil {
		t.Fatal(err)
	}
	if got := claEndpoints(b); got != 5 {
		t.Fatalf("claEndpoints = %d; want 5", got)
	}
	for i := range b {
		claEndpoints(b[:i]) // must not panic
	}
}
