package hub

import (
	"hash/maphash"
	"maps"
	"slices"
	"sync"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hubmesh/hub/hub/xdsgen"
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

// heldResources is what a stream holds of one type: the resources by
// name (a holding, which only the stream's loop may change, in place while
// the stream alone holds it and nobody froze it: see holdings.apply) or the
// resources of a whole-state response, with the version of the set it
// was, if a wildcard's.
type heldResources struct {
	holding *holding[heldResource] // nil: none by name
	whole   []*xdsgen.Resource
	set     string
	// sent are the resources of the whole-state response, as sent (Istio
	// config's are not xdsgen.Resources: whole is empty for them).
	sent []*anypb.Any
}

// heldResource is what a stream holds of one resource: its version and,
// when the hub sent it, the resource (nil when the stream only said it
// holds it: Delta's initial_resource_versions; or when it is to be sent
// again whatever its version: version ""). Streams that hold the same
// versions of the same resources share one holding.
type heldResource struct {
	version string
	any     *anypb.Any
}

// changeOf is what a response that sent res and removed removed does to
// what a stream holds.
func changeOf(res []*xdsgen.Resource, removed []string) change[heldResource] {
	c := change[heldResource]{names: make([]string, len(res)), vals: make([]heldResource, len(res)), removed: removed}
	for i, r := range res {
		c.names[i], c.vals[i] = r.Name, heldResource{r.Version, r.Any}
	}
	return c
}

// same reports whether h and o are the same record: the same holding and
// the very same whole-state slices.
func (h heldResources) same(o heldResources) bool {
	return h.holding == o.holding && h.set == o.set &&
		(h.whole == nil) == (o.whole == nil) && sameSlice(h.whole, o.whole) &&
		(h.sent == nil) == (o.sent == nil) && sameSlice(h.sent, o.sent)
}

// byName returns the resources held by name (nil: none).
func (h heldResources) byName() map[string]heldResource {
	if h.holding == nil {
		return nil
	}
	return h.holding.res
}

// version returns the version the stream holds of name.
func (h heldResources) version(name string) (string, bool) {
	if r, ok := h.byName()[name]; ok {
		return r.version, true
	}
	for _, r := range h.whole {
		if r.Name == name {
			return r.Version, true
		}
	}
	return "", false
}

// changed reports whether r is not what the stream holds of its name (a
// resource held by name: whole states are compared whole, see sameAs).
func (h heldResources) changed(r *xdsgen.Resource) bool {
	held, ok := h.byName()[r.Name]
	return !ok || held.version != r.Version
}

// sameAs reports whether the stream holds exactly res, a whole state
// (nothing held is the same as none).
func (h heldResources) sameAs(res []*xdsgen.Resource) bool {
	if len(h.byName()) > 0 {
		if len(res) != len(h.byName()) {
			return false
		}
		for _, r := range res {
			if h.changed(r) {
				return false
			}
		}
		return true
	}
	if len(res) != len(h.whole) {
		return false
	}
	for i, r := range res {
		if h.whole[i].Name != r.Name || h.whole[i].Version != r.Version {
			byName := make(map[string]string, len(h.whole))
			for _, w := range h.whole {
				byName[w.Name] = w.Version
			}
			for _, r := range res {
				if v, ok := byName[r.Name]; !ok || v != r.Version {
					return false
				}
			}
			return true
		}
	}
	return true
}

// anys are the resources the stream holds, in order of name for a holding
// (those it only said it holds, with no resource, left out).
func (h heldResources) anys() []*anypb.Any {
	if h.sent != nil {
		return h.sent
	}
	out := make([]*anypb.Any, 0, len(h.byName()))
	for _, name := range slices.Sorted(maps.Keys(h.byName())) {
		if a := h.byName()[name].any; a != nil {
			out = append(out, a)
		}
	}
	return out
}

// count is how many resources the stream holds.
func (h heldResources) count() int { return max(len(h.byName()), len(h.whole), len(h.sent)) }
