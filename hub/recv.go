package hub

import (
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// requestStream decodes a stream's xDS requests itself, from their bytes
// (../shared/reference/push-floor.md §2):
//   - a request is copied into a reused buffer of the hub's, not gRPC's
//     pool, which zeroes a 1 MiB buffer for every message over 32 KiB
//     (every SotW ACK of Envoy's 1,000 cluster names);
//   - the node of a Delta request after the stream's first node is not
//     decoded: Envoy before 1.38 repeats its whole node (11–23 KB, ~70 µs
//     to decode) in every Delta request, ACKs included, and istio-agent
//     forwards it (re-encoded: its map entries need not come in the same
//     order, so the bytes are not compared). The xDS protocol says a node
//     sent more than once on a stream is identical; the request gets the
//     stream's first node, the same pointer, so the tracker does not
//     check and identify it again, and a stream cannot switch nodes.
type requestStream struct {
	grpc.ServerStream
	node *corev3.Node // the stream's first Delta node
}

// rawRequest is a request's encoding, which the codec copies as it is
// (sharedCodec.Unmarshal).
type rawRequest struct{ b []byte }

// rawRequests are reused request buffers; one larger than
// maxPooledRequest is left to the garbage collector.
var rawRequests = sync.Pool{New: func() any { return new(rawRequest) }}

const maxPooledRequest = 1 << 20

// RecvMsg implements grpc.ServerStream.
func (s *requestStream) RecvMsg(m any) error {
	switch m.(type) {
	case *discoveryv3.DiscoveryRequest, *discoveryv3.DeltaDiscoveryRequest:
	default:
		return s.ServerStream.RecvMsg(m)
	}
	raw := rawRequests.Get().(*rawRequest)
	defer func() {
		if cap(raw.b) <= maxPooledRequest {
			raw.b = raw.b[:0]
			rawRequests.Put(raw)
		}
	}()
	if err := s.ServerStream.RecvMsg(raw); err != nil {
		return err
	}
	if d, ok := m.(*discoveryv3.DeltaDiscoveryRequest); ok {
		return s.decodeDelta(raw.b, d)
	}
	return proto.Unmarshal(raw.b, m.(proto.Message))
}

// deltaNodeField is DeltaDiscoveryRequest.node's field number.
const deltaNodeField = 1

// decodeDelta decodes b into m; once the stream has a node, m gets that
// node instead of decoding the one b carries.
func (s *requestStream) decodeDelta(b []byte, m *discoveryv3.DeltaDiscoveryRequest) error {
	if s.node == nil {
		if err := proto.Unmarshal(b, m); err != nil {
			return err
		}
		s.node = m.Node
		return nil
	}
	start, end, ok := nodeField(b)
	switch {
	case !ok: // malformed, or the node in pieces: the decoder says what
		if err := proto.Unmarshal(b, m); err != nil {
			return err
		}
		if m.Node != nil {
			m.Node = s.node
		}
		return nil
	case start < 0:
		return proto.Unmarshal(b, m)
	}
	// A message's encoding is the concatenation of its fields': the parts
	// before and after the node decode to the rest of it.
	if err := proto.Unmarshal(b[:start], m); err != nil {
		return err
	}
	if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(b[end:], m); err != nil {
		return err
	}
	m.Node = s.node
	return nil
}

// nodeField returns where the node field of an encoded Delta request
// starts and ends (-1, -1 when it has none); ok is false when the encoding
// is malformed or has more than one node field.
func nodeField(b []byte) (start, end int, ok bool) {
	start, end = -1, -1
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return -1, -1, false
		}
		v := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if v < 0 {
			return -1, -1, false
		}
		if num == deltaNodeField {
			if start >= 0 || typ != protowire.BytesType {
				return -1, -1, false
			}
			start, end = i, i+n+v
		}
		i += n + v
	}
	return start, end, true
}
