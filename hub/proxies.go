package hub

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/internal/clip"
	"github.com/hubmesh/hub/hub/pacing"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/mcp"
)

// proxyTracker follows every ADS stream as its loop (adsServer) reports
// it: who is connected, what was sent, what was ACKed or NACKed. Its
// checks and records run on the stream's loop, which alone writes the
// stream's state; readers (the API, other streams' TypeSyncz) read what
// the loop published (shownStream), taking no lock of the stream's (but the
// holdings' lock for an instant, to freeze what they read of a holding).
type proxyTracker struct {
	trackerInputs
	mu        sync.Mutex          // guards streams
	streams   map[*conn]struct{}  // the open streams
	perSecond xdsstatus.PerSecond // responses sent

	connected   prometheus.Gauge
	sentByLabel sync.Map // type label → sentCounters
	responses   *prometheus.CounterVec
	bytes       *prometheus.CounterVec
	nacks       *prometheus.CounterVec
	unserved    prometheus.Counter
	refused     *xdsstatus.Refusals
}

// streamState is what the tracker checks and shows of a stream: its
// verified identity, its status, the nonces it was sent and each type's
// protocol state. It is part of the stream's conn and its loop's alone (no
// lock): what others see of it is what the loop publishes (conn.shown).
type streamState struct {
	ident   authn.Identity
	claimed string          // the member the proxy says it is in (may differ from ident.Cluster)
	token   string          // a bearer token still to be reviewed (mTLS streams without a certificate)
	ctx     context.Context // the stream's, for that review
	node    *corev3.Node
	status  xdsstatus.Proxy       // but Types: those are types'
	types   map[string]*typeState // by type URL
	nonces  map[string]sent       // per stream (nonces are unique per stream)
	// asked are the type URLs the stream asked for (see check).
	asked map[string]struct{}
	// anonymous is a stream on the mTLS listener with neither a client
	// certificate nor a bearer token: it may read Istio config and nothing
	// else (see checkAnonymous).
	anonymous bool
	// plaintext is a stream on the plaintext listener (no TLS at all).
	plaintext bool
}

// sent is what a response carried: the type and version a nonce names.
type sent struct{ typeURL, version string }

// typeState is the protocol state of one type on a stream, as its loop
// last published it: the type's status (copied on write: the loop reads
// it too) and what the stream holds of the type.
type typeState struct {
	typeURL string
	status  atomic.Pointer[xdsstatus.Type] // nil until a response is sent
	held    atomic.Pointer[heldResources]  // its byName may change in place until frozen (holdings.freeze)
}

// shownStream is what a stream shows to readers other than its loop: the
// API, and other streams' TypeSyncz. The loop publishes immutable values
// after each change it makes (publishFacts, typeState's status and held), so
// that a reader never waits for a stream, nor a stream for a reader.
type shownStream struct {
	facts atomic.Pointer[streamFacts]
	types atomic.Pointer[[]*typeState] // in no order; replaced when a type is added
}

// streamFacts is who a stream is and what it asked for, as published.
type streamFacts struct {
	status xdsstatus.Proxy // but Types
	ident  authn.Identity
	asked  []string // the type URLs the stream asked for, in no order
}

// publishFacts publishes what the loop changed of the stream's status,
// identity or asked types: a new node, claim or identity, or an unserved
// request (rare, against a response's per type).
func (c *conn) publishFacts() {
	st := &c.state
	c.shown.facts.Store(&streamFacts{status: st.status, ident: st.ident, asked: slices.Collect(maps.Keys(st.asked))})
}

// typeState returns the stream's state of typeURL, made (and published)
// on first use.
func (c *conn) typeState(typeURL string) *typeState {
	ts := c.state.types[typeURL]
	if ts == nil {
		ts = &typeState{typeURL: typeURL}
		c.state.types[typeURL] = ts
		list := slices.Collect(maps.Values(c.state.types))
		c.shown.types.Store(&list)
	}
	return ts
}

// current returns a copy of the type's status, for the loop to change
// and publish (status.Store).
func (t *typeState) current() xdsstatus.Type {
	if v := t.status.Load(); v != nil {
		return *v
	}
	return xdsstatus.Type{TypeURL: t.typeURL}
}

// shownTypes returns what the stream published of its types.
func (s *shownStream) shownTypes() []*typeState {
	if l := s.types.Load(); l != nil {
		return *l
	}
	return nil
}

// status returns the stream's status as published, its types in the
// order they are shown.
func (s *shownStream) status() xdsstatus.Proxy {
	types := s.shownTypes()
	out := s.facts.Load().status
	out.Types = make([]xdsstatus.Type, 0, len(types))
	for _, t := range types {
		if ts := t.status.Load(); ts != nil {
			out.Types = append(out.Types, *ts)
		}
	}
	sort.Slice(out.Types, func(i, j int) bool {
		a, b := xdsTypeOf(out.Types[i].TypeURL).shown, xdsTypeOf(out.Types[j].TypeURL).shown
		if a != b {
			return a < b
		}
		return out.Types[i].TypeURL < out.Types[j].TypeURL
	})
	return out
}

// trackerInputs are what the tracker checks streams with and whom it
// tells, built before it (Hub.New).
type trackerInputs struct {
	log    *slog.Logger
	limits Limits
	// tokens authenticates service-account tokens on mTLS streams that
	// carry no client certificate; nil rejects them.
	tokens *authn.TokenAuth
	// roots checks that a client certificate's member binding comes from
	// our own CA; nil honours no binding.
	roots authn.RootSource
	// fleet counts the responses clients answered (may be nil).
	fleet *pacing.Deliveries
	// held is where the stream loops' holdings of resources come from
	// (required): the API freezes one before it reads it (config).
	held *resourceHoldings
}

func newProxyTracker(in trackerInputs) *proxyTracker {
	return &proxyTracker{
		trackerInputs: in,
		streams:       map[*conn]struct{}{},
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hub_xds_connected_streams", Help: "Open ADS streams.",
		}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_xds_responses_total", Help: "xDS responses sent, by type (\"other\" for a type the hub does not serve).",
		}, []string{"type"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_xds_response_bytes_total", Help: "Bytes of the xDS responses sent (encoded messages), by type (\"MCP\" for Istio config, \"other\" for a type the hub does not serve).",
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_xds_nacks_total", Help: "xDS responses rejected by clients, by type (\"other\" for a type the hub does not serve).",
		}, []string{"type"}),
		refused: xdsstatus.NewRefusals(),
		unserved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hub_xds_unserved_requests_total", Help: "xDS requests for types the hub does not serve (e.g. pilot-agent's NDS, PCDS and health), ignored as istiod ignores them; the stream stays.",
		}),
	}
}

func (p *proxyTracker) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.connected, p.responses, p.bytes, p.nacks, p.unserved, p.refused.Collector()}
}

// onRefused records that c's stream ends refused with err because of what
// its client sent: counted by code, kept among the recent refusals
// (Hub.RefusedStreams) and logged, so the operator sees what the client
// was told.
func (p *proxyTracker) onRefused(c *conn, err error) {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied, codes.FailedPrecondition, codes.OutOfRange:
	default:
		return // the hub's own state (a full hub, a drain), not what the client sent
	}
	st := c.state.status // on the stream's loop
	p.refused.Record(st, c.node, err)
	s := status.Convert(err)
	id := st.ID
	if id == "" {
		id = c.node.GetId()
	}
	p.log.Warn("xDS stream refused", "proxy", clip.String(id, 256), "address", st.Address, "identity", st.Identity,
		"code", s.Code().String(), "reason", clip.String(s.Message(), 512))
}

// onUnserved records a request for a type the hub does not serve, which
// is ignored as istiod ignores it: nothing of it is kept but a count, and
// the stream stays. A node it carries is checked as any request's is, so
// no client can park an oversized one behind an unserved type.
func (p *proxyTracker) onUnserved(c *conn, node *corev3.Node, typeURL string) error {
	if node != nil && c.state.node != node {
		if err := p.limits.checkNode(node); err != nil {
			return err
		}
	}
	p.unserved.Inc()
	c.state.status.Unserved++
	c.publishFacts()
	if c.state.status.Unserved == 1 {
		p.log.Debug("xDS request for a type the hub does not serve ignored", "proxy", clip.String(node.GetId(), 256), "type", clip.String(typeURL, 128))
	}
	return nil
}

// onStreamOpen registers a stream. On the mTLS listener a stream that
// presents neither a verified client certificate nor a service-account token
// (checked on its first request) is anonymous: an istiod reading its config
// sources over SIMPLE TLS, which can present neither (istio#33143). It may
// open Istio config types only (checkAnonymous); a per-type discovery
// service (CDS, EDS, LDS, RDS) is refused with Unauthenticated at once.
// Anonymous streams count against the stream limit like any other.
func (p *proxyTracker) onStreamOpen(ctx context.Context, c *conn, typ string) error {
	st := &c.state
	*st = streamState{
		status: xdsstatus.Proxy{Stream: c.id, ConnectedAt: time.Now()}, ctx: ctx,
		types: map[string]*typeState{}, nonces: map[string]sent{},
	}
	secure := false
	if pr, ok := peer.FromContext(ctx); ok {
		st.status.Address = pr.Addr.String()
		var info credentials.TLSInfo
		info, secure = pr.AuthInfo.(credentials.TLSInfo)
		st.ident.SpiffeID, st.ident.Namespace = authn.PeerIdentity(pr)
		if !st.ident.SpiffeID.IsZero() {
			st.status.Identity = st.ident.SpiffeID.String()
			st.ident.Cluster = authn.MemberBinding(info.State.PeerCertificates, p.roots)
			st.status.Cluster = st.ident.Cluster
		}
	}
	claimed := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("clusterid"); len(v) > 0 {
			claimed = v[0] // docs/architecture.md §3.4: the ClusterID header, unless metadata says otherwise
		}
		// A token is only worth reviewing where secrets can be served: on
		// the mTLS listener, from a client without a certificate.
		if secure && st.ident.SpiffeID.IsZero() {
			st.token = authn.BearerToken(md)
		}
	}
	st.plaintext = !secure
	if secure && st.ident.SpiffeID.IsZero() && st.token == "" {
		st.anonymous = true
		if typ != resourcev3.AnyType {
			return errAnonymousType(typ)
		}
	}
	p.claim(st, claimed)
	c.publishFacts()
	p.mu.Lock()
	if len(p.streams) >= p.limits.MaxStreams {
		p.mu.Unlock()
		return errTooManyStreams(p.limits.MaxStreams)
	}
	p.streams[c] = struct{}{}
	p.mu.Unlock()
	p.connected.Inc()
	return nil
}

// claim records the member cluster a proxy says it is in (node metadata
// CLUSTER_ID or the ClusterID header), for the stream's loop to publish. A token's member is
// where it was reviewed, whatever the proxy says later. A certificate bound
// to a member (see trust.MemberOID) that claims another one is in conflict:
// it gets no Kubernetes Secrets, which is logged once and shown in status.
// An unbound certificate's claim is only shown: it proves nothing.
func (p *proxyTracker) claim(st *streamState, member string) {
	if member == "" || st.ident.FromToken {
		return
	}
	st.claimed = member
	switch {
	case st.ident.Cluster == "":
		st.status.Cluster = member
	case member != st.ident.Cluster && st.ident.Conflict == "":
		st.ident.Conflict = member
		st.status.Warning = fmt.Sprintf("claims member cluster %q but its certificate is bound to %q: no Kubernetes Secrets are served to it", clip.String(member, 64), st.ident.Cluster)
		p.log.Warn("xDS proxy claims another member than its certificate proves; no Kubernetes Secrets are served to it",
			"proxy", clip.String(st.status.ID, 256), "identity", st.status.Identity, "certificateMember", st.ident.Cluster, "claimedMember", clip.String(member, 64))
	}
}

// onStreamClosed forgets a stream. It is called also for streams whose
// open was refused (rate limit), which were never counted.
func (p *proxyTracker) onStreamClosed(c *conn) {
	p.mu.Lock()
	if _, ok := p.streams[c]; !ok {
		p.mu.Unlock()
		return
	}
	delete(p.streams, c)
	p.mu.Unlock()
	p.fleet.Answer(len(c.state.nonces)) // lost with the stream
	p.connected.Dec()
}

// onStreamRequest checks and records a SotW request. repeated says its
// names are the very list of its type's last request on the stream (an
// ACK's interned names, see wire.RequestStream): checked and recorded then.
func (p *proxyTracker) onStreamRequest(c *conn, req *discoveryv3.DiscoveryRequest, repeated bool) error {
	if err := p.check(c, req.GetNode(), req.GetTypeUrl()); err != nil {
		return err
	}
	if !repeated {
		if err := p.limits.checkNames(req.GetTypeUrl(), len(req.GetResourceNames()), req.GetResourceNames()); err != nil {
			return err
		}
	}
	if err := p.authenticate(c, req.GetNode()); err != nil {
		return err
	}
	p.request(c, req.GetNode(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
	return nil
}

func (p *proxyTracker) onDeltaRequest(c *conn, req *discoveryv3.DeltaDiscoveryRequest) error {
	if err := p.check(c, req.GetNode(), req.GetTypeUrl()); err != nil {
		return err
	}
	// What the stream subscribes to in all is checked by the watcher; here
	// what this request adds, before the stream's loop keeps it.
	initial := make([]string, 0, len(req.GetInitialResourceVersions()))
	for name := range req.GetInitialResourceVersions() {
		initial = append(initial, name)
	}
	if err := p.limits.checkNames(req.GetTypeUrl(), len(req.GetResourceNamesSubscribe())+len(initial), req.GetResourceNamesSubscribe(), initial); err != nil {
		return err
	}
	if err := p.authenticate(c, req.GetNode()); err != nil {
		return err
	}
	p.request(c, req.GetNode(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
	return nil
}

// check refuses, before anything of it is kept, a request for a type the
// hub does not serve, one an anonymous stream may not read (checkAnonymous)
// and a node larger than any real client's (measured
// once per node: the stream's loop stamps later requests with its first node).
func (p *proxyTracker) check(c *conn, node *corev3.Node, typeURL string) error {
	if err := checkRequestType(typeURL); err != nil {
		return err
	}
	st := &c.state
	if err := checkAnonymous(st, typeURL); err != nil {
		return err
	}
	if node == nil {
		return nil
	}
	known := st.node == node
	// Istio config type URLs are the client's words (any
	// <group>/<version>/<Kind> is answered): bound how many one
	// stream may open, each costs the stream's loop and the tracker state.
	if _, ok := st.asked[typeURL]; !ok {
		if len(st.asked) >= maxTypesPerStream {
			return status.Errorf(codes.InvalidArgument, "more than %d resource types on one stream", maxTypesPerStream)
		}
		if st.asked == nil {
			st.asked = map[string]struct{}{}
		}
		st.asked[typeURL] = struct{}{}
		c.publishFacts()
	}
	if known {
		return nil
	}
	return p.limits.checkNode(node)
}

// checkAnonymous refuses, on an anonymous stream of the mTLS listener, any
// type URL but Istio config's (mcp.IsConfigType): that is all istiod's
// config-source client asks for, and all such a stream may read. The refusal
// ends the stream, whatever it opened before.
func checkAnonymous(st *streamState, typeURL string) error {
	if !st.anonymous || mcp.IsConfigType(typeURL) {
		return nil
	}
	return errAnonymousType(typeURL)
}

func errAnonymousType(typeURL string) error {
	return status.Errorf(codes.Unauthenticated, "xDS type %s on the mTLS port needs a client certificate of a trusted trust domain or a Kubernetes service-account token (authorization: Bearer); without either a stream may read only Istio config (<group>/<version>/<Kind>, as istiod's configSources do)", typeLabel(typeURL))
}

// maxTypesPerStream bounds the resource types one stream may ask for:
// Envoy asks for five, istiod for sixteen.
const maxTypesPerStream = 64

// authenticate reviews a stream's bearer token once, on its first request,
// in the member cluster the proxy names (node metadata CLUSTER_ID, else the
// ClusterID header). A rejected token ends the stream with Unauthenticated,
// as istiod does; the identity it proves is pinned to that cluster.
func (p *proxyTracker) authenticate(c *conn, node *corev3.Node) error {
	st := &c.state
	if st.token == "" {
		return nil
	}
	token, cluster, ctx := st.token, st.claimed, st.ctx
	st.token = ""
	if member := node.GetMetadata().GetFields()["CLUSTER_ID"].GetStringValue(); member != "" {
		cluster = member
	}
	if cluster == "" {
		return status.Error(codes.Unauthenticated, "a service-account token is checked in the proxy's own member cluster: set node metadata CLUSTER_ID or the ClusterID header")
	}
	ident, err := p.tokens.Authenticate(ctx, cluster, token, 0)
	if err != nil {
		p.log.Warn("xDS stream rejected: service-account token not accepted", "proxy", node.GetId(), "cluster", clip.String(cluster, 64), "error", err)
		return status.Errorf(authn.TokenErrorCode(err), "service-account token not accepted by cluster %s: %v", clip.String(cluster, 64), err)
	}
	st.ident = ident
	st.status.Identity, st.status.Cluster = ident.SpiffeID.String(), cluster
	c.publishFacts()
	return nil
}

// request records a request: the node on first sight, and whether it ACKs
// or NACKs the response its nonce names. What is recorded is what that
// response carried (its type and version), never the client's words, but
// for a NACK's error detail, which is truncated.
func (p *proxyTracker) request(c *conn, node *corev3.Node, nonce, nackMsg string, nack bool) {
	st := &c.state
	// The stream's loop stamps every request with the stream's first node:
	// a node not seen before is that one, recorded and identified once.
	if node != nil && node != st.node {
		if st.status.ID == "" {
			st.status.ID = node.GetId()
			st.status.Namespace = node.GetMetadata().GetFields()["NAMESPACE"].GetStringValue()
			st.status.ConfigSubscriber = node.GetMetadata().GetFields()["GENERATOR"].GetStringValue() == "api"
			st.status.IstioVersion = clip.String(node.GetMetadata().GetFields()["ISTIO_VERSION"].GetStringValue(), 64)
			st.status.Proxyless = xdsgen.Proxyless(node)
		}
		p.claim(st, node.GetMetadata().GetFields()["CLUSTER_ID"].GetStringValue())
		st.node = node
		c.publishFacts()
	}
	if nonce == "" {
		return
	}
	s, ok := st.nonces[nonce]
	if !ok {
		return
	}
	delete(st.nonces, nonce)
	p.fleet.Answer(1)
	t := c.typeState(s.typeURL)
	ts := t.current()
	if nack {
		ts.NackedVersion, ts.NackError, ts.NackedAt = s.version, clip.String(nackMsg, maxNackDetailBytes), time.Now()
		ts.Nacks++
		p.nacks.WithLabelValues(typeLabel(s.typeURL)).Inc()
	} else {
		ts.AckedVersion, ts.AckedNonce, ts.AckedAt = s.version, nonce, time.Now()
	}
	t.status.Store(&ts)
}

// onStreamResponse records a SotW response about to be sent and what the
// stream holds of its type once it is (sotwSubscription.took).
func (p *proxyTracker) onStreamResponse(c *conn, resp *discoveryv3.DiscoveryResponse, held heldResources, incremental bool) {
	resources := len(resp.GetResources())
	if incremental {
		resources = held.count() // what it holds, not what this response carried
	}
	p.response(c, resp.GetTypeUrl(), resp.GetVersionInfo(), resp.GetNonce(), resources, proto.Size(resp)).held.Store(&held)
}

// onDeltaResponse is onStreamResponse for Delta.
func (p *proxyTracker) onDeltaResponse(c *conn, resp *discoveryv3.DeltaDiscoveryResponse, held heldResources) {
	p.response(c, resp.GetTypeUrl(), resp.GetSystemVersionInfo(), resp.GetNonce(), len(resp.GetResources()), proto.Size(resp)).held.Store(&held)
}

// holds publishes what the stream holds of typeURL after its loop changed
// it other than by a response (a request's names, a resource to send
// again); an ACK, which changes nothing, publishes nothing.
func (c *conn) holds(typeURL string, held heldResources) {
	t := c.typeState(typeURL)
	if prev := t.held.Load(); prev == nil || !prev.same(held) {
		t.held.Store(&held)
	}
}

// response records (and publishes) a sent response of size bytes and
// returns its type's state.
func (p *proxyTracker) response(c *conn, typeURL, version, nonce string, resources, size int) *typeState {
	now := time.Now()
	m := p.sentMetrics(typeURL)
	m.responses.Inc()
	m.bytes.Add(float64(size))
	p.perSecond.Count(now)
	st := &c.state
	t := c.typeState(typeURL)
	ts := t.current()
	ts.SentVersion, ts.SentNonce, ts.SentAt, ts.Resources = version, nonce, now, resources
	ts.Sends++
	t.status.Store(&ts)
	st.nonces[nonce] = sent{typeURL, version}
	if len(st.nonces) > 64 { // a client that never answers must not grow this forever
		p.fleet.Answer(len(st.nonces) - 1) // given up on
		clear(st.nonces)
		st.nonces[nonce] = sent{typeURL, version}
	}
	return t
}

// sentCounters are the counters of the responses sent of one type label.
type sentCounters struct{ responses, bytes prometheus.Counter }

// sentMetrics returns the counters of typeURL's label, made once per label
// (a label lookup costs more than the response's other bookkeeping).
func (p *proxyTracker) sentMetrics(typeURL string) sentCounters {
	label := typeLabel(typeURL)
	if m, ok := p.sentByLabel.Load(label); ok {
		return m.(sentCounters)
	}
	m := sentCounters{p.responses.WithLabelValues(label), p.bytes.WithLabelValues(label)}
	p.sentByLabel.Store(label, m)
	return m
}

// proxies lists every open stream, by proxy ID then stream, with what
// server (nil: not shown) says the policies make of its inbound listeners.
func (p *proxyTracker) proxies(server func(*streamRecord) *xdsstatus.ServerSecurity) []xdsstatus.Proxy {
	conns := p.open()
	out := make([]xdsstatus.Proxy, 0, len(conns))
	for _, c := range conns {
		out = append(out, c.shown.status())
	}
	if server != nil {
		for i, c := range conns {
			out[i].Server = server(&c.rec)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ID != out[j].ID {
			return out[i].ID < out[j].ID
		}
		return out[i].Stream < out[j].Stream
	})
	return out
}

// config returns the newest stream of a proxy and what it last received.
func (p *proxyTracker) config(id string, server func(*streamRecord) *xdsstatus.ServerSecurity) (xdsstatus.ProxyConfig, bool) {
	var found *conn
	for _, c := range p.open() {
		if c.shown.facts.Load().status.ID == id && (found == nil || c.id > found.id) {
			found = c
		}
	}
	if found == nil {
		return xdsstatus.ProxyConfig{}, false
	}
	types := found.shown.shownTypes()
	res := make(map[string][]*anypb.Any, len(types))
	for _, t := range types {
		held := t.held.Load()
		if held == nil {
			continue
		}
		// The loop may change a holding in place while it alone holds
		// it; frozen, it never changes again and is read without a lock.
		p.held.freeze(held.holding)
		if held.whole != nil || len(held.byName()) > 0 {
			res[t.typeURL] = held.anys()
		}
	}
	pc := xdsstatus.ProxyConfig{Proxy: found.shown.status(), Resources: res}
	if server != nil {
		pc.Proxy.Server = server(&found.rec)
	}
	return pc, true
}

// pushesPerSecond returns the responses sent in each of the last 60
// seconds, oldest first.
func (p *proxyTracker) pushesPerSecond() []int { return p.perSecond.Last60(time.Now()) }

// open returns the open streams (in no order).
func (p *proxyTracker) open() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Keys(p.streams))
}

// ResourceName reads field 1 of an encoded xDS resource without decoding
// the rest: the name of a Cluster, ClusterLoadAssignment (cluster_name),
// Listener, RouteConfiguration or Secret. It returns "" when the bytes do not
// parse. Load tools use it too, to follow thousands of streams cheaply.
func ResourceName(b []byte) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return ""
			}
			return v
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}
