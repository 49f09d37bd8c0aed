package hub

import (
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/internal/clip"
	"github.com/hubmesh/hub/hub/xdsstatus"
)

// TypeSyncz is istiod's debug type for the sync state of its proxies
// (pilot/pkg/xds statusgen.go): `istioctl proxy-status --xds-address`
// asks for it over ADS and prints one row per proxy. The hub answers it the
// same way (docs/architecture.md §3.4): one envoy.service.status.v3.ClientConfig per
// proxy stream, its node carrying the proxy's ID and the metadata CLUSTER_ID,
// NAMESPACE and ISTIO_VERSION, and a GenericXdsConfig per type the stream
// asked for, with its sync state:
//   - ERROR: the type's last answer was a NACK (until an ACK follows),
//   - NOT_SENT: nothing of the type was sent yet,
//   - SYNCED: the last response sent was ACKed (its nonce),
//   - STALE: the last response sent is not ACKed yet.
//
// Who sees which proxies (syncz.scope): on the plaintext port every proxy,
// but only to a caller on loopback (`kubectl port-forward`, or a debug
// container in the hub's pod): the port is unauthenticated, and istiod
// refuses debug types to a caller without an identity (its
// ENABLE_DEBUG_ENDPOINT_AUTH, on by default), so any other plaintext caller
// gets Unauthenticated and a pod of any namespace cannot list the mesh's
// proxies; on the mTLS port a verified identity of our trust
// domain that its member may assert (authn.Scope): every proxy for Istio's
// root namespace asserted by a member (the home cluster or one annotated
// for it), else the proxies whose verified identity is of the caller's
// namespace, as istiod restricts non-system callers; anyone else is refused
// (an anonymous stream with Unauthenticated, see checkAnonymous; a federated
// trust domain's identity or one its member may not assert with
// PermissionDenied). Answers to mTLS callers are paced per replica, as each
// walks every stream: 2 a second (bursts of 5) per
// caller identity, 5 (bursts of 10) for the callers of one member, 10
// (bursts of 20) for all, root-namespace callers paced by the first only
// (see debugPerSecond); a request over a pace ends its stream with
// ResourceExhausted at once (istioctl says so; run it again), so no stream
// waits and one tenant cannot queue others out. The loopback operator is
// not paced.
const TypeSyncz = "istio.io/debug/syncz"

// syncz answers TypeSyncz requests from what the tracker knows.
type syncz struct {
	tracker *proxyTracker
	// roots names our trust domain (nil: no identity on the mTLS port is
	// ours, so only the plaintext port answers).
	roots authn.RootSource
	// identities decides which identities a member may assert.
	identities *authn.Scope
	// rootNamespace is Istio's root namespace ("": none): its identities
	// see every proxy.
	rootNamespace string
	// controlPlane identifies this replica in every response, as istiod's
	// does (istioctl prints its ID in the ISTIOD column).
	controlPlane *corev3.ControlPlane
	// pace paces the answers to all callers on the mTLS port, members
	// each member's callers', callers each caller's (at most debugCallers
	// of each remembered).
	pace    *rate.Limiter
	members *lru.Cache[string, *rate.Limiter]
	callers *lru.Cache[synczCaller, *rate.Limiter]
	// callerRate and callerBurst are each caller's pace.
	callerRate  rate.Limit
	callerBurst int
}

// newSyncz makes the answerer; instance is the replica's name in responses
// ("": the host name, a pod's name in Kubernetes); limits (with defaults)
// pace the answers to mTLS callers.
func newSyncz(tracker *proxyTracker, roots authn.RootSource, scope *authn.Scope, rootNamespace, instance string, limits Limits) *syncz {
	if instance == "" {
		instance, _ = os.Hostname()
	}
	callers, _ := lru.New[synczCaller, *rate.Limiter](debugCallers) // a positive size never fails
	members, _ := lru.New[string, *rate.Limiter](debugCallers)
	return &syncz{tracker: tracker, roots: roots, identities: scope, rootNamespace: rootNamespace, controlPlane: controlPlaneOf(instance),
		pace: rate.NewLimiter(debugPerSecond, debugBurst), members: members, callers: callers, callerRate: limits.debugRate, callerBurst: limits.debugBurst}
}

// allow reports whether caller id may have an answer now: its own pace,
// and unless it is an operator (Istio's root namespace) its member's and
// everyone's; a turn is taken only when every pace allows it.
func (z *syncz) allow(id synczCaller, operator bool) bool {
	lims := []*rate.Limiter{cachedLimiter(z.callers, id, z.callerRate, z.callerBurst)}
	if !operator {
		lims = append(lims, cachedLimiter(z.members, id.cluster, debugPerMemberPerSecond, debugPerMemberBurst), z.pace)
	}
	now := time.Now()
	var taken []*rate.Reservation
	for _, lim := range lims {
		r := lim.ReserveN(now, 1)
		if !r.OK() || r.DelayFrom(now) > 0 {
			r.CancelAt(now)
			for _, t := range taken {
				t.CancelAt(now)
			}
			return false
		}
		taken = append(taken, r)
	}
	return true
}

// cachedLimiter is key's limiter in cache, made with every and burst if
// it has none.
func cachedLimiter[K comparable](cache *lru.Cache[K, *rate.Limiter], key K, every rate.Limit, burst int) *rate.Limiter {
	if lim, ok := cache.Get(key); ok {
		return lim
	}
	lim := rate.NewLimiter(every, burst)
	if prev, found, _ := cache.PeekOrAdd(key, lim); found {
		return prev
	}
	return lim
}

// controlPlaneOf is istiod's control plane identifier
// (pilotxds.IstioControlPlaneInstance as JSON) for the hub: component, ID
// and build info.
func controlPlaneOf(instance string) *corev3.ControlPlane {
	type buildInfo struct {
		Version       string `json:"version"`
		GitRevision   string `json:"revision"`
		GolangVersion string `json:"golang_version"`
		BuildStatus   string `json:"status"`
		GitTag        string `json:"tag"`
	}
	info := buildInfo{Version: "unknown", GolangVersion: runtime.Version(), BuildStatus: "Clean"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" {
			info.Version, info.GitTag = v, v
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision":
				info.GitRevision = s.Value
			case s.Key == "vcs.modified" && s.Value == "true":
				info.BuildStatus = "Modified"
			}
		}
	}
	id, _ := json.Marshal(struct {
		Component string
		ID        string
		Info      buildInfo
	}{"hub", clip.String(instance, 253), info})
	return &corev3.ControlPlane{Identifier: string(id)}
}

// debugReply is what one debug request is answered with.
type debugReply struct {
	version   string
	nonce     string                  // set by adsServer.debugReply
	resources []*discoveryv3.Resource // named ClientConfigs
}

// answer builds the reply to a TypeSyncz request of stream c, or the error
// that ends the stream (PermissionDenied) when its caller may see nothing.
// A caller on the mTLS port over its pace gets ResourceExhausted.
func (z *syncz) answer(c *conn) (debugReply, error) {
	sc, err := z.scope(c)
	if err != nil {
		return debugReply{}, err
	}
	if !sc.loopback && !z.allow(sc.caller, sc.all) {
		return debugReply{}, status.Errorf(codes.ResourceExhausted, "%s answers each identity at most %v times a second (bursts of %d), a member's identities %d times and everyone %d times; try again shortly", TypeSyncz, float64(z.callerRate), z.callerBurst, debugPerMemberPerSecond, debugPerSecond)
	}
	rows := z.tracker.syncRows(sc.all, sc.namespace)
	out := debugReply{version: time.Now().UTC().Format(time.RFC3339Nano), resources: make([]*discoveryv3.Resource, 0, len(rows))}
	for _, r := range rows {
		cc := &statusv3.ClientConfig{
			Node: &corev3.Node{Id: r.id, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				"CLUSTER_ID":    structpb.NewStringValue(r.cluster),
				"NAMESPACE":     structpb.NewStringValue(r.namespace),
				"ISTIO_VERSION": structpb.NewStringValue(r.istioVersion),
			}}},
			GenericXdsConfigs: make([]*statusv3.ClientConfig_GenericXdsConfig, 0, len(r.types)),
		}
		for _, ts := range r.types {
			g := &statusv3.ClientConfig_GenericXdsConfig{TypeUrl: ts.TypeURL, ConfigStatus: syncStatus(ts), VersionInfo: ts.SentVersion}
			if !ts.SentAt.IsZero() {
				g.LastUpdated = timestamppb.New(ts.SentAt)
			}
			if g.ConfigStatus == statusv3.ConfigStatus_ERROR {
				g.ErrorState = &adminv3.UpdateFailureState{LastUpdateAttempt: timestamppb.New(ts.NackedAt), Details: ts.NackError, VersionInfo: ts.NackedVersion}
			}
			cc.GenericXdsConfigs = append(cc.GenericXdsConfigs, g)
		}
		a, err := anypb.New(cc)
		if err != nil {
			return debugReply{}, status.Errorf(codes.Internal, "encoding the sync state of %s: %v", clip.String(r.id, 256), err)
		}
		out.resources = append(out.resources, &discoveryv3.Resource{Name: r.id, Resource: a})
	}
	return out, nil
}

// synczScope is what a stream may see: every proxy (all) or those of one
// namespace; loopback marks the plaintext operator on loopback, caller the
// verified identity (member and namespace) of anyone else.
type synczScope struct {
	all       bool
	namespace string
	loopback  bool
	caller    synczCaller
}

// synczCaller is whom a caller's pace belongs to: a namespace as a member
// proves it (a member's proxies cannot take another member's turns).
type synczCaller struct{ cluster, namespace string }

func callerOf(id authn.Identity) synczCaller { return synczCaller{id.Cluster, id.Namespace} }

// scope decides what stream c may see, or that it may see nothing (an
// error: Unauthenticated or PermissionDenied).
func (z *syncz) scope(c *conn) (synczScope, error) {
	plaintext, id, addr := c.state.plaintext, c.state.ident, c.state.status.Address // c's loop asks
	if plaintext {
		if !loopbackAddr(addr) {
			return synczScope{}, status.Errorf(codes.Unauthenticated, "%s on the plaintext port answers loopback callers only (kubectl port-forward to the hub's pod); elsewhere use the mTLS port with a workload identity", TypeSyncz)
		}
		return synczScope{all: true, loopback: true}, nil
	}
	local := ""
	if z.roots != nil {
		local = z.roots.LocalTrustDomain()
	}
	if local == "" || !id.Verified(local) {
		return synczScope{}, status.Errorf(codes.PermissionDenied, "%s on the mTLS port needs a workload identity of trust domain %q (a client certificate or service-account token); a federated trust domain's proves no namespace of ours", TypeSyncz, local)
	}
	if err := z.identities.Allow(id.Cluster, id.Namespace); err != nil {
		return synczScope{}, status.Errorf(codes.PermissionDenied, "%s: %v", TypeSyncz, err)
	}
	// The root namespace sees everything only with a member that may
	// assert it (the home cluster, or annotated); a certificate bound to
	// no member proves no member's consent, so it sees its namespace only.
	if z.rootNamespace != "" && id.Namespace == z.rootNamespace && id.Cluster != "" {
		return synczScope{all: true, caller: callerOf(id)}, nil
	}
	return synczScope{namespace: id.Namespace, caller: callerOf(id)}, nil
}

// syncStatus is a type's sync state as istiod's statusgen works it out
// (see TypeSyncz).
func syncStatus(ts xdsstatus.Type) statusv3.ConfigStatus {
	switch {
	case ts.Nacks > 0 && ts.NackedAt.After(ts.AckedAt):
		return statusv3.ConfigStatus_ERROR
	case ts.SentNonce == "":
		return statusv3.ConfigStatus_NOT_SENT
	case ts.AckedNonce == ts.SentNonce:
		return statusv3.ConfigStatus_SYNCED
	}
	return statusv3.ConfigStatus_STALE
}

// syncRow is one proxy stream as TypeSyncz lists it.
type syncRow struct {
	id, cluster, namespace, istioVersion string
	stream                               int64
	types                                []xdsstatus.Type // by type URL
}

// syncRows lists the proxy streams a caller may see (every one when all,
// else those whose verified identity is of our trust domain and of
// namespace), by proxy ID then stream. Streams that sent no node, and
// streams that asked for debug types only (istioctl's own), are left out.
func (p *proxyTracker) syncRows(all bool, namespace string) []syncRow {
	local := ""
	if p.roots != nil {
		local = p.roots.LocalTrustDomain()
	}
	conns := p.open()
	rows := make([]syncRow, 0, len(conns))
	for _, c := range conns {
		if r, ok := syncRowOf(&c.shown, c.id, all, namespace, local); ok {
			rows = append(rows, r)
		}
	}
	for i := range rows {
		slices.SortFunc(rows[i].types, func(a, b xdsstatus.Type) int { return strings.Compare(a.TypeURL, b.TypeURL) })
	}
	slices.SortFunc(rows, func(a, b syncRow) int {
		if c := strings.Compare(a.id, b.id); c != 0 {
			return c
		}
		return int(a.stream - b.stream)
	})
	return rows
}

// debugOnly reports whether a stream asked for debug types only.
func debugOnly(asked []string) bool {
	if len(asked) == 0 {
		return false
	}
	for _, typeURL := range asked {
		if !isDebugType(typeURL) {
			return false
		}
	}
	return true
}

// debugAnswered is a stream's loop state for its debug types: the nonce of
// each one's last response. A debug type is answered once per request, not
// pushed: on its first request on the stream and on every request that
// names no response nonce; an ACK or NACK of its response (or a stale
// nonce) is not answered (as istiod answers an ACK of a debug type).
type debugAnswered map[string]string

// wants reports whether a request of a debug type gets a response.
func (d debugAnswered) wants(typeURL, responseNonce string) bool {
	_, answered := d[typeURL]
	return !answered || responseNonce == ""
}

// answerDebug answers a SotW debug request on c's stream, from its loop.
func (c *sotwConn) answerDebug(req *discoveryv3.DiscoveryRequest) error {
	reply, ok, err := c.a.debugReply(c.conn, c.debug, req.TypeUrl, req.ResponseNonce)
	if !ok {
		return err
	}
	anys := make([]*anypb.Any, len(reply.resources))
	for i, r := range reply.resources {
		anys[i] = r.Resource
	}
	out := &discoveryv3.DiscoveryResponse{TypeUrl: req.TypeUrl, VersionInfo: reply.version, Resources: anys,
		Nonce: reply.nonce, ControlPlane: c.a.syncz.controlPlane}
	c.a.debugSent(c.conn, out.TypeUrl, out.VersionInfo, out.Nonce, len(anys), proto.Size(out))
	return c.st.Send(out)
}

// answerDebug answers a Delta debug request on c's stream, from its loop:
// the whole list every time (a debug type keeps no state to diff against).
func (c *deltaConn) answerDebug(req *discoveryv3.DeltaDiscoveryRequest) error {
	reply, ok, err := c.a.debugReply(c.conn, c.debug, req.TypeUrl, req.ResponseNonce)
	if !ok {
		return err
	}
	for _, r := range reply.resources {
		r.Version = reply.version
	}
	out := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: req.TypeUrl, SystemVersionInfo: reply.version, Resources: reply.resources,
		Nonce: reply.nonce, ControlPlane: c.a.syncz.controlPlane}
	c.a.debugSent(c.conn, out.TypeUrl, out.SystemVersionInfo, out.Nonce, len(reply.resources), proto.Size(out))
	return c.st.Send(out)
}

// debugReply builds the reply to a debug request of stream c, with the
// stream's next nonce, unless the request gets none (ok false; err ends the
// stream).
func (a *adsServer) debugReply(c *conn, answered debugAnswered, typeURL, responseNonce string) (debugReply, bool, error) {
	if !answered.wants(typeURL, responseNonce) {
		return debugReply{}, false, nil
	}
	reply, err := a.syncz.answer(c)
	if err != nil {
		return debugReply{}, false, err
	}
	c.nonce++
	reply.nonce = strconv.FormatInt(c.nonce, 10)
	answered[typeURL] = reply.nonce
	return reply, true, nil
}

// debugSent records a debug response about to be sent: the tracker knows
// its nonce, and the pacing counts it handed (its ACK answers it).
func (a *adsServer) debugSent(c *conn, typeURL, version, nonce string, resources, size int) {
	a.tracker.onDebugResponse(c, typeURL, version, nonce, resources, size)
	a.fleet.Hand()
}

// onDebugResponse records a debug response sent: its nonce, so that the
// ACK is recognised, but not its resources (what other proxies' state was
// is not something the stream holds).
func (p *proxyTracker) onDebugResponse(c *conn, typeURL, version, nonce string, resources, size int) {
	p.response(c, typeURL, version, nonce, resources, size)
}

// syncRowOf is the row of the stream that shows shown, as published;
// false when the caller may not see it (see syncRows), or it sent no node,
// or it asked for debug types only.
func syncRowOf(shown *shownStream, stream int64, all bool, namespace, local string) (syncRow, bool) {
	f := shown.facts.Load()
	if f.status.ID == "" || debugOnly(f.asked) {
		return syncRow{}, false
	}
	ns, verified := f.status.Namespace, false
	if !f.ident.SpiffeID.IsZero() {
		ns, verified = f.ident.Namespace, f.ident.Verified(local)
	}
	if !all && (!verified || ns != namespace) {
		return syncRow{}, false
	}
	r := syncRow{id: f.status.ID, cluster: f.status.Cluster, namespace: ns, istioVersion: f.status.IstioVersion, stream: stream}
	sent := map[string]bool{}
	for _, t := range shown.shownTypes() {
		if ts := t.status.Load(); ts != nil && !isDebugType(ts.TypeURL) {
			r.types = append(r.types, *ts)
			sent[ts.TypeURL] = true
		}
	}
	for _, typeURL := range f.asked {
		if !sent[typeURL] && !isDebugType(typeURL) {
			r.types = append(r.types, xdsstatus.Type{TypeURL: typeURL})
		}
	}
	return r, true
}

// loopbackAddr reports whether addr (a peer's "host:port") is a loopback
// address of a caller in the hub's own network namespace. Istio's
// sidecar delivers inbound connections from 127.0.0.6 (its
// InboundPassthroughBindIpv4; the IPv6 one, ::6, is not loopback): behind
// a sidecar every caller, from anywhere, would be "loopback", so that
// address is not.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	return ip.IsLoopback() && ip != istioInboundPassthrough
}

// istioInboundPassthrough is the source address of the connections an
// Istio sidecar passes to its pod's application (istio/istio
// pkg/config/constants InboundPassthroughBindIpv4).
var istioInboundPassthrough = netip.MustParseAddr("127.0.0.6")
