package mcp

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/hubmesh/hub/distribute"
)

// Policy is the source of the Istio objects operators author once in the
// home cluster and label for distribution (distribute.Source).
type Policy interface {
	// Objects returns a kind's objects (kind as distribute.CanonicalKind
	// names it) and whether they are complete (the kind is watched and
	// synced).
	Objects(kind string) ([]distribute.Object, bool)
}

// policyKind is what the generator keeps of one distributed kind: each
// object's envelope, marshalled once per version, and the last complete
// list, served while the kind is not complete (an empty list would make
// istiod delete what it holds).
type policyKind struct {
	entries map[string]*entry // <namespace>/<name> → envelope
	served  []*entry          // the last complete list, sorted by name
}

// policyEntriesLocked returns the envelopes of a kind's distributed
// objects, with g.mu held.
func (g *Generator) policyEntriesLocked(kind string) ([]*entry, error) {
	if g.policy == nil {
		return nil, nil
	}
	pk := g.policyKinds[kind]
	if pk == nil {
		pk = &policyKind{entries: map[string]*entry{}}
		g.policyKinds[kind] = pk
	}
	objects, complete := g.policy.Objects(kind)
	if !complete {
		return pk.served, nil
	}
	next := make(map[string]*entry, len(objects))
	list := make([]*entry, 0, len(objects))
	for _, o := range objects {
		name := o.Namespace + "/" + o.Name
		e := pk.entries[name]
		if e == nil || e.version != o.Version {
			var err error
			if e, err = marshalObject(name, o); err != nil {
				return nil, err
			}
		}
		next[name] = e
		list = append(list, e)
	}
	slices.SortFunc(list, func(a, b *entry) int { return strings.Compare(a.name, b.name) })
	pk.entries, pk.served = next, list
	return list, nil
}

// marshalObject wraps a distributed object in its envelope, unchanged:
// its spec, labels, annotations, creation time and content version.
func marshalObject(name string, o distribute.Object) (*entry, error) {
	body := &anypb.Any{}
	if err := anypb.MarshalFrom(body, o.Spec, deterministic); err != nil {
		return nil, fmt.Errorf("marshalling %s %s: %w", o.Kind, name, err)
	}
	res := &mcpapi.Resource{
		Metadata: &mcpapi.Metadata{Name: name, Version: o.Version, CreateTime: timestamppb.New(o.CreationTimestamp),
			Labels: o.Labels, Annotations: o.Annotations},
		Body: body,
	}
	value, err := deterministic.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("marshalling the envelope of %s %s: %w", o.Kind, name, err)
	}
	return &entry{name: name, version: o.Version, created: o.CreationTimestamp, any: &anypb.Any{TypeUrl: ResourceType, Value: value}}, nil
}

// setOf builds a set from entries sorted by name: its version changes
// exactly when an entry is added, removed or changes version.
func setOf(list []*entry) *Set {
	if len(list) == 0 {
		return &emptySet
	}
	h := sha256.New()
	set := &Set{Resources: make([]*anypb.Any, len(list))}
	for i, e := range list {
		set.Resources[i] = e.any
		h.Write([]byte(e.name))
		h.Write([]byte{0})
		h.Write([]byte(e.version))
		h.Write([]byte{0})
	}
	set.Version = hex.EncodeToString(h.Sum(nil)[:8])
	return set
}

// merge combines the federated ServiceEntries with distributed ones, sorted
// by name; a distributed object named like a generated one is left out
// (the generated names carry the hub- prefix).
func merge(generated, distributed []*entry) []*entry {
	names := make(map[string]bool, len(generated))
	out := make([]*entry, 0, len(generated)+len(distributed))
	for _, e := range generated {
		names[e.name] = true
		out = append(out, e)
	}
	for _, e := range distributed {
		if !names[e.name] {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *entry) int { return strings.Compare(a.name, b.name) })
	return out
}
