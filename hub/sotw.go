package hub

import (
	"slices"
	"strconv"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hubmesh/hub/hub/xdsgen"
)

// sotwConn is a SotW stream's conn with its loop's per-type state.
type sotwConn struct {
	*conn
	a     *adsServer
	st    sotwStream
	types map[string]*sotwType
	debug debugAnswered
}

// sotwType is a SotW stream's state for one type.
type sotwType struct {
	sub    sotwSubscription
	req    *discoveryv3.DiscoveryRequest // the current watch's
	cancel func()                        // the current watch's (nil: none)
	nonce  string                        // the last response's
	// seen is the resource_names of the last request of the type, stale
	// ones included, as the tracker has recorded them.
	seen []string
	// clusters is, for CDS, the last whole-state response's clusters
	// (shared, read only): what a new one changed is re-warmed by Envoy
	// (see resendEndpoints).
	clusters []*xdsgen.Resource
}

func (a *adsServer) serveSotw(st sotwStream, defaultType string) error {
	c := &sotwConn{conn: newConn(a.streamIDs.Add(1)), a: a, st: st, types: map[string]*sotwType{}, debug: debugAnswered{}}
	return serveStream(a, st, defaultType, c.conn, c)
}

// handle takes one request: the tracker checks and records it; unless its
// nonce is stale, it replaces its type's watch.
func (c *sotwConn) handle(req *discoveryv3.DiscoveryRequest, defaultType string) error {
	// The xDS protocol: a node sent again on a stream is the same node;
	// the stream's first one stands for it (the tracker checks and
	// records a node once, on first sight).
	if req.Node != nil && !c.named {
		c.node, c.named = req.Node, true
	} else {
		req.Node = c.node
	}
	if req.TypeUrl == "" {
		if defaultType == resourcev3.AnyType {
			return errNoType
		}
		req.TypeUrl = defaultType
	}
	if !served(req.TypeUrl) {
		return c.a.tracker.onUnserved(c.conn, req.Node, req.TypeUrl)
	}
	t := c.types[req.TypeUrl]
	repeated := t != nil && sameSlice(req.ResourceNames, t.seen)
	if err := c.a.tracker.onStreamRequest(c.conn, req, repeated); err != nil {
		return err
	}
	c.identified(c.a.watcher)
	c.trimNode()
	if isDebugType(req.TypeUrl) {
		return c.answerDebug(req) // answered here, never watched
	}
	if t == nil {
		t = &sotwType{sub: newSotwSubscription(req.ResourceNames, c.a.held)}
		c.types[req.TypeUrl] = t
	} else {
		t.seen = req.ResourceNames
		if sotwStale(req.ResponseNonce, t.nonce) {
			return nil // stale: the client has not seen the type's last response yet
		}
		if t.cancel != nil {
			t.cancel()
		}
		t.sub.set(req.ResourceNames)
		if req.ResponseNonce == "" {
			// A new request (istiod's shouldRespond: no nonce is a client
			// starting over): answered with all it subscribes to, as the
			// type's first request is.
			t.sub.forget(nil)
		}
		c.holds(req.TypeUrl, t.sub.held())
		if req.ResponseNonce == "" {
			c.a.watcher.renew(&c.rec, req.TypeUrl)
		}
	}
	t.seen, t.req = req.ResourceNames, req
	var err error
	t.cancel, err = c.a.watcher.CreateWatch(req, &t.sub, c.conn)
	return err
}

// sendQueued sends what the watches answered; a response whose watch a
// newer request replaced is dropped (the new watch answers for it).
func (c *sotwConn) sendQueued() error {
	for _, r := range c.out.take() {
		resp := r.sotw
		t := c.types[resp.Request.GetTypeUrl()]
		if t == nil || resp.Request != t.req {
			continue
		}
		out := resp.DiscoveryResponse
		c.nonce++
		out.Nonce = strconv.FormatInt(c.nonce, 10)
		t.nonce = out.Nonce
		t.sub.took(resp)
		c.a.tracker.onStreamResponse(c.conn, out, t.sub.held(), resp.incremental)
		if err := c.st.Send(out); err != nil {
			return err
		}
		if out.TypeUrl == resourcev3.ClusterType && resp.whole != nil {
			changed := changedClusters(t.clusters, resp.whole)
			t.clusters = resp.whole
			if err := c.resendEndpoints(changed); err != nil {
				return err
			}
		}
	}
	return nil
}

// sotwStale reports whether a SotW request's nonce makes it stale, as
// istiod reads nonces: a request naming a response other than the type's
// last one is stale (the client has not seen the last one yet) and is
// ignored; an empty nonce is a new request and is answered; and so is any
// request of a type no response has gone out for yet.
func sotwStale(requestNonce, lastNonce string) bool {
	return requestNonce != "" && lastNonce != "" && requestNonce != lastNonce
}

// resendEndpoints sends the stream the endpoint assignments of the
// clusters a CDS response just changed, whether or not the assignments
// changed: Envoy warms a changed Cluster until its ClusterLoadAssignment
// arrives (15 s by default), and asks for nothing new, since it already
// watches that name (istiod's AlwaysRespond and forceEDSPush do the same).
func (c *sotwConn) resendEndpoints(clusters []string) error {
	t := c.types[resourcev3.EndpointType]
	if len(clusters) == 0 || t == nil || t.req == nil {
		return nil
	}
	if t.cancel != nil {
		t.cancel()
	}
	t.sub.forget(clusters)
	c.holds(resourcev3.EndpointType, t.sub.held())
	c.a.watcher.renew(&c.rec, resourcev3.EndpointType)
	// A request of its own identity: a response the cancelled watch queued
	// is dropped (sendQueued), as the new watch's requested() counted it
	// answered, instead of being sent besides the new one.
	t.req = &discoveryv3.DiscoveryRequest{VersionInfo: t.req.VersionInfo, Node: t.req.Node, ResourceNames: t.req.ResourceNames,
		TypeUrl: t.req.TypeUrl, ResponseNonce: t.req.ResponseNonce}
	var err error
	t.cancel, err = c.a.watcher.CreateWatch(t.req, &t.sub, c.conn)
	return err
}

// changedClusters lists the names of next whose version differs from the
// same name's in prev (both sorted by name, as Generator.Resources and
// Generator.All return them, named subscriptions too): clusters that
// Envoy re-warms. New ones are left out: Envoy asks for their endpoints
// itself.
func changedClusters(prev, next []*xdsgen.Resource) []string {
	var changed []string
	i := 0
	for _, r := range next {
		for i < len(prev) && prev[i].Name < r.Name {
			i++
		}
		if i < len(prev) && prev[i].Name == r.Name && prev[i].Version != r.Version {
			changed = append(changed, r.Name)
		}
	}
	return changed
}

func (c *sotwConn) close() {
	for _, t := range c.types {
		if t.cancel != nil {
			t.cancel()
		}
	}
	c.unpublishHeld()
	for _, t := range c.types {
		t.sub.release()
	}
	c.a.watcher.closeStream(&c.rec)
	c.a.tracker.onStreamClosed(c.conn)
}

// sotwSubscription is a SotW stream's subscription to one type, with the
// semantics of go-control-plane's stream.Subscription (the xDS protocol's
// "how the client specifies what resources to return"): until a request
// names a resource, an empty request is a wildcard (legacy wildcard); "*"
// is one explicitly. It keeps the request's list of names rather than a
// map of them (a map is built only when asked for, see
// SubscribedResources), and it changes only when a request's names do.
//
// It is also the one record of what the stream holds of the type
// (heldResources): a watch's evaluation (responder) compares with it, the
// API shows it. For
// responses that carry only what changed (EDS, RDS, SDS by name) that is a
// holding shared with every stream that was sent the same
// (resourceHoldings): with Envoy sidecars every stream holds every
// cluster's endpoints, and a map per stream would be most of the hub's
// memory; for the others, the last response's resources. A watch's
// evaluation reads it only while a watch of the stream's type is parked or being
// created, and the stream's loop changes it (took, set, forget) only while
// none is, under the conn's lock, which the API takes to read it.
type sotwSubscription struct {
	names    []string // the last request's, shared (read only)
	wildcard bool
	legacy   bool // no request named a resource yet
	// holds is what the last responses that carried only what changed
	// left the stream holding (nil: none).
	holds *holding[heldResource]
	// whole is the last whole-state response's resources (shared, read
	// only; nil: none), and set the version of the set of every resource of
	// the type it carried, for a wildcard one.
	whole      []*xdsgen.Resource
	setVersion string
	sent       []*anypb.Any // the whole-state response's resources, as sent (shared, read only)
	resources  *resourceHoldings
}

func newSotwSubscription(names []string, resources *resourceHoldings) sotwSubscription {
	s := sotwSubscription{wildcard: len(names) == 0, legacy: true, resources: resources}
	s.set(names)
	return s
}

func (s *sotwSubscription) held() heldResources {
	h := heldResources{whole: s.whole, set: s.setVersion, sent: s.sent}
	h.holding = s.holds
	return h
}

// set takes a request's names (see stream.Subscription.SetResourceSubscription).
func (s *sotwSubscription) set(names []string) {
	if sameSlice(names, s.names) && !s.legacy {
		return // an ACK of the same names: nothing changes
	}
	s.names = names
	if s.legacy {
		if len(names) == 0 {
			return
		}
		s.legacy = false
	}
	s.wildcard = slices.Contains(names, "*")
	if s.wildcard || s.held().count() == 0 {
		return
	}
	if s.setVersion != "" {
		// What a wildcard response left is known by its version only:
		// forgotten, as every name of it may no longer be subscribed.
		s.whole, s.setVersion, s.sent = nil, "", nil
		return
	}
	// Forget what was returned of names no longer subscribed: subscribing
	// to them again gets them again.
	keep := s.SubscribedResources()
	if s.holds == nil {
		s.whole = slices.DeleteFunc(slices.Clone(s.whole), func(r *xdsgen.Resource) bool { _, ok := keep[r.Name]; return !ok })
		s.holdWhole() // by name from now on, whatever the responses carry
		return
	}
	var gone []string
	for name := range s.holds.res {
		if _, ok := keep[name]; !ok {
			gone = append(gone, name)
		}
	}
	slices.Sort(gone)
	s.holds = s.resources.apply(s.holds, change[heldResource]{removed: gone})
}

// took records that the stream was sent r.
func (s *sotwSubscription) took(r *sotwResponse) {
	r.markSent()
	if !r.incremental {
		s.release()
		s.whole, s.setVersion, s.sent = r.whole, r.set, nil
		if r.PassthroughResponse != nil {
			s.sent = r.DiscoveryResponse.GetResources()
		}
		if s.whole == nil {
			s.whole = noResources // held: nothing
		}
		if s.sent == nil {
			s.sent = []*anypb.Any{}
		}
		return
	}
	if s.holds == nil && len(s.whole) > 0 {
		// What a whole-state response left (an SDS wildcard before these
		// names): from here on, shared.
		s.holdWhole()
	}
	s.whole, s.setVersion, s.sent = nil, "", nil
	s.holds = s.resources.apply(s.holds, changeOf(r.changed, nil))
}

// forget drops names (nil: every name) from what the stream was sent,
// so that the next evaluation sends them again whatever their versions.
func (s *sotwSubscription) forget(names []string) {
	if names == nil || s.setVersion != "" {
		s.release()
		s.whole, s.setVersion, s.sent = nil, "", nil
		return
	}
	if s.holds == nil {
		drop := make(map[string]bool, len(names))
		for _, n := range names {
			drop[n] = true
		}
		s.whole = slices.DeleteFunc(slices.Clone(s.whole), func(r *xdsgen.Resource) bool { return drop[r.Name] })
		s.holdWhole()
		return
	}
	var gone []string
	for _, name := range names {
		if _, ok := s.holds.res[name]; ok {
			gone = append(gone, name)
		}
	}
	if len(gone) == 0 {
		return
	}
	slices.Sort(gone)
	s.holds = s.resources.apply(s.holds, change[heldResource]{removed: gone})
}

// holdWhole makes what the last whole-state response left (whole) a
// holding by name, shared: the responses that follow may carry only what
// changed, and are compared with it by name.
func (s *sotwSubscription) holdWhole() {
	if len(s.whole) == 0 {
		s.whole, s.setVersion, s.sent = noResources, "", []*anypb.Any{} // held: nothing
		return
	}
	s.holds = s.resources.apply(nil, changeOf(s.whole, nil))
	s.whole, s.setVersion, s.sent = nil, "", nil
}

// noResources is a whole state of nothing (nil is none).
var noResources = []*xdsgen.Resource{}

// release gives up the stream's shared holding, if any.
func (s *sotwSubscription) release() {
	s.resources.release(s.holds)
	s.holds = nil
}

// IsWildcard reports whether the subscription is to every resource.
func (s *sotwSubscription) IsWildcard() bool { return s.wildcard }

// SubscribedResources returns a new map of the names ("*" left out) on
// every call.
func (s *sotwSubscription) SubscribedResources() map[string]struct{} {
	m := make(map[string]struct{}, len(s.names))
	for _, n := range s.names {
		if n != "*" {
			m[n] = struct{}{}
		}
	}
	return m
}
