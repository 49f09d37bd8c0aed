package hub

import (
	"hash/maphash"
	"maps"
	"slices"
	"sync"
)

// holding is what a stream holds of one type, by name: the resources it
// was sent (what the responder compares new ones with, and the API shows), or
// the names it subscribes to (Delta). Streams that received the
// same responses hold the same resources (with Envoy sidecars, every stream
// holds every cluster's endpoints), so a holding reached by a change that
// another stream made first is shared instead of copied: with thousands of
// streams a map per stream would be most of the hub's memory. A holding is
// changed in place only while one stream holds it and no other can reach
// it; its map is read only once shared, or frozen for a reader outside the
// stream's loop.
type holding[V comparable] struct {
	res    map[string]V
	refs   int  // streams holding it
	cached bool // reachable from holdings.cache: never changed again
	keyed  bool // a change from it is remembered: never changed again
	frozen bool // read outside its stream's loop (freeze): never changed again
}

// change is what one response did to a holding: names now hold vals,
// removed hold nothing.
type change[V comparable] struct {
	names   []string
	vals    []V
	removed []string
}

func (c change[V]) same(o change[V]) bool {
	return slices.Equal(c.names, o.names) && slices.Equal(c.vals, o.vals) && slices.Equal(c.removed, o.removed)
}

type transitionKey[V comparable] struct {
	base   *holding[V]
	digest uint64
}

type transition[V comparable] struct {
	change change[V]
	next   *holding[V]
}

// holdings shares holdings between streams: it remembers the latest
// changes (from which holding, which resources) and where they led. Safe
// for concurrent use.
type holdings[V comparable] struct {
	mu    sync.Mutex
	seed  maphash.Seed
	empty *holding[V] // where every stream starts (never changed)
	cache map[transitionKey[V]]transition[V]
}

// The stream loops' holdings: the resources streams hold, and the names
// Delta streams subscribe to.
type (
	resourceHoldings = holdings[heldResource]
	nameHoldings     = holdings[struct{}]
)

// maxTransitions bounds the changes remembered: a push makes one per
// distinct holding it changes, and the streams that follow it look it up
// while it is recent.
const maxTransitions = 64

func newHoldings[V comparable]() *holdings[V] {
	return &holdings[V]{seed: maphash.MakeSeed(), empty: &holding[V]{cached: true}, cache: map[transitionKey[V]]transition[V]{}}
}

func (h *holdings[V]) digest(c change[V]) uint64 {
	var d maphash.Hash
	d.SetSeed(h.seed)
	for i, name := range c.names {
		d.WriteString(name)
		d.WriteByte(0)
		v := maphash.Comparable(h.seed, c.vals[i])
		for range 8 {
			d.WriteByte(byte(v))
			v >>= 8
		}
	}
	d.WriteByte(1)
	for _, name := range c.removed {
		d.WriteString(name)
		d.WriteByte(0)
	}
	return d.Sum64()
}

// apply returns the holding that base (nil: nothing) becomes with c, for
// one stream that held base and now holds the result. c's slices are not
// kept.
func (h *holdings[V]) apply(base *holding[V], c change[V]) *holding[V] {
	h.mu.Lock()
	defer h.mu.Unlock()
	if base == nil {
		base = h.empty
		base.refs++
	}
	if len(c.names) == 0 && len(c.removed) == 0 {
		return base
	}
	key := transitionKey[V]{base, h.digest(c)}
	if t, ok := h.cache[key]; ok && t.change.same(c) {
		base.refs--
		t.next.refs++
		return t.next
	}
	if base.refs == 1 && !base.cached && !base.keyed && !base.frozen {
		applyChange(base.res, c)
		return base
	}
	next := &holding[V]{res: make(map[string]V, len(base.res)+len(c.names)), refs: 1}
	maps.Copy(next.res, base.res)
	applyChange(next.res, c)
	base.refs--
	if len(h.cache) >= maxTransitions {
		for k, t := range h.cache {
			k.base.keyed = false
			t.next.cached = false
		}
		h.empty.cached = true
		clear(h.cache)
	}
	base.keyed, next.cached = true, true
	h.cache[key] = transition[V]{change: change[V]{names: slices.Clone(c.names), vals: slices.Clone(c.vals), removed: slices.Clone(c.removed)}, next: next}
	return next
}

func applyChange[V comparable](m map[string]V, c change[V]) {
	for i, name := range c.names {
		m[name] = c.vals[i]
	}
	for _, name := range c.removed {
		delete(m, name)
	}
}

// freeze says x (nil: nothing) is never changed in place again, so that
// a reader outside the stream's loop (the API) may read its map without a
// lock once freeze returned: a change the loop made in place before is
// seen, and any later one copies the map.
func (h *holdings[V]) freeze(x *holding[V]) {
	if x != nil {
		h.mu.Lock()
		x.frozen = true
		h.mu.Unlock()
	}
}

// release notes that one stream no longer holds x (nil: nothing).
func (h *holdings[V]) release(x *holding[V]) {
	if x != nil {
		h.mu.Lock()
		x.refs--
		h.mu.Unlock()
	}
}
