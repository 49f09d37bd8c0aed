package hub

import (
	"hash/maphash"
	"maps"
	"slices"

	"google.golang.org/protobuf/types/known/anypb"
)

// holding is what a stream holds of one type, by name, as the proxy
// tracker records it. Streams that received the same responses hold the
// same resources (with Envoy sidecars, every stream holds every cluster's
// endpoints), so a holding reached by a change that another stream made
// first is shared instead of copied: with thousands of streams a map per
// stream would be most of the tracker's memory. A holding is changed in
// place only while one stream holds it and no other can reach it.
type holding struct {
	res    map[string]*anypb.Any // read only once shared
	refs   int                   // streams holding it
	cached bool                  // reachable from holdings.cache: never changed again
	keyed  bool                  // a change from it is remembered: never changed again
}

// change is what one response did to a holding.
type change struct {
	names   []string
	anys    []*anypb.Any
	removed []string
}

func (c change) same(o change) bool {
	return slices.Equal(c.names, o.names) && slices.Equal(c.anys, o.anys) && slices.Equal(c.removed, o.removed)
}

type transitionKey struct {
	base   *holding
	digest uint64
}

type transition struct {
	change change
	next   *holding
}

// holdings shares holdings between streams: it remembers the latest
// changes (from which holding, which resources) and where they led.
// Guarded by the tracker's mutex.
type holdings struct {
	seed  maphash.Seed
	empty *holding // where every stream starts (never changed)
	cache map[transitionKey]transition
}

// maxTransitions bounds the changes remembered: a push makes one per
// distinct holding it changes, and the streams that follow it look it up
// while it is recent.
const maxTransitions = 64

func newHoldings() *holdings {
	return &holdings{seed: maphash.MakeSeed(), empty: &holding{cached: true}, cache: map[transitionKey]transition{}}
}

func (h *holdings) digest(c change) uint64 {
	var d maphash.Hash
	d.SetSeed(h.seed)
	for i, name := range c.names {
		d.WriteString(name)
		d.WriteByte(0)
		v := maphash.Comparable(h.seed, c.anys[i])
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
func (h *holdings) apply(base *holding, c change) *holding {
	if base == nil {
		base = h.empty
		base.refs++
	}
	if len(c.names) == 0 && len(c.removed) == 0 {
		return base
	}
	key := transitionKey{base, h.digest(c)}
	if t, ok := h.cache[key]; ok && t.change.same(c) {
		h.release(base)
		t.next.refs++
		return t.next
	}
	if base.refs == 1 && !base.cached && !base.keyed {
		applyChange(base.res, c)
		return base
	}
	next := &holding{res: make(map[string]*anypb.Any, len(base.res)+len(c.names)), refs: 1}
	maps.Copy(next.res, base.res)
	applyChange(next.res, c)
	h.release(base)
	if len(h.cache) >= maxTransitions {
		for k, t := range h.cache {
			k.base.keyed = false
			t.next.cached = false
		}
		h.empty.cached = true
		clear(h.cache)
	}
	base.keyed, next.cached = true, true
	h.cache[key] = transition{change: change{names: slices.Clone(c.names), anys: slices.Clone(c.anys), removed: slices.Clone(c.removed)}, next: next}
	return next
}

func applyChange(m map[string]*anypb.Any, c change) {
	for i, name := range c.names {
		m[name] = c.anys[i]
	}
	for _, name := range c.removed {
		delete(m, name)
	}
}

// release notes that one stream no longer holds x (nil: nothing).
func (h *holdings) release(x *holding) {
	if x != nil {
		x.refs--
	}
}
