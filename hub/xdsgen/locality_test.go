package xdsgen

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	typev1beta1 "istio.io/api/type/v1beta1"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub/feed"
)

// Localities of the ranking tests: two members in r1/z1, one in r1/z2,
// one in r2/z9 on another network.
var rankLocs = []placed{
	{member: "west", network: "net-a", region: "r1", zone: "z1"},
	{member: "east", network: "net-a", region: "r1", zone: "z1"},
	{member: "north", network: "net-a", region: "r1", zone: "z2"},
	{member: "far", network: "net-b", region: "r2", zone: "z9"},
}

// TestRankLocalitiesAsIstiod: each case is what istiod's
// ApplyLocalityLoadBalancer gives a proxy (loadbalancer_test.go's cases,
// read with the hub's sub-zone being the member).
func TestRankLocalitiesAsIstiod(t *testing.T) {
	outlier := &networking.OutlierDetection{Consecutive_5XxErrors: wrapperspb.UInt32(1)}
	west := Locality{Region: "r1", Zone: "z1", Member: "west"}
	base := []uint32{2, 1, 1, 4}
	for _, tc := range []struct {
		name        string
		lb          localityLB
		client      Locality
		network     string
		wantPrio    []uint32
		wantWeights []uint32
	}{
		{name: "no outlier detection: no priorities", lb: localityLB{setting: &networking.LocalityLoadBalancerSetting{}},
			client: west, wantPrio: []uint32{0, 0, 0, 0}},
		{name: "disabled", lb: localityLB{outlier: outlier}, client: west, wantPrio: []uint32{0, 0, 0, 0}},
		{name: "default failover: member, zone, region, elsewhere", lb: localityLB{setting: &networking.LocalityLoadBalancerSetting{}, outlier: outlier},
			client: west, wantPrio: []uint32{0, 1, 2, 3}},
		{name: "a client of no member shares only zones", lb: localityLB{setting: &networking.LocalityLoadBalancerSetting{}, outlier: outlier},
			client: Locality{Region: "r1", Zone: "z1"}, wantPrio: []uint32{0, 0, 1, 2}},
		{name: "failover to a region not named goes last", lb: localityLB{setting: &networking.LocalityLoadBalancerSetting{
			Failover: []*networking.LocalityLoadBalancerSetting_Failover{{From: "r2", To: "r3"}}}, outlier: outlier},
			client: Locality{Region: "r2", Zone: "z1", Member: "far"}, wantPrio: []uint32{1, 1, 1, 0}},
		{name: "failoverPriority network, cluster", lb: localityLB{setting: &networking.LocalityLoadBalancerSetting{
			FailoverPriority: []string{labelNetwork, labelCluster}}, outlier: outlier},
			client: west, network: "net-a", wantPrio: []uint32{0, 1, 1, 2}},
		{name: "failoverPriority region, zone, cluster", lb: localityLB{setting: &networking.LocalityLoadBalancerSetting{
			FailoverPriority: []string{labelRegion, labelZone, labelCluster}}, outlier: outlier},
			client: west, network: "net-a", wantPrio: []uint32{0, 1, 2, 3}},
		{name: "failoverPriority with an override and an unknown label", lb: localityLB{setting: &networking.LocalityLoadBalancerSetting{
			FailoverPriority: []string{"app.example/tier", labelCluster + "=east"}}, outlier: outlier},
			client: west, network: "net-a", wantPrio: []uint32{1, 0, 1, 1}},
		{name: "failoverPriority then failover", lb: localityLB{setting: &networking.LocalityLoadBalancerSetting{
			FailoverPriority: []string{labelNetwork}, Failover: []*networking.LocalityLoadBalancerSetting_Failover{{From: "r1", To: "r2"}}}, outlier: outlier},
			client: west, network: "net-a", wantPrio: []uint32{0, 1, 2, 3}},
		{name: "distribute", lb: localityLB{setting: &networking.LocalityLoadBalancerSetting{
			Distribute: []*networking.LocalityLoadBalancerSetting_Distribute{
				{From: "r2/*", To: map[string]uint32{"r2/*": 100}},
				{From: "r1/z1/*", To: map[string]uint32{"r1/z1/west": 70, "r1/*": 30}},
			}}},
			client: west, wantPrio: []uint32{0, 0, 0, 0}, wantWeights: []uint32{70, 15, 15, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prio, weights := rankLocalities(rankLocs, base, tc.client, tc.network, tc.lb)
			if !slices.Equal(prio, tc.wantPrio) || !slices.Equal(weights, tc.wantWeights) {
				t.Errorf("priorities %v weights %v; want %v %v", prio, weights, tc.wantPrio, tc.wantWeights)
			}
		})
	}
}

// TestDemotionComposesWithFailover: a demoted member goes behind every
// healthy locality, keeping the order among the demoted.
func TestDemotionComposesWithFailover(t *testing.T) {
	prio := []uint32{0, 1, 2, 3}
	demote(prio, rankLocs, func(m string) bool { return m == "west" || m == "north" })
	if want := []uint32{2, 0, 3, 1}; !slices.Equal(prio, want) {
		t.Errorf("priorities %v; want %v", prio, want)
	}
	all := []uint32{0, 1, 2, 3}
	demote(all, rankLocs, func(string) bool { return true })
	if want := []uint32{0, 1, 2, 3}; !slices.Equal(all, want) {
		t.Errorf("all demoted: priorities %v; want %v (never behind nothing)", all, want)
	}
}

// localityIndex holds echo.demo in west and east (r1/z1) and north (r1/z2).
func localityIndex() *feed.Index {
	x := feed.NewIndex("cluster.local", nil)
	port := []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}}
	for i, m := range []struct{ id, zone string }{{"west", "z1"}, {"east", "z1"}, {"north", "z2"}} {
		x.ReplaceCluster(m.id, []*clusters.Service{{Namespace: "demo", Name: "echo", Ports: port, Endpoints: []clusters.Endpoint{
			{Address: fmt.Sprintf("10.0.%d.1", i), Port: 8080, ServicePort: 7070, Region: "r1", Zone: m.zone},
		}}})
	}
	return x
}

func drObject(ns, name, host string, tp *networking.TrafficPolicy, age time.Duration) distribute.Object {
	return distribute.Object{Kind: DestinationRuleKind, Namespace: ns, Name: name, Version: name + "-1",
		CreationTimestamp: time.Unix(1e9, 0).Add(-age), Spec: &networking.DestinationRule{Host: host, TrafficPolicy: tp}}
}

// TestDestinationRulesRankForTheClient: with a DestinationRule's outlier
// detection, each member's clients get their own member first (its own
// variant), the Cluster carries outlier detection and locality-weighted
// load balancing; a host without a rule is the one shared assignment;
// the rule's removal reports the host changed.
func TestDestinationRulesRankForTheClient(t *testing.T) {
	x := localityIndex()
	g := New(x)
	const echo = "outbound|7070||echo.demo.svc.cluster.local"
	viewOf := func(member string) View {
		return ViewOf(nodeAt("r1", "z1"), member, x)
	}
	_, before := assignmentFor(t, g, echo, viewOf("west"))
	if got, want := shape(before), "east/p0/w1: 10.0.1.1:8080×1; north/p0/w1: 10.0.2.1:8080×1; west/p0/w1: 10.0.0.1:8080×1"; got != want {
		t.Fatalf("without a rule:\n got %s\nwant %s", got, want)
	}
	tp := &networking.TrafficPolicy{
		OutlierDetection: &networking.OutlierDetection{Consecutive_5XxErrors: wrapperspb.UInt32(3), Interval: durationpb.New(time.Second)},
		LoadBalancer: &networking.LoadBalancerSettings{LocalityLbSetting: &networking.LocalityLoadBalancerSetting{
			FailoverPriority: []string{labelCluster, labelZone}}},
	}
	changed, refused := g.SetDestinationRules([]distribute.Object{
		drObject("istio-system", "echo", "echo.demo.svc.cluster.local", tp, time.Hour),
		drObject("istio-system", "younger", "echo.demo.svc.cluster.local", nil, 0), // the older rule wins
		drObject("istio-system", "other", "*.other.svc.cluster.local", tp, 0),
	})
	if !slices.Equal(changed, []string{"echo.demo.svc.cluster.local"}) || len(refused) != 0 {
		t.Fatalf("changed = %v, refused %v", changed, refused)
	}
	g.Invalidate(map[string]struct{}{"echo.demo.svc.cluster.local": {}})
	for member, want := range map[string]string{
		"west":  "east/p1/w1: 10.0.1.1:8080×1; north/p1/w1: 10.0.2.1:8080×1; west/p0/w1: 10.0.0.1:8080×1",
		"east":  "east/p0/w1: 10.0.1.1:8080×1; north/p1/w1: 10.0.2.1:8080×1; west/p1/w1: 10.0.0.1:8080×1",
		"north": "east/p1/w1: 10.0.1.1:8080×1; north/p0/w1: 10.0.2.1:8080×1; west/p1/w1: 10.0.0.1:8080×1",
	} {
		if _, cla := assignmentFor(t, g, echo, viewOf(member)); shape(cla) != want {
			t.Errorf("client of %s:\n got %s\nwant %s", member, shape(cla), want)
		}
	}
	// The cluster label comes first: a client's own member, then every
	// other (the zone ranks only within a member). North's clients, in
	// zone z1, rank north first; a Stale west goes behind everything.
	x.MemberState("west", clusters.StateStale)
	g.Invalidate(map[string]struct{}{"echo.demo.svc.cluster.local": {}})
	_, cla := assignmentFor(t, g, echo, viewOf("north"))
	if got, want := shape(cla), "east/p1/w1: 10.0.1.1:8080×1; north/p0/w1: 10.0.2.1:8080×1; west/p2/w1: 10.0.0.1:8080×1"; got != want {
		t.Errorf("west Stale, client of north:\n got %s\nwant %s", got, want)
	}
	x.MemberState("west", clusters.StateReady)

	res, err := g.Resources(resourcev3.ClusterType, []string{echo}, viewOf("west"))
	if err != nil || len(res) != 1 {
		t.Fatal(res, err)
	}
	c := unpack(t, res[0], &clusterv3.Cluster{})
	if c.GetCommonLbConfig().GetLocalityWeightedLbConfig() == nil || c.GetOutlierDetection().GetConsecutive_5Xx().GetValue() != 3 ||
		c.GetOutlierDetection().GetEnforcingConsecutive_5Xx().GetValue() != 100 || c.GetOutlierDetection().GetInterval().AsDuration() != time.Second {
		t.Errorf("Cluster: lb config %v, outlier detection %v", c.GetCommonLbConfig(), c.GetOutlierDetection())
	}
	if err := c.ValidateAll(); err != nil {
		t.Error(err)
	}

	if changed, _ := g.SetDestinationRules(nil); !slices.Equal(changed, []string{"echo.demo.svc.cluster.local"}) {
		t.Errorf("removing the rules changed %v", changed)
	}
	g.Invalidate(map[string]struct{}{"echo.demo.svc.cluster.local": {}})
	a, _ := assignmentFor(t, g, echo, viewOf("west"))
	b, _ := assignmentFor(t, g, echo, viewOf("east"))
	if a != b {
		t.Error("without a rule the members' clients do not share one assignment")
	}
}

// TestDestinationRuleSelection: exact host over wildcard, short names in
// the rule's namespace, disabled locality load balancing, port-level
// settings, and rules with a workload selector ignored.
func TestDestinationRuleSelection(t *testing.T) {
	outlier := &networking.OutlierDetection{Consecutive_5XxErrors: wrapperspb.UInt32(1)}
	on := &networking.TrafficPolicy{OutlierDetection: outlier}
	off := &networking.TrafficPolicy{OutlierDetection: outlier, LoadBalancer: &networking.LoadBalancerSettings{
		LocalityLbSetting: &networking.LocalityLoadBalancerSetting{Enabled: wrapperspb.Bool(false)}}}
	selected := drObject("demo", "selected", "api.demo.svc.cluster.local", on, 0)
	selected.Spec.(*networking.DestinationRule).WorkloadSelector = &typev1beta1.WorkloadSelector{}
	rules := newDestinationRules([]distribute.Object{
		drObject("demo", "short", "echo", on, 0),
		drObject("demo", "wide", "*.svc.cluster.local", off, 0),
		drObject("demo", "narrow", "*.demo.svc.cluster.local", on, 0),
		selected,
	}, "cluster.local")
	for host, want := range map[string]string{
		"echo.demo.svc.cluster.local": "demo/short@short-1",
		"api.demo.svc.cluster.local":  "demo/narrow@narrow-1",
		"api.prod.svc.cluster.local":  "demo/wide@wide-1",
	} {
		if r, _ := rules.lookup(host); r.id != want {
			t.Errorf("%s: rule %q; want %q", host, r.id, want)
		}
	}
	if r, _ := rules.lookup("api.prod.svc.cluster.local"); localityLBOf(r.spec, 80).applies() {
		t.Error("enabled: false still applies")
	}
	portLevel := &networking.DestinationRule{TrafficPolicy: &networking.TrafficPolicy{
		PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{{
			Port: &networking.PortSelector{Number: 7070}, OutlierDetection: outlier}}}}
	if !localityLBOf(portLevel, 7070).applies() || localityLBOf(portLevel, 8080).applies() {
		t.Error("port-level outlier detection: want failover on 7070 only")
	}
}

func nodeAt(region, zone string) *corev3.Node {
	return &corev3.Node{Locality: &corev3.Locality{Region: region, Zone: zone}}
}

// TestLocalityReviewCases: port-level settings replace the rule's whole
// policy; values Istio refuses make the rule count as absent; a
// distribute that keeps only a demoted member leaves it at priority 0; a
// client in a region no endpoint is in keeps it when a rule names it as a
// failover source.
func TestLocalityReviewCases(t *testing.T) {
	outlier := &networking.OutlierDetection{Consecutive_5XxErrors: wrapperspb.UInt32(1)}
	noInherit := &networking.DestinationRule{TrafficPolicy: &networking.TrafficPolicy{OutlierDetection: outlier,
		PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{{
			Port: &networking.PortSelector{Number: 7070}, ConnectionPool: &networking.ConnectionPoolSettings{}}}}}
	if localityLBOf(noInherit, 7070).applies() || !localityLBOf(noInherit, 8080).applies() {
		t.Error("a port-level entry without outlier detection inherits the rule's")
	}
	bad := &networking.DestinationRule{TrafficPolicy: &networking.TrafficPolicy{
		OutlierDetection: &networking.OutlierDetection{Interval: durationpb.New(-time.Second)}}}
	if localityLBOf(bad, 80).applies() {
		t.Error("an invalid interval applies")
	}
	badDistribute := &networking.DestinationRule{TrafficPolicy: &networking.TrafficPolicy{LoadBalancer: &networking.LoadBalancerSettings{
		LocalityLbSetting: &networking.LocalityLoadBalancerSetting{Distribute: []*networking.LocalityLoadBalancerSetting_Distribute{
			{From: "r1/*", To: map[string]uint32{"r1/*": 60}}}}}}}
	if localityLBOf(badDistribute, 80).applies() {
		t.Error("a distribute summing to 60 applies")
	}
	_, refused := New(localityIndex()).SetDestinationRules([]distribute.Object{
		{Namespace: "istio-system", Name: "bad", Spec: bad}, {Namespace: "istio-system", Name: "bad-distribute", Spec: badDistribute}})
	if len(refused) != 2 || refused[0].Rule != "istio-system/bad" || !strings.Contains(refused[1].Reason, "summing to 100") {
		t.Errorf("refused %+v", refused)
	}

	x := localityIndex()
	g := New(x)
	const echo = "outbound|7070||echo.demo.svc.cluster.local"
	toWest := &networking.TrafficPolicy{LoadBalancer: &networking.LoadBalancerSettings{LocalityLbSetting: &networking.LocalityLoadBalancerSetting{
		Distribute: []*networking.LocalityLoadBalancerSetting_Distribute{{From: "*", To: map[string]uint32{"r1/z1/west": 100}}},
		Failover:   []*networking.LocalityLoadBalancerSetting_Failover{{From: "r3", To: "r1"}},
	}}}
	g.SetDestinationRules([]distribute.Object{drObject("istio-system", "to-west", "echo.demo.svc.cluster.local", toWest, 0)})
	x.MemberState("west", clusters.StateStale)
	_, cla := assignmentFor(t, g, echo, g.ViewOf(nodeAt("r1", "z1"), "east"))
	if got, want := shape(cla), "west/p0/w100: 10.0.0.1:8080×1"; got != want {
		t.Errorf("distribute to a demoted member alone:\n got %s\nwant %s", got, want)
	}
	if v := g.ViewOf(nodeAt("r3", "z9"), "east"); v.Locality.Region != "r3" {
		t.Errorf("a client in r3, which a rule names: view %+v", v.Locality)
	}
	if v := g.ViewOf(nodeAt("r4", "z9"), "east"); v.Locality.Region != feed.UnknownLocality {
		t.Errorf("a client in r4: view %+v", v.Locality)
	}
}
