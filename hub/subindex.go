package hub

import (
	"iter"
	"slices"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/hubmesh/hub/hub/feed"
)

// subscriberIndex is how a push finds the subscribers a change concerns:
// those of named resources by hostname, every wildcard one, SDS ones by
// the member Secrets they ask for, by those Secrets' member and by whether
// they ask for roots, and the proxyless gRPC servers by their inbound
// listeners. Kept subscribers of the same type and names share one
// nameIndex (intern). It is guarded by watcher.mu, as the subscribers'
// push state is.
type subscriberIndex struct {
	byHost   map[string]map[*nameIndex]struct{} // see ofHost
	indexes  map[indexKey]*nameIndex            // the shared name indexes of kept subscribers
	byType   map[*subscriber]struct{}           // wildcard subscribers
	bySecret map[*subscriber]struct{}           // every SDS subscriber
	byRef    map[feed.SecretRef]map[*subscriber]struct{}
	byMember map[string]map[*subscriber]struct{}
	byRoots  map[*subscriber]struct{}
	// byServer are the LDS subscribers that name an inbound listener: the
	// proxyless gRPC servers a policy change may concern.
	byServer map[*subscriber]struct{}
}

func newSubscriberIndex() subscriberIndex {
	return subscriberIndex{
		byHost: map[string]map[*nameIndex]struct{}{}, indexes: map[indexKey]*nameIndex{}, byType: map[*subscriber]struct{}{},
		bySecret: map[*subscriber]struct{}{}, byRef: map[feed.SecretRef]map[*subscriber]struct{}{},
		byMember: map[string]map[*subscriber]struct{}{}, byRoots: map[*subscriber]struct{}{}, byServer: map[*subscriber]struct{}{},
	}
}

// indexKey finds a shared nameIndex.
type indexKey struct {
	typeURL string
	sum     uint64
}

// intern makes s use the shared index of its names, if there is one, else
// shares its own; before s is added.
func (x *subscriberIndex) intern(s *subscriber) {
	if s.idx == nil {
		return
	}
	key := indexKey{s.typeURL, s.idx.sum}
	if shared := x.indexes[key]; shared != nil && slices.Equal(shared.list, s.idx.list) {
		s.idx, s.list = shared, shared.list
		return
	}
	if x.indexes[key] == nil {
		x.indexes[key] = s.idx
	}
}

// add makes pushes find s.
func (x *subscriberIndex) add(s *subscriber) {
	if s.indexed {
		return
	}
	s.indexed = true
	switch {
	case s.typeURL == resourcev3.SecretType:
		x.bySecret[s] = struct{}{}
		for _, ref := range s.secrets {
			addSubscriber(x.byRef, ref, s)
			addSubscriber(x.byMember, ref.Cluster, s)
		}
		if s.roots {
			x.byRoots[s] = struct{}{}
		}
	case s.wildcard:
		x.byType[s] = struct{}{}
	default:
		names := s.idx
		if isServer(s) {
			x.byServer[s] = struct{}{}
		}
		if len(names.subs) == 0 {
			for host := range names.hosts {
				set := x.byHost[host]
				if set == nil {
					set = map[*nameIndex]struct{}{}
					x.byHost[host] = set
				}
				set[names] = struct{}{}
			}
		}
		names.subs[s] = struct{}{}
	}
}

// remove undoes add.
func (x *subscriberIndex) remove(s *subscriber) {
	if !s.indexed {
		return
	}
	s.indexed = false
	switch {
	case s.typeURL == resourcev3.SecretType:
		delete(x.bySecret, s)
		for _, ref := range s.secrets {
			removeSubscriber(x.byRef, ref, s)
			removeSubscriber(x.byMember, ref.Cluster, s)
		}
		delete(x.byRoots, s)
	case s.wildcard:
		delete(x.byType, s)
	default:
		names := s.idx
		delete(x.byServer, s)
		delete(names.subs, s)
		if len(names.subs) > 0 {
			return
		}
		for host := range names.hosts {
			set := x.byHost[host]
			delete(set, names)
			if len(set) == 0 {
				delete(x.byHost, host)
			}
		}
		if key := (indexKey{names.typeURL, names.sum}); x.indexes[key] == names {
			delete(x.indexes, key)
		}
	}
}

// ofHost lists the subscribers of a hostname's names.
func (x *subscriberIndex) ofHost(host string) iter.Seq[*subscriber] {
	return func(yield func(*subscriber) bool) {
		for names := range x.byHost[host] {
			for s := range names.subs {
				if !yield(s) {
					return
				}
			}
		}
	}
}

// reached calls touched for every subscriber of a hostname b changed, with
// the hostname, and changed for every other subscriber b concerns as a
// whole: every wildcard one when a service or Istio config changed, the
// SDS ones of a changed Secret, member or roots, and those whose last
// evaluation consulted an access review b decided anew.
func (x *subscriberIndex) reached(b *feed.Batch, touched func(s *subscriber, host string), changed func(*subscriber)) {
	for host := range b.Hosts {
		for s := range x.ofHost(host) {
			touched(s, host)
		}
	}
	if len(b.Hosts) > 0 || len(b.Kinds) > 0 {
		// Every wildcard set may have changed (Istio config's too): those
		// whose set version did not are skipped in the waves.
		for s := range x.byType {
			changed(s)
		}
	}
	for ref := range b.Secrets {
		for s := range x.byRef[ref] {
			changed(s)
		}
	}
	for member := range b.Members {
		for s := range x.byMember[member] {
			changed(s)
		}
	}
	if b.Roots {
		for s := range x.byRoots {
			changed(s)
		}
	}
	if len(b.Reviews) > 0 {
		for s := range x.bySecret {
			for k := range s.reviews {
				if _, ok := b.Reviews[k]; ok {
					changed(s)
					break
				}
			}
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
