package hub

import (
	"maps"
	"slices"
	"strconv"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// deltaConn is a Delta stream's conn with its loop's per-type state.
type deltaConn struct {
	*conn
	a     *adsServer
	st    deltaStream
	types map[string]*deltaType
	debug debugAnswered
	// rewarm: clusters changed before the stream's first endpoint request.
	rewarm rewarm
}

// deltaType is a Delta stream's state for one type.
type deltaType struct {
	sub    deltaSubscription
	cancel func() // the current watch's (nil: none)
	// req is the current watch's request: a response of an earlier watch
	// still queued when resendEndpoints replaced it is dropped (the new
	// watch evaluates every name again), so that what the stream holds
	// never changes under a parked watch.
	req *discoveryv3.DeltaDiscoveryRequest
	// answered says a response of the type went out on the stream: until
	// then a request is answered even with nothing (CreateDeltaWatch).
	answered bool
}

// rewarm are the clusters a Delta stream was sent changed versions of
// before it asked for endpoints (a reconnect: initial_resource_versions):
// their assignments are sent again however the stream says it holds them
// (see sotwConn.resendEndpoints).
type rewarm map[string]struct{}

// deltaSubscription is a Delta stream's subscription to one type, with
// the semantics of go-control-plane's stream.Subscription: until a request
// subscribes to something, the subscription is a wildcard (legacy
// wildcard); "*" subscribes to every resource and unsubscribing it ends
// that; a name unsubscribed while wildcard is sent again or named removed.
// The names it subscribes to and what the stream holds (their versions,
// from initial_resource_versions on) are holdings shared with every stream
// that asked for and was sent the same (see sotwSubscription for why and
// when they change).
type deltaSubscription struct {
	wildcard   bool
	legacy     bool
	subscribed *holding[struct{}]
	holds      *holding[heldResource] // what the stream holds: what it was sent, or says it has (no Any)
	names      *nameHoldings
	resources  *resourceHoldings
}

func newDeltaSubscription(req *discoveryv3.DeltaDiscoveryRequest, names *nameHoldings, resources *resourceHoldings) deltaSubscription {
	s := deltaSubscription{wildcard: len(req.ResourceNamesSubscribe) == 0, legacy: true, names: names, resources: resources}
	s.subscribed = names.apply(nil, change[struct{}]{})
	held := change[heldResource]{names: slices.Sorted(maps.Keys(req.InitialResourceVersions))}
	for _, name := range held.names {
		held.vals = append(held.vals, heldResource{version: req.InitialResourceVersions[name]})
	}
	s.holds = resources.apply(nil, held)
	s.update(req.ResourceNamesSubscribe, req.ResourceNamesUnsubscribe)
	return s
}

// update takes a request's subscribe and unsubscribe lists (see
// stream.Subscription.UpdateResourceSubscriptions).
func (s *deltaSubscription) update(subscribe, unsubscribe []string) {
	if s.legacy {
		if len(subscribe) == 0 {
			return
		}
		s.legacy = false
	}
	var add change[struct{}]
	for _, name := range subscribe {
		if name == "*" {
			s.wildcard = true
			continue
		}
		if _, ok := s.subscribed.res[name]; !ok {
			add.names, add.vals = append(add.names, name), append(add.vals, struct{}{})
		}
	}
	s.subscribed = s.names.apply(s.subscribed, add)
	var drop change[struct{}]
	var held change[heldResource]
	dropped := map[string]bool{}
	for _, name := range unsubscribe {
		if name == "*" {
			s.wildcard = false
			continue
		}
		_, subscribed := s.subscribed.res[name]
		subscribed = subscribed && !dropped[name]
		if subscribed && s.wildcard {
			// Still wanted as part of the wildcard: sent again, or named
			// removed if it no longer exists.
			held.names, held.vals = append(held.names, name), append(held.vals, heldResource{})
		} else if _, ok := s.holds.res[name]; ok {
			held.removed = append(held.removed, name)
		}
		if subscribed {
			drop.removed = append(drop.removed, name)
			dropped[name] = true
		}
	}
	s.subscribed = s.names.apply(s.subscribed, drop)
	s.holds = s.resources.apply(s.holds, held)
}

// took records that the stream was sent r.
func (s *deltaSubscription) took(r *deltaResponse) {
	s.holds = s.resources.apply(s.holds, changeOf(r.changed, r.removed))
}

// holdsAny reports whether the stream holds any of names (read only).
func (s *deltaSubscription) holdsAny(names []string) bool {
	for _, name := range names {
		if _, ok := s.holds.res[name]; ok {
			return true
		}
	}
	return false
}

// forget drops names from what the stream holds, so that the next
// evaluation sends them again whatever their versions; it reports whether
// the stream held any of them. Only while no watch of the type is parked
// (the holding may change in place).
func (s *deltaSubscription) forget(names []string) bool {
	var gone []string
	for _, name := range names {
		if _, ok := s.holds.res[name]; ok {
			gone = append(gone, name)
		}
	}
	if len(gone) == 0 {
		return false
	}
	slices.Sort(gone)
	s.holds = s.resources.apply(s.holds, change[heldResource]{removed: gone})
	return true
}

func (s *deltaSubscription) release() {
	s.names.release(s.subscribed)
	s.resources.release(s.holds)
	s.subscribed, s.holds = nil, nil
}

func (s *deltaSubscription) held() heldResources {
	return heldResources{holding: s.holds}
}

// IsWildcard reports whether the subscription is to every resource.
func (s *deltaSubscription) IsWildcard() bool { return s.wildcard }

// SubscribedResources returns the names subscribed to (read only).
func (s *deltaSubscription) SubscribedResources() map[string]struct{} { return s.subscribed.res }

func (a *adsServer) serveDelta(st deltaStream, defaultType string) error {
	c := &deltaConn{conn: newConn(a.streamIDs.Add(1)), a: a, st: st, types: map[string]*deltaType{}, debug: debugAnswered{}}
	return serveStream(a, st, defaultType, c.conn, c)
}

// handle takes one request: the tracker checks and records it, and it
// updates its type's subscription and replaces its watch. (Delta has no
// stale nonces: every request says what changes.)
func (c *deltaConn) handle(req *discoveryv3.DeltaDiscoveryRequest, defaultType string) error {
	// Stamped first: the tracker checks every request as its stream's.
	if req.Node != nil {
		c.node = req.Node // wire.RequestStream hands every request the stream's first node
	} else {
		req.Node = c.node
	}
	if req.TypeUrl != "" && !served(req.TypeUrl) {
		return c.a.tracker.onUnserved(c.conn, req.Node, req.TypeUrl)
	}
	if err := c.a.tracker.onDeltaRequest(c.conn, req); err != nil {
		return err
	}
	c.identified(c.a.watcher)
	c.trimNode()
	if req.TypeUrl == "" {
		if defaultType == resourcev3.AnyType {
			return errNoType
		}
		req.TypeUrl = defaultType
	}
	if isDebugType(req.TypeUrl) {
		return c.answerDebug(req) // answered here, never watched
	}
	t := c.types[req.TypeUrl]
	if t == nil {
		t = &deltaType{sub: newDeltaSubscription(req, c.a.names, c.a.held)}
		c.types[req.TypeUrl] = t
		if req.TypeUrl == resourcev3.EndpointType && len(c.rewarm) > 0 {
			t.sub.forget(slices.Collect(maps.Keys(c.rewarm)))
			c.rewarm = nil
		}
		c.holds(req.TypeUrl, t.sub.held())
	} else {
		if t.cancel != nil {
			t.cancel()
		}
		// A push may have answered the cancelled watch after the loop
		// last looked: it goes out now, and into what the stream holds,
		// before the new watch reads that (Delta responses are never
		// stale; each says what changes).
		replaced := t.req
		if err := c.sendQueued(); err != nil {
			return err
		}
		if t.req != replaced {
			// A CDS response just sent made resendEndpoints replace this
			// type's watch: that one ends too (its answer, if any, is
			// dropped, as this request's watch replaces it), and this
			// request's watch evaluates every name, so the endpoints it was
			// to send again go out.
			if t.cancel != nil {
				t.cancel()
			}
			c.a.watcher.renew(&c.rec, req.TypeUrl)
		}
		t.sub.update(req.ResourceNamesSubscribe, req.ResourceNamesUnsubscribe)
		c.holds(req.TypeUrl, t.sub.held())
	}
	var err error
	t.req = req
	t.cancel, err = c.a.watcher.CreateDeltaWatch(req, &t.sub, c.conn, !t.answered)
	return err
}

func (c *deltaConn) sendQueued() error {
	queued := c.out.take()
	for i, r := range queued {
		resp := r.delta
		if t := c.types[resp.GetDeltaRequest().GetTypeUrl()]; t != nil && t.req != nil && resp.DeltaRequest != t.req {
			c.a.fleet.Answer(1) // dropped: nobody will answer it
			continue
		}
		out := resp.DeltaDiscoveryResponse
		c.nonce++
		out.Nonce = strconv.FormatInt(c.nonce, 10)
		var updated []string // clusters the stream held another version of: Envoy re-warms them
		var held heldResources
		if t := c.types[out.TypeUrl]; t != nil {
			if out.TypeUrl == resourcev3.ClusterType {
				for _, r := range resp.changed {
					if _, ok := t.sub.holds.res[r.Name]; ok {
						updated = append(updated, r.Name)
					}
				}
			}
			t.sub.took(resp)
			t.answered = true
			held = t.sub.held()
		}
		c.a.tracker.onDeltaResponse(c.conn, out, held)
		if err := c.st.Send(out); err != nil {
			c.a.fleet.Answer(len(queued) - i - 1) // never sent: nobody will answer them
			return err
		}
		if err := c.resendEndpoints(updated); err != nil {
			return err
		}
	}
	return nil
}

// resendEndpoints sends the stream the endpoint assignments of clusters a
// CDS response just changed (see sotwConn.resendEndpoints); before the
// stream asks for endpoints, its first request's
// initial_resource_versions are not trusted for them.
func (c *deltaConn) resendEndpoints(names []string) error {
	if len(names) == 0 {
		return nil
	}
	t := c.types[resourcev3.EndpointType]
	if t == nil {
		if c.rewarm == nil {
			c.rewarm = rewarm{}
		}
		for _, name := range names {
			if len(c.rewarm) >= maxRewarm {
				break
			}
			c.rewarm[name] = struct{}{}
		}
		return nil
	}
	if !t.sub.holdsAny(names) {
		return nil // none of them held: nothing Envoy waits for
	}
	// Cancelled first: a push may be evaluating the parked watch, which
	// reads what the stream holds (forget changes it, possibly in place).
	if t.cancel != nil {
		t.cancel()
	}
	t.sub.forget(names)
	c.holds(resourcev3.EndpointType, t.sub.held())
	c.a.watcher.renew(&c.rec, resourcev3.EndpointType)
	var err error
	t.req = &discoveryv3.DeltaDiscoveryRequest{Node: c.node, TypeUrl: resourcev3.EndpointType}
	t.cancel, err = c.a.watcher.CreateDeltaWatch(t.req, &t.sub, c.conn, !t.answered)
	return err
}

// maxRewarm bounds the clusters a Delta stream remembers to re-warm before
// it asks for endpoints (each is a name the hub generated).
const maxRewarm = 1 << 16

func (c *deltaConn) close() {
	for _, t := range c.types {
		if t.cancel != nil {
			t.cancel()
		}
	}
	c.unpublishHeld()
	for _, t := range c.types {
		t.sub.release()
	}
	// Responses handed to the stream and never sent: nobody will answer
	// them (the pacing counts them answered). SotW's are counted by the
	// watcher (streamRecord.handed).
	c.a.fleet.Answer(len(c.out.take()))
	c.a.watcher.closeStream(&c.rec)
	c.a.tracker.onStreamClosed(c.conn)
}
