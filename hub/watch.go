package hub

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/authz"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/pacing"
	"github.com/hubmesh/hub/hub/sds"
	"github.com/hubmesh/hub/hub/wire"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/mcp"
)

// watcher decides what each stream gets and when (docs/architecture.md §3.6); the
// stream loops (adsServer) hand it every request as a watch. A request is answered at once when
// the stream lacks something it subscribes to; otherwise the watch is parked
// until a push changes it. Because the comparison is against what was sent
// (not what was acknowledged), a NACKed version is never resent until an
// input changes.
//
// SotW responses for EDS, RDS and SDS subscriptions by name carry only the
// resources the stream does not hold yet: the protocol requires the whole
// state only for LDS, CDS and wildcard subscriptions, and clients keep the
// resources a response of these types leaves out (see sotwResponse).
type watcher struct {
	watcherInputs
	// responder builds the response of a watch the watcher evaluates.
	responder *responder
	// evaluations counts the watches pushes evaluated, by type: the work
	// changes cost.
	evaluations *prometheus.CounterVec

	mu    sync.Mutex
	epoch uint64          // incremented by every push
	index subscriberIndex // the subscribers pushes find
	// policyServers counts the servers whose inbound listeners policy
	// changes re-evaluated: what a policy edit costs.
	policyServers prometheus.Counter
}

// watch is one request with its stream's subscription state. The map of
// what the stream holds is the stream loop's (a holding shared between
// streams, see sotwSubscription), not a copy: the loop changes it only
// after cancelling the watch, or once the watch answered, and cancelling
// waits until no push is evaluating the watch (busy), so the two never
// overlap.
type watch struct {
	typeURL string
	nodeID  string
	// view is the shape of what the stream's client gets (viewOf).
	view xdsgen.View
	// ident is the stream's identity when the watch was created; rec, the
	// stream's record, has the current one, which SDS evaluations read
	// (see watcher.evaluate).
	ident    authn.Identity
	rec      *streamRecord
	wildcard bool
	sub      *subscriber
	// names are the subscribed names (shared with sub, read only).
	names []string
	// setVersion is, for a wildcard watch, the version of the set of every
	// resource of its type when it was last evaluated: a push that leaves
	// the set as it is has nothing for it.
	setVersion string
	held       heldResources  // what the stream holds; the loop's, read only
	busy       sync.WaitGroup // pushes evaluating this watch; cancelling waits for them

	req *cachev3.Request // SotW
	// out is the stream's: the response goes there (adsServer sends it).
	out *outbox
	// first says no response of the watch's type has gone out on its
	// stream yet; sent is the stream's flag that says so once one has
	// (SotW only; a Delta stream's loop tells it, deltaType.answered).
	first bool
	sent  *atomic.Bool

	deltaReq *cachev3.DeltaRequest // Delta

	// awaiting says an access review an SDS watch needs was pending when
	// it was last evaluated: a first SotW response waits for it. reviews
	// are the access reviews that evaluation consulted, which the watcher
	// records in the subscriber.
	awaiting bool
	reviews  map[feed.ReviewKey]struct{}
}

// incremental reports whether wt's responses carry only what changed.
func (wt *watch) incremental() bool {
	return wt.deltaReq == nil && !wt.wildcard && xdsTypeOf(wt.typeURL).changedOnly
}

// watcherInputs are what the watcher reads and whom it tells, built
// before it (Hub.New).
type watcherInputs struct {
	gen    *xdsgen.Generator
	config *mcp.Generator   // Istio config for member istiods
	roots  authn.RootSource // may be nil: no SDS
	// sds builds the SDS resources a stream may have but its workload
	// certificate, which workload issues ("default", nil: not served).
	sds      *sds.Generator
	workload *workloadCerts
	// scope decides which identities a member may assert; SDS serves
	// Kubernetes Secrets only to those (nil: any).
	scope *authn.Scope
	// maxNames bounds the names a stream subscribes to per type (zero:
	// DefaultMaxResourceNames).
	maxNames int
	log      *slog.Logger
	// workers bounds how many watches a push evaluates at once (at least 1).
	workers int
	// latency measures pushed responses (may be nil: not measured).
	latency *xdsstatus.PushLatency
	// fleet counts the responses handed to streams (may be nil).
	fleet *pacing.Deliveries
	// paceLimit bounds how long a push of churn paces its waves (see pacing.Pace;
	// zero: DefaultDebounceMax).
	paceLimit time.Duration
}

func newWatcher(in watcherInputs) *watcher {
	in.workers = max(in.workers, 1)
	if in.maxNames <= 0 {
		in.maxNames = DefaultMaxResourceNames
	}
	if in.paceLimit <= 0 {
		in.paceLimit = DefaultDebounceMax
	}
	if in.log == nil {
		in.log = slog.Default()
	}
	return &watcher{
		watcherInputs: in,
		responder: &responder{gen: in.gen, config: in.config, lists: wire.NewLists(), roots: in.roots, sds: in.sds,
			workload: in.workload, scope: in.scope, log: in.log},
		evaluations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_xds_push_evaluations_total",
			Help: "Parked xDS watches that pushes evaluated because a change could affect them (whether or not a response followed), by type: the work changes cost.",
		}, []string{"type"}),
		index: newSubscriberIndex(),
		policyServers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hub_xds_policy_server_updates_total",
			Help: "Proxyless gRPC servers whose inbound listeners a change of AuthorizationPolicies or PeerAuthentications re-evaluated (only those the changed policies select, or every one when the mesh-wide mode changed).",
		}),
	}
}

// viewOf is the view a stream's client gets (xdsgen.ViewOf): its member is
// the one its credentials prove, else the one its node names; a proxyless
// client's workload is its server's (serverOf). On the mTLS listener what
// only some members are offered (hub.federation/export-to, or kept home)
// goes only to a client whose member a credential proves: a node's
// CLUSTER_ID is anyone's to write, so there it chooses the client's network
// and locality, never what it may read. The plaintext listener (plaintext)
// trusts its callers' claims, as istiod's port 15010 does: whoever can
// reach it reads what any member's clients read (docs/architecture.md §3.6).
func (w *watcher) viewOf(rec *streamRecord, node *corev3.Node, ident authn.Identity, plaintext bool) xdsgen.View {
	member := ident.Cluster
	if member == "" {
		member = node.GetMetadata().GetFields()["CLUSTER_ID"].GetStringValue()
	}
	v := w.gen.ViewOf(node, member)
	if ident.Cluster == "" && !plaintext {
		v.Client = ""
	}
	if v.Flavour == xdsgen.FlavourEnvoy && (w.roots == nil || !ident.Verified(w.roots.LocalTrustDomain())) {
		v.Flavour = xdsgen.FlavourEnvoyPlaintext // no certificate for it: see FlavourEnvoyPlaintext
	}
	if v.Flavour == xdsgen.FlavourGRPC {
		v.Server = w.serverOf(rec, node, ident)
	}
	return v
}

// subscription is what a watch reads of its stream's subscription to its
// type (sotwSubscription, deltaSubscription).
type subscription interface {
	IsWildcard() bool
	SubscribedResources() map[string]struct{}
	held() heldResources
}

// CreateWatch takes a State-of-the-World request of c's stream with the
// stream's subscription to its type; the response, now or on a later push,
// goes to c.out. The returned function cancels the watch.
func (w *watcher) CreateWatch(req *cachev3.Request, sub subscription, c *conn) (func(), error) {
	if err := checkType(req.GetTypeUrl()); err != nil {
		return nil, err
	}
	rec := &c.rec
	wt := &watch{typeURL: req.GetTypeUrl(), nodeID: req.GetNode().GetId(), ident: w.streamIdentity(rec), rec: rec, wildcard: sub.IsWildcard(), held: sub.held(), req: req, out: c.out}
	wt.view = w.viewOf(rec, req.GetNode(), wt.ident, c.state.plaintext)
	if mcp.IsConfigType(wt.typeURL) {
		wt.wildcard = true // Istio config has no names: every subscription gets the whole type
	}
	wt.sent = w.requested(rec, wt.typeURL)
	wt.first = !wt.sent.Load()
	wt.sub = w.subscriberFor(rec, wt, sub)
	if wt.typeURL == resourcev3.SecretType {
		w.mu.Lock()
		wt.sub.full = true // SDS is re-evaluated on every request: access decisions age
		w.mu.Unlock()
	}
	wt.names = wt.sub.list
	return w.watch(wt)
}

// CreateDeltaWatch is CreateWatch for Delta (incremental) streams: only
// resources whose version differs from what the stream holds are sent, and
// resources that disappeared are named as removed. Until a response of its
// type went out on the stream (first), a request is answered even when
// that is nothing: Envoy's initialisation waits for an answer to each
// subscription (a wildcard LDS with no Listener for it, a CDS of an empty
// mesh), as istiod answers.
func (w *watcher) CreateDeltaWatch(req *cachev3.DeltaRequest, sub subscription, c *conn, first bool) (func(), error) {
	if err := checkType(req.GetTypeUrl()); err != nil {
		return nil, err
	}
	if err := checkDeltaConfig(req.GetTypeUrl()); err != nil {
		return nil, err
	}
	// A Delta subscription grows request by request: bound the sum. (The
	// names of each request, initial_resource_versions included, were
	// checked before the stream's loop kept them; what the stream was returned is
	// the hub's own, a wildcard stream's can be larger.)
	if n := len(sub.SubscribedResources()); n > w.maxNames {
		return nil, status.Errorf(codes.InvalidArgument, "%d %s resource names on one stream; at most %d are accepted", n, typeLabel(req.GetTypeUrl()), w.maxNames)
	}
	rec := &c.rec
	ident := w.streamIdentity(rec)
	wt := &watch{typeURL: req.GetTypeUrl(), nodeID: req.GetNode().GetId(), ident: ident, rec: rec, wildcard: sub.IsWildcard(), held: sub.held(), deltaReq: req, out: c.out, first: first}
	wt.view = w.viewOf(rec, req.GetNode(), ident, c.state.plaintext)
	wt.sub = w.deltaSubscriberFor(rec, wt, sub.SubscribedResources())
	if wt.typeURL == resourcev3.SecretType {
		wt.sub.aim(ident) // a subscriber of the watch's own (deltaSubscriberFor)
	}
	wt.names = wt.sub.list
	return w.watch(wt)
}

// watch answers wt at once if its stream lacks something, else parks it
// until a push. A push that changes what wt subscribes to while wt is being
// evaluated makes it evaluate again, so no change is missed.
func (w *watcher) watch(wt *watch) (func(), error) {
	s := wt.sub
	for {
		w.mu.Lock()
		epoch := w.epoch
		dirty, full := s.takeLocked()
		w.mu.Unlock()
		resp, err := w.evaluate(wt, dirty, full)
		if err != nil {
			return nil, err
		}
		if resp.ok() {
			w.mu.Lock()
			s.last = resp.sotw
			wt.rec.handedLocked(wt.typeURL, resp.sotw)
			w.mu.Unlock()
			resp.send(wt) // never blocks: see reply.send
			w.fleet.Hand()
			return func() {}, nil
		}
		w.mu.Lock()
		if w.epoch != epoch && (!s.persistent || s.typeURL == resourcev3.SecretType) {
			// Not indexed while evaluated, or (SDS) the access reviews it
			// consulted were not recorded yet: a push may have missed it.
			s.full = true
		}
		if len(s.dirty) == 0 && !s.full {
			s.parked = wt
			w.index.add(s)
			w.mu.Unlock()
			return func() { w.cancel(wt) }, nil
		}
		w.mu.Unlock() // a push changed it while we evaluated: evaluate again
	}
}

// evaluate builds what wt's stream lacks (responder.evaluate). An SDS
// watch is evaluated for the identity of its stream as the stream's loop
// last told it (conn.identified): a claim that puts a proxy in conflict
// mid-stream (see proxyTracker.claim) applies to the watches parked before
// it too; the access reviews it consulted are recorded in its subscriber,
// where pushes read them.
func (w *watcher) evaluate(wt *watch, dirty map[string]struct{}, full bool) (reply, error) {
	if wt.typeURL != resourcev3.SecretType {
		return w.responder.evaluate(wt, dirty, full, authn.Identity{})
	}
	r, err := w.responder.evaluate(wt, dirty, full, w.streamIdentity(wt.rec))
	w.mu.Lock()
	wt.sub.reviews = wt.reviews
	w.mu.Unlock()
	return r, err
}

// cancel ends a parked watch: the stream's loop (its handle, in sotw.go or delta.go) changes the
// subscription state next, so it waits until no push is evaluating the
// watch.
func (w *watcher) cancel(wt *watch) {
	w.mu.Lock()
	if s := wt.sub; s.parked == wt {
		s.parked = nil
		if !s.persistent {
			w.index.remove(s)
		}
	}
	w.mu.Unlock()
	wt.busy.Wait()
}

// job is a parked watch a push evaluates, with the hostnames that changed for it.
type job struct {
	wt    *watch
	dirty map[string]struct{}
	full  bool
	since time.Time // when the push's oldest change reached the hub
}

// push sends what changed, once the generators' inputs were applied
// (generatorInputs.apply: DestinationRules, security policies, the changed
// hostnames' resources forgotten), which changed security (nil: nothing);
// m is where the fleet's counters stood before (pacing.Deliveries.Mark).
// It evaluates the parked watches that what changed in b can affect: the
// proxyless servers whose inbound listeners security changed;
// the subscribers of the changed hostnames (each only for its names of
// them where responses carry only what changed) and the wildcard ones; the
// SDS subscribers asking for a changed Secret, for a Secret of a member
// whose Secret cache resynced, for roots when roots changed, and those
// whose last evaluation consulted an access review whose decision changed.
// It answers the watches whose stream lacks something. Subscribers without
// a parked watch just note the change, for their next request. At most
// w.workers watches are evaluated at once; sends never block (see
// reply.send).
//
// A push of churn (b.Churn) reaches its streams in waves (pacing.Pace), so
// that the fleet, the hub and what shares their machines are not saturated
// while the changes keep coming; push returns when the last wave is handed
// out, with the time it left the fleet idle between waves, or early when
// ctx is done (the streams not reached keep their changes noted, for their
// next request or push). The channel it returns is closed once the
// streams answered all but a few of the responses it handed them (nil:
// it handed none, or nobody counts them): the change feed paces the next
// push by it (feed.Changes.Run).
func (w *watcher) push(ctx context.Context, b *feed.Batch, m pacing.Mark, security *xdsgen.SecurityChange) (delivered <-chan struct{}, idled time.Duration) {
	streams := w.affected(b, w.serversAffected(security))
	if b.Churn {
		idled = pacing.Pace(ctx, w.fleet, streams, w.paceLimit, func(wave [][]*subscriber) { w.pushWave(wave, b.Since) })
	} else {
		w.pushWave(streams, b.Since)
	}
	return w.fleet.Await(m), idled
}

// serversAffected returns the proxyless servers (LDS subscribers of
// inbound listeners) whose inbound listeners change (nil: nothing
// changed), to be evaluated again. What a change does is worked out once
// per kind of workload (namespace and labels), outside the lock every
// watch needs.
func (w *watcher) serversAffected(change *xdsgen.SecurityChange) (affected []*subscriber) {
	if change == nil {
		return nil
	}
	type server struct {
		s  *subscriber
		wl *authz.Workload
	}
	w.mu.Lock()
	servers := make([]server, 0, len(w.index.byServer))
	for s := range w.index.byServer {
		servers = append(servers, server{s, s.view.Server})
	}
	w.mu.Unlock()
	affects := map[string]bool{}
	for _, sv := range servers {
		wl := authz.Workload{}
		if sv.wl != nil {
			wl = *sv.wl
		}
		key := strconv.Quote(wl.Namespace) + strconv.FormatBool(wl.Truncated) + wl.LabelsKey()
		a, ok := affects[key]
		if !ok {
			a = change.Affects(wl)
			affects[key] = a
		}
		if a {
			affected = append(affected, sv.s)
		}
	}
	return affected
}

// affected marks the subscribers b (and the policy servers) concern as
// changed and returns the parked ones, by stream.
func (w *watcher) affected(b *feed.Batch, servers []*subscriber) [][]*subscriber {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.epoch++
	var (
		streams [][]*subscriber // the parked subscribers to evaluate, by stream
		at      = map[*outbox]int{}
		taken   = map[*subscriber]bool{}
	)
	schedule := func(s *subscriber) {
		if s.parked != nil && !taken[s] {
			taken[s] = true
			i, ok := at[s.parked.out]
			if !ok {
				i = len(streams)
				at[s.parked.out] = i
				streams = append(streams, nil)
			}
			streams[i] = append(streams[i], s)
		}
	}
	changedAll := func(s *subscriber) { s.full = true; schedule(s) }
	w.index.reached(b, func(s *subscriber, host string) { s.touchLocked(host); schedule(s) }, changedAll)
	for _, s := range servers {
		if s.indexed { // still subscribed
			changedAll(s)
			w.policyServers.Inc()
		}
	}
	return streams
}

// pushWave evaluates the subscribers of a push's streams that are still
// parked, taking the changes noted on them: a subscriber whose watch was
// cancelled meanwhile keeps them for its stream's next watch. One worker
// answers a stream's watches one after another in ADS order (xdsType.rank), so
// its loop sends their responses in that order (the outbox keeps it).
func (w *watcher) pushWave(streams [][]*subscriber, since time.Time) {
	byStream := make([][]job, 0, len(streams))
	w.mu.Lock()
	for _, subs := range streams {
		var js []job
		for _, s := range subs {
			if s.parked == nil {
				continue
			}
			s.parked.busy.Add(1) // under w.mu: a cancel after this waits for pushTo
			dirty, full := s.takeLocked()
			js = append(js, job{wt: s.parked, dirty: dirty, full: full, since: since})
		}
		byStream = append(byStream, js)
	}
	w.mu.Unlock()
	sets := map[xdsgen.WildcardSetKey]string{}
	n := 0
	for _, js := range byStream {
		js = w.skipUnchangedWildcards(js, sets)
		if len(js) == 0 {
			continue
		}
		if len(js) > 1 {
			slices.SortStableFunc(js, func(a, b job) int { return xdsTypeOf(a.wt.typeURL).rank - xdsTypeOf(b.wt.typeURL).rank })
		}
		for _, j := range js {
			w.evaluations.WithLabelValues(shortType(j.wt.typeURL)).Inc()
		}
		byStream[n] = js
		n++
	}
	byStream = byStream[:n]
	work := make(chan []job)
	var wg sync.WaitGroup
	for range min(w.workers, len(byStream)) {
		wg.Go(func() {
			for js := range work {
				for _, j := range js {
					w.pushTo(j)
				}
			}
		})
	}
	for _, js := range byStream {
		work <- js
	}
	close(work)
	wg.Wait()
}

// skipUnchangedWildcards drops the wildcard watches whose type's set is
// the one they were last evaluated against: with thousands of proxies
// subscribed to every cluster, an endpoint change is not re-checked
// against every proxy's full cluster list. versions are the current sets'
// versions, filled as they are looked up (shared by a push's calls).
func (w *watcher) skipUnchangedWildcards(jobs []job, versions map[xdsgen.WildcardSetKey]string) []job {
	out := jobs[:0]
	for _, j := range jobs {
		wt := j.wt
		if wt.wildcard && wt.typeURL != resourcev3.SecretType && wt.setVersion != "" {
			view := wt.view
			view.Server = nil // a wildcard set never holds inbound listeners
			key := xdsgen.WildcardSetKey{TypeURL: wt.typeURL, View: view}
			v, ok := versions[key]
			if !ok {
				set, err := w.responder.all(wt.typeURL, wt.view)
				if err == nil {
					v = set.Version
				}
				versions[key] = v
			}
			if v == wt.setVersion {
				wt.busy.Done()
				continue
			}
		}
		out = append(out, j)
	}
	return out
}

// pushTo answers one parked watch if its stream lacks something. Sending
// while holding busy cannot block the stream's cancel: it sends only if the
// watch was still parked, and such a send never blocks (see reply.send).
func (w *watcher) pushTo(j job) {
	wt, s := j.wt, j.wt.sub
	defer wt.busy.Done()
	resp, err := w.evaluate(wt, j.dirty, j.full)
	if err != nil {
		w.log.Error("generating xDS response", "node", wt.nodeID, "type", wt.typeURL, "error", err)
	}
	if err != nil || !resp.ok() {
		if err != nil {
			w.mu.Lock()
			s.full = true // try again on the stream's next request or push
			w.mu.Unlock()
		}
		return
	}
	w.mu.Lock()
	open := s.parked == wt
	if open {
		s.parked = nil
		s.last = resp.sotw
		wt.rec.handedLocked(wt.typeURL, resp.sotw)
		if !s.persistent {
			w.index.remove(s)
		}
	} else {
		// Cancelled meanwhile: the stream has a newer request, whose watch
		// must evaluate what this one did.
		for host := range j.dirty {
			s.touchLocked(host)
		}
		s.full = s.full || j.full
	}
	w.mu.Unlock()
	if open {
		resp.send(wt)
		w.fleet.Hand()
		w.latency.Observe(latencyLabel(wt.typeURL), j.since)
	}
}
