package hub

import (
	"hash/maphash"
	"slices"

	lru "github.com/hashicorp/golang-lru/v2"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hubmesh/hub/hub/xdsgen"
)

// responseLists shares the resource list of SotW responses that carry the
// same resources: streams that subscribe to the same names and hold the
// same versions (an Envoy fleet's first EDS response, 1,000 assignments;
// every stream's catch-up after a burst) get one list, whose encoding the
// codec then makes once for all of them (sharedCodec), instead of a list,
// a version hash and a megabyte of encoding per stream. A list is known by
// a hash of its resources' addresses (a secret seed) and checked element
// by element on a hit; the cache keeps the resources, so their addresses
// are not reused while cached. Safe for concurrent use.
type responseLists struct {
	seed  maphash.Seed
	cache *lru.Cache[uint64, responseList]
}

// responseList is a shared list: the resources (sorted by name), their
// Anys in that order, and the response version they make.
type responseList struct {
	res     []*xdsgen.Resource
	anys    []*anypb.Any
	version string
}

// minSharedList is the smallest list shared: smaller ones cost little to
// build and are not encoded for sharing either (minSharedResources).
const minSharedList = minSharedResources

func newResponseLists() *responseLists {
	c, _ := lru.New[uint64, responseList](32) // only a size ≤ 0 fails
	return &responseLists{seed: maphash.MakeSeed(), cache: c}
}

// list returns the shared list for res (sorted by name; not changed after
// the call), making it when no recent response carried the same resources.
func (l *responseLists) list(res []*xdsgen.Resource) responseList {
	if l == nil || len(res) < minSharedList {
		return makeResponseList(res)
	}
	var h maphash.Hash
	h.SetSeed(l.seed)
	for _, r := range res {
		maphash.WriteComparable(&h, r) // the pointer, not what it points to
	}
	key := h.Sum64()
	if e, ok := l.cache.Get(key); ok && slices.Equal(e.res, res) {
		return e
	}
	e := makeResponseList(res)
	l.cache.Add(key, e)
	return e
}

func makeResponseList(res []*xdsgen.Resource) responseList {
	anys := make([]*anypb.Any, len(res))
	for i, r := range res {
		anys[i] = r.Any
	}
	return responseList{res: res, anys: anys, version: xdsgen.ResponseVersion(res)}
}
