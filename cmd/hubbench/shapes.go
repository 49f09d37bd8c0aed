package main

import (
	"fmt"
	"slices"
	"strings"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/hubmesh/hub/hub"
)

// The shapes of a stream's subscriptions, each standing for a kind of
// client (docs/performance.md, "Shapes"):
//
//   - named: CDS wildcard (or by name with --cds named) and EDS for a fixed
//     set of ServicesPerStream services, both requested at once. No real
//     client subscribes like this; it is the shape of the first figures.
//   - envoy: what an Envoy sidecar without a Sidecar scope does: CDS as
//     wildcard and, once CDS has answered, EDS for the EDS service name of
//     every EDS cluster CDS returned, following every later CDS change.
//   - grpc: what grpc-go's xds resolver (v1.85, internal/xds/xdsdepmgr)
//     does for each target xds:///<hostname>:<port>: LDS for the listener
//     "<hostname>:<port>"; RDS for the route configuration its
//     HttpConnectionManager names; CDS for the clusters of the routes of
//     the virtual host that best matches "<hostname>:<port>"; EDS for each
//     cluster's EDS service name (or its name when it has none). Every step
//     waits for the previous resource.
//   - istiod: a member istiod's config-source stream (MCP-over-XDS); it
//     does not use client and is driven by istiod.go.
const (
	shapeNamed = "named"
	shapeEnvoy = "envoy"
	shapeGRPC  = "grpc"

	cdsWildcard = "wildcard"
	cdsNamed    = "named"
)

// subscriptionOrder is the order in which a stream (re)subscribes to types.
var subscriptionOrder = []string{resourcev3.ListenerType, resourcev3.RouteType, resourcev3.ClusterType, resourcev3.EndpointType}

// fullState reports whether a SotW response of the type carries every
// resource the stream holds (LDS and CDS), so that a held resource missing
// from it is gone. For the other types a response may carry only some of
// the subscribed resources and the client keeps the others.
func fullState(typeURL string) bool {
	return typeURL == resourcev3.ListenerType || typeURL == resourcev3.ClusterType
}

// subscription is what a stream asks for of one type.
type subscription struct {
	wildcard bool
	names    []string // sorted; empty for wildcard
	set      map[string]bool
}

func wildcardSub() subscription { return subscription{wildcard: true} }

func namedSub(names []string) subscription {
	s := subscription{names: slices.Compact(slices.Sorted(slices.Values(names))), set: map[string]bool{}}
	for _, n := range s.names {
		s.set[n] = true
	}
	return s
}

func (s subscription) equal(o subscription) bool {
	return s.wildcard == o.wildcard && slices.Equal(s.names, o.names)
}

// wants reports whether the subscription covers a resource name.
func (s subscription) wants(name string) bool { return s.wildcard || s.set[name] }

// heldResource is what a client keeps of a resource it received.
type heldResource struct {
	version string // Delta: the resource's version; SotW: ""
	// ref is what the resource makes the client subscribe to next: a
	// Listener's route configuration name, an EDS Cluster's EDS service
	// name ("" for other clusters).
	ref string
	// vhosts are a RouteConfiguration's virtual hosts.
	vhosts []vhost
}

type vhost struct {
	domains  []string
	clusters []string
}

// client is one stream's subscription state: what it asked for, what it
// holds, and what it asks for next, as the client of its shape would. It
// knows nothing of the transport (SotW or Delta); streams.go drives it.
type client struct {
	shape    string
	namedCDS bool
	// targets are, for grpc, the listener names (= the authorities to
	// match virtual hosts against); for named, the EDS names.
	targets []string
	// watch are the benchmark EDS names the stream must end up holding;
	// bench are every benchmark cluster's name.
	watch, bench map[string]bool

	subs map[string]subscription            // typeURL → last requested
	held map[string]map[string]heldResource // typeURL → name → resource
	// answered marks the types that got at least one response.
	answered map[string]bool
	// gen counts the changes of what want reads (answered, and the held
	// resources other types refer from); changes skips its work while gen
	// is the one it last saw (wanted), as after every EDS response and
	// every CDS response that added or dropped no cluster.
	gen, wanted uint64

	edsHeld int // names of watch held in EDS
	cdsHeld int // names of bench held in CDS

	// bulk are the clusters the bulk phase creates (bulk.go), each with
	// its number of endpoints; shared, read only. bulkCDS counts those
	// held in CDS, bulkEDS those held in EDS with all their endpoints
	// (bulkFull).
	bulk             map[string]int
	bulkCDS, bulkEDS int
	bulkFull         map[string]bool
}

func newClient(shape string, namedCDS bool, targets []string, watch, bench map[string]bool) *client {
	c := &client{shape: shape, namedCDS: namedCDS, targets: targets, watch: watch, bench: bench,
		subs: map[string]subscription{}, held: map[string]map[string]heldResource{}, answered: map[string]bool{}}
	for _, t := range subscriptionOrder {
		c.held[t] = map[string]heldResource{}
	}
	return c
}

// want is the subscription a type should have now; ok is false while the
// client has no reason to subscribe to the type yet.
func (c *client) want(typeURL string) (subscription, bool) {
	switch c.shape {
	case shapeNamed:
		switch typeURL {
		case resourcev3.ClusterType:
			if c.namedCDS {
				return namedSub(c.targets), true
			}
			return wildcardSub(), true
		case resourcev3.EndpointType:
			return namedSub(c.targets), true
		}
	case shapeEnvoy:
		switch typeURL {
		case resourcev3.ClusterType:
			return wildcardSub(), true
		case resourcev3.EndpointType:
			if !c.answered[resourcev3.ClusterType] {
				return subscription{}, false
			}
			return c.refs(resourcev3.ClusterType)
		}
	case shapeGRPC:
		switch typeURL {
		case resourcev3.ListenerType:
			return namedSub(c.targets), true
		case resourcev3.RouteType:
			return c.refs(resourcev3.ListenerType)
		case resourcev3.ClusterType:
			var names []string
			for _, t := range c.targets {
				l, ok := c.held[resourcev3.ListenerType][t]
				if !ok {
					continue
				}
				r, ok := c.held[resourcev3.RouteType][l.ref]
				if !ok {
					continue
				}
				if vh := bestVirtualHost(t, r.vhosts); vh != nil {
					names = append(names, vh.clusters...)
				}
			}
			return c.keep(resourcev3.ClusterType, names)
		case resourcev3.EndpointType:
			return c.refs(resourcev3.ClusterType)
		}
	}
	return subscription{}, false
}

// refs subscribes to what the held resources of a type refer to.
func (c *client) refs(typeURL string) (subscription, bool) {
	var names []string
	for _, h := range c.held[typeURL] {
		if h.ref != "" {
			names = append(names, h.ref)
		}
	}
	return c.keep(typeOfRefs(typeURL), names)
}

// keep is a named subscription, or none while there is nothing to ask
// for and nothing was asked for before.
func (c *client) keep(typeURL string, names []string) (subscription, bool) {
	if _, before := c.subs[typeURL]; len(names) == 0 && !before {
		return subscription{}, false
	}
	return namedSub(names), true
}

func typeOfRefs(typeURL string) string {
	switch typeURL {
	case resourcev3.ListenerType:
		return resourcev3.RouteType
	case resourcev3.ClusterType:
		return resourcev3.EndpointType
	}
	panic("no references from " + typeURL)
}

// change is one type whose subscription changes.
type change struct {
	typeURL string
	sub     subscription
	first   bool     // the type's first request on the stream
	added   []string // Delta: names to subscribe
	removed []string // Delta: names to unsubscribe
}

// changes lists, in subscription order, every type whose subscription
// must change now, and records the new subscriptions (dropping held
// resources that are no longer subscribed). The caller sends them.
func (c *client) changes() []change {
	gen := c.gen
	if gen == c.wanted && gen != 0 {
		return nil
	}
	defer func() {
		if c.gen == gen { // else the removals below changed what want reads: look again next time
			c.wanted = gen
		}
	}()
	var out []change
	for _, t := range subscriptionOrder {
		sub, ok := c.want(t)
		if !ok {
			continue
		}
		old, had := c.subs[t]
		if had && old.equal(sub) {
			continue
		}
		ch := change{typeURL: t, sub: sub, first: !had}
		if !sub.wildcard {
			for _, n := range sub.names {
				if !old.set[n] {
					ch.added = append(ch.added, n)
				}
			}
			for _, n := range old.names {
				if !sub.set[n] {
					ch.removed = append(ch.removed, n)
				}
			}
			for name := range c.held[t] {
				if !sub.set[name] {
					c.remove(t, name)
				}
			}
		}
		c.subs[t] = sub
		out = append(out, ch)
	}
	return out
}

// put stores a received resource; it reports whether the client already
// held that very version (a Delta resend).
func (c *client) put(typeURL, name, version string, value []byte) (resend bool, err error) {
	h := heldResource{version: version}
	switch typeURL {
	case resourcev3.ListenerType:
		if h.ref, err = routeConfigName(value); err != nil {
			return false, fmt.Errorf("listener %s: %w", name, err)
		}
	case resourcev3.RouteType:
		if h.vhosts, err = virtualHosts(value); err != nil {
			return false, fmt.Errorf("route configuration %s: %w", name, err)
		}
	case resourcev3.ClusterType:
		h.ref = edsServiceName(value)
	case resourcev3.EndpointType:
		if want, ok := c.bulk[name]; ok {
			c.setBulkFull(name, claEndpoints(value) == want)
		}
	}
	old, had := c.held[typeURL][name]
	c.held[typeURL][name] = h
	if !had {
		c.count(typeURL, name, 1)
	}
	if typeURL != resourcev3.EndpointType && (!had || old.ref != h.ref || typeURL == resourcev3.RouteType) {
		c.gen++
	}
	return had && version != "" && old.version == version, nil
}

func (c *client) remove(typeURL, name string) {
	if _, ok := c.held[typeURL][name]; ok {
		delete(c.held[typeURL], name)
		c.count(typeURL, name, -1)
		if typeURL != resourcev3.EndpointType {
			c.gen++
		}
	}
}

func (c *client) count(typeURL, name string, d int) {
	switch {
	case typeURL == resourcev3.EndpointType && c.watch[name]:
		c.edsHeld += d
	case typeURL == resourcev3.ClusterType && c.bench[name]:
		c.cdsHeld += d
	case typeURL == resourcev3.ClusterType && c.bulk[name] > 0:
		c.bulkCDS += d
	case typeURL == resourcev3.EndpointType && d < 0 && c.bulk[name] > 0:
		c.setBulkFull(name, false)
	}
}

// setBulkFull records whether the client holds a bulk cluster's assignment
// with all its endpoints.
func (c *client) setBulkFull(name string, full bool) {
	if c.bulkFull[name] == full {
		return
	}
	if full {
		if c.bulkFull == nil {
			c.bulkFull = map[string]bool{}
		}
		c.bulkFull[name] = true
		c.bulkEDS++
		return
	}
	delete(c.bulkFull, name)
	c.bulkEDS--
}

// claEndpoints counts the endpoints of an encoded ClusterLoadAssignment
// (0 if it does not decode).
func claEndpoints(b []byte) int {
	n := 0
	eachField(b, 2, func(loc []byte) { // ClusterLoadAssignment.endpoints
		eachField(loc, 2, func([]byte) { n++ }) // LocalityLbEndpoints.lb_endpoints
	})
	return n
}

// eachField calls f with every length-delimited field numbered num of an
// encoded message, without decoding the rest: the bulk phase counts the
// endpoints of every assignment of every EDS response, and decoding them
// whole made the load generator the busiest process on the machine.
func eachField(b []byte, num protowire.Number, f func([]byte)) {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return
			}
			f(v)
			b = b[l:]
			continue
		}
		if l = protowire.ConsumeFieldValue(n, typ, b); l < 0 {
			return
		}
		b = b[l:]
	}
}

// markAnswered records that a type got a response.
func (c *client) markAnswered(typeURL string) {
	if !c.answered[typeURL] {
		c.answered[typeURL] = true
		c.gen++
	}
}

// applySotW takes a SotW response's resources. Resources the stream did
// not subscribe to are ignored; for LDS and CDS, held resources missing
// from the response are gone.
func (c *client) applySotW(typeURL string, values [][]byte) error {
	c.markAnswered(typeURL)
	sub := c.subs[typeURL]
	var seen map[string]bool
	if fullState(typeURL) {
		seen = make(map[string]bool, len(values))
	}
	for _, v := range values {
		name := hub.ResourceName(v)
		if !sub.wants(name) {
			continue
		}
		if seen != nil {
			seen[name] = true
		}
		if _, err := c.put(typeURL, name, "", v); err != nil {
			return err
		}
	}
	if seen != nil {
		for name := range c.held[typeURL] {
			if !seen[name] {
				c.remove(typeURL, name)
			}
		}
	}
	return nil
}

// bestVirtualHost picks the virtual host for an authority as grpc-go's
// xdsresource.FindBestMatchingVirtualHost does: an exact domain first,
// then the longest suffix wildcard ("*.example.com"), then the longest
// prefix wildcard ("example.*"), then "*".
func bestVirtualHost(authority string, vhs []vhost) *vhost {
	authority = strings.ToLower(authority)
	var best *vhost
	bestKind, bestLen := 0, -1 // kinds: 4 exact, 3 suffix, 2 prefix, 1 universal
	for i := range vhs {
		for _, d := range vhs[i].domains {
			d = strings.ToLower(d)
			kind := 0
			switch {
			case d == "*":
				kind = 1
			case strings.HasPrefix(d, "*"):
				if strings.HasSuffix(authority, d[1:]) {
					kind = 3
				}
			case strings.HasSuffix(d, "*"):
				if strings.HasPrefix(authority, d[:len(d)-1]) {
					kind = 2
				}
			case d == authority:
				kind = 4
			}
			if kind == 0 {
				continue
			}
			if kind > bestKind || (kind == bestKind && len(d) > bestLen) {
				best, bestKind, bestLen = &vhs[i], kind, len(d)
			}
		}
	}
	return best
}

// routeConfigName is the RDS name of an api_listener's HttpConnectionManager.
func routeConfigName(b []byte) (string, error) {
	var l listenerv3.Listener
	if err := proto.Unmarshal(b, &l); err != nil {
		return "", err
	}
	var hcm hcmv3.HttpConnectionManager
	if err := l.GetApiListener().GetApiListener().UnmarshalTo(&hcm); err != nil {
		return "", fmt.Errorf("api_listener: %w", err)
	}
	name := hcm.GetRds().GetRouteConfigName()
	if name == "" {
		return "", fmt.Errorf("the HttpConnectionManager names no RDS route configuration (inline routes are not followed)")
	}
	return name, nil
}

// virtualHosts are a RouteConfiguration's domains and the clusters of
// their routes (single or weighted).
func virtualHosts(b []byte) ([]vhost, error) {
	var rc routev3.RouteConfiguration
	if err := proto.Unmarshal(b, &rc); err != nil {
		return nil, err
	}
	var out []vhost
	for _, vh := range rc.GetVirtualHosts() {
		v := vhost{domains: vh.GetDomains()}
		for _, r := range vh.GetRoutes() {
			a := r.GetRoute()
			if c := a.GetCluster(); c != "" {
				v.clusters = append(v.clusters, c)
			}
			for _, w := range a.GetWeightedClusters().GetClusters() {
				v.clusters = append(v.clusters, w.GetName())
			}
		}
		out = append(out, v)
	}
	return out, nil
}

// Fields of envoy.config.cluster.v3.Cluster read by edsServiceName.
const (
	clusterNameField        = 1
	clusterTypeField        = 2
	clusterEDSConfigField   = 3
	edsServiceNameField     = 2 // of Cluster.EdsClusterConfig
	clusterDiscoveryTypeEDS = 3
)

// edsServiceName is the EDS name an encoded Cluster makes a client
// subscribe to: its eds_cluster_config.service_name, or its name when
// that is empty; "" when it is not an EDS cluster. It reads the few fields
// it needs without decoding the rest (a stream of the envoy shape reads
// every cluster of every CDS response).
func edsServiceName(b []byte) string {
	var name, service string
	eds := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		switch {
		case num == clusterNameField && typ == protowire.BytesType:
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return ""
			}
			name, b = v, b[n:]
			continue
		case num == clusterTypeField && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return ""
			}
			eds, b = v == clusterDiscoveryTypeEDS, b[n:]
			continue
		case num == clusterEDSConfigField && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return ""
			}
			service, b = subString(v, edsServiceNameField), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return ""
		}
		b = b[n:]
	}
	if !eds {
		return ""
	}
	if service != "" {
		return service
	}
	return name
}

// subString is the last value of string field num of an encoded message.
func subString(b []byte, num protowire.Number) string { return string(subBytes(b, num)) }
