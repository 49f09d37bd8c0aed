package hub

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hubmesh/hub/hub/authz"
	"github.com/hubmesh/hub/hub/pacing"
	"github.com/hubmesh/hub/hub/xdsgen"
)

// adsServer is the hub's xDS server (docs/architecture.md §3.6): the handlers of ADS
// and of the per-type discovery services, each running one stream's loop.
// A loop holds its stream's conn (one object per stream), takes the
// stream's requests in order, has the tracker check and record them
// (proxyTracker), hands each one with the conn to the watcher as a watch
// (watcher.CreateWatch, CreateDeltaWatch) and sends what the watcher
// answers, one response at a time, from the stream's own goroutine.
//
// It keeps go-control-plane's protocol behaviour (a stale SotW nonce is
// ignored; a request replaces its type's watch; SotW and Delta wildcard
// semantics, legacy wildcard included, through go-control-plane's
// stream.Subscription for Delta and sotwSubscription for SotW) without
// its per-request work: a SotW ACK that repeats its type's last names (the
// same interned slice, see wire.RequestStream) is neither re-checked nor turned
// into a new map of names, and there is no select over a channel per
// watch.
type adsServer struct {
	// REST xDS (Fetch*) is not served: Unimplemented.
	clusterservice.UnimplementedClusterDiscoveryServiceServer
	endpointservice.UnimplementedEndpointDiscoveryServiceServer
	listenerservice.UnimplementedListenerDiscoveryServiceServer
	routeservice.UnimplementedRouteDiscoveryServiceServer

	tracker *proxyTracker
	watcher *watcher
	held    *resourceHoldings  // what the streams hold, shared
	names   *nameHoldings      // what the Delta streams subscribe to, shared
	fleet   *pacing.Deliveries // may be nil
	syncz   *syncz             // answers TypeSyncz
	admit   func(context.Context) error
	// done ends every stream (nil error): the listener's drain is over.
	done <-chan struct{}
	// streamIDs numbers the streams of every listener of the hub.
	streamIDs *atomic.Int64
}

// StreamAggregatedResources implements ADS over SotW.
func (a *adsServer) StreamAggregatedResources(st grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	return a.serveSotw(st, resourcev3.AnyType)
}

// DeltaAggregatedResources implements ADS over Delta (incremental) xDS.
func (a *adsServer) DeltaAggregatedResources(st grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	return a.serveDelta(st, resourcev3.AnyType)
}

// The per-type discovery services (CDS, EDS, LDS, RDS) are the same loops
// with a default type URL.
type (
	sotwStream  = grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
	deltaStream = grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]
)

func (a *adsServer) StreamClusters(st sotwStream) error {
	return a.serveSotw(st, resourcev3.ClusterType)
}
func (a *adsServer) StreamEndpoints(st sotwStream) error {
	return a.serveSotw(st, resourcev3.EndpointType)
}
func (a *adsServer) StreamListeners(st sotwStream) error {
	return a.serveSotw(st, resourcev3.ListenerType)
}
func (a *adsServer) StreamRoutes(st sotwStream) error { return a.serveSotw(st, resourcev3.RouteType) }
func (a *adsServer) DeltaClusters(st deltaStream) error {
	return a.serveDelta(st, resourcev3.ClusterType)
}
func (a *adsServer) DeltaEndpoints(st deltaStream) error {
	return a.serveDelta(st, resourcev3.EndpointType)
}
func (a *adsServer) DeltaListeners(st deltaStream) error {
	return a.serveDelta(st, resourcev3.ListenerType)
}
func (a *adsServer) DeltaRoutes(st deltaStream) error { return a.serveDelta(st, resourcev3.RouteType) }

var errNoType = status.Error(codes.InvalidArgument, "type URL is required for ADS")

// outbox is where a stream's watches put their responses for the stream's
// loop to send. put never blocks: a watch answers at most once, and a
// stream has at most one watch per type.
type outbox struct {
	mu    sync.Mutex
	queue []reply
	wake  chan struct{} // one slot: something was put
}

func newOutbox() *outbox { return &outbox{wake: make(chan struct{}, 1)} }

func (o *outbox) put(r reply) {
	o.mu.Lock()
	o.queue = append(o.queue, r)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// take returns what was put since the last take, oldest first.
func (o *outbox) take() []reply {
	o.mu.Lock()
	defer o.mu.Unlock()
	q := o.queue
	o.queue = nil
	return q
}

// receive reads a stream's requests on a goroutine of its own (gRPC's
// RecvMsg blocks) and hands them over one at a time; the channel closes
// when the stream ends or the loop is gone.
func receive[R any](st interface{ Recv() (*R, error) }, stop <-chan struct{}) <-chan *R {
	reqs := make(chan *R)
	go func() {
		defer close(reqs)
		for {
			req, err := st.Recv()
			if err != nil {
				return
			}
			select {
			case reqs <- req:
			case <-stop:
				return
			}
		}
	}()
	return reqs
}

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

// streamConn is a stream's state as its loop (serveStream) drives it.
type streamConn[R any] interface {
	handle(req *R, defaultType string) error
	sendQueued() error
	close()
}

// serveStream is a stream's loop: it admits and registers the stream,
// then takes its requests in order and sends what its watches answer,
// until the stream, its listener's drain or an error ends it.
func serveStream[R any](a *adsServer, st interface {
	Context() context.Context
	Recv() (*R, error)
}, defaultType string, sc *conn, c streamConn[R]) error {
	defer c.close()
	ctx := st.Context()
	if err := a.admit(ctx); err != nil {
		return err
	}
	if err := a.tracker.onStreamOpen(ctx, sc, defaultType); err != nil {
		a.tracker.onRefused(sc, err)
		return err
	}
	out := sc.out
	stop := make(chan struct{})
	defer close(stop)
	reqs := receive(st, stop)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.done:
			return nil
		case <-out.wake:
			if err := c.sendQueued(); err != nil {
				return err
			}
		case req, ok := <-reqs:
			if !ok {
				return nil
			}
			// What the watches answered before this request goes first:
			// the request may acknowledge it.
			if err := c.sendQueued(); err != nil {
				return err
			}
			if err := c.handle(req, defaultType); err != nil {
				a.tracker.onRefused(sc, err)
				return err
			}
		}
	}
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

// forgetUnread drops what the hub never reads of a node once the node was
// checked (Limits) and recorded (proxyTracker.request): a stream keeps its
// node for as long as it lives. Envoy lists every extension compiled into
// it (~130, 10–20 KB decoded), and an Istio sidecar's metadata (~17 KB
// encoded: labels, annotations, the pod's ports, the agent's settings)
// decodes to ~9 KB of structs; of the metadata only readNodeMetadata stay,
// and a proxyless gRPC node's LABELS, bounded (authz.TrimLabels).
func forgetUnread(n *corev3.Node) {
	n.Extensions, n.ClientFeatures, n.DynamicParameters = nil, nil, nil
	fields := n.GetMetadata().GetFields()
	if len(fields) == 0 {
		return
	}
	kept := map[string]*structpb.Value{}
	for _, k := range readNodeMetadata {
		if v, ok := fields[k]; ok {
			kept[k] = v
		}
	}
	trimmed := false
	if v, ok := fields["LABELS"]; ok && xdsgen.Proxyless(n) {
		kept["LABELS"] = authz.TrimLabels(v) // which policies select a proxyless server (authz.WorkloadOf)
		trimmed = kept["LABELS"] != v
	}
	if len(kept) < len(fields) || trimmed {
		n.Metadata = &structpb.Struct{Fields: kept}
	}
}

// readNodeMetadata are the node metadata keys the hub reads (as Istio
// names them): the proxy's member cluster, namespace, generator (grpc:
// proxyless; api: an istiod taking config), Istio version, network and
// service account; and, of a proxyless gRPC node only, its LABELS.
var readNodeMetadata = []string{"CLUSTER_ID", "NAMESPACE", "GENERATOR", "ISTIO_VERSION", "NETWORK", "SERVICE_ACCOUNT"}

// sameSlice reports whether a and b are the same slice (not only equal):
// an interned resource_names list (wire.RequestStream) repeated by an ACK, or
// what a stream holds published again unchanged.
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || unsafe.SliceData(a) == unsafe.SliceData(b))
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

// heldResources is what a stream holds of one type: the resources by
// name (a holding, which only the stream's loop may change, in place while
// the stream alone holds it and nobody froze it: see holdings.apply) or the
// resources of a whole-state response, with the version of the set it
// was, if a wildcard's.
type heldResources struct {
	holding *holding[heldResource] // nil: none by name
	whole   []*xdsgen.Resource
	set     string
	// sent are the resources of the whole-state response, as sent (Istio
	// config's are not xdsgen.Resources: whole is empty for them).
	sent []*anypb.Any
}

// heldResource is what a stream holds of one resource: its version and,
// when the hub sent it, the resource (nil when the stream only said it
// holds it: Delta's initial_resource_versions; or when it is to be sent
// again whatever its version: version ""). Streams that hold the same
// versions of the same resources share one holding.
type heldResource struct {
	version string
	any     *anypb.Any
}

// changeOf is what a response that sent res and removed removed does to
// what a stream holds.
func changeOf(res []*xdsgen.Resource, removed []string) change[heldResource] {
	c := change[heldResource]{names: make([]string, len(res)), vals: make([]heldResource, len(res)), removed: removed}
	for i, r := range res {
		c.names[i], c.vals[i] = r.Name, heldResource{r.Version, r.Any}
	}
	return c
}

// same reports whether h and o are the same record: the same holding and
// the very same whole-state slices.
func (h heldResources) same(o heldResources) bool {
	return h.holding == o.holding && h.set == o.set &&
		(h.whole == nil) == (o.whole == nil) && sameSlice(h.whole, o.whole) &&
		(h.sent == nil) == (o.sent == nil) && sameSlice(h.sent, o.sent)
}

// byName returns the resources held by name (nil: none).
func (h heldResources) byName() map[string]heldResource {
	if h.holding == nil {
		return nil
	}
	return h.holding.res
}

// version returns the version the stream holds of name.
func (h heldResources) version(name string) (string, bool) {
	if r, ok := h.byName()[name]; ok {
		return r.version, true
	}
	for _, r := range h.whole {
		if r.Name == name {
			return r.Version, true
		}
	}
	return "", false
}

// changed reports whether r is not what the stream holds of its name (a
// resource held by name: whole states are compared whole, see sameAs).
func (h heldResources) changed(r *xdsgen.Resource) bool {
	held, ok := h.byName()[r.Name]
	return !ok || held.version != r.Version
}

// sameAs reports whether the stream holds exactly res, a whole state
// (nothing held is the same as none).
func (h heldResources) sameAs(res []*xdsgen.Resource) bool {
	if len(h.byName()) > 0 {
		if len(res) != len(h.byName()) {
			return false
		}
		for _, r := range res {
			if h.changed(r) {
				return false
			}
		}
		return true
	}
	if len(res) != len(h.whole) {
		return false
	}
	for i, r := range res {
		if h.whole[i].Name != r.Name || h.whole[i].Version != r.Version {
			byName := make(map[string]string, len(h.whole))
			for _, w := range h.whole {
				byName[w.Name] = w.Version
			}
			for _, r := range res {
				if v, ok := byName[r.Name]; !ok || v != r.Version {
					return false
				}
			}
			return true
		}
	}
	return true
}

// anys are the resources the stream holds, in order of name for a holding
// (those it only said it holds, with no resource, left out).
func (h heldResources) anys() []*anypb.Any {
	if h.sent != nil {
		return h.sent
	}
	out := make([]*anypb.Any, 0, len(h.byName()))
	for _, name := range slices.Sorted(maps.Keys(h.byName())) {
		if a := h.byName()[name].any; a != nil {
			out = append(out, a)
		}
	}
	return out
}

// count is how many resources the stream holds.
func (h heldResources) count() int { return max(len(h.byName()), len(h.whole), len(h.sent)) }

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
