package hub

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
)

// Streams that receive the same changes share one holding; a stream that
// diverges gets its own, and a change remembered from a holding is never
// replayed onto a holding that was changed since.
func TestHoldingsShareAndDiverge(t *testing.T) {
	h := newHoldings[*anypb.Any]()
	a1, a2, b1, c1 := &anypb.Any{Value: []byte("a1")}, &anypb.Any{Value: []byte("a2")}, &anypb.Any{Value: []byte("b1")}, &anypb.Any{Value: []byte("c1")}
	set := func(names ...string) change[*anypb.Any] {
		c := change[*anypb.Any]{names: names}
		for _, n := range names {
			c.vals = append(c.vals, map[string]*anypb.Any{"a": a1, "b": b1, "c": c1}[n])
		}
		return c
	}
	want := func(x *holding[*anypb.Any], w map[string]*anypb.Any) {
		t.Helper()
		if !maps.Equal(x.res, w) {
			t.Fatalf("holding %v; want %v", slices.Sorted(maps.Keys(x.res)), slices.Sorted(maps.Keys(w)))
		}
	}
	s1 := h.apply(nil, set("a", "b"))
	s2 := h.apply(nil, set("a", "b"))
	if s1 != s2 || s1.refs != 2 {
		t.Fatalf("two streams given the same resources hold %p and %p (refs %d); want one shared holding", s1, s2, s1.refs)
	}
	// s2 takes a change first; s1 diverges, then takes the same change.
	s2 = h.apply(s2, change[*anypb.Any]{names: []string{"a"}, vals: []*anypb.Any{a2}})
	want(s2, map[string]*anypb.Any{"a": a2, "b": b1})
	s1 = h.apply(s1, set("c"))
	want(s1, map[string]*anypb.Any{"a": a1, "b": b1, "c": c1})
	s1 = h.apply(s1, change[*anypb.Any]{names: []string{"a"}, vals: []*anypb.Any{a2}})
	want(s1, map[string]*anypb.Any{"a": a2, "b": b1, "c": c1})
	want(s2, map[string]*anypb.Any{"a": a2, "b": b1})
	// Removals are changes too, and are shared the same way.
	s1 = h.apply(s1, change[*anypb.Any]{removed: []string{"c"}})
	want(s1, map[string]*anypb.Any{"a": a2, "b": b1})
	s3 := h.apply(nil, set("a", "b"))
	s3 = h.apply(s3, change[*anypb.Any]{names: []string{"a"}, vals: []*anypb.Any{a2}})
	if s3 != s2 {
		t.Fatal("a third stream making the same change as s2 does not share its holding")
	}
	// Many distinct changes overflow the remembered ones without losing state.
	for i := range 3 * maxTransitions {
		s1 = h.apply(s1, change[*anypb.Any]{names: []string{"x"}, vals: []*anypb.Any{{Value: []byte{byte(i)}}}})
	}
	if len(s1.res) != 3 || len(h.cache) > maxTransitions {
		t.Fatalf("after many changes: %d held, %d remembered", len(s1.res), len(h.cache))
	}
	want(s2, map[string]*anypb.Any{"a": a2, "b": b1})
}

// A holding a reader froze (the API) is never changed in place: the next
// change copies it, and the reader's map stays as it was.
func TestFrozenHoldingIsCopied(t *testing.T) {
	h := newHoldings[string]()
	x := h.apply(nil, change[string]{names: []string{"a"}, vals: []string{"1"}})
	for i := range maxTransitions + 1 { // the cache forgets x: it may change in place
		h.apply(nil, change[string]{names: []string{fmt.Sprint("other", i)}, vals: []string{"1"}})
	}
	if y := h.apply(x, change[string]{names: []string{"b"}, vals: []string{"1"}}); y != x {
		t.Fatal("a holding only one stream holds and nothing remembers was copied; want it changed in place")
	}
	h.freeze(x)
	y := h.apply(x, change[string]{names: []string{"c"}, vals: []string{"1"}})
	if y == x || len(x.res) != 2 || len(y.res) != 3 {
		t.Fatalf("after freeze: the change gave %p (was %p), which holds %d; the frozen one holds %d; want a copy of 3 and 2 left", y, x, len(y.res), len(x.res))
	}
}
