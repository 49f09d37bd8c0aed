package hub

import (
	"fmt"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
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

func roundTrip(t *testing.T, c *sharedCodec, resp *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryResponse {
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
	c := newSharedCodec()
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
