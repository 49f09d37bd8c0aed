package hub

import (
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// subscriber is one stream's subscription to one type as pushes see it:
// the hostnames its names belong to, indexed in watcher.byHost so that a
// change reaches only the subscribers of the changed hostnames, and what
// changed for it while none of its watches was parked.
//
// A SotW subscription to named resources outlives its watches: it is kept
// with its stream (streamRecord) for as long as the stream asks for the
// same names, so an ACK neither re-parses its names nor re-evaluates them,
// only what changed since the response it acknowledges was built. Delta
// and wildcard watches, and the watches of a stream the tracker has not
// announced, get a subscriber of their own that is indexed only while the
// watch is parked and evaluated in full each time.
type subscriber struct {
	typeURL    string
	wildcard   bool
	persistent bool
	// names is the subscription as the server keeps it (SotW builds a new
	// map per request and never changes it after); list holds the same
	// names, for evaluations that need every one.
	names map[string]struct{}
	list  []string
	hosts map[string][]string // hostname → subscribed names of it (not SDS, not wildcard)
	// SDS: the Secrets (of the identity's member) and whether roots the
	// names ask for; a change of one of them re-evaluates the subscriber.
	secrets []secretRef
	roots   bool

	// Guarded by watcher.mu.
	parked  *watch
	indexed bool
	dirty   map[string]struct{} // changed hostnames not yet evaluated
	full    bool                // evaluate every name: new subscription, its last response was not sent, or (SDS, wildcard) a change
	last    *sotwResponse       // the last SotW response handed to the stream for this subscription
	// reviews are the access reviews an SDS subscriber's last evaluation
	// consulted: a new decision for one of them re-evaluates it (see
	// watcher.push).
	reviews map[reviewKey]struct{}
}

func newSubscriber(typeURL string, names map[string]struct{}, wildcard, persistent bool) *subscriber {
	s := &subscriber{typeURL: typeURL, wildcard: wildcard, persistent: persistent, names: names, full: true}
	if wildcard {
		return s
	}
	s.list = make([]string, 0, len(names))
	if typeURL != resourcev3.SecretType {
		s.hosts = map[string][]string{}
	}
	for name := range names {
		s.list = append(s.list, name)
		if s.hosts == nil {
			continue
		}
		if host, _, ok := parseName(typeURL, name); ok {
			s.hosts[host] = append(s.hosts[host], name)
		}
	}
	return s
}

// aim records which Secrets and roots an SDS subscriber's names ask for,
// read as the stream's identity means them (parseSecretName); not while s
// is indexed.
func (s *subscriber) aim(id identity) {
	s.secrets, s.roots = nil, false
	if s.typeURL != resourcev3.SecretType {
		return
	}
	for _, name := range s.list {
		switch sn := parseSecretName(name, id.namespace); {
		case sn.roots:
			s.roots = true
		case sn.wellFormed && id.cluster != "":
			for _, k := range sn.keys() {
				s.secrets = append(s.secrets, secretRef{id.cluster, k})
			}
		}
	}
}

// sameNames reports whether names is the subscription s was built for.
func (s *subscriber) sameNames(names map[string]struct{}, wildcard bool) bool {
	if s.wildcard != wildcard || len(s.names) != len(names) {
		return false
	}
	for name := range names {
		if _, ok := s.names[name]; !ok {
			return false
		}
	}
	return true
}

// streamRecord is what the watcher keeps per stream, under the stream's
// node pointer (the server stamps it on every request of the stream): its
// verified identity and its persistent subscribers by type.
type streamRecord struct {
	ident identity
	subs  map[string]*subscriber
	// sent says, per type, that a SotW response of that type went out on
	// the stream (set by the server's send, see sotwResponse): a stream's
	// first request of a type is answered even when there is nothing for
	// it, which a client's nonce cannot tell (Istio's adsc makes one up).
	sent map[string]*atomic.Bool
}

// sentFlag returns the stream's flag for typeURL's first response.
func (w *watcher) sentFlag(rec *streamRecord, typeURL string) *atomic.Bool {
	w.mu.Lock()
	defer w.mu.Unlock()
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

// identify follows the proxy tracker's view of a stream: its node pointer
// appears (old nil), changes (the client sent a new node), or goes away
// (new nil: the stream closed, its subscribers are dropped).
func (w *watcher) identify(old, new *corev3.Node, id identity) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rec := w.streams[old]
	delete(w.streams, old)
	if new == nil {
		if rec != nil {
			for _, s := range rec.subs {
				w.unindexLocked(s)
			}
		}
		return
	}
	if rec == nil {
		rec = &streamRecord{subs: map[string]*subscriber{}}
	}
	if s := rec.subs[resourcev3.SecretType]; s != nil && (rec.ident.cluster != id.cluster || rec.ident.namespace != id.namespace) {
		indexed := s.indexed
		w.unindexLocked(s)
		s.aim(id)
		s.full = true
		if indexed {
			w.indexLocked(s)
		}
	}
	rec.ident = id
	w.streams[new] = rec
}

// record returns the stream's record and identity, if the tracker announced it.
func (w *watcher) record(node *corev3.Node) (*streamRecord, identity) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rec := w.streams[node]
	if rec == nil {
		return nil, identity{}
	}
	return rec, rec.ident
}

// subscriberFor returns the subscriber a new watch belongs to: the
// stream's persistent one when it still asks for the same names, else a
// new one (full evaluation).
func (w *watcher) subscriberFor(rec *streamRecord, wt *watch, names map[string]struct{}) *subscriber {
	if rec == nil || wt.deltaOut != nil || wt.wildcard {
		if rec != nil && wt.deltaOut == nil {
			w.dropSubscriber(rec, wt.typeURL)
		}
		return newSubscriber(wt.typeURL, names, wt.wildcard, false)
	}
	w.mu.Lock()
	s := rec.subs[wt.typeURL]
	w.mu.Unlock()
	// s is replaced only here, on the stream's own goroutine, and its names
	// never change: reading them unlocked is safe.
	if s != nil && s.sameNames(names, false) {
		w.mu.Lock()
		if s.last != nil && !s.last.sent.Load() {
			s.full = true // a response was dropped for a newer request: the stream lacks it
		}
		s.last = nil
		w.mu.Unlock()
		return s
	}
	ns := newSubscriber(wt.typeURL, names, false, true)
	ns.aim(wt.ident)
	w.mu.Lock()
	if s != nil {
		w.unindexLocked(s)
	}
	rec.subs[wt.typeURL] = ns
	w.indexLocked(ns)
	w.mu.Unlock()
	return ns
}

func (w *watcher) dropSubscriber(rec *streamRecord, typeURL string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := rec.subs[typeURL]; s != nil {
		w.unindexLocked(s)
		delete(rec.subs, typeURL)
	}
}

// indexLocked makes pushes find s, with w.mu held.
func (w *watcher) indexLocked(s *subscriber) {
	if s.indexed {
		return
	}
	s.indexed = true
	switch {
	case s.typeURL == resourcev3.SecretType:
		w.bySecret[s] = struct{}{}
		for _, ref := range s.secrets {
			addSubscriber(w.byRef, ref, s)
			addSubscriber(w.byMember, ref.cluster, s)
		}
		if s.roots {
			w.byRoots[s] = struct{}{}
		}
	case s.wildcard:
		w.byType[s] = struct{}{}
	default:
		for host := range s.hosts {
			addSubscriber(w.byHost, host, s)
		}
	}
}

func addSubscriber[K comparable](index map[K]map[*subscriber]struct{}, k K, s *subscriber) {
	set := index[k]
	if set == nil {
		set = map[*subscriber]struct{}{}
		index[k] = set
	}
	set[s] = struct{}{}
}

func removeSubscriber[K comparable](index map[K]map[*subscriber]struct{}, k K, s *subscriber) {
	set := index[k]
	delete(set, s)
	if len(set) == 0 {
		delete(index, k)
	}
}

// unindexLocked undoes indexLocked, with w.mu held.
func (w *watcher) unindexLocked(s *subscriber) {
	if !s.indexed {
		return
	}
	s.indexed = false
	switch {
	case s.typeURL == resourcev3.SecretType:
		delete(w.bySecret, s)
		for _, ref := range s.secrets {
			removeSubscriber(w.byRef, ref, s)
			removeSubscriber(w.byMember, ref.cluster, s)
		}
		delete(w.byRoots, s)
	case s.wildcard:
		delete(w.byType, s)
	default:
		for host := range s.hosts {
			removeSubscriber(w.byHost, host, s)
		}
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
