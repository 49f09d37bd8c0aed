package wire

import (
	"fmt"
	"testing"
	"unsafe"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hubmesh/hub/hub/xdsgen"
)

func sharedResources(t *testing.T, n int, tag string) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, n)
	for i := range out {
		a, err := anypb.New(wrapperspb.String(fmt.Sprintf("%s-%d", tag, i)))
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

func roundTrip(t *testing.T, c *Codec, resp *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryResponse {
	t.Helper()
	data, err := c.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var got discoveryv3.DiscoveryResponse
	if err := proto.Unmarshal(data.Materialize(), &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

// The codec's bytes decode to the response it was given: with a shared
// list (encoded once a second response carries it, then reused), with a
// list that shares its first elements with a cached one, and small ones;
// a list carried once (built for one stream) is not kept.
func TestSharedCodec(t *testing.T) {
	c := NewCodec()
	set := sharedResources(t, 100, "a")
	for i, nonce := range []string{"1", "7"} {
		resp := &discoveryv3.DiscoveryResponse{VersionInfo: "v1", Resources: set, TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Nonce: nonce}
		if got := roundTrip(t, c, resp); !proto.Equal(got, resp) {
			t.Fatalf("stream %d: decoded %v; want %v", i, got, resp)
		}
	}
	if n := c.shared.Len(); n != 1 {
		t.Errorf("%d lists encoded for one shared list", n)
	}
	// Another list with the same first element and length (a set where one
	// later resource changed) is not taken for the cached one.
	other := append([]*anypb.Any(nil), set...)
	other[50] = sharedResources(t, 1, "changed")[0]
	resp := &discoveryv3.DiscoveryResponse{VersionInfo: "v2", Resources: other, Nonce: "8"}
	if got := roundTrip(t, c, resp); !proto.Equal(got, resp) {
		t.Fatal("a list sharing its first element with a cached one was encoded as that one")
	}
	if n := c.shared.Len(); n != 1 {
		t.Errorf("%d lists cached after a list's first response; want 1", n)
	}
	if got := roundTrip(t, c, resp); !proto.Equal(got, resp) {
		t.Fatal("a list's second response")
	}
	small := &discoveryv3.DiscoveryResponse{VersionInfo: "v3", Resources: sharedResources(t, 3, "s"), Nonce: "9"}
	if got := roundTrip(t, c, small); !proto.Equal(got, small) {
		t.Fatal("a small response")
	}
	if n := c.shared.Len(); n != 2 {
		t.Errorf("%d lists cached; want the two large ones", n)
	}
	var req discoveryv3.DiscoveryRequest
	b, _ := proto.Marshal(&discoveryv3.DiscoveryRequest{TypeUrl: "x", ResourceNames: []string{"a"}})
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &req); err != nil || req.TypeUrl != "x" {
		t.Fatalf("Unmarshal: %v, %v", &req, err)
	}
}

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
	l := NewLists()
	res := testResources(t, 100, "a")
	first := l.SotW(append([]*xdsgen.Resource(nil), res...))
	second := l.SotW(append([]*xdsgen.Resource(nil), res...))
	if unsafe.SliceData(first.Anys) != unsafe.SliceData(second.Anys) || first.Version != second.Version {
		t.Fatal("two responses with the same resources got lists of their own")
	}
	other := append([]*xdsgen.Resource(nil), res...)
	other[60] = testResources(t, 1, "b")[0]
	third := l.SotW(other)
	if unsafe.SliceData(third.Anys) == unsafe.SliceData(first.Anys) || third.Version == first.Version || third.Anys[60] != other[60].Any {
		t.Fatal("a list differing in one resource was taken for the shared one")
	}
	for i, r := range res {
		if first.Anys[i] != r.Any || first.Res[i] != r {
			t.Fatalf("resource %d of the shared list is not the one given", i)
		}
	}
	small := testResources(t, 3, "s")
	if a, b := l.SotW(small), l.SotW(small); unsafe.SliceData(a.Anys) == unsafe.SliceData(b.Anys) {
		t.Error("a small list was shared")
	}
}

// Delta responses share lists too: two responses with the same resources
// get one list of Delta resources and one version, which the codec encodes
// once; the bytes decode to the response given.
func TestDeltaResponsesShareLists(t *testing.T) {
	l := NewLists()
	res := testResources(t, 100, "a")
	first := l.Delta(append([]*xdsgen.Resource(nil), res...))
	second := l.Delta(append([]*xdsgen.Resource(nil), res...))
	if unsafe.SliceData(first.Out) != unsafe.SliceData(second.Out) || first.Version != second.Version {
		t.Fatal("two Delta responses with the same resources got lists of their own")
	}
	for i, r := range res {
		if d := first.Out[i]; d.Name != r.Name || d.Version != r.Version || d.Resource != r.Any {
			t.Fatalf("resource %d of the shared list is %v; want %s %s", i, d, r.Name, r.Version)
		}
	}
	if sotw := l.SotW(append([]*xdsgen.Resource(nil), res...)); sotw.Version != first.Version {
		t.Errorf("SotW version %s, Delta %s for the same resources", sotw.Version, first.Version)
	}

	c := NewCodec()
	for i, nonce := range []string{"1", "2", "3"} {
		resp := &discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: first.Version, Resources: first.Out, RemovedResources: []string{"gone"}, TypeUrl: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", Nonce: nonce}
		data, err := c.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var got discoveryv3.DeltaDiscoveryResponse
		if err := proto.Unmarshal(data.Materialize(), &got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&got, resp) {
			t.Fatalf("stream %d: decoded %v; want %v", i, &got, resp)
		}
	}
	if n := c.shared.Len(); n != 1 {
		t.Errorf("%d lists encoded for one shared Delta list; want 1", n)
	}
}
