package hub

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync/atomic"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/sds"
	"github.com/hubmesh/hub/hub/wire"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/mcp"
)

// What a watch's stream lacks, built by the responder from the generators:
// the watcher decides which watches a change concerns and when they are
// evaluated; the responder builds each one's response, outside the
// watcher's lock.

// responder builds the responses of watches: the xDS resources (xdsgen),
// member istiods' Istio config (mcp) and SDS (sds, workload certificates,
// roots). Its only state is the response lists it shares between streams.
type responder struct {
	gen      *xdsgen.Generator
	config   *mcp.Generator
	lists    *wire.Lists
	roots    authn.RootSource
	sds      *sds.Generator
	workload *workloadCerts
	scope    *authn.Scope
	log      *slog.Logger
}

// reply is a SotW or a Delta response, or neither.
type reply struct {
	sotw  *sotwResponse
	delta *deltaResponse
}

func (r reply) ok() bool { return r.sotw != nil || r.delta != nil }

// send hands the reply to the stream's loop; it never blocks (outbox).
func (r reply) send(wt *watch) { wt.out.put(r) }

// sotwResponse is a SotW response that tells whether its stream's loop
// sent it (markSent): the loop drops a response still queued when a newer
// request of its type arrives.
//
// A response that carries only what changed (incremental) is recorded
// into what the stream holds (sotwSubscription.took) as a change of the
// resources it carried, never rebuilt; what the stream held before
// was read by the watch that built it.
type sotwResponse struct {
	*cachev3.PassthroughResponse
	incremental bool
	changed     []*xdsgen.Resource
	// whole is, for a whole-state response, its resources (shared, read
	// only): what the stream holds once it is sent; set is the version of
	// the set of every resource of the type it is, for a wildcard's.
	whole    []*xdsgen.Resource
	set      string
	sent     atomic.Bool
	typeSent *atomic.Bool // the stream's flag for the type's first response (may be nil)
}

// markSent records that the stream's loop sent r.
func (r *sotwResponse) markSent() {
	r.sent.Store(true)
	if r.typeSent != nil {
		r.typeSent.Store(true)
	}
}

// respondChanged builds a response with the subscribed resources whose
// version differs from what the stream holds: of the changed hostnames'
// names, or of every name when full (and for SDS, whose names are few).
// Resources that disappeared are not named: for these types a SotW
// response leaves the others as the client has them. The first request of
// a type on a stream (watch.first) is always answered, possibly with no
// resources; for SDS once the access reviews its names need are decided.
func (rs *responder) respondChanged(wt *watch, dirty map[string]struct{}, full bool, id authn.Identity) (*sotwResponse, error) {
	var changed []*xdsgen.Resource
	consider := func(r *xdsgen.Resource) {
		if r != nil && !r.Kept && wt.held.changed(r) {
			changed = append(changed, r)
		}
	}
	switch {
	case wt.typeURL == resourcev3.SecretType:
		res, err := rs.secretResources(wt, id)
		if err != nil {
			return nil, err
		}
		if wt.awaiting && wt.first {
			// The first response to an SDS subscription waits for the
			// access reviews its names need (each bounded by its timeout):
			// a client may not ask again (Istio's adsc acknowledges
			// without resource names), so it must not be told "nothing"
			// for a name that is only undecided.
			return nil, nil
		}
		for _, r := range res {
			consider(r)
		}
	case full:
		for _, name := range wt.sub.list {
			r, err := rs.gen.Resource(wt.typeURL, name, wt.view)
			if err != nil {
				return nil, err
			}
			consider(r)
		}
	default:
		for host := range dirty {
			for _, name := range wt.sub.namesOf(host) {
				r, err := rs.gen.Resource(wt.typeURL, name, wt.view)
				if err != nil {
					return nil, err
				}
				consider(r)
			}
		}
	}
	if len(changed) == 0 && !wt.first {
		return nil, nil
	}
	sort.Slice(changed, func(i, j int) bool { return changed[i].Name < changed[j].Name })
	list := rs.lists.SotW(changed)
	return &sotwResponse{
		PassthroughResponse: &cachev3.PassthroughResponse{
			Request: wt.req,
			DiscoveryResponse: &discoveryv3.DiscoveryResponse{
				VersionInfo: list.Version,
				Resources:   list.Anys,
				TypeUrl:     wt.typeURL,
			},
		},
		incremental: true,
		changed:     list.Res,
		typeSent:    wt.sent,
	}, nil
}

// respond builds a whole-state response (LDS and CDS by name), or returns
// nil when the stream already holds exactly these resources (the first
// request of a type on a stream, watch.first, is always answered, possibly
// with no resources), or when one of them is Kept (not buildable yet).
func (rs *responder) respond(wt *watch, id authn.Identity) (*sotwResponse, error) {
	res, err := rs.resources(wt, id)
	if err != nil {
		return nil, err
	}
	for _, r := range res {
		if r.Kept {
			// A whole-state response without it would remove it from the
			// client (a proxyless server would stop serving): wait until
			// it can be built (a push re-evaluates the watch then).
			return nil, nil
		}
	}
	if !wt.first && wt.held.sameAs(res) {
		return nil, nil
	}
	anys := make([]*anypb.Any, 0, len(res))
	for _, r := range res {
		anys = append(anys, r.Any)
	}
	return &sotwResponse{PassthroughResponse: &cachev3.PassthroughResponse{
		Request: wt.req,
		DiscoveryResponse: &discoveryv3.DiscoveryResponse{
			VersionInfo: xdsgen.ResponseVersion(res),
			Resources:   anys,
			TypeUrl:     wt.req.GetTypeUrl(),
		},
	}, whole: res, typeSent: wt.sent}, nil
}

// respondWildcard answers a SotW wildcard watch from the shared set: one
// slice of resources and one version for every stream.
func (rs *responder) respondWildcard(wt *watch) (*sotwResponse, error) {
	set, err := rs.all(wt.typeURL, wt.view)
	if err != nil {
		return nil, err
	}
	wt.setVersion = set.Version
	if !wt.first && wt.held.set == set.Version {
		return nil, nil
	}
	return &sotwResponse{PassthroughResponse: &cachev3.PassthroughResponse{
		Request: wt.req,
		DiscoveryResponse: &discoveryv3.DiscoveryResponse{
			VersionInfo: set.Version,
			Resources:   set.Anys, // shared: the stream's loop and the tracker only read it
			TypeUrl:     wt.typeURL,
		},
	}, whole: set.Resources, set: set.Version, typeSent: wt.sent}, nil
}

// resources are what a watch subscribes to: per-proxy secrets for SDS,
// shared generated resources for everything else.
func (rs *responder) resources(wt *watch, id authn.Identity) ([]*xdsgen.Resource, error) {
	if wt.typeURL == resourcev3.SecretType {
		return rs.secretResources(wt, id)
	}
	if wt.wildcard {
		set, err := rs.all(wt.typeURL, wt.view)
		wt.setVersion = set.Version
		return set.Resources, err
	}
	return rs.gen.Resources(wt.typeURL, wt.names, wt.view)
}

// respondDelta builds a Delta response with the resources whose version
// differs from what the stream holds and the names that are gone, or nil,
// from the whole subscription: for wildcard and SDS subscriptions (those
// by name are evaluated per changed hostname, see respondDeltaChanged).
func (rs *responder) respondDelta(wt *watch, id authn.Identity) (*deltaResponse, error) {
	res, err := rs.resources(wt, id)
	if err != nil {
		return nil, err
	}
	exists := make(map[string]struct{}, len(res))
	var changed []*xdsgen.Resource
	for _, r := range res {
		exists[r.Name] = struct{}{}
		if !r.Kept && wt.held.changed(r) {
			changed = append(changed, r)
		}
	}
	var removed []string
	for name := range wt.held.byName() {
		if _, ok := exists[name]; !ok {
			removed = append(removed, name)
		}
	}
	if len(changed) == 0 && len(removed) == 0 && !wt.first {
		return nil, nil
	}
	sort.Strings(removed)
	list := rs.lists.Delta(changed) // in res's order: by name (SDS: as subscribed)
	return newDeltaResponse(wt, xdsgen.ResponseVersion(res), list, removed), nil
}

// respondDeltaChanged builds a Delta response for a persistent
// subscription by name: of the changed hostnames' names (every name when
// full), the resources whose version differs from what the stream holds
// and the held ones that are gone, or nil. Its work is proportional to
// what changed, not to the subscription.
func (rs *responder) respondDeltaChanged(wt *watch, dirty map[string]struct{}, full bool) (*deltaResponse, error) {
	var changed []*xdsgen.Resource
	var removed []string
	consider := func(name string) error {
		r, err := rs.gen.Resource(wt.typeURL, name, wt.view)
		if err != nil {
			return err
		}
		switch {
		case r == nil:
			if _, ok := wt.held.byName()[name]; ok {
				removed = append(removed, name)
			}
		case !r.Kept && wt.held.changed(r):
			changed = append(changed, r)
		}
		return nil
	}
	if full {
		for _, name := range wt.sub.list {
			if err := consider(name); err != nil {
				return nil, err
			}
		}
		// Held but no longer subscribed (the stream's loop forgets unsubscribed
		// names itself; initial_resource_versions may name others).
		for name := range wt.held.byName() {
			if !wt.sub.has(name) {
				removed = append(removed, name)
			}
		}
	} else {
		for host := range dirty {
			for _, name := range wt.sub.namesOf(host) {
				if err := consider(name); err != nil {
					return nil, err
				}
			}
		}
	}
	if len(changed) == 0 && len(removed) == 0 && !wt.first {
		return nil, nil
	}
	sort.Slice(changed, func(i, j int) bool { return changed[i].Name < changed[j].Name })
	sort.Strings(removed)
	list := rs.lists.Delta(changed)
	return newDeltaResponse(wt, list.Version, list, removed), nil
}

// newDeltaResponse answers wt's Delta request with list's resources and
// the removed names, at version.
func newDeltaResponse(wt *watch, version string, list wire.DeltaList, removed []string) *deltaResponse {
	return &deltaResponse{
		DeltaPassthroughResponse: &cachev3.DeltaPassthroughResponse{
			DeltaRequest: wt.deltaReq,
			DeltaDiscoveryResponse: &discoveryv3.DeltaDiscoveryResponse{
				SystemVersionInfo: version,
				Resources:         list.Out,
				RemovedResources:  removed,
				TypeUrl:           wt.typeURL,
			},
		},
		changed: list.Res,
		removed: removed,
	}
}

// deltaResponse is a Delta response with what it changes of what the
// stream holds: the changed resources and the removed names, which the
// stream's loop records (deltaSubscription.took) once it sent it.
type deltaResponse struct {
	*cachev3.DeltaPassthroughResponse
	changed []*xdsgen.Resource
	removed []string
}

// evaluate builds what wt's stream lacks, given the hostnames that changed
// for it since its last evaluation (every name when full), or an empty
// reply; id is the stream's identity (SDS only).
func (rs *responder) evaluate(wt *watch, dirty map[string]struct{}, full bool, id authn.Identity) (reply, error) {
	switch {
	case wt.deltaReq != nil:
		var resp *deltaResponse
		var err error
		if wt.sub.persistent {
			resp, err = rs.respondDeltaChanged(wt, dirty, full)
		} else {
			resp, err = rs.respondDelta(wt, id)
		}
		if err != nil || resp == nil {
			return reply{}, err
		}
		return reply{delta: resp}, nil
	case wt.wildcard && wt.typeURL != resourcev3.SecretType:
		resp, err := rs.respondWildcard(wt)
		return reply{sotw: resp}, err
	case wt.incremental():
		resp, err := rs.respondChanged(wt, dirty, full, id)
		return reply{sotw: resp}, err
	case !full && len(dirty) == 0 && wt.sub.persistent:
		return reply{}, nil // nothing changed since the stream's last response
	default:
		resp, err := rs.respond(wt, id)
		return reply{sotw: resp}, err
	}
}

// all returns every resource of a type, for wildcard subscriptions: Istio
// config from the mcp generator (only the set version and the messages:
// config types are served over SotW only), everything else from the
// xDS generator (xdsgen).
func (rs *responder) all(typeURL string, v xdsgen.View) (xdsgen.WildcardSet, error) {
	if mcp.IsConfigType(typeURL) {
		set, err := rs.config.Set(typeURL, v.Client)
		if err != nil {
			return xdsgen.WildcardSet{}, err
		}
		return xdsgen.WildcardSet{Version: set.Version, Anys: set.Resources}, nil
	}
	return rs.gen.All(typeURL, v)
}

// secretResources builds the SDS resources a watch asked for, as istiod
// does: only to a verified identity of our trust domain, Secrets of the
// member its credential proves, of the proxy's own namespace or of another
// namespace whose Secrets its service account may list there (a
// SubjectAccessReview in that member, see sds.Generator.Secret); also roots (ROOTCA, a
// trust domain's bundle) and its own workload certificate ("default").
// Names it may not have are left out (and logged once per stream and
// reason), never an error for the stream. id is the stream's identity; the
// access reviews consulted are left in wt.reviews.
func (rs *responder) secretResources(wt *watch, id authn.Identity) ([]*xdsgen.Resource, error) {
	var out []*xdsgen.Resource
	var reviews map[feed.ReviewKey]struct{}
	wt.awaiting = false
	defer func() { wt.reviews = reviews }()
	var others map[string]struct{} // namespaces other than the proxy's its names ask for
	for _, name := range wt.names {
		var msg proto.Message
		var review *feed.ReviewKey
		var err error
		if ns, ok := sds.OtherNamespace(name, id.Namespace); ok && len(others) >= sds.MaxOtherNamespaces && !has(others, ns) {
			// Each other namespace costs an access review in the member:
			// a client cannot make the hub ask for thousands.
			err = fmt.Errorf("%w: the subscription names Secrets of more than %d namespaces other than %s", sds.ErrDenied, sds.MaxOtherNamespaces, id.Namespace)
		} else {
			if ok {
				add(&others, ns)
			}
			if name == xdsgen.SDSWorkloadCert {
				msg, err = rs.workload.secret(&wt.rec.workload, id, rs.roots)
			} else {
				msg, review, err = rs.sds.Secret(id, name)
			}
		}
		if review != nil {
			add(&reviews, *review)
		}
		if errors.Is(err, sds.ErrReviewPending) {
			wt.awaiting = true
		} else if err != nil {
			if first, last := wt.rec.withheld.first(name, err.Error()); first {
				rs.scope.Count("sds", err)
				rs.log.Warn("SDS resource withheld", "proxy", wt.nodeID, "cluster", id.Cluster, "identity", id.SpiffeID.String(), "resource", name, "reason", err,
					"moreNotLogged", last)
			}
		}
		if err != nil {
			if v, ok := wt.held.version(name); ok && sds.Transient(err) {
				out = append(out, &xdsgen.Resource{Name: name, Version: v, Kept: true})
			}
			continue
		}
		r, err := xdsgen.Marshal(name, resourcev3.SecretType, msg)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
