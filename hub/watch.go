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
	"google.golang.org/protobuf/types/known/anypb"
)

// watcher implements go-control-plane's cache.Cache (DESIGN.md §3.6): it
// decides what each stream gets and when. A request is answered at once when
// the resources it subscribes to differ from what the stream last received;
// otherwise the watch is parked until a push changes them. Because the
// comparison is against what was sent (not what was acknowledged), a NACKed
// version is never resent until an input changes.
type watcher struct {
	gen *generator
	log *slog.Logger

	mu      sync.Mutex
	epoch   uint64 // incremented by every push
	watches map[*watch]struct{}
}

// watch is a SotW request with copies of its stream's subscription state:
// the server's Subscription shares maps with the stream goroutine, which may
// change them as soon as the watch is cancelled, while a push may still be
// evaluating it.
type watch struct {
	req      *cachev3.Request
	names    []string
	wildcard bool
	returned map[string]string // what the stream last received
	out      chan cachev3.Response
}

func newWatch(req *cachev3.Request, sub cachev3.Subscription, out chan cachev3.Response) *watch {
	wt := &watch{req: req, wildcard: sub.IsWildcard(), returned: maps.Clone(sub.ReturnedResources()), out: out}
	if !wt.wildcard {
		for name := range sub.SubscribedResources() {
			wt.names = append(wt.names, name)
		}
	}
	return wt
}

var _ cachev3.Cache = (*watcher)(nil)

func newWatcher(gen *generator, log *slog.Logger) *watcher {
	return &watcher{gen: gen, log: log, watches: map[*watch]struct{}{}}
}

// CreateWatch implements cache.ConfigWatcher.
func (w *watcher) CreateWatch(req *cachev3.Request, sub cachev3.Subscription, out chan cachev3.Response) (func(), error) {
	wt := newWatch(req, sub, out)
	for {
		w.mu.Lock()
		epoch := w.epoch
		w.mu.Unlock()
		resp, err := w.respond(wt)
		if err != nil {
			return nil, err
		}
		if resp != nil {
			out <- resp // buffered by the server: one slot per type, one watch per type
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
			}, nil
		}
		w.mu.Unlock() // a push ran while we evaluated: evaluate again
	}
}

// CreateDeltaWatch implements cache.ConfigWatcher. Delta xDS is not served
// yet; the stream ends with this error and clients fall back to SotW.
func (w *watcher) CreateDeltaWatch(*cachev3.DeltaRequest, cachev3.Subscription, chan cachev3.DeltaResponse) (func(), error) {
	return nil, errors.New("delta (incremental) xDS is not supported by this hub yet; use state-of-the-world ADS")
}

// Fetch implements cache.ConfigFetcher; REST xDS is not served.
func (w *watcher) Fetch(context.Context, *cachev3.Request) (cachev3.Response, error) {
	return nil, errors.New("REST xDS is not supported; use ADS over gRPC")
}

// push re-evaluates every parked watch after the index changed and answers
// those whose resources differ from what their stream last received.
func (w *watcher) push() {
	w.mu.Lock()
	w.epoch++
	parked := make([]*watch, 0, len(w.watches))
	for wt := range w.watches {
		parked = append(parked, wt)
	}
	w.mu.Unlock()
	for _, wt := range parked {
		resp, err := w.respond(wt)
		if err != nil {
			w.log.Error("generating xDS response", "node", wt.req.GetNode().GetId(), "type", wt.req.GetTypeUrl(), "error", err)
			continue
		}
		if resp == nil {
			continue
		}
		w.mu.Lock()
		_, open := w.watches[wt]
		delete(w.watches, wt)
		w.mu.Unlock()
		if !open {
			continue // cancelled meanwhile: the stream has a newer request
		}
		select {
		case wt.out <- resp:
		default:
			w.log.Error("xDS response channel full; dropping response", "node", wt.req.GetNode().GetId(), "type", wt.req.GetTypeUrl())
		}
	}
}

// respond builds the response for a watch, or returns nil when the stream
// already holds exactly these resources (the first request of a type on a
// stream is always answered, possibly with no resources).
func (w *watcher) respond(wt *watch) (cachev3.Response, error) {
	res, err := w.gen.resources(wt.req.GetTypeUrl(), wt.names, wt.wildcard)
	if err != nil {
		return nil, err
	}
	returned := make(map[string]string, len(res))
	for _, r := range res {
		returned[r.name] = r.version
	}
	if wt.req.GetResponseNonce() != "" && sameVersions(returned, wt.returned) {
		return nil, nil
	}
	anys := make([]*anypb.Any, len(res))
	for i, r := range res {
		anys[i] = r.any
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

func sameVersions(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
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
