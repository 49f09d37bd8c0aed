// Package xdsgen builds the hub's Envoy resources from the federated
// Index (hub/feed): Clusters, endpoint assignments, Listeners and Routes
// of every federated service port, in the flavour each kind of client gets
// (proxyless gRPC clients under mTLS STRICT get Clusters with an
// UpstreamTlsContext), and the inbound Listeners of proxyless gRPC
// servers. Its one job is building them and caching them, marshalled once
// and shared, until their hostnames change. It knows nothing of streams:
// the hub's responder (hub/respond.go) asks it for resources by type, name
// and flavour, and the watcher tells it what changed.
package xdsgen

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/golang-lru/v2/simplelru"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub/authz"
	"github.com/hubmesh/hub/hub/feed"
)

// MetadataNamespace is the filter-metadata namespace of every LbEndpoint; its
// "cluster" field is the member cluster ID (docs/architecture.md §3.4: hub.cluster).
const MetadataNamespace = "hub"

// Resource is one generated, marshalled xDS resource. It is immutable and
// shared by every stream that receives it (marshal once, send many).
type Resource struct {
	Name    string
	Version string
	Any     *anypb.Any
	// Kept marks a resource the hub could not build right now for a
	// transient reason: the stream keeps the version it has (nothing is
	// sent, nothing is removed) until the hub can build it again.
	Kept bool
}

// generatedHostnames bounds the Generator's cache: the resources of this
// many most recently used hostnames stay marshalled.
const generatedHostnames = 20000

// Generator builds CDS/EDS/LDS/RDS resources from the Index and memoises
// them per hostname, in an LRU, until that hostname changes. Versions are
// content hashes, so a resource rebuilt after eviction is not resent.
type Generator struct {
	index *feed.Index
	// meshDefault is the mesh-wide mTLS mode where no PeerAuthentication
	// sets one, rootNamespace Istio's root namespace, and trustDomain
	// ours, whose identities proxyless clients accept (see peerSANs); all
	// are fixed for the Generator's life (SetMTLS).
	meshDefault   MTLSMode
	rootNamespace string
	trustDomain   string
	// keepUnhealthyFirst turns off the demotion of members that are not
	// healthy (see SetDemoteUnhealthy); fixed for the Generator's life.
	keepUnhealthyFirst bool

	mu sync.Mutex
	// rules are the DestinationRules read (SetDestinationRules).
	rules *destinationRules
	// security is the AuthorizationPolicies and PeerAuthentications read
	// (SetSecurity); securityPending says they are awaited (see
	// AwaitSecurity): no inbound listener is built until they come.
	security        *authz.Set
	securityPending bool
	cache           *simplelru.LRU[string, map[resourceKey]*Resource] // hostname → resource (only existing ones)
	// wildcard memoises every resource of a type (what wildcard
	// subscriptions get) with its set version. A change marks the
	// hostnames it touched in each set; the next ask checks only those
	// hostnames' resources and keeps the set when they are as it has them
	// (an endpoint change leaves every Cluster as it is). allGen counts
	// invalidations so a set built or checked before one is not stored.
	wildcard map[WildcardSetKey]WildcardSet
	allGen   uint64
	// inbound memoises proxyless gRPC servers' inbound listeners by name
	// and the key of the policies that select the server (see
	// authz.Selection.Key); cleared when it holds maxInbound, since the
	// names are the clients' words, and when the policies change.
	inbound map[inboundKey]*Resource
	// gens stamps each hostname's last invalidation (from the counter
	// stamp), so that a resource built from the index before an
	// invalidation is never stored after it. Hostnames come and go: when
	// gens grows past maxGens it is cleared and genFloor (the newest stamp
	// then) stands in for every hostname it no longer lists, which only
	// makes builds that were under way then skip the cache.
	gens     map[string]uint64
	stamp    uint64
	genFloor uint64
}

// WildcardSetKey names a wildcard set: a type in one view (as viewFor
// narrows it for the type).
type WildcardSetKey struct {
	TypeURL string
	View    View
}

// maxVariants bounds the resources kept per hostname: its types, ports
// and the variants clients' views make of them (networks, flavours, and
// where a DestinationRule ranks localities, the clients' localities).
const maxVariants = 1024

// maxWildcardSets bounds the wildcard sets kept (one per type and view).
const maxWildcardSets = 1024

// maxInbound bounds the Generator's memo of inbound listeners.
const maxInbound = 4096

// maxGens bounds the Generator's per-hostname invalidation stamps.
const maxGens = 2 * generatedHostnames

// genOf is a hostname's invalidation stamp, with g.mu held.
func (g *Generator) genOf(host string) uint64 {
	if gen, ok := g.gens[host]; ok {
		return gen
	}
	return g.genFloor
}

// New returns a Generator of the resources of index's services, in
// DefaultMTLSMode, with no policies until SetMTLS and SetSecurity.
func New(index *feed.Index) *Generator {
	cache, err := simplelru.NewLRU[string, map[resourceKey]*Resource](generatedHostnames, nil)
	if err != nil {
		panic(err) // only for a size ≤ 0
	}
	return &Generator{index: index, meshDefault: DefaultMTLSMode, security: authz.NewSet("", DefaultMTLSMode, authz.TrustDomainBundle{}, nil, nil),
		cache: cache, gens: map[string]uint64{}, wildcard: map[WildcardSetKey]WildcardSet{}, inbound: map[inboundKey]*Resource{}}
}

// WildcardSet is every resource of one type, sorted by name, and the
// version that identifies the set (see ResponseVersion). Shared: read only.
type WildcardSet struct {
	Resources []*Resource
	Anys      []*anypb.Any // Resources' messages, the body of every SotW response for the set
	Version   string
	hosts     map[string][]*Resource // hostname → its resources in Resources, sorted by name
	// changed are the hostnames invalidated since the set was built or
	// last checked (guarded by Generator.mu; nil: the set is current).
	changed map[string]struct{}
}

// maxWildcardChanges bounds the hostnames a wildcard set is checked for
// before it is rebuilt instead.
const maxWildcardChanges = 256

// All returns every resource of a type in a view, built or checked once
// per change of the index however many wildcard watches ask.
func (g *Generator) All(typeURL string, v View) (WildcardSet, error) {
	v = viewFor(typeURL, v)
	if !g.hasRules() {
		v.Locality = Locality{} // one set for every locality
	}
	if !g.index.AnyRestricted() {
		v.Client = "" // one set for every member
	}
	key := WildcardSetKey{typeURL, v}
	g.mu.Lock()
	set, ok := g.wildcard[key]
	changed := set.changed
	if ok && changed == nil {
		g.mu.Unlock()
		return set, nil
	}
	gen := g.allGen
	g.mu.Unlock()
	if ok {
		same, err := g.sameHosts(typeURL, v, set, changed)
		if err != nil {
			return WildcardSet{}, err
		}
		if same {
			set.changed = nil
			g.mu.Lock()
			if g.allGen == gen {
				g.wildcard[key] = set
			}
			g.mu.Unlock()
			return set, nil
		}
	}
	res, err := g.Resources(typeURL, g.allNames(typeURL), v)
	if err != nil {
		return WildcardSet{}, err
	}
	set = WildcardSet{Resources: res, Anys: make([]*anypb.Any, len(res)), Version: ResponseVersion(res), hosts: make(map[string][]*Resource, len(res))}
	for i, r := range res {
		set.Anys[i] = r.Any
		if host, _, ok := ParseName(typeURL, r.Name); ok {
			set.hosts[host] = append(set.hosts[host], r)
		}
	}
	g.mu.Lock()
	if _, had := g.wildcard[key]; g.allGen == gen && (had || len(g.wildcard) < maxWildcardSets) {
		g.wildcard[key] = set
	}
	g.mu.Unlock()
	return set, nil
}

// sameHosts reports whether the resources of typeURL of these hostnames
// are exactly the ones set has of them.
func (g *Generator) sameHosts(typeURL string, v View, set WildcardSet, hosts map[string]struct{}) (bool, error) {
	for host := range hosts {
		res, err := g.Resources(typeURL, hostNames(typeURL, host, g.index.Service(host)), v)
		if err != nil {
			return false, err
		}
		old := set.hosts[host]
		if len(res) != len(old) {
			return false, nil
		}
		for i, r := range res {
			if r.Name != old[i].Name || r.Version != old[i].Version {
				return false, nil
			}
		}
	}
	return true, nil
}

// Invalidate forgets what was generated for these hostnames.
func (g *Generator) Invalidate(hostnames map[string]struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.gens)+len(hostnames) > maxGens {
		clear(g.gens)
		g.genFloor = g.stamp
	}
	for h := range hostnames {
		g.cache.Remove(h)
		g.stamp++
		g.gens[h] = g.stamp
	}
	if len(hostnames) == 0 {
		return
	}
	g.allGen++
	for key, set := range g.wildcard {
		if len(set.changed)+len(hostnames) > maxWildcardChanges {
			delete(g.wildcard, key)
			continue
		}
		changed := make(map[string]struct{}, len(set.changed)+len(hostnames)) // sets handed out keep theirs
		for h := range set.changed {
			changed[h] = struct{}{}
		}
		for h := range hostnames {
			changed[h] = struct{}{}
		}
		set.changed = changed
		g.wildcard[key] = set
	}
}

// Resources returns the named resources of one type in a view that exist,
// sorted by name.
func (g *Generator) Resources(typeURL string, names []string, v View) ([]*Resource, error) {
	out := make([]*Resource, 0, len(names))
	for _, name := range names {
		r, err := g.Resource(typeURL, name, v)
		if err != nil {
			return nil, err
		}
		if r != nil {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// allNames lists every resource name of a type, for wildcard subscriptions.
func (g *Generator) allNames(typeURL string) []string {
	var names []string
	for _, host := range g.index.Hostnames() {
		names = append(names, hostNames(typeURL, host, g.index.Service(host))...)
	}
	return names
}

// hostNames lists the resource names of a type that a service has.
func hostNames(typeURL, host string, members map[string]*clusters.Service) []string {
	var names []string
	for _, port := range FederatedPorts(members) {
		switch typeURL {
		case resourcev3.ClusterType, resourcev3.EndpointType:
			names = append(names, clusterName(host, port.Port))
		case resourcev3.ListenerType, resourcev3.RouteType:
			names = append(names, ListenerName(host, port.Port))
		}
	}
	return names
}

// viewFor is the view whose resources of typeURL a client of v gets:
// Clusters differ by flavour, endpoint assignments by network and whether
// the client speaks Istio mTLS, every other type is shared.
func viewFor(typeURL string, v View) View {
	if v.Flavour == FlavourEnvoyPlaintext {
		if typeURL == resourcev3.ListenerType {
			v.Flavour = FlavourEnvoy
		} else {
			v.Flavour = FlavourPlain
		}
	}
	switch typeURL {
	case resourcev3.ClusterType:
		return View{Flavour: v.Flavour, Client: v.Client}
	case resourcev3.ListenerType:
		// Envoy gets none of the proxyless api_listeners; every other
		// client the same.
		if v.Flavour == FlavourEnvoy {
			return View{Flavour: FlavourEnvoy, Client: v.Client}
		}
		return View{Client: v.Client}
	case resourcev3.EndpointType:
		// The flavour says whether the client speaks Istio mTLS, which
		// gateways need (see memberSplit); the locality matters only
		// where a DestinationRule's locality load balancing applies
		// (Resource drops it elsewhere).
		v.Server = nil
		return v
	}
	return View{Client: v.Client}
}

// Resource returns the named resource of one type in a view, or nil when
// it does not exist. An endpoint assignment that a client's network does
// not change (needsSplit) is the one resource every such client shares.
func (g *Generator) Resource(typeURL, name string, v View) (*Resource, error) {
	if typeURL == resourcev3.ListenerType && (v.Flavour == FlavourEnvoy || v.Flavour == FlavourEnvoyPlaintext) {
		return nil, nil // Envoy would skip an api_listener (it takes one only from its bootstrap)
	}
	if typeURL == resourcev3.ListenerType && strings.HasPrefix(name, InboundListenerPrefix) {
		return g.inboundListener(name, v.Server)
	}
	host, port, ok := ParseName(typeURL, name)
	if !ok {
		return nil, nil
	}
	v = viewFor(typeURL, v)
	// Members' clients differ only for hostnames with views not exported
	// to every member: the key holds whose views the client gets.
	client := v.Client
	v.Client, v.Audience = "", g.index.Audience(host, client)
	// The rule, the cache and the host's stamp are read together: a rule
	// replaced (SetDestinationRules, then Invalidate) after this is seen
	// as an invalidation, and what is built here is not kept.
	g.mu.Lock()
	var lb localityLB
	if typeURL == resourcev3.ClusterType || typeURL == resourcev3.EndpointType {
		rule, ok := g.rules.lookup(host)
		if ok {
			lb = localityLBOf(rule.spec, port)
		}
		if v.Flavour == FlavourGRPC && !g.clientMTLSLocked(rule.spec, port) {
			v.Flavour = FlavourPlain // what a client without mTLS gets
		}
		if v.Flavour == FlavourEnvoy && !g.envoyMTLSLocked(rule.spec, port) {
			v.Flavour = FlavourPlain // plaintext to every endpoint
		}
	}
	if !lb.applies() {
		v.Locality = Locality{} // the client's locality changes nothing here
	}
	key := resourceKey{typeURL: typeURL, name: name, view: v}
	variants := 0
	if byName, ok := g.cache.Get(host); ok {
		if r, ok := byName[key]; ok {
			g.mu.Unlock()
			return r, nil
		}
		variants = len(byName)
	}
	gen := g.genOf(host)
	g.mu.Unlock()

	members := g.index.Service(host)
	if v.Audience != "" {
		members = feed.Visible(members, client)
	}
	msg, shared := g.build(key, host, port, lb, members)
	if msg == nil {
		return nil, nil // absent names are not cached: clients choose them freely
	}
	r, err := Marshal(name, typeURL, msg)
	if err != nil {
		return nil, err
	}
	return g.keep(host, gen, variants, key, shared, r), nil
}

// build makes the resource of key (nil: the service has no such port) for
// a host's members, and says the key under which every view that gets the
// same resource shares it.
func (g *Generator) build(key resourceKey, host string, port int32, lb localityLB, members map[string]*clusters.Service) (msg proto.Message, shared resourceKey) {
	sp, ok := findPort(FederatedPorts(members), port)
	if !ok {
		return nil, key
	}
	name, v := key.name, key.view
	switch key.typeURL {
	case resourcev3.ClusterType:
		c := buildCluster(name, sp)
		lb.applyToCluster(c)
		switch v.Flavour {
		case FlavourGRPC:
			c.TransportSocket = upstreamTLS(peerSANs(g.trustDomain, members), SNI(host, port))
		case FlavourEnvoy:
			c.TransportSocketMatches = envoyTransportSockets(peerSANs(g.trustDomain, members), SNI(host, port), speaksHTTP2(sp))
		}
		return c, key
	case resourcev3.EndpointType:
		a := assignment{demoted: g.demoted, mtls: v.Flavour == FlavourGRPC || v.Flavour == FlavourEnvoy, proxyless: v.Flavour == FlavourGRPC,
			network: v.Network, lb: lb, client: v.Locality, gateways: g.index.NetworkGateways}
		shared = key
		switch {
		case needsSplit(v.Network, a.mtls, a.proxyless, members, a.gateways):
			a.split = true
		case !lb.applies():
			shared = resourceKey{typeURL: key.typeURL, name: name, view: View{Audience: v.Audience}, direct: true}
		}
		return buildLoadAssignment(name, port, members, a), shared
	case resourcev3.ListenerType:
		return buildListener(name), key
	case resourcev3.RouteType:
		return buildRoute(name, host, port), key
	}
	return nil, key
}

// keep caches r under key and shared, and returns the resource to serve:
// the one already shared under shared, if any. Not kept: when the index
// changed while it was built (gen), and past maxVariants per hostname
// (clients choose their member, network and locality: each their own
// variant is built, not kept).
func (g *Generator) keep(host string, gen uint64, variants int, key, shared resourceKey, r *Resource) *Resource {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.genOf(host) != gen || variants >= maxVariants {
		return r
	}
	byName, ok := g.cache.Get(host)
	if !ok {
		byName = map[resourceKey]*Resource{}
		g.cache.Add(host, byName)
	}
	if s, ok := byName[shared]; ok {
		r = s // one encoding for every view that gets the same
	}
	byName[shared] = r
	byName[key] = r
	return r
}

// SetDemoteUnhealthy says whether the endpoints of members that are not
// healthy (feed.Index.Demoted) go one priority behind the healthy ones (the
// default) or stay where they are. Call it before the Generator is used.
func (g *Generator) SetDemoteUnhealthy(on bool) { g.keepUnhealthyFirst = !on }

// ViewOf is the view of a client of member with node (see ViewOf).
func (g *Generator) ViewOf(node *corev3.Node, member string) View {
	g.mu.Lock()
	rules := g.rules
	g.mu.Unlock()
	return viewOf(node, member, g.index, rules)
}

// SetDestinationRules replaces the DestinationRules the hub's xDS takes
// locality load balancing and outlier detection from (distribute.Source.Rules
// of DestinationRuleKind) and returns the hostnames whose rule changed:
// their resources are to be rebuilt and pushed (add them to the batch's
// hosts before Invalidate), and the rules whose values it refuses.
func (g *Generator) SetDestinationRules(objs []distribute.Object) (changed []string, refused []Refused) {
	refused = refusedRules(objs)
	next := newDestinationRules(objs, g.index.DomainSuffix())
	g.mu.Lock()
	prev := g.rules
	g.rules = next
	g.mu.Unlock()
	if prev.empty() && next.empty() {
		return nil, refused
	}
	for _, host := range g.index.Hostnames() {
		a, _ := prev.lookup(host)
		b, _ := next.lookup(host)
		if a.id != b.id {
			changed = append(changed, host)
		}
	}
	return changed, refused
}

// hasRules reports whether any DestinationRule is read.
func (g *Generator) hasRules() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.rules.empty()
}

// demoted reports whether a member's endpoints go behind the others.
func (g *Generator) demoted(member string) bool {
	if g.keepUnhealthyFirst {
		return false
	}
	_, ok := g.index.Demoted(member)
	return ok
}

// resourceKey names a generated resource within its hostname's cache entry:
// the resource of a view, or (direct) the endpoint assignment every client
// of an audience gets whose network does not change it.
type resourceKey struct {
	typeURL, name string
	view          View
	direct        bool
}

// Marshal makes msg, of typeURL, the resource of that name: its bytes
// deterministic, its version their content hash.
func Marshal(name, typeURL string, msg proto.Message) (*Resource, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("marshalling %s %s: %w", typeURL, name, err)
	}
	sum := sha256.Sum256(b)
	return &Resource{Name: name, Version: hex.EncodeToString(sum[:8]), Any: &anypb.Any{TypeUrl: typeURL, Value: b}}, nil
}

// clusterName is the CDS/EDS name of a service port: outbound|<port>||<hostname>.
func clusterName(host string, port int32) string {
	return "outbound|" + strconv.Itoa(int(port)) + "||" + host
}

// ListenerName is the LDS/RDS name of a service port: <hostname>:<port>.
func ListenerName(host string, port int32) string {
	return host + ":" + strconv.Itoa(int(port))
}

// ResponseVersion identifies a set of resources by their names and versions.
func ResponseVersion(res []*Resource) string {
	if len(res) == 0 {
		return "empty"
	}
	h := sha256.New()
	sorted := append([]*Resource(nil), res...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, r := range sorted {
		h.Write([]byte(r.Name))
		h.Write([]byte{0})
		h.Write([]byte(r.Version))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// ParseName maps a resource name of a type back to its hostname and port.
func ParseName(typeURL, name string) (string, int32, bool) {
	var host, portStr string
	switch typeURL {
	case resourcev3.ClusterType, resourcev3.EndpointType:
		// outbound|<port>||<host>, no other '|' (without allocating: this
		// runs for every name of every subscription and lookup).
		rest, ok := strings.CutPrefix(name, "outbound|")
		if !ok {
			return "", 0, false
		}
		i := strings.IndexByte(rest, '|')
		if i < 0 || !strings.HasPrefix(rest[i+1:], "|") {
			return "", 0, false
		}
		portStr, host = rest[:i], rest[i+2:]
		if strings.IndexByte(host, '|') >= 0 {
			return "", 0, false
		}
	case resourcev3.ListenerType, resourcev3.RouteType:
		i := strings.LastIndexByte(name, ':')
		if i < 0 || strings.HasPrefix(name, InboundListenerPrefix) {
			return "", 0, false // a proxyless server's inbound listener names no service
		}
		host, portStr = name[:i], name[i+1:]
	default:
		return "", 0, false
	}
	port, err := strconv.ParseInt(portStr, 10, 32)
	if err != nil || port <= 0 || port > 65535 || host == "" {
		return "", 0, false
	}
	return host, int32(port), true
}

// FederatedPorts is the union of the TCP ports of every member's view of a
// service, by port number; on disagreement the alphabetically first member wins.
func FederatedPorts(members map[string]*clusters.Service) []clusters.ServicePort {
	ids := make([]string, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	seen := map[int32]bool{}
	var out []clusters.ServicePort
	for _, id := range ids {
		for _, p := range members[id].Ports {
			if p.Protocol != "" && p.Protocol != "TCP" || seen[p.Port] {
				continue
			}
			seen[p.Port] = true
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out
}

func findPort(ports []clusters.ServicePort, port int32) (clusters.ServicePort, bool) {
	for _, p := range ports {
		if p.Port == port {
			return p, true
		}
	}
	return clusters.ServicePort{}, false
}

var adsSource = &corev3.ConfigSource{
	ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	ResourceApiVersion:    corev3.ApiVersion_V3,
}

// speaksHTTP2 reports whether a port carries gRPC or HTTP/2, by appProtocol
// or by Istio's port-name prefix convention.
func speaksHTTP2(p clusters.ServicePort) bool {
	switch strings.ToLower(p.AppProtocol) {
	case "grpc", "http2", "kubernetes.io/h2c":
		return true
	}
	name := strings.ToLower(p.Name)
	return name == "grpc" || name == "http2" || strings.HasPrefix(name, "grpc-") || strings.HasPrefix(name, "http2-")
}

func buildCluster(name string, port clusters.ServicePort) *clusterv3.Cluster {
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsSource, ServiceName: name},
		ConnectTimeout:       durationpb.New(10 * time.Second),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
	}
	if speaksHTTP2(port) {
		opts := &upstreamhttpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{
				ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
						Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
					},
				},
			},
		}
		c.TypedExtensionProtocolOptions = map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(opts),
		}
	}
	return c
}

// buildListener is a proxyless-gRPC api_listener whose HCM fetches the
// route configuration of the same name over ADS.
func buildListener(name string) *listenerv3.Listener {
	hcm := &hcmv3.HttpConnectionManager{
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		StatPrefix: name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource: adsSource, RouteConfigName: name,
		}},
		HttpFilters: []*hcmv3.HttpFilter{{
			Name:       "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
		}},
	}
	return &listenerv3.Listener{Name: name, ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(hcm)}}
}

func buildRoute(name, host string, port int32) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    name,
			Domains: []string{host, ListenerName(host, port)},
			Routes: []*routev3.Route{{
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{
					ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: clusterName(host, port)},
				}},
			}},
		}},
	}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("packing %T: %v", m, err))
	}
	return a
}
