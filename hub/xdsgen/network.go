package xdsgen

import (
	"math"
	"slices"
	"sort"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/authz"
)

// View is what the resources a client gets depend on besides their names:
// the flavour of its Clusters and the network its endpoint assignments are
// split for.
type View struct {
	Flavour Flavour
	// Network is the client's Istio network: node metadata NETWORK, else
	// its member's network (see ViewOf). Endpoints on other networks reach
	// it through their networks' gateways (docs/architecture.md §3.9).
	Network string
	// Locality is where the client is, for the DestinationRules' locality
	// load balancing (it matters only for hosts they apply to).
	Locality Locality
	// Server is the workload behind a proxyless gRPC client, which the
	// inbound listeners it asks for as a server depend on (nil for other
	// clients: such a client asking for one gets what a workload of no
	// namespace and no labels gets). Only inbound listeners read it:
	// every other resource's key leaves it out (viewFor).
	Server *authz.Workload
	// Client is the client's member ("" when unknown): which Services it
	// gets when some are not exported to every member (feed.Visible).
	// Audience is what a resource's key holds instead (feed.Index.Audience):
	// the members whose views of its hostname the client gets, "" when
	// the hostname's views go to every member.
	Client   string
	Audience string
}

// Places is what the index knows of members, networks and localities; a
// view names only what it knows (feed.Index implements it).
type Places interface {
	MemberNetwork(member string) string
	KnownNetwork(network string) bool
	KnownMember(member string) bool
	KnownLocality(region, zone string) (string, string)
}

// ViewOf is the view of a client of member: its flavour (FlavourOf), its
// network, node metadata NETWORK (as istio-agent writes it), else its
// member's, and its locality, the node's region and zone and its member.
// A network no member is on is OtherNetwork, a region or zone no endpoint
// is in is feed.UnknownLocality, an unknown member none: every such client
// gets the same, so a client cannot make the hub build and keep a variant
// per made-up name.
func ViewOf(node *corev3.Node, member string, places Places) View {
	return viewOf(node, member, places, nil)
}

// viewOf is ViewOf keeping also the localities rules name (see
// destinationRules.knownLocality).
func viewOf(node *corev3.Node, member string, places Places, rules *destinationRules) View {
	nw := node.GetMetadata().GetFields()["NETWORK"].GetStringValue()
	if nw == "" {
		nw = places.MemberNetwork(member)
	}
	if nw != "" && !places.KnownNetwork(nw) {
		nw = OtherNetwork
	}
	if !places.KnownMember(member) {
		member = ""
	}
	region, zone := rules.knownLocality(places, node.GetLocality().GetRegion(), node.GetLocality().GetZone())
	return View{Flavour: FlavourOf(node), Network: nw, Locality: Locality{Region: region, Zone: zone, Member: member}, Client: member}
}

// OtherNetwork stands for every network no member is on (it is not a valid
// label value, so no member can be on it).
const OtherNetwork = "(other)"

// Istio's endpoint metadata that selects the transport socket of a cluster
// (tlsMode "istio": Istio mTLS), which Envoy reads from
// envoy.transport_socket_match; istiod sets it on every mTLS endpoint.
const (
	transportSocketMatch = "envoy.transport_socket_match"
	tlsModeKey           = "tlsMode"
	tlsModeIstio         = "istio"
)

// SNI is the server name a client sends through an east-west gateway for
// a service port, as istiod builds it (model.BuildDNSSrvSubsetKey): the
// gateway routes on it without terminating TLS. It is "" when longer than
// a server name may be (255 bytes; grpc-go refuses the Cluster then): such
// a service is not reached through gateways.
func SNI(host string, port int32) string {
	sni := "outbound_." + strconv.Itoa(int(port)) + "_._." + host
	if len(sni) > maxSNI {
		return ""
	}
	return sni
}

// maxSNI is the longest server name grpc-go accepts in a Cluster.
const maxSNI = 255

// split is how the endpoints of one member reach a client: directly, by
// the member's network gateways, or not at all.
type split int

const (
	splitDirect  split = iota // the client's own network, or none involved
	splitGateway              // another network: its gateways, mTLS endpoints only
	splitDropped              // another network without a gateway
)

// memberSplit decides how a client on network reaches a member's endpoints,
// as istiod's EndpointsByNetworkFilter does: an endpoint without a network
// or on the client's is direct; one on another network goes through that
// network's gateways, if the client speaks Istio mTLS (mtls: the gateway
// routes on its SNI), else it is left out; a client without a network
// reaches a network with no gateway directly (Istio's IsSameOrEmpty), and
// any network directly when it does not speak Istio mTLS (adding a gateway
// must not take endpoints away from it).
// Unlike istiod in sidecar mode, and like its ambient mode, a client on a
// network does not get endpoints of another network that has no gateway:
// they would not answer.
//
// gateways are those the client may use (usableGateways): a proxyless
// client only those that admit it.
func memberSplit(network string, mtls bool, svc *clusters.Service, gateways []clusters.Gateway) split {
	switch {
	case svc.Network == "" || svc.Network == network:
		return splitDirect
	case network == "" && !mtls:
		return splitDirect // IsSameOrEmpty; a gateway would not take it anyway
	case len(gateways) > 0 && mtls:
		return splitGateway
	case len(gateways) > 0:
		return splitDropped
	case network == "":
		return splitDirect
	}
	return splitDropped
}

// memberGateways are the gateways to a member's endpoints that a client
// may use (usableGateways): the member's own, else those of the other
// members of the service on the same network, else those of any member on
// that network (network; nil: none). A network's east-west gateway routes
// to every member's endpoints on it, as istiod takes a network's gateways
// from any of its clusters, preferring the endpoint's own.
func memberGateways(id string, members map[string]*clusters.Service, ids []string, network func(string) []clusters.Gateway, proxyless bool) []clusters.Gateway {
	svc := members[id]
	if own := usableGateways(svc.Gateways, proxyless); len(own) > 0 || svc.Network == "" {
		return own
	}
	var out []clusters.Gateway
	seen := map[clusters.Gateway]bool{}
	for _, other := range ids {
		o := members[other]
		if other == id || o.Network != svc.Network {
			continue
		}
		for _, g := range usableGateways(o.Gateways, proxyless) {
			if !seen[g] {
				seen[g] = true
				out = append(out, g)
			}
		}
	}
	if len(out) == 0 && network != nil {
		out = usableGateways(network(svc.Network), proxyless)
	}
	return out
}

// usableGateways are the gateways a client may be sent through: for a
// proxyless gRPC client only those that admit its ALPN, h2
// (clusters.AnnotationProxylessALPN): a real Istio gateway closes its
// connections otherwise, so it gets none of that network's endpoints
// rather than calls that fail (Status.ProxylessWithheld says so).
func usableGateways(gateways []clusters.Gateway, proxyless bool) []clusters.Gateway {
	if !proxyless || !slices.ContainsFunc(gateways, func(g clusters.Gateway) bool { return !g.Proxyless }) {
		return gateways
	}
	return slices.DeleteFunc(slices.Clone(gateways), func(g clusters.Gateway) bool { return !g.Proxyless })
}

// needsSplit reports whether a client on network gets a service's
// endpoints other than directly: only then is its assignment built for the
// network; every other client shares the direct one. gateways is a
// network's gateways (see memberGateways).
func needsSplit(network string, mtls, proxyless bool, members map[string]*clusters.Service, gateways func(string) []clusters.Gateway) bool {
	ids := sortedIDs(members)
	for _, id := range ids {
		if memberSplit(network, mtls, members[id], memberGateways(id, members, ids, gateways, proxyless)) != splitDirect {
			return true
		}
	}
	return false
}

func sortedIDs(members map[string]*clusters.Service) []string {
	ids := make([]string, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// assignment says for whom a ClusterLoadAssignment is built: a client's
// network when split, and which members are demoted (not healthy: served
// at a lower priority).
type assignment struct {
	split   bool
	network string
	mtls    bool // the client speaks Istio mTLS
	// proxyless: the client is proxyless gRPC (usableGateways).
	proxyless bool
	demoted   func(member string) bool
	// lb is the DestinationRule's locality load balancing of the port and
	// client the client's locality (used only when lb applies).
	lb     localityLB
	client Locality
	// gateways are a network's gateways, from every member on it (nil:
	// only the service's members' are known).
	gateways func(network string) []clusters.Gateway
}

// buildLoadAssignment groups a service port's endpoints into one locality per
// (member, region, zone). The member ID goes into the locality's sub_zone so
// that localities of different members never collide (grpc-go rejects
// duplicate localities) and locality-aware load balancing prefers the
// proxy's own member. Locality weights are the endpoint counts, so never 0.
//
// When the assignment is split for a network, a member's endpoints on
// another network are replaced, per locality, by that network's gateways,
// each weighted by the count of mTLS endpoints it stands for (plaintext
// endpoints cannot be routed by SNI and are left out), or left out when
// the network has no gateway (see memberSplit). Localities of demoted
// members go one priority behind the others, unless nothing else is left.
func buildLoadAssignment(name string, port int32, members map[string]*clusters.Service, a assignment) *endpointv3.ClusterLoadAssignment {
	groups, viaGateway := groupEndpoints(port, members, a)
	locs := make([]locality, 0, len(groups))
	for l := range groups {
		locs = append(locs, l)
	}
	sort.Slice(locs, func(i, j int) bool { return locs[i].less(locs[j]) })
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	placedLocs := make([]placed, len(locs))
	weights := make([]uint32, len(locs))
	for i, l := range locs {
		eps := groups[l]
		sort.Slice(eps, func(i, j int) bool {
			a, b := eps[i].GetEndpoint().GetAddress().GetSocketAddress(), eps[j].GetEndpoint().GetAddress().GetSocketAddress()
			if a.GetAddress() != b.GetAddress() {
				return a.GetAddress() < b.GetAddress()
			}
			return a.GetPortValue() < b.GetPortValue()
		})
		weights[i] = uint32(len(eps))
		if v, ok := viaGateway[l]; ok {
			// The member keeps the share of the endpoints the gateways
			// stand for (a member's endpoints are all direct or all not).
			weights[i], _ = v.weight()
		}
		placedLocs[i] = placed{member: l.cluster, network: members[l.cluster].Network, region: l.region, zone: l.zone}
	}
	prio, distributed := rankLocalities(placedLocs, weights, a.client, a.network, a.lb)
	demote(prio, placedLocs, a.demoted)
	for i, l := range locs {
		weight := weights[i]
		if distributed != nil {
			if weight = distributed[i]; weight == 0 {
				continue // the rule's distribute leaves it out
			}
		}
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:            &corev3.Locality{Region: l.region, Zone: l.zone, SubZone: l.cluster},
			LbEndpoints:         groups[l],
			LoadBalancingWeight: wrapperspb.UInt32(weight),
			Priority:            prio[i],
		})
	}
	cla.Endpoints = mergeDuplicates(cla.Endpoints)
	compactLocalities(cla.Endpoints) // a distribute or a merge may have left a gap
	return cla
}

// locality is one locality of an assignment: a member's region and zone.
type locality struct{ cluster, region, zone string }

func (l locality) less(o locality) bool {
	if l.cluster != o.cluster {
		return l.cluster < o.cluster
	}
	if l.region != o.region {
		return l.region < o.region
	}
	return l.zone < o.zone
}

// gatewayShare counts the mTLS endpoints of one locality that its
// network's gateways stand for.
type gatewayShare struct{ healthy, draining uint32 }

// weight is the share's weight and health: its healthy endpoints, or its
// draining ones when none is healthy.
func (g gatewayShare) weight() (uint32, corev3.HealthStatus) {
	if g.healthy == 0 {
		return g.draining, corev3.HealthStatus_DRAINING
	}
	return g.healthy, corev3.HealthStatus_HEALTHY
}

// groupEndpoints sorts the members' endpoints of port into localities:
// each direct endpoint as itself, and each locality a member's network
// reaches through its gateways as those gateways, weighted by the
// endpoints they stand for (see buildLoadAssignment).
func groupEndpoints(port int32, members map[string]*clusters.Service, a assignment) (map[locality][]*endpointv3.LbEndpoint, map[locality]*gatewayShare) {
	groups := map[locality][]*endpointv3.LbEndpoint{}
	viaGateway := map[locality]*gatewayShare{}
	ids := sortedIDs(members)
	for _, id := range ids {
		svc := members[id]
		how, gateways := splitDirect, []clusters.Gateway(nil)
		if a.split {
			gateways = memberGateways(id, members, ids, a.gateways, a.proxyless)
			how = memberSplit(a.network, a.mtls, svc, gateways)
		}
		if how == splitDropped {
			continue
		}
		meta := memberMetadata{member: id}
		for _, ep := range svc.Endpoints {
			if ep.ServicePort != port {
				continue
			}
			loc := locality{id, ep.Region, ep.Zone}
			if how == splitGateway {
				if !ep.MTLS {
					continue
				}
				g := viaGateway[loc]
				if g == nil {
					g = &gatewayShare{}
					viaGateway[loc] = g
				}
				if ep.Health == clusters.Draining {
					g.draining++
				} else {
					g.healthy++
				}
				continue
			}
			health := corev3.HealthStatus_HEALTHY
			if ep.Health == clusters.Draining {
				health = corev3.HealthStatus_DRAINING
			}
			groups[loc] = append(groups[loc], lbEndpoint(ep.Address, uint32(ep.Port), health, 1, meta.of(ep.Workload, ep.MTLS)))
		}
		for loc, g := range viaGateway {
			if loc.cluster != id {
				continue
			}
			weight, health := g.weight()
			for _, gw := range gateways {
				groups[loc] = append(groups[loc], lbEndpoint(gw.Address, uint32(gw.Port), health, weight, meta.of(gatewayWorkload, true)))
			}
		}
	}
	return groups, viaGateway
}

// compactLocalities renumbers the localities' priorities 0..N in order.
func compactLocalities(locs []*endpointv3.LocalityLbEndpoints) {
	prio := make([]uint32, len(locs))
	for i, l := range locs {
		prio[i] = l.Priority
	}
	compact(prio)
	for i, l := range locs {
		l.Priority = prio[i]
	}
}

// mergeDuplicates keeps each endpoint address once in an assignment, as
// grpc-go requires (it NACKs an address listed twice, in any localities):
// a network's gateway stands for the endpoints of every member on it, so
// their localities list it each. An address stays in the locality of the
// best priority listing it (the first such in order) with the weights of
// its other listings added; a locality that gives up listings gives up the
// same share of its weight (its listings' weight over all of theirs) to
// the localities keeping them; localities left without endpoints are
// dropped. Priorities are compacted by the caller.
func mergeDuplicates(locs []*endpointv3.LocalityLbEndpoints) []*endpointv3.LocalityLbEndpoints {
	type at struct{ loc, ep int }
	type address struct {
		ip   string
		port uint32
	}
	addr := func(ep *endpointv3.LbEndpoint) address {
		sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
		return address{sa.GetAddress(), sa.GetPortValue()}
	}
	order := make([]int, len(locs))
	n := 0
	for i := range order {
		order[i] = i
		n += len(locs[i].LbEndpoints)
	}
	sort.SliceStable(order, func(a, b int) bool { return locs[order[a]].Priority < locs[order[b]].Priority })
	first := make(map[address]at, n)
	moved := map[at]at{} // a dropped listing → the one kept
	for _, li := range order {
		for ei, ep := range locs[li].LbEndpoints {
			if f, ok := first[addr(ep)]; ok {
				moved[at{li, ei}] = f
			} else {
				first[addr(ep)] = at{li, ei}
			}
		}
	}
	if len(moved) == 0 {
		return locs
	}
	epWeight := make([]float64, len(locs)) // per locality: its listings' weights
	locWeight := make([]float64, len(locs))
	epAdd := map[at]float64{}
	for li, l := range locs {
		locWeight[li] = float64(l.GetLoadBalancingWeight().GetValue())
		for _, ep := range l.LbEndpoints {
			epWeight[li] += float64(ep.GetLoadBalancingWeight().GetValue())
		}
	}
	locAdd := make([]float64, len(locs))
	for from, to := range moved {
		w := float64(locs[from.loc].LbEndpoints[from.ep].GetLoadBalancingWeight().GetValue())
		epAdd[to] += w
		if epWeight[from.loc] > 0 {
			share := locWeight[from.loc] * w / epWeight[from.loc]
			locAdd[from.loc] -= share
			locAdd[to.loc] += share
		}
	}
	out := make([]*endpointv3.LocalityLbEndpoints, 0, len(locs))
	for li, l := range locs {
		c := &endpointv3.LocalityLbEndpoints{Locality: l.Locality, Priority: l.Priority}
		for ei, ep := range l.LbEndpoints {
			if _, gone := moved[at{li, ei}]; gone {
				continue
			}
			if add := epAdd[at{li, ei}]; add > 0 {
				ep = proto.Clone(ep).(*endpointv3.LbEndpoint)
				ep.LoadBalancingWeight = wrapperspb.UInt32(ep.GetLoadBalancingWeight().GetValue() + uint32(math.Round(add)))
			}
			c.LbEndpoints = append(c.LbEndpoints, ep)
		}
		if len(c.LbEndpoints) == 0 {
			continue
		}
		c.LoadBalancingWeight = wrapperspb.UInt32(uint32(max(1, math.Round(locWeight[li]+locAdd[li]))))
		out = append(out, c)
	}
	return out
}

// demote moves the localities of demoted members behind every other one
// (keeping their order among themselves), unless nothing else is left:
// priorities start at 0.
func demote(prio []uint32, locs []placed, demoted func(string) bool) {
	if demoted == nil {
		return
	}
	var healthy, bad bool
	var top uint32
	for i, l := range locs {
		if demoted(l.member) {
			bad = true
		} else {
			healthy = true
		}
		top = max(top, prio[i])
	}
	if !healthy || !bad {
		return
	}
	for i, l := range locs {
		if demoted(l.member) {
			prio[i] += top + 1
		}
	}
	compact(prio)
}

// endpointMetadata is the metadata of a member's endpoints of one workload
// (clusters.Endpoint.Workload): hub.cluster; Istio's istio.workload
// "<workload>;<namespace>;<canonical-name>;<canonical-revision>;<member>"
// when the workload is known, which Istio's telemetry reads (the member is
// its cluster ID, as istiod's is the cluster's); and for endpoints that
// accept Istio mTLS Envoy's transport socket match tlsMode: istio, as
// istiod's endpoint builder sets them (util.AppendLbEndpointMetadata).
func endpointMetadata(member, workload string, mtls bool) *corev3.Metadata {
	m := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		MetadataNamespace: {Fields: map[string]*structpb.Value{"cluster": structpb.NewStringValue(member)}},
	}}
	if mtls {
		m.FilterMetadata[transportSocketMatch] = &structpb.Struct{Fields: map[string]*structpb.Value{
			tlsModeKey: structpb.NewStringValue(tlsModeIstio),
		}}
	}
	if workload != "" {
		m.FilterMetadata[istioMetadata] = &structpb.Struct{Fields: map[string]*structpb.Value{
			istioWorkloadKey: structpb.NewStringValue(workload + ";" + member),
		}}
	}
	return m
}

// Istio's endpoint metadata for telemetry: istio.workload.
const (
	istioMetadata    = "istio"
	istioWorkloadKey = "workload"
)

// gatewayWorkload is the workload of a network gateway's endpoint standing
// for a member's endpoints: none known, as istiod sends it (";;;;<cluster>").
const gatewayWorkload = ";;;"

// memberMetadata makes the metadata of one member's endpoints, shared by
// the endpoints of each workload.
type memberMetadata struct {
	member string
	byKey  map[metadataKey]*corev3.Metadata
}

type metadataKey struct {
	workload string
	mtls     bool
}

func (m *memberMetadata) of(workload string, mtls bool) *corev3.Metadata {
	k := metadataKey{workload, mtls}
	if md, ok := m.byKey[k]; ok {
		return md
	}
	if m.byKey == nil {
		m.byKey = map[metadataKey]*corev3.Metadata{}
	}
	md := endpointMetadata(m.member, workload, mtls)
	m.byKey[k] = md
	return md
}

func lbEndpoint(addr string, port uint32, health corev3.HealthStatus, weight uint32, meta *corev3.Metadata) *endpointv3.LbEndpoint {
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address:       addr,
				PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
			}}},
		}},
		HealthStatus:        health,
		Metadata:            meta,
		LoadBalancingWeight: wrapperspb.UInt32(weight),
	}
}
