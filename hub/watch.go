package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"maps"
	"sort"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// watcher implements go-control-plane's cache.Cache (DESIGN.md §3.6): it
// decides what each stream gets and when. A request is answered at once when
// the resources it subscribes to differ from what the stream last received;
// otherwise the watch is parked until a push changes them. Because the
// comparison is against what was sent (not what was acknowledged), a NACKed
// version is never resent until an input changes.
type watcher struct {
	gen     *generator
	secrets SecretSource // may be nil: no SDS
	roots   RootSource   // may be nil: no SDS
	// sar decides access reviews without waiting; nil: other namespaces
	// are always denied.
	sar *accessReviews
	// hubNamespace is the hub's own namespace, whose Secrets are never served.
	hubNamespace string
	// maxNames bounds the names a stream subscribes to per type.
	maxNames int
	log      *slog.Logger
	// workers bounds how many watches a push evaluates at once.
	workers int
	// identities carries each stream's verified identity from the server's
	// callbacks (which know the stream) to CreateWatch (which knows only the
	// request, stamped with the stream's node pointer).
	identities sync.Map // *corev3.Node → identity

	mu      sync.Mutex
	epoch   uint64 // incremented by every push
	watches map[*watch]struct{}
}

// watch is a request with its stream's subscription state. The names are
// copied; the map of what the stream holds is not (with thousands of
// wildcard streams that copy was most of the hub's memory): the server
// mutates it only after cancelling the watch, and cancelling waits until no
// push is evaluating the watch (busy), so the two never overlap.
type watch struct {
	typeURL  string
	nodeID   string
	ident    identity
	names    []string
	wildcard bool
	hosts    map[string]struct{} // hostnames the names belong to (not for SDS or wildcard)
	// setVersion is, for a wildcard watch, the version of the set of every
	// resource of its type when it was last evaluated: a push that leaves
	// the set as it is has nothing for it.
	setVersion string
	returned   map[string]string // what the stream last received (and, for Delta, still holds); shared, read only
	busy       sync.WaitGroup    // pushes evaluating this watch; cancelling waits for them

	req *cachev3.Request // SotW
	out chan cachev3.Response

	deltaReq *cachev3.DeltaRequest // Delta
	deltaOut chan cachev3.DeltaResponse

	// reviews are the change keys of the access reviews an SDS watch
	// consulted when last evaluated: a new decision re-evaluates it.
	// awaiting says one of them was pending: a first SotW response waits.
	reviews  map[string]struct{}
	awaiting bool
}

func newWatch(typeURL, nodeID string, sub cachev3.Subscription) *watch {
	wt := &watch{typeURL: typeURL, nodeID: nodeID, wildcard: sub.IsWildcard(), returned: sub.ReturnedResources()}
	if !wt.wildcard {
		if typeURL != resourcev3.SecretType {
			wt.hosts = map[string]struct{}{}
		}
		for name := range sub.SubscribedResources() {
			wt.names = append(wt.names, name)
			if host, _, ok := parseName(typeURL, name); ok && wt.hosts != nil {
				wt.hosts[host] = struct{}{}
			}
		}
	}
	return wt
}

// affectedBy reports whether a push of these changed hostnames (sdsKey for
// secrets and roots, an access review's key for its decision) can change
// what wt subscribes to: SDS watches follow secrets and the reviews they
// consulted, wildcard ones any service, named ones only their own hostnames.
func (wt *watch) affectedBy(changed map[string]struct{}) bool {
	if wt.typeURL == resourcev3.SecretType {
		if _, ok := changed[sdsKey]; ok {
			return true
		}
		for k := range wt.reviews {
			if _, ok := changed[k]; ok {
				return true
			}
		}
		return false
	}
	if wt.wildcard {
		return servicesChanged(changed)
	}
	for host := range changed {
		if _, ok := wt.hosts[host]; ok {
			return true
		}
	}
	return false
}

var _ cachev3.Cache = (*watcher)(nil)

func newWatcher(gen *generator, workers int, log *slog.Logger) *watcher {
	return &watcher{gen: gen, workers: max(workers, 1), log: log, watches: map[*watch]struct{}{}, maxNames: DefaultMaxResourceNames}
}

// servedTypes are the resource types the hub serves; a request for any
// other ends its stream with InvalidArgument (nothing is kept for it).
var servedTypes = map[string]bool{
	resourcev3.ClusterType: true, resourcev3.EndpointType: true, resourcev3.ListenerType: true,
	resourcev3.RouteType: true, resourcev3.SecretType: true,
}

func checkType(typeURL string) error {
	if !servedTypes[typeURL] {
		return status.Errorf(codes.InvalidArgument, "type %q is not served by the hub (CDS, EDS, LDS, RDS and SDS are)", typeURL)
	}
	return nil
}

// CreateWatch implements cache.ConfigWatcher for State-of-the-World streams.
func (w *watcher) CreateWatch(req *cachev3.Request, sub cachev3.Subscription, out chan cachev3.Response) (func(), error) {
	if err := checkType(req.GetTypeUrl()); err != nil {
		return nil, err
	}
	wt := newWatch(req.GetTypeUrl(), req.GetNode().GetId(), sub)
	wt.req, wt.out = req, out
	if id, ok := w.identities.Load(req.GetNode()); ok {
		wt.ident = id.(identity)
	}
	return w.watch(wt)
}

// CreateDeltaWatch implements cache.ConfigWatcher for Delta (incremental)
// streams: only resources whose version differs from what the stream holds
// are sent, and resources that disappeared are named as removed.
func (w *watcher) CreateDeltaWatch(req *cachev3.DeltaRequest, sub cachev3.Subscription, out chan cachev3.DeltaResponse) (func(), error) {
	if err := checkType(req.GetTypeUrl()); err != nil {
		return nil, err
	}
	// A Delta subscription grows request by request: bound the sum. (The
	// names of each request, initial_resource_versions included, were
	// checked before the server kept them; what the stream was returned is
	// the hub's own, a wildcard stream's can be larger.)
	if n := len(sub.SubscribedResources()); n > w.maxNames {
		return nil, status.Errorf(codes.InvalidArgument, "%d %s resource names on one stream; at most %d are accepted", n, typeLabel(req.GetTypeUrl()), w.maxNames)
	}
	wt := newWatch(req.GetTypeUrl(), req.GetNode().GetId(), sub)
	wt.deltaReq, wt.deltaOut = req, out
	if id, ok := w.identities.Load(req.GetNode()); ok {
		wt.ident = id.(identity)
	}
	return w.watch(wt)
}

// watch answers wt at once if its stream lacks something, else parks it
// until a push. A push that runs while wt is being evaluated makes it
// evaluate again, so no change is missed.
func (w *watcher) watch(wt *watch) (func(), error) {
	for {
		w.mu.Lock()
		epoch := w.epoch
		w.mu.Unlock()
		sent, err := w.answer(wt)
		if err != nil {
			return nil, err
		}
		if sent {
			return func() {}, nil
		}
		w.mu.Lock()
		if w.epoch == epoch {
			w.watches[wt] = struct{}{}
			w.mu.Unlock()
			return func() {
				w.mu.Lock()
				delete(w.watches, wt)
				w.mu.Unlock()
				wt.busy.Wait() // the server changes the subscription state next
			}, nil
		}
		w.mu.Unlock() // a push ran while we evaluated: evaluate again
	}
}

// answer sends wt's response if there is one. Sends never block: a watch
// sends at most once, SotW gives every watch its own one-slot channel, and
// Delta's shared channel (20 slots) is drained before each request, after
// which at most one watch per served type can answer.
func (w *watcher) answer(wt *watch) (bool, error) {
	if wt.deltaOut != nil {
		resp, err := w.respondDelta(wt)
		if err != nil || resp == nil {
			return false, err
		}
		wt.deltaOut <- resp
		return true, nil
	}
	resp, err := w.respond(wt)
	if err != nil || resp == nil {
		return false, err
	}
	wt.out <- resp
	return true, nil
}

// Fetch implements cache.ConfigFetcher; REST xDS is not served.
func (w *watcher) Fetch(context.Context, *cachev3.Request) (cachev3.Response, error) {
	return nil, errors.New("REST xDS is not supported; use ADS over gRPC")
}

// push re-evaluates the parked watches that the changed hostnames (sdsKey
// for secrets and roots) can affect and answers those whose resources
// differ from what their stream last received. At most w.workers watches are
// evaluated at once; sends never block (see answer).
func (w *watcher) push(changed map[string]struct{}) {
	w.mu.Lock()
	w.epoch++
	parked := make([]*watch, 0, len(w.watches))
	for wt := range w.watches {
		if wt.affectedBy(changed) {
			wt.busy.Add(1) // under w.mu: a cancel after this waits for pushTo
			parked = append(parked, wt)
		}
	}
	w.mu.Unlock()
	parked = w.skipUnchangedWildcards(parked)
	work := make(chan *watch)
	var wg sync.WaitGroup
	for range min(w.workers, len(parked)) {
		wg.Go(func() {
			for wt := range work {
				w.pushTo(wt)
			}
		})
	}
	for _, wt := range parked {
		work <- wt
	}
	close(work)
	wg.Wait()
}

// skipUnchangedWildcards drops the wildcard watches whose type's set is
// the one they were last evaluated against: with thousands of proxies
// subscribed to every cluster, an endpoint change is not re-checked
// against every proxy's full cluster list.
func (w *watcher) skipUnchangedWildcards(parked []*watch) []*watch {
	versions := map[string]string{}
	out := parked[:0]
	for _, wt := range parked {
		if wt.wildcard && wt.typeURL != resourcev3.SecretType && wt.setVersion != "" {
			v, ok := versions[wt.typeURL]
			if !ok {
				set, err := w.gen.all(wt.typeURL)
				if err == nil {
					v = set.version
				}
				versions[wt.typeURL] = v
			}
			if v == wt.setVersion {
				wt.busy.Done()
				continue
			}
		}
		out = append(out, wt)
	}
	return out
}

// pushTo answers one parked watch if its stream lacks something. Sending
// while holding busy cannot block the stream's cancel: it sends only if the
// watch was still parked, and such a send never blocks (see answer).
func (w *watcher) pushTo(wt *watch) {
	defer wt.busy.Done()
	var send func()
	if wt.deltaOut != nil {
		resp, err := w.respondDelta(wt)
		if err != nil || resp == nil {
			w.logError(wt, err)
			return
		}
		send = func() { wt.deltaOut <- resp }
	} else {
		resp, err := w.respond(wt)
		if err != nil || resp == nil {
			w.logError(wt, err)
			return
		}
		send = func() { wt.out <- resp }
	}
	w.mu.Lock()
	_, open := w.watches[wt]
	delete(w.watches, wt)
	w.mu.Unlock()
	if open { // else cancelled meanwhile: the stream has a newer request
		send()
	}
}

func (w *watcher) logError(wt *watch, err error) {
	if err != nil {
		w.log.Error("generating xDS response", "node", wt.nodeID, "type", wt.typeURL, "error", err)
	}
}

// resources are what a watch subscribes to: per-proxy secrets for SDS,
// shared generated resources for everything else.
func (w *watcher) resources(wt *watch) ([]*resource, error) {
	if wt.typeURL == resourcev3.SecretType {
		return w.secretResources(wt)
	}
	if wt.wildcard {
		set, err := w.gen.all(wt.typeURL)
		wt.setVersion = set.version
		return set.res, err
	}
	return w.gen.resources(wt.typeURL, wt.names, false)
}

// respondDelta builds a Delta response with the resources whose version
// differs from what the stream holds and the names that are gone, or nil.
func (w *watcher) respondDelta(wt *watch) (cachev3.DeltaResponse, error) {
	res, err := w.resources(wt)
	if err != nil {
		return nil, err
	}
	next := make(map[string]string, len(res))
	var changed []*discoveryv3.Resource
	for _, r := range res {
		next[r.name] = r.version
		if !r.kept && wt.returned[r.name] != r.version {
			changed = append(changed, &discoveryv3.Resource{Name: r.name, Version: r.version, Resource: r.any})
		}
	}
	var removed []string
	for name := range wt.returned {
		if _, ok := next[name]; !ok {
			removed = append(removed, name)
		}
	}
	if len(changed) == 0 && len(removed) == 0 {
		return nil, nil
	}
	sort.Strings(removed)
	return &cachev3.DeltaPassthroughResponse{
		DeltaRequest:   wt.deltaReq,
		NextVersionMap: next,
		DeltaDiscoveryResponse: &discoveryv3.DeltaDiscoveryResponse{
			SystemVersionInfo: responseVersion(res),
			Resources:         changed,
			RemovedResources:  removed,
			TypeUrl:           wt.typeURL,
		},
	}, nil
}

// respond builds the response for a watch, or returns nil when the stream
// already holds exactly these resources (the first request of a type on a
// stream is always answered, possibly with no resources, once the access
// reviews its SDS names need are decided).
func (w *watcher) respond(wt *watch) (cachev3.Response, error) {
	if wt.wildcard && wt.typeURL != resourcev3.SecretType {
		return w.respondWildcard(wt)
	}
	res, err := w.resources(wt)
	if err != nil {
		return nil, err
	}
	if wt.awaiting && wt.req.GetResponseNonce() == "" {
		return nil, nil // a first SDS response waits for its access reviews
	}
	returned := make(map[string]string, len(res))
	for _, r := range res {
		returned[r.name] = r.version
	}
	if wt.req.GetResponseNonce() != "" && maps.Equal(returned, wt.returned) {
		return nil, nil
	}
	anys := make([]*anypb.Any, 0, len(res))
	for _, r := range res {
		if !r.kept {
			anys = append(anys, r.any)
		}
	}
	return &cachev3.PassthroughResponse{
		Request: wt.req,
		DiscoveryResponse: &discoveryv3.DiscoveryResponse{
			VersionInfo: responseVersion(res),
			Resources:   anys,
			TypeUrl:     wt.req.GetTypeUrl(),
		},
		ReturnedResources: returned,
	}, nil
}

// wildcardKey is the only entry of what a SotW wildcard stream is recorded
// to hold: the version of the whole set. No resource can have this name.
// With thousands of streams subscribed to every cluster, a per-stream map
// of every name would cost more than everything else the hub keeps.
const wildcardKey = "\x00every resource"

// respondWildcard answers a SotW wildcard watch from the shared set: one
// slice of resources and one version for every stream.
func (w *watcher) respondWildcard(wt *watch) (cachev3.Response, error) {
	set, err := w.gen.all(wt.typeURL)
	if err != nil {
		return nil, err
	}
	wt.setVersion = set.version
	if wt.req.GetResponseNonce() != "" && len(wt.returned) == 1 && wt.returned[wildcardKey] == set.version {
		return nil, nil
	}
	return &cachev3.PassthroughResponse{
		Request: wt.req,
		DiscoveryResponse: &discoveryv3.DiscoveryResponse{
			VersionInfo: set.version,
			Resources:   set.anys, // shared: the server and the tracker only read it
			TypeUrl:     wt.typeURL,
		},
		ReturnedResources: map[string]string{wildcardKey: set.version},
	}, nil
}

// responseVersion identifies a set of resources by their names and versions.
func responseVersion(res []*resource) string {
	if len(res) == 0 {
		return "empty"
	}
	h := sha256.New()
	sorted := append([]*resource(nil), res...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	for _, r := range sorted {
		h.Write([]byte(r.name))
		h.Write([]byte{0})
		h.Write([]byte(r.version))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
