package wire

import (
	"fmt"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// After the stream's first node, the node of a Delta request is not
// decoded: the request gets the stream's node, the same pointer, and
// otherwise decodes as a whole would.
func TestDeltaRequestReusesTheStreamsNode(t *testing.T) {
	meta, _ := structpb.NewStruct(map[string]any{"CLUSTER_ID": "west", "NAMESPACE": "demo"})
	node := &corev3.Node{Id: "sidecar~10.0.0.1~a.demo~demo.svc.cluster.local", Metadata: meta}
	var s RequestStream
	// No node yet: a request without one leaves the stream without one.
	none := &discoveryv3.DeltaDiscoveryRequest{}
	if err := s.decodeDelta(mustMarshal(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType}), none); err != nil || none.Node != nil || s.node != nil {
		t.Fatalf("request without node = %v, %v", none, err)
	}
	first := &discoveryv3.DeltaDiscoveryRequest{}
	if err := s.decodeDelta(mustMarshal(t, &discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"*"}}), first); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first.Node, node) || s.node != first.Node {
		t.Fatalf("first node = %v", first.Node)
	}
	ackMsg := &discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType, ResponseNonce: "7"}
	ack := &discoveryv3.DeltaDiscoveryRequest{}
	if err := s.decodeDelta(mustMarshal(t, ackMsg), ack); err != nil {
		t.Fatal(err)
	}
	if ack.Node != first.Node {
		t.Fatal("the repeated node was decoded again (a new pointer)")
	}
	if !proto.Equal(ack, ackMsg) {
		t.Fatalf("ACK decoded as %v; want %v", ack, ackMsg)
	}
	// Fields on both sides of the node.
	b := protowire.AppendTag(nil, 3, protowire.BytesType) // resource_names_subscribe, before the node
	b = protowire.AppendString(b, "outbound|80||a.demo.svc.cluster.local")
	nb, _ := proto.Marshal(node)
	b = protowire.AppendTag(b, deltaNodeField, protowire.BytesType)
	b = protowire.AppendBytes(b, nb)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendString(b, "outbound|80||b.demo.svc.cluster.local")
	mixed := &discoveryv3.DeltaDiscoveryRequest{}
	if err := s.decodeDelta(b, mixed); err != nil {
		t.Fatal(err)
	}
	if mixed.Node != first.Node || len(mixed.ResourceNamesSubscribe) != 2 || mixed.ResourceNamesSubscribe[1] != "outbound|80||b.demo.svc.cluster.local" {
		t.Fatalf("fields around the node = %v (same node: %v)", mixed.ResourceNamesSubscribe, mixed.Node == first.Node)
	}
	// Another node on the same stream: the stream keeps its first.
	other := proto.Clone(node).(*corev3.Node)
	other.Id = "sidecar~10.0.0.2~b.demo~demo.svc.cluster.local"
	changed := &discoveryv3.DeltaDiscoveryRequest{}
	if err := s.decodeDelta(mustMarshal(t, &discoveryv3.DeltaDiscoveryRequest{Node: other, TypeUrl: resourcev3.ClusterType}), changed); err != nil {
		t.Fatal(err)
	}
	if changed.Node != first.Node {
		t.Fatalf("a later node replaced the stream's: %v", changed.Node.GetId())
	}
}

// Whatever the bytes, a Delta request on a stream that has its node
// decodes as proto.Unmarshal decodes it without its node field (or fails
// where that fails), with the stream's node when it carried one.
func FuzzDeltaRequestDecode(f *testing.F) {
	node := &corev3.Node{Id: "sidecar~10.0.0.1~a.demo~demo.svc.cluster.local", Cluster: "c"}
	prime := mustMarshal(f, &discoveryv3.DeltaDiscoveryRequest{Node: node})
	f.Add(mustMarshal(f, &discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResponseNonce: "1"}))
	f.Add(mustMarshal(f, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesUnsubscribe: []string{"x"}}))
	f.Add(append(append([]byte{}, prime...), prime...)) // the node twice
	f.Add([]byte{0x0a, 0x05, 0x0a})                     // truncated node
	f.Add([]byte{0x0a, 0x02, 0xff, 0xff})               // a node whose content is malformed
	f.Fuzz(func(t *testing.T, b []byte) {
		var s RequestStream
		if err := s.decodeDelta(prime, &discoveryv3.DeltaDiscoveryRequest{}); err != nil {
			t.Fatal(err)
		}
		got := &discoveryv3.DeltaDiscoveryRequest{}
		gotErr := s.decodeDelta(b, got)
		stripped, carried := b, false
		if start, end, ok := fieldRun(b, deltaNodeField); ok && start >= 0 {
			stripped, carried = append(append([]byte{}, b[:start]...), b[end:]...), true
		}
		want := &discoveryv3.DeltaDiscoveryRequest{}
		wantErr := proto.Unmarshal(stripped, want)
		if !carried && wantErr == nil && want.Node != nil {
			want.Node, carried = nil, true // the node in pieces: decoded, then replaced
		}
		if carried {
			want.Node = s.node
		}
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("error %v; proto.Unmarshal's %v", gotErr, wantErr)
		}
		if wantErr == nil && (!proto.Equal(got, want) || carried && got.Node != s.node) {
			t.Fatalf("decoded %v; want %v", got, want)
		}
	})
}

func sotwNames(n int, prefix string) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("outbound|80||%s-%04d.bench.svc.cluster.local", prefix, i)
	}
	return names
}

// A SotW request whose resource_names run was decoded before gets the same
// names, shared, and otherwise decodes as a whole would; another run is
// decoded and interned in turn.
func TestSotWRequestSharesRepeatedNames(t *testing.T) {
	names := sotwNames(100, "shared")
	table := NewInternedNames()
	first := &discoveryv3.DiscoveryRequest{}
	if err := table.decode(mustMarshal(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names}), first); err != nil {
		t.Fatal(err)
	}
	ackMsg := &discoveryv3.DiscoveryRequest{VersionInfo: "v1", TypeUrl: resourcev3.EndpointType, ResourceNames: names, ResponseNonce: "3"}
	ack := &discoveryv3.DiscoveryRequest{}
	if err := table.decode(mustMarshal(t, ackMsg), ack); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(ack, ackMsg) {
		t.Fatalf("ACK decoded as %v", ack)
	}
	if &ack.ResourceNames[0] != &first.ResourceNames[0] {
		t.Fatal("the repeated names were decoded again")
	}
	other := &discoveryv3.DiscoveryRequest{}
	otherNames := sotwNames(100, "other")
	if err := table.decode(mustMarshal(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: otherNames}), other); err != nil {
		t.Fatal(err)
	}
	if len(other.ResourceNames) != 100 || other.ResourceNames[0] != otherNames[0] {
		t.Fatalf("other names decoded as %v", other.ResourceNames[:1])
	}
	// A run larger than maxInternedRun is decoded every time, never kept.
	huge := mustMarshal(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: sotwNames(3000, "huge")})
	a, b := &discoveryv3.DiscoveryRequest{}, &discoveryv3.DiscoveryRequest{}
	if err := table.decode(huge, a); err != nil {
		t.Fatal(err)
	}
	if err := table.decode(huge, b); err != nil {
		t.Fatal(err)
	}
	if len(huge) <= maxInternedRun || len(a.ResourceNames) != 3000 || &a.ResourceNames[0] == &b.ResourceNames[0] {
		t.Fatalf("a %d-byte request's names were interned (or not decoded: %d)", len(huge), len(a.ResourceNames))
	}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Whatever the bytes, a SotW request decodes as proto.Unmarshal decodes it
// (or fails where it fails), also when its names were interned before.
func FuzzSotWRequestDecode(f *testing.F) {
	names := sotwNames(60, "fuzz")
	table := NewInternedNames()
	primed := mustMarshal(f, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names})
	f.Add(mustMarshal(f, &discoveryv3.DiscoveryRequest{VersionInfo: "1", TypeUrl: resourcev3.EndpointType, ResourceNames: names, ResponseNonce: "1"}))
	f.Add(append(append([]byte{}, primed...), primed...)) // the run twice, apart
	f.Add(primed[:len(primed)-3])                         // truncated
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := table.decode(primed, &discoveryv3.DiscoveryRequest{}); err != nil {
			t.Fatal(err)
		}
		want := &discoveryv3.DiscoveryRequest{}
		wantErr := proto.Unmarshal(b, want)
		got := &discoveryv3.DiscoveryRequest{}
		gotErr := table.decode(b, got)
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("error %v; proto.Unmarshal's %v", gotErr, wantErr)
		}
		if wantErr == nil && !proto.Equal(got, want) {
			t.Fatalf("decoded %v; want %v", got, want)
		}
	})
}

// BenchmarkSotWACKDecode decodes an Envoy SotW ACK of 1,000 cluster names
// whose run was interned before: what every ACK of a push costs.
func BenchmarkSotWACKDecode(b *testing.B) {
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("outbound|7070||svc-%05d.bench-ns.svc.cluster.local", i)
	}
	ack := mustMarshal(b, &discoveryv3.DiscoveryRequest{VersionInfo: "v1", TypeUrl: resourcev3.EndpointType, ResourceNames: names, ResponseNonce: "17"})
	table := NewInternedNames()
	if err := table.decode(ack, &discoveryv3.DiscoveryRequest{}); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(ack)))
	b.ReportAllocs()
	for b.Loop() {
		var m discoveryv3.DiscoveryRequest
		if err := table.decode(ack, &m); err != nil || len(m.ResourceNames) != len(names) {
			b.Fatal(err, len(m.ResourceNames))
		}
	}
}
