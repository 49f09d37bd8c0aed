// Package wire is the ADS server's bytes: requests decoded from their
// encoding, with the stream's first node and interned resource names
// (RequestStream, InternedNames), and responses whose large resource lists are
// shared by the streams that get the same (Lists) and encoded once for
// all of them (Codec). What the bytes say is the hub's business; how few
// times they are made and read is this package's.
package wire

import (
	"bytes"
	"hash/maphash"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	lru "github.com/hashicorp/golang-lru/v2"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// RequestStream decodes a stream's xDS requests itself, from their bytes
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
//     stream's first node, the same pointer, so the hub does not check
//     and identify it again, and a stream cannot switch nodes;
//   - the resource_names of a SotW request are looked up by their bytes
//     (InternedNames, the server's) instead of decoded: Envoy's SotW ACK repeats
//     every name it subscribes to (1,000 clusters: 48 KB, ~100 µs and ~1,000
//     allocations to decode), and streams of one kind subscribe to the
//     same names.
type RequestStream struct {
	grpc.ServerStream
	names *InternedNames // shared by the server's streams
	node  *corev3.Node   // the stream's first Delta node
}

// NewRequestStream decodes the requests of ss, looking SotW names up in
// names (the server's).
func NewRequestStream(ss grpc.ServerStream, names *InternedNames) *RequestStream {
	return &RequestStream{ServerStream: ss, names: names}
}

// rawRequest is a request's encoding, which the codec copies as it is
// (Codec.Unmarshal) into a buffer taken from rawBuffers when the
// message has arrived: a stream waiting for its next request holds none.
type rawRequest struct{ b *[]byte }

// rawBuffers are reused request buffers; one larger than
// maxPooledRequest is left to the garbage collector.
var rawBuffers = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledRequest = 1 << 20

// RecvMsg implements grpc.ServerStream.
func (s *RequestStream) RecvMsg(m any) error {
	switch m.(type) {
	case *discoveryv3.DiscoveryRequest, *discoveryv3.DeltaDiscoveryRequest:
	default:
		return s.ServerStream.RecvMsg(m)
	}
	var raw rawRequest
	defer func() {
		if raw.b != nil && cap(*raw.b) <= maxPooledRequest {
			*raw.b = (*raw.b)[:0]
			rawBuffers.Put(raw.b)
		}
	}()
	if err := s.ServerStream.RecvMsg(&raw); err != nil {
		return err
	}
	if raw.b == nil {
		raw.b = rawBuffers.Get().(*[]byte) // an empty message
	}
	b := *raw.b
	if d, ok := m.(*discoveryv3.DeltaDiscoveryRequest); ok {
		return s.decodeDelta(b, d)
	}
	return s.names.decode(b, m.(*discoveryv3.DiscoveryRequest))
}

// sotwNamesField is DiscoveryRequest.resource_names' field number.
const sotwNamesField = 3

// Resource_names runs between these sizes (bytes) are interned: smaller
// ones decode as fast as they are looked up; larger ones (a client may
// send up to --xds-max-request-bytes) would let made-up runs hold the
// table's memory (64 × 128 KiB of runs and their names at most; 1,000
// Envoy cluster names are ~48 KB).
const (
	minInternedRun = 1 << 10
	maxInternedRun = 128 << 10
)

// InternedNames are recent resource_names runs of SotW requests, by a
// hash of their bytes (a secret seed), with the names they decode to. The
// names are shared by every request that carries the same bytes and are
// never changed (the hub only reads them). Bounded:
// each entry holds its run's bytes and names. Safe for concurrent use.
type InternedNames struct {
	seed  maphash.Seed
	cache *lru.Cache[uint64, namesRun]
}

// NewInternedNames makes an empty cache of names.
func NewInternedNames() *InternedNames {
	c, _ := lru.New[uint64, namesRun](64) // only a size ≤ 0 fails
	return &InternedNames{seed: maphash.MakeSeed(), cache: c}
}

// namesRun is an interned resource_names run.
type namesRun struct {
	run   []byte // its encoding, checked byte for byte on a hit
	names []string
}

// decode decodes the SotW request b into m, taking its resource_names
// from the table when the same run was decoded before.
func (t *InternedNames) decode(b []byte, m *discoveryv3.DiscoveryRequest) error {
	start, end, ok := fieldRun(b, sotwNamesField)
	if !ok || end-start < minInternedRun || end-start > maxInternedRun {
		return proto.Unmarshal(b, m)
	}
	run := b[start:end]
	key := maphash.Bytes(t.seed, run)
	if e, hit := t.cache.Get(key); hit && bytes.Equal(e.run, run) {
		if err := unmarshalAround(b, start, end, m); err != nil {
			return err
		}
		m.ResourceNames = e.names
		return nil
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return err
	}
	t.cache.Add(key, namesRun{run: bytes.Clone(run), names: m.ResourceNames})
	return nil
}

// fieldRun returns where the one contiguous run of field num's entries
// in an encoded message starts and ends (-1, -1 when there is none); ok
// is false when the encoding is malformed or the entries are not
// contiguous.
func fieldRun(b []byte, num protowire.Number) (start, end int, ok bool) {
	start, end = -1, -1
	// short is field num's tag as one byte, when it fits in one: an entry
	// shorter than 128 bytes (an Envoy cluster name) is then that byte
	// and a one-byte length, read without the general decoder.
	short := byte(0)
	if tag := protowire.EncodeTag(num, protowire.BytesType); tag < 0x80 {
		short = byte(tag)
	}
	for i := 0; i < len(b); {
		if short != 0 && b[i] == short && i+1 < len(b) && b[i+1] < 0x80 {
			next := i + 2 + int(b[i+1])
			if next > len(b) {
				return -1, -1, false
			}
			if start < 0 {
				start = i
			} else if end != i { // a second run
				return -1, -1, false
			}
			end, i = next, next
			continue
		}
		n, typ, tl := protowire.ConsumeTag(b[i:])
		if tl < 0 {
			return -1, -1, false
		}
		v := protowire.ConsumeFieldValue(n, typ, b[i+tl:])
		if v < 0 {
			return -1, -1, false
		}
		if n == num {
			switch {
			case typ != protowire.BytesType:
				return -1, -1, false
			case start < 0:
				start = i
			case end != i: // a second run
				return -1, -1, false
			}
			end = i + tl + v
		}
		i += tl + v
	}
	return start, end, true
}

// deltaNodeField is DeltaDiscoveryRequest.node's field number.
const deltaNodeField = 1

// decodeDelta decodes b into m; once the stream has a node, m gets that
// node instead of decoding the one b carries.
func (s *RequestStream) decodeDelta(b []byte, m *discoveryv3.DeltaDiscoveryRequest) error {
	if s.node == nil {
		if err := proto.Unmarshal(b, m); err != nil {
			return err
		}
		s.node = m.Node
		return nil
	}
	start, end, ok := fieldRun(b, deltaNodeField)
	switch {
	case !ok: // malformed, or the node in pieces apart: the decoder says what
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
	if err := unmarshalAround(b, start, end, m); err != nil {
		return err
	}
	m.Node = s.node
	return nil
}

// unmarshalAround decodes the encoded message b without its bytes
// b[start:end], a run of whole fields, into m. A message's encoding is
// the concatenation of its fields': the parts before and after the run
// decode to the rest of it.
func unmarshalAround(b []byte, start, end int, m proto.Message) error {
	if err := proto.Unmarshal(b[:start], m); err != nil {
		return err
	}
	return proto.UnmarshalOptions{Merge: true}.Unmarshal(b[end:], m)
}
