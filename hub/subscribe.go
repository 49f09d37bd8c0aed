package hub

import (
	"hash/maphash"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/authz"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/sds"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/hub/xdsstatus"
)

// subscriber is one stream's subscription to one type as pushes see it:
// the hostnames its names belong to, indexed (subscriberIndex) so that a
// change reaches only the subscribers of the changed hostnames, and what
// changed for it while none of its watches was parked.
//
// A subscription to named resources (SotW, and Delta but for SDS)
// outlives its watches: it is kept with its stream (streamRecord) for as
// long as the stream asks for the same names, so an ACK neither re-parses
// its names nor re-evaluates them, only what changed since the response
// it acknowledges was built. Wildcard watches and Delta SDS watches get a
// subscriber of their own that is indexed only while the watch is parked
// and evaluated in full each time.
type subscriber struct {
	typeURL    string
	wildcard   bool
	persistent bool
	// idx is the subscribed names by hostname (not SDS, not wildcard),
	// shared with every kept subscriber of the same names (read only).
	idx *nameIndex
	// list is every subscribed name (idx.list, or SDS's names).
	list []string
	// names is, for SDS only, the subscription as the stream's loop
	// handed it over (read only: SotW's is a new map per request, Delta's a
	// shared holding the loop replaces or changes only after the watch).
	names map[string]struct{}
	// requested identifies the request's own list of the names (SotW): an
	// ACK repeats it, usually in the same order, which is recognised by
	// hashing the list rather than by a lookup per name. The digest's seed
	// is secret, and a collision could only affect the stream that sent it.
	requested digest
	// asked is that list itself (SotW; shared, read only): an ACK of the
	// same interned list (wire.RequestStream) is the same subscription.
	asked []string
	// SDS: the Secrets (of the identity's member) and whether roots the
	// names ask for; a change of one of them re-evaluates the subscriber.
	secrets []feed.SecretRef
	roots   bool

	// Guarded by watcher.mu.
	// view is the view the subscriber was last evaluated for: a watch of
	// another view (the client's network became known, or changed) makes
	// the next evaluation full.
	view    xdsgen.View
	parked  *watch
	indexed bool
	dirty   map[string]struct{} // changed hostnames not yet evaluated
	full    bool                // evaluate every name: new subscription, its last response was not sent, or (SDS, wildcard) a change
	last    *sotwResponse       // the last SotW response handed to the stream for this subscription
	// reviews are the access reviews an SDS subscriber's last evaluation
	// consulted: a new decision for one of them re-evaluates it (see
	// subscriberIndex.reached).
	reviews map[feed.ReviewKey]struct{}
}

// digest identifies a list of names, in order.
type digest struct {
	n   int
	sum uint64
}

var digestSeed = maphash.MakeSeed()

func digestOf(names []string) digest {
	var h maphash.Hash
	h.SetSeed(digestSeed)
	for _, n := range names {
		h.WriteString(n)
		h.WriteByte(0)
	}
	return digest{len(names), h.Sum64()}
}

// nameIndex is a subscription's names by hostname: every name, those of
// a hostname side by side (sorted by hostname, then name), then those
// that name no hostname; hosts maps a hostname to its names' span of
// list. It is built once per subscription and read only after. Kept
// subscribers of the same type and names share one (subscriberIndex):
// with Envoy sidecars every stream subscribes to every cluster, and an
// index per stream would be a large part of the hub's memory.
type nameIndex struct {
	typeURL string
	list    []string
	hosts   map[string]span
	hosted  int // how many of list name a hostname (they come first)
	sum     uint64
	// subs are the indexed subscribers that use it (guarded by
	// watcher.mu); while there are any, the subscriberIndex lists it under
	// each of its hostnames.
	subs map[*subscriber]struct{}
}

// span is where a hostname's names are in nameIndex.list.
type span struct{ at, n uint32 }

func newNameIndex(typeURL string, names map[string]struct{}) *nameIndex {
	type named struct{ host, name string }
	byHost := make([]named, 0, len(names))
	var other []string
	for name := range names {
		if host, _, ok := xdsgen.ParseName(typeURL, name); ok {
			byHost = append(byHost, named{host, name})
		} else {
			other = append(other, name)
		}
	}
	slices.SortFunc(byHost, func(a, b named) int {
		if c := strings.Compare(a.host, b.host); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	slices.Sort(other)
	x := &nameIndex{typeURL: typeURL, list: make([]string, len(byHost), len(names)), hosts: map[string]span{}, hosted: len(byHost), subs: map[*subscriber]struct{}{}}
	for i, n := range byHost {
		x.list[i] = n.name
		if i > 0 && byHost[i-1].host == n.host {
			sp := x.hosts[n.host]
			sp.n++
			x.hosts[n.host] = sp
			continue
		}
		x.hosts[n.host] = span{at: uint32(i), n: 1}
	}
	x.list = append(x.list, other...)
	x.sum = digestOf(x.list).sum
	return x
}

func newSubscriber(typeURL string, names map[string]struct{}, wildcard, persistent bool) *subscriber {
	s := &subscriber{typeURL: typeURL, wildcard: wildcard, persistent: persistent, full: true}
	switch {
	case wildcard:
	case typeURL == resourcev3.SecretType:
		s.names = names
		s.list = slices.Collect(maps.Keys(names))
	default:
		s.idx = newNameIndex(typeURL, names)
		s.list = s.idx.list
	}
	return s
}

// aim records which Secrets and roots an SDS subscriber's names ask for,
// read as the stream's identity means them (sds.ParseName); not while s
// is indexed.
func (s *subscriber) aim(id authn.Identity) {
	s.secrets, s.roots = nil, false
	if s.typeURL != resourcev3.SecretType {
		return
	}
	for _, name := range s.list {
		switch n := sds.ParseName(name, id.Namespace); {
		case n.Roots:
			s.roots = true
		case n.WellFormed && id.Cluster != "":
			for _, k := range n.Keys() {
				s.secrets = append(s.secrets, feed.SecretRef{Cluster: id.Cluster, Key: k})
			}
		}
	}
}

// namesOf returns the subscribed names of a hostname (shared, read only).
func (s *subscriber) namesOf(host string) []string {
	if s.idx == nil {
		return nil
	}
	sp, ok := s.idx.hosts[host]
	if !ok {
		return nil
	}
	return s.idx.list[sp.at : sp.at+sp.n]
}

// has reports whether name is subscribed (s not wildcard).
func (s *subscriber) has(name string) bool {
	if s.idx == nil {
		_, ok := s.names[name]
		return ok
	}
	if host, _, ok := xdsgen.ParseName(s.typeURL, name); ok {
		return slices.Contains(s.namesOf(host), name)
	}
	return slices.Contains(s.idx.list[s.idx.hosted:], name)
}

// sameNames reports whether names (requested: the request's list of
// them) is the subscription s was built for.
func (s *subscriber) sameNames(names map[string]struct{}, requested []string, wildcard bool) bool {
	if s.wildcard != wildcard || len(s.list) != len(names) {
		return false
	}
	if s.requested.n == len(requested) && s.requested.n > 0 && digestOf(requested) == s.requested {
		return true
	}
	for name := range names {
		if !s.has(name) {
			return false
		}
	}
	return true
}

// streamRecord is what the watcher keeps of a stream, part of the
// stream's conn (which the loop hands to every watch) and guarded by
// watcher.mu: its verified identity (the loop tells it, see identify) and
// its persistent subscribers by type.
type streamRecord struct {
	ident authn.Identity
	subs  map[string]*subscriber
	// server is the workload behind the stream, for the inbound
	// listeners of a proxyless gRPC server, as worked out for the
	// identity serverFor (see watcher.serverOf; guarded by watcher.mu).
	server    *authz.Workload
	serverFor authn.Identity
	// withheld logs each SDS name withheld from the stream once
	// (secretResources), for the stream's whole life; it has its own lock
	// (pushes evaluate the stream's watches beside its loop).
	withheld withheldLog
	// workload is the stream's workload certificate (SDS "default").
	workload streamWorkload
	// sent says, per type, that a SotW response of that type went out on
	// the stream (set when the stream's loop sends it, see sotwResponse): a stream's
	// first request of a type is answered even when there is nothing for
	// it, which a client's nonce cannot tell (Istio's adsc makes one up).
	sent map[string]*atomic.Bool
	// handed is, per type, the last SotW response handed to the stream
	// (guarded by watcher.mu): one the stream's loop dropped for a newer request,
	// or never sent before the stream closed, is counted as answered for
	// the pacing (pacing.Deliveries), since no client will answer it.
	handed map[string]*sotwResponse
}

// handedLocked records r as the last SotW response handed to rec's stream
// for typeURL, with w.mu held.
func (rec *streamRecord) handedLocked(typeURL string, r *sotwResponse) {
	if r == nil {
		return
	}
	if rec.handed == nil {
		rec.handed = map[string]*sotwResponse{}
	}
	rec.handed[typeURL] = r
}

// unsentLocked forgets the last SotW response handed to rec's stream for
// typeURL (every type when typeURL is "") and returns how many of those
// the stream's loop never sent, with w.mu held.
func (rec *streamRecord) unsentLocked(typeURL string) int {
	n := 0
	for t, r := range rec.handed {
		if typeURL != "" && t != typeURL {
			continue
		}
		if !r.sent.Load() {
			n++
		}
		delete(rec.handed, t)
	}
	return n
}

// requested records a new SotW request of typeURL on rec's stream and
// returns the stream's flag for the type's first response. The type's last
// response was sent before the stream's loop took the request, or dropped for it:
// then nobody answers it, and it counts as answered (pacing.Deliveries).
func (w *watcher) requested(rec *streamRecord, typeURL string) *atomic.Bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fleet.Answer(rec.unsentLocked(typeURL))
	f := rec.sent[typeURL]
	if f == nil {
		if rec.sent == nil {
			rec.sent = map[string]*atomic.Bool{}
		}
		f = &atomic.Bool{}
		rec.sent[typeURL] = f
	}
	return f
}

// renew makes the next watch of typeURL on rec's stream answer as the
// type's first does: with every name its subscription has that the stream
// does not hold, and even when that is nothing (a client that starts over,
// or endpoints Envoy waits for; see sotwConn.resendEndpoints).
func (w *watcher) renew(rec *streamRecord, typeURL string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rec.sent != nil {
		rec.sent[typeURL] = &atomic.Bool{}
	}
	if s := rec.subs[typeURL]; s != nil {
		s.full = true
	}
}

// closeStream forgets a stream that ended: its subscribers are dropped,
// and what it was handed and never sent counts as answered.
func (w *watcher) closeStream(rec *streamRecord) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range rec.subs {
		w.index.remove(s)
	}
	clear(rec.subs)
	w.fleet.Answer(rec.unsentLocked("")) // the stream is gone: nobody will answer them
}

// identify sets the verified identity of rec's stream, as the stream's
// loop tells it once the tracker settled it (conn.identified): an SDS
// subscriber of another member or namespace than before is aimed again.
func (w *watcher) identify(rec *streamRecord, id authn.Identity) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := rec.subs[resourcev3.SecretType]; s != nil && (rec.ident.Cluster != id.Cluster || rec.ident.Namespace != id.Namespace) {
		indexed := s.indexed
		w.index.remove(s)
		s.aim(id)
		s.full = true
		if indexed {
			w.index.add(s)
		}
	}
	rec.ident = id
}

// streamIdentity returns the verified identity of rec's stream.
func (w *watcher) streamIdentity(rec *streamRecord) authn.Identity {
	w.mu.Lock()
	defer w.mu.Unlock()
	return rec.ident
}

// subscriberFor returns the subscriber a new SotW watch belongs to: the
// stream's persistent one when it still asks for the same names, else a
// new one (full evaluation). An ACK that repeats the interned list of
// names its subscriber was built from (wire.RequestStream) is recognised
// without looking at the names.
func (w *watcher) subscriberFor(rec *streamRecord, wt *watch, sub subscription) *subscriber {
	if wt.wildcard {
		w.dropSubscriber(rec, wt.typeURL)
		return newSubscriber(wt.typeURL, sub.SubscribedResources(), wt.wildcard, false)
	}
	requested := wt.req.GetResourceNames()
	w.mu.Lock()
	s := rec.subs[wt.typeURL]
	w.mu.Unlock()
	// s is replaced only here, on the stream's own goroutine, and its names
	// never change: reading them unlocked is safe.
	var names map[string]struct{}
	same := s != nil && sameSlice(requested, s.asked)
	if s != nil && !same {
		names = sub.SubscribedResources()
		same = s.sameNames(names, requested, false)
	}
	if same {
		w.mu.Lock()
		if s.last != nil && !s.last.sent.Load() {
			s.full = true // a response was dropped for a newer request: the stream lacks it
		}
		if s.view != wt.view {
			s.full, s.view = true, wt.view
		}
		s.last = nil
		w.mu.Unlock()
		return s
	}
	if names == nil {
		names = sub.SubscribedResources()
	}
	ns := newSubscriber(wt.typeURL, names, false, true)
	ns.aim(wt.ident)
	ns.requested, ns.asked = digestOf(requested), requested
	ns.view = wt.view
	w.keep(rec, s, ns)
	return ns
}

// keep makes ns the stream's kept subscriber of its type in place of old
// (nil: none), indexed for pushes.
func (w *watcher) keep(rec *streamRecord, old, ns *subscriber) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if old != nil {
		w.index.remove(old)
	}
	w.index.intern(ns)
	rec.subs[ns.typeURL] = ns
	w.index.add(ns)
}

// deltaSubscriberFor returns the subscriber a new Delta watch belongs
// to. A subscription by name (not SDS) is kept with its stream like a
// SotW one: a request that neither subscribes nor unsubscribes anything
// (an ACK or a NACK) keeps it, so pushes evaluate only the changed
// hostnames' names; any other request builds a new one, evaluated in
// full once. The stream's subscription map changes with its next request
// (deltaSubscription), so the subscriber keeps a list of its own.
func (w *watcher) deltaSubscriberFor(rec *streamRecord, wt *watch, names map[string]struct{}) *subscriber {
	if wt.wildcard || wt.typeURL == resourcev3.SecretType {
		w.dropSubscriber(rec, wt.typeURL)
		return newSubscriber(wt.typeURL, names, wt.wildcard, false)
	}
	req := wt.deltaReq
	w.mu.Lock()
	s := rec.subs[wt.typeURL]
	w.mu.Unlock()
	if s != nil && len(req.GetResourceNamesSubscribe()) == 0 && len(req.GetResourceNamesUnsubscribe()) == 0 && len(s.list) == len(names) {
		w.mu.Lock()
		if s.view != wt.view {
			s.full, s.view = true, wt.view
		}
		w.mu.Unlock()
		return s
	}
	ns := newSubscriber(wt.typeURL, names, false, true)
	ns.view = wt.view
	w.keep(rec, s, ns)
	return ns
}

func (w *watcher) dropSubscriber(rec *streamRecord, typeURL string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := rec.subs[typeURL]; s != nil {
		w.index.remove(s)
		delete(rec.subs, typeURL)
	}
}

// touchLocked records that one of s's hostnames changed, with w.mu held.
func (s *subscriber) touchLocked(host string) {
	if s.dirty == nil {
		s.dirty = map[string]struct{}{}
	}
	s.dirty[host] = struct{}{}
}

// takeLocked returns and clears what s must evaluate, with w.mu held.
func (s *subscriber) takeLocked() (dirty map[string]struct{}, full bool) {
	dirty, full = s.dirty, s.full
	s.dirty, s.full = nil, false
	return dirty, full
}

// serverOf is the workload behind rec's stream, for the inbound listeners
// of a proxyless gRPC server (see authz.WorkloadOf): worked out once per
// identity the stream proves, so that every watch of the stream has the
// same one (a new one would make its next evaluation full).
func (w *watcher) serverOf(rec *streamRecord, node *corev3.Node, ident authn.Identity) *authz.Workload {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rec.server != nil && rec.serverFor == ident {
		return rec.server
	}
	var proven authz.Proven
	if !ident.SpiffeID.IsZero() {
		// A proven identity stands, whatever the node says; one of
		// another trust domain, or without /ns/<ns>/sa/<sa>, selects
		// no namespace's policies.
		proven = authz.Proven{Verified: true, Member: ident.Cluster}
		if w.roots != nil && ident.Verified(w.roots.LocalTrustDomain()) {
			proven.Namespace, proven.ServiceAccount = ident.Namespace, authn.ServiceAccountOf(ident.SpiffeID)
		}
	}
	wl := authz.WorkloadOf(node, proven)
	rec.server, rec.serverFor = &wl, ident
	return rec.server
}

// serverSecurity is what the policies make of rec's stream's inbound
// listeners; nil when it asks for none.
func (w *watcher) serverSecurity(rec *streamRecord) *xdsstatus.ServerSecurity {
	w.mu.Lock()
	names, wl := inboundNames(rec.subs[resourcev3.ListenerType]), rec.server
	w.mu.Unlock()
	if len(names) == 0 || w.gen == nil {
		return nil
	}
	out := &xdsstatus.ServerSecurity{}
	if wl != nil {
		out.Workload = *wl
	}
	set, known := w.gen.Security()
	out.Pending = !known
	sel := set.Select(out.Workload)
	out.PeerAuthentications, out.Policies, out.FailClosed = sel.PeerAuthentications(), sel.Policies(), sel.FailsClosed()
	for _, name := range names {
		ap, ok := xdsgen.ParseInboundName(name)
		if !ok {
			continue
		}
		port := uint32(ap.Port())
		out.Listeners = append(out.Listeners, xdsstatus.InboundListener{Name: name, Port: port, Mode: sel.ServerMode(port), PolicyMode: sel.PolicyMode(port)})
	}
	return out
}
