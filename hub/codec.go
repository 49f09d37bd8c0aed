package hub

import (
	"fmt"
	"unsafe"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	lru "github.com/hashicorp/golang-lru/v2"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// sharedCodec is the ADS server's gRPC codec: gRPC's proto codec, except
// that a DiscoveryResponse whose resources are a large list shared by many
// streams (a wildcard set: every cluster for Envoy's CDS, every
// ServiceEntry for istiods; see respondWildcard) is encoded as its own
// small fields followed by that list's encoding, made once per list and
// reused for every stream. Protobuf lets a message's fields come in any
// order, so the bytes decode to the same message. Without it gRPC would
// marshal the same megabytes once per stream on every change.
//
// A list is known by the address and length of its backing array; the
// cache keeps the list itself, so that address cannot be reused for
// another list while it is cached. Lists are never changed after they
// are built (the generators build a new one per version). A list is
// cached once a second response carries it: a large list built for one
// stream (the first EDS response of an Envoy, its 1,000 assignments) is
// marshalled as gRPC would, not kept (16 of them held ~22 MB at 2,000
// streams).
type sharedCodec struct {
	proto  encoding.CodecV2
	shared *lru.Cache[sharedKey, sharedList] // safe for concurrent use
	// seen are the lists marshalled once, not cached yet (the keys only:
	// an address reused by another list after the first is freed makes
	// that list cached on its first sighting, which is harmless).
	seen *lru.Cache[sharedKey, struct{}]
}

// minSharedResources is the smallest list the codec caches: smaller ones
// are cheap to marshal and mostly built per stream (responses that carry
// only what changed).
const minSharedResources = 64

type sharedKey struct {
	array unsafe.Pointer
	n     int
}

type sharedList struct {
	keep    []*anypb.Any // holds the backing array (see sharedCodec)
	encoded []byte       // field 2 (resources) of DiscoveryResponse, every element
}

func newSharedCodec() *sharedCodec {
	shared, _ := lru.New[sharedKey, sharedList](16) // only a size ≤ 0 fails
	seen, _ := lru.New[sharedKey, struct{}](256)
	return &sharedCodec{proto: encoding.GetCodecV2(grpcproto.Name), shared: shared, seen: seen}
}

var _ encoding.CodecV2 = (*sharedCodec)(nil)

// Name is the proto codec's: clients see no difference.
func (c *sharedCodec) Name() string { return grpcproto.Name }

// Unmarshal is the proto codec's, except that a rawRequest gets the
// message's bytes as they are (see requestStream).
func (c *sharedCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rawRequest); ok {
		r.b = rawBuffers.Get().(*[]byte)
		for _, buf := range data {
			*r.b = append(*r.b, buf.ReadOnlyData()...)
		}
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// Marshal encodes v; see sharedCodec.
func (c *sharedCodec) Marshal(v any) (mem.BufferSlice, error) {
	resp, ok := v.(*discoveryv3.DiscoveryResponse)
	if !ok || len(resp.GetResources()) < minSharedResources {
		return c.proto.Marshal(v)
	}
	list, ok, err := c.encoded(resp.Resources)
	if err != nil {
		return nil, err
	}
	if !ok {
		// The list's first response, marshalled into memory of its own
		// rather than gRPC's pool, which would keep buffers this large
		// (one per stream, a megabyte or more each) after their write.
		b, err := proto.Marshal(resp)
		if err != nil {
			return nil, fmt.Errorf("marshalling a %s response: %w", resp.GetTypeUrl(), err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	// The response's other fields, shallowly: resources left out.
	head := &discoveryv3.DiscoveryResponse{}
	hm := head.ProtoReflect()
	resp.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Number() != resourcesField {
			hm.Set(fd, v)
		}
		return true
	})
	headBytes, err := proto.Marshal(head)
	if err != nil {
		return nil, fmt.Errorf("marshalling a %s response: %w", resp.GetTypeUrl(), err)
	}
	return mem.BufferSlice{mem.SliceBuffer(headBytes), mem.SliceBuffer(list)}, nil
}

// resourcesField is DiscoveryResponse.resources' field number.
const resourcesField = 2

// encoded returns the encoding of a shared resource list as field 2 of a
// DiscoveryResponse, from the cache or made now; ok is false, and nothing
// encoded, the first time the list is seen.
func (c *sharedCodec) encoded(res []*anypb.Any) (b []byte, ok bool, err error) {
	key := sharedKey{array: unsafe.Pointer(unsafe.SliceData(res)), n: len(res)}
	if l, ok := c.shared.Get(key); ok {
		return l.encoded, true, nil
	}
	if ok, _ := c.seen.ContainsOrAdd(key, struct{}{}); !ok {
		return nil, false, nil
	}
	c.seen.Remove(key)
	size := 0
	for _, a := range res {
		size += protowire.SizeTag(resourcesField) + protowire.SizeBytes(proto.Size(a))
	}
	b = make([]byte, 0, size)
	for _, a := range res {
		b = protowire.AppendTag(b, resourcesField, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(proto.Size(a)))
		if b, err = (proto.MarshalOptions{}).MarshalAppend(b, a); err != nil {
			return nil, false, fmt.Errorf("marshalling a resource of type %s: %w", a.GetTypeUrl(), err)
		}
	}
	c.shared.Add(key, sharedList{keep: res, encoded: b})
	return b, true, nil
}
