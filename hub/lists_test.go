package hub

import (
	"fmt"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hubmesh/hub/hub/xdsgen"
)

func testResources(t *testing.T, n int, tag string) []*xdsgen.Resource {
	t.Helper()
	out := make([]*xdsgen.Resource, n)
	for i := range out {
		a, err := anypb.New(wrapperspb.String(fmt.Sprintf("%s-%d", tag, i)))
		if err != nil {
			t.Fatal(err)
		}
		out[i] = &xdsgen.Resource{Name: fmt.Sprintf("%s-%04d", tag, i), Version: tag, Any: a}
	}
	return out
}

// Responses carrying the same resources share one list (so the codec
// encodes it once); a list differing in one resource, or a small one, is
// a list of its own, and every list matches what it was made from.
func TestResponseListsShareEqualLists(t *testing.T) {
	l := newResponseLists()
	res := testResources(t, 100, "a")
	first := l.list(append([]*xdsgen.Resource(nil), res...))
	second := l.list(append([]*xdsgen.Resource(nil), res...))
	if unsafe.SliceData(first.anys) != unsafe.SliceData(second.anys) || first.version != second.version {
		t.Fatal("two responses with the same resources got lists of their own")
	}
	other := append([]*xdsgen.Resource(nil), res...)
	other[60] = testResources(t, 1, "b")[0]
	third := l.list(other)
	if unsafe.SliceData(third.anys) == unsafe.SliceData(first.anys) || third.version == first.version || third.anys[60] != other[60].Any {
		t.Fatal("a list differing in one resource was taken for the shared one")
	}
	for i, r := range res {
		if first.anys[i] != r.Any || first.res[i] != r {
			t.Fatalf("resource %d of the shared list is not the one given", i)
		}
	}
	small := testResources(t, 3, "s")
	if a, b := l.list(small), l.list(small); unsafe.SliceData(a.anys) == unsafe.SliceData(b.anys) {
		t.Error("a small list was shared")
	}
}
