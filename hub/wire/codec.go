package wire

import (
	"fmt"
	"hash/maphash"
	"slices"
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

	"github.com/hubmesh/hub/hub/xdsgen"
)

// Codec is the ADS server's gRPC codec: gRPC's proto codec, except
// that a SotW or Delta response whose resources are a large list shared by
// many streams (a wildcard set: every cluster for Envoy's CDS, every
// ServiceEntry for istiods, as the hub's responder builds them; or a list of Lists)
// is encoded as its own
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
type Codec struct {
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
	keep    any    // the list ([]*anypb.Any or []*discoveryv3.Resource): holds its backing array (see Codec)
	encoded []byte // field 2 (resources) of the response, every element
}

// NewCodec makes the codec, with empty caches.
func NewCodec() *Codec {
	shared, _ := lru.New[sharedKey, sharedList](16) // only a size ≤ 0 fails
	seen, _ := lru.New[sharedKey, struct{}](256)
	return &Codec{proto: encoding.GetCodecV2(grpcproto.Name), shared: shared, seen: seen}
}

var _ encoding.CodecV2 = (*Codec)(nil)

// Name is the proto codec's: clients see no difference.
func (c *Codec) Name() string { return grpcproto.Name }

// Unmarshal is the proto codec's, except that a rawRequest gets the
// message's bytes as they are (see RequestStream).
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rawRequest); ok {
		r.b = rawBuffers.Get().(*[]byte)
		for _, buf := range data {
			*r.b = append(*r.b, buf.ReadOnlyData()...)
		}
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// Marshal encodes v; see Codec.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	switch resp := v.(type) {
	case *discoveryv3.DiscoveryResponse:
		if len(resp.GetResources()) >= minSharedResources {
			return marshalShared(c, resp, resp.GetResources())
		}
	case *discoveryv3.DeltaDiscoveryResponse:
		if len(resp.GetResources()) >= minSharedResources {
			return marshalShared(c, resp, resp.GetResources())
		}
	}
	return c.proto.Marshal(v)
}

// marshalShared encodes resp, a SotW or Delta response whose resources
// (field 2 of both) are res, with res's shared encoding when it has one.
func marshalShared[T proto.Message](c *Codec, resp proto.Message, res []T) (mem.BufferSlice, error) {
	list, ok, err := encodedList(c, res)
	if err != nil {
		return nil, err
	}
	if !ok {
		// The list's first response, marshalled into memory of its own
		// rather than gRPC's pool, which would keep buffers this large
		// (one per stream, a megabyte or more each) after their write.
		b, err := proto.Marshal(resp)
		if err != nil {
			return nil, fmt.Errorf("marshalling a %s: %w", resp.ProtoReflect().Descriptor().Name(), err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	// The response's other fields, shallowly: resources left out.
	hm := resp.ProtoReflect().New()
	resp.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Number() != resourcesField {
			hm.Set(fd, v)
		}
		return true
	})
	headBytes, err := proto.Marshal(hm.Interface())
	if err != nil {
		return nil, fmt.Errorf("marshalling a %s: %w", resp.ProtoReflect().Descriptor().Name(), err)
	}
	return mem.BufferSlice{mem.SliceBuffer(headBytes), mem.SliceBuffer(list)}, nil
}

// resourcesField is the field number of resources in DiscoveryResponse
// and in DeltaDiscoveryResponse.
const resourcesField = 2

// encodedList returns the encoding of a shared resource list as field 2 of
// a response, from the cache or made now; ok is false, and nothing
// encoded, the first time the list is seen.
func encodedList[T proto.Message](c *Codec, res []T) (b []byte, ok bool, err error) {
	key := sharedKey{array: unsafe.Pointer(unsafe.SliceData(res)), n: len(res)}
	if l, ok := c.shared.Get(key); ok {
		return l.encoded, true, nil
	}
	if ok, _ := c.seen.ContainsOrAdd(key, struct{}{}); !ok {
		return nil, false, nil
	}
	c.seen.Remove(key)
	size := 0
	for _, m := range res {
		size += protowire.SizeTag(resourcesField) + protowire.SizeBytes(proto.Size(m))
	}
	b = make([]byte, 0, size)
	for _, m := range res {
		b = protowire.AppendTag(b, resourcesField, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(proto.Size(m)))
		if b, err = (proto.MarshalOptions{}).MarshalAppend(b, m); err != nil {
			return nil, false, fmt.Errorf("marshalling a resource: %w", err)
		}
	}
	c.shared.Add(key, sharedList{keep: res, encoded: b})
	return b, true, nil
}

// Lists shares the resource list of responses that carry the
// same resources: streams that subscribe to the same names and hold the
// same versions (an Envoy fleet's first EDS response, 1,000 assignments;
// every stream's catch-up after a burst) get one list, whose encoding the
// codec then makes once for all of them (Codec), instead of a list,
// a version hash and a megabyte of encoding per stream. SotW and Delta
// lists are kept apart (their elements differ). A list is known by a hash
// of its resources' addresses (a secret seed) and checked element by
// element on a hit; the caches keep the resources, so their addresses are
// not reused while cached. Safe for concurrent use.
type Lists struct {
	seed   maphash.Seed
	sotw   *lru.Cache[uint64, SotWList]
	deltas *lru.Cache[uint64, DeltaList]
}

// SotWList is a shared SotW list: the resources (sorted by name),
// their Anys in that order, and the response version they make. Read
// only.
type SotWList struct {
	Res     []*xdsgen.Resource
	Anys    []*anypb.Any
	Version string
}

// DeltaList is a shared Delta list: the resources (sorted by name), as
// Delta's resources in that order, and the version they make. Read only.
type DeltaList struct {
	Res     []*xdsgen.Resource
	Out     []*discoveryv3.Resource
	Version string
}

// minSharedList is the smallest list shared: smaller ones cost little to
// build and are not encoded for sharing either (minSharedResources).
const minSharedList = minSharedResources

// sharedLists is how many lists of each kind Lists keeps.
const sharedLists = 32

// NewLists makes empty lists.
func NewLists() *Lists {
	sotw, _ := lru.New[uint64, SotWList](sharedLists) // only a size ≤ 0 fails
	deltas, _ := lru.New[uint64, DeltaList](sharedLists)
	return &Lists{seed: maphash.MakeSeed(), sotw: sotw, deltas: deltas}
}

// key hashes the addresses of res, not what they point to.
func (l *Lists) key(res []*xdsgen.Resource) uint64 {
	var h maphash.Hash
	h.SetSeed(l.seed)
	for _, r := range res {
		maphash.WriteComparable(&h, r)
	}
	return h.Sum64()
}

// SotW returns the shared SotW list for res (sorted by name; not changed
// after the call), making it when no recent response carried the same
// resources.
func (l *Lists) SotW(res []*xdsgen.Resource) SotWList {
	if l == nil {
		return makeSotWList(res)
	}
	return lookup(l, l.sotw, res, makeSotWList, func(e SotWList) []*xdsgen.Resource { return e.Res })
}

// Delta is SotW for Delta responses.
func (l *Lists) Delta(res []*xdsgen.Resource) DeltaList {
	if l == nil {
		return makeDeltaList(res)
	}
	return lookup(l, l.deltas, res, makeDeltaList, func(e DeltaList) []*xdsgen.Resource { return e.Res })
}

// lookup returns cache's list for res, or one made by build (and cached
// when it is large enough to share); resOf reads a list's resources.
func lookup[L any](l *Lists, cache *lru.Cache[uint64, L], res []*xdsgen.Resource, build func([]*xdsgen.Resource) L, resOf func(L) []*xdsgen.Resource) L {
	if len(res) < minSharedList {
		return build(res)
	}
	key := l.key(res)
	if e, ok := cache.Get(key); ok && slices.Equal(resOf(e), res) {
		return e
	}
	e := build(res)
	cache.Add(key, e)
	return e
}

func makeSotWList(res []*xdsgen.Resource) SotWList {
	anys := make([]*anypb.Any, len(res))
	for i, r := range res {
		anys[i] = r.Any
	}
	return SotWList{Res: res, Anys: anys, Version: xdsgen.ResponseVersion(res)}
}

func makeDeltaList(res []*xdsgen.Resource) DeltaList {
	out := make([]*discoveryv3.Resource, len(res))
	for i, r := range res {
		out[i] = &discoveryv3.Resource{Name: r.Name, Version: r.Version, Resource: r.Any}
	}
	return DeltaList{Res: res, Out: out, Version: xdsgen.ResponseVersion(res)}
}
