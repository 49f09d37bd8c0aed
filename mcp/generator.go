// Package mcp generates Istio config for member istiods (MCP-over-XDS,
// docs/architecture.md §3.7): the federated services as ServiceEntries and the Istio
// objects distributed from the home cluster, each wrapped in an
// istio.mcp.v1alpha1.Resource envelope, marshalled once per version and
// shared by every stream. It only builds resources; the hub's xDS
// watcher decides which stream gets what and when.
package mcp

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/distribute"
)

// ResourceType is the type URL of every resource in a config response:
// the envelope istiod unwraps (its body carries the spec's own type).
const ResourceType = "type.googleapis.com/istio.mcp.v1alpha1.Resource"

// DefaultFederatedDomain is the default suffix of federated hostnames:
// <name>.<namespace>.svc.clusterset.local, the Kubernetes Multi-Cluster
// Services convention, which never collides with a member's own
// svc.cluster.local Services.
const DefaultFederatedDomain = "clusterset.local"

// Index is what the generator reads: the hub's federated index
// (feed.Index), every member's view of each federated Service.
type Index interface {
	// Hostnames returns every federated hostname.
	Hostnames() []string
	// Service returns every member's view of one hostname, by member ID
	// (shared, read only); nil when none has it.
	Service(hostname string) map[string]*clusters.Service
}

// Options configures a Generator.
type Options struct {
	// FederatedDomain makes ServiceEntry hosts
	// <name>.<namespace>.svc.<FederatedDomain>; empty: DefaultFederatedDomain.
	FederatedDomain string
	// Now stamps the create_time of a ServiceEntry whose Service no member
	// gave a creation time for (clusters.Service.Created); nil: time.Now.
	Now func() time.Time
	// Policy, if set, has the Istio objects distributed from the home
	// cluster: served unchanged, each under its kind.
	Policy Policy
	// TrustDomain is our SPIFFE trust domain: the ServiceEntries'
	// subjectAltNames are identities in it (clusters.PeerIdentities);
	// empty: none are set.
	TrustDomain string
}

// Set is the full state of one config type as istiod receives it: every
// resource (shared, read only; sorted by name) and a version that
// changes exactly when a resource is added, removed or changes version.
type Set struct {
	Version   string
	Resources []*anypb.Any
}

// emptySet answers every kind the hub has nothing of.
var emptySet = Set{Version: "empty"}

// Generator builds the config sets. It keeps each federated Service's
// ServiceEntry, marshalled, until its hostname changes (Invalidate), and
// rebuilds only what changed; a rebuilt entry whose content is the same
// keeps its version, bytes and create_time. Safe for concurrent use.
type Generator struct {
	index       Index
	domain      string
	trustDomain string
	now         func() time.Time
	policy      Policy

	mu      sync.Mutex
	entries map[string]*entry   // index hostname → its ServiceEntry (only existing ones)
	dirty   map[string]struct{} // hostnames changed since the set was built
	built   bool                // entries reflect the whole index but for dirty
	set     *Set                // the ServiceEntry set; nil: rebuild from entries
	// variants are, for the hostnames with views offered to some members
	// only (hub.federation/export-to), the ServiceEntry each member named
	// gets instead of entries' (nil: none, the host is absent for it);
	// memberSets the ServiceEntry sets of members, cleared with set.
	variants   map[string]map[string]*entry
	memberSets map[string]*Set
	// policyKinds are the distributed objects by kind (distribute.CanonicalKind).
	policyKinds map[string]*policyKind
}

// entry is one generated object, marshalled (immutable, shared).
type entry struct {
	name    string // <namespace>/<name>
	version string // content hash of spec, labels and annotations
	created time.Time
	any     *anypb.Any // the envelope
}

// New creates a Generator reading index.
func New(index Index, opts Options) *Generator {
	if opts.FederatedDomain == "" {
		opts.FederatedDomain = DefaultFederatedDomain
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Generator{index: index, domain: opts.FederatedDomain, trustDomain: opts.TrustDomain, now: opts.Now, policy: opts.Policy,
		entries: map[string]*entry{}, dirty: map[string]struct{}{}, policyKinds: map[string]*policyKind{},
		variants: map[string]map[string]*entry{}, memberSets: map[string]*Set{}}
}

// Invalidate records that the federated view of these hostnames changed.
func (g *Generator) Invalidate(hostnames map[string]struct{}) {
	if len(hostnames) == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for h := range hostnames {
		g.dirty[h] = struct{}{}
	}
}

// Set returns the full state of an Istio config type (IsConfigType) for
// the istiod of member: for networking.istio.io/<any version>/ServiceEntry
// the federated ServiceEntries (of the views offered to every member, and
// to member by hub.federation/export-to), and for every kind the objects
// distributed from the home cluster (Options.Policy); an empty set for a
// kind with neither. The caller echoes the type URL it was asked for; the
// resources are the same for every version.
func (g *Generator) Set(typeURL, member string) (Set, error) {
	group, _, kindName, ok := typeURLParts(typeURL)
	if !ok {
		return Set{}, fmt.Errorf("%q is not an Istio config type URL", typeURL)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var distributed []*entry
	if kind, known := distribute.CanonicalKind(typeURL); known {
		var err error
		if distributed, err = g.policyEntriesLocked(kind); err != nil {
			return Set{}, err
		}
	}
	if group != groupNetworking || kindName != kindServiceEntry {
		return *setOf(distributed), nil
	}
	if err := g.refreshLocked(); err != nil {
		return Set{}, err
	}
	if g.set == nil {
		g.set = g.buildSetLocked()
		clear(g.memberSets)
	}
	set := g.memberSetLocked(member)
	if len(distributed) == 0 {
		return *set, nil
	}
	return *setOf(merge(g.sortedEntriesLocked(member), distributed)), nil
}

// memberSetLocked is the ServiceEntry set of member's istiod: the shared
// one unless a hostname has a variant for it.
func (g *Generator) memberSetLocked(member string) *Set {
	if set, ok := g.memberSets[member]; ok {
		return set
	}
	set := g.set
	for _, byMember := range g.variants {
		if _, ok := byMember[member]; ok {
			set = setOf(g.sortedEntriesLocked(member))
			break
		}
	}
	if len(g.memberSets) < maxMemberSets {
		g.memberSets[member] = set
	}
	return set
}

// maxMemberSets bounds the member sets kept (member IDs come from clients:
// one not named by any export-to gets the shared set, kept or not).
const maxMemberSets = 1024

// refreshLocked rebuilds the entries of the changed hostnames (of every
// hostname the first time), with g.mu held. Reading the index under g.mu
// is safe: the index never calls the generator.
func (g *Generator) refreshLocked() error {
	hosts := g.dirty
	if !g.built {
		hosts = map[string]struct{}{}
		for _, h := range g.index.Hostnames() {
			hosts[h] = struct{}{}
		}
	}
	for h := range hosts {
		changed, err := g.rebuildLocked(h)
		if err != nil {
			return err // dirty stays as it is: tried again on the next ask
		}
		if changed {
			g.set = nil
		}
	}
	g.built = true
	clear(g.dirty)
	return nil
}

// rebuildLocked regenerates one hostname's entry, and its variants for
// the members its views' export-to lists name, and reports whether any
// changed (appeared, went, or got a new version).
func (g *Generator) rebuildLocked(host string) (bool, error) {
	members := g.index.Service(host)
	e, changed, err := g.entryLocked(members, "", g.entries[host])
	if err != nil {
		return false, err
	}
	if e == nil {
		delete(g.entries, host)
	} else {
		g.entries[host] = e
	}
	named := map[string]bool{}
	for _, s := range members {
		if !s.NotExported {
			for _, id := range s.ExportTo {
				named[id] = true
			}
		}
	}
	old := g.variants[host]
	if len(named) == 0 {
		delete(g.variants, host)
		return changed || len(old) > 0, nil
	}
	variants := make(map[string]*entry, len(named))
	for id := range named {
		prev, had := old[id]
		v, vchanged, err := g.entryLocked(members, id, prev)
		if err != nil {
			return false, err
		}
		variants[id] = v
		changed = changed || vchanged || !had
	}
	for id := range old {
		if !named[id] {
			changed = true
		}
	}
	g.variants[host] = variants
	return changed, nil
}

// entryLocked builds the ServiceEntry of a hostname's views offered to
// audience (buildServiceEntry) and reports whether it differs from old,
// which it stands in for (its create_time kept when no member knows one).
func (g *Generator) entryLocked(members map[string]*clusters.Service, audience string, old *entry) (*entry, bool, error) {
	se := buildServiceEntry(members, g.domain, g.trustDomain, audience)
	if se == nil {
		return nil, old != nil, nil
	}
	name := se.namespace + "/" + se.name
	version, err := contentVersion(se)
	if err != nil {
		return nil, false, err
	}
	created := se.created
	if created.IsZero() { // no member knows when it was created: keep the first stamp
		created = g.now()
		if old != nil && old.name == name {
			created = old.created
		}
	}
	if old != nil && old.name == name && old.version == version && old.created.Equal(created) {
		return old, false, nil
	}
	e, err := marshalEntry(name, version, created, se)
	if err != nil {
		return nil, false, err
	}
	return e, true, nil
}

// buildSetLocked collects the entries into a set sorted by name.
func (g *Generator) buildSetLocked() *Set { return setOf(g.sortedEntriesLocked("")) }

// sortedEntriesLocked lists the federated ServiceEntries member's istiod
// gets ("": the shared ones), sorted by name.
func (g *Generator) sortedEntriesLocked(member string) []*entry {
	list := make([]*entry, 0, len(g.entries))
	for host, e := range g.entries {
		if v, ok := g.variants[host][member]; ok && member != "" {
			e = v
		}
		if e != nil {
			list = append(list, e)
		}
	}
	if member != "" {
		for host, byMember := range g.variants {
			if v := byMember[member]; v != nil && g.entries[host] == nil {
				list = append(list, v) // offered to some members only
			}
		}
	}
	slices.SortFunc(list, func(a, b *entry) int { return strings.Compare(a.name, b.name) })
	return list
}

// deterministic marshals maps in key order: equal content, equal bytes.
var deterministic = proto.MarshalOptions{Deterministic: true}

// contentVersion hashes what istiod compares an object by: its spec and
// labels, and its creation time when known (istiod takes a new
// create_time only with a new version).
func contentVersion(se *serviceEntry) (string, error) {
	meta, err := deterministic.Marshal(&mcpapi.Metadata{Labels: se.labels})
	if err != nil {
		return "", fmt.Errorf("marshalling labels of %s/%s: %w", se.namespace, se.name, err)
	}
	spec, err := deterministic.Marshal(se.spec)
	if err != nil {
		return "", fmt.Errorf("marshalling ServiceEntry %s/%s: %w", se.namespace, se.name, err)
	}
	h := sha256.New()
	h.Write(meta)
	h.Write([]byte{0})
	h.Write(spec)
	if !se.created.IsZero() {
		h.Write([]byte{0})
		h.Write([]byte(se.created.UTC().Format(time.RFC3339)))
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), nil
}

// marshalEntry wraps a spec in its envelope and marshals it once.
func marshalEntry(name, version string, created time.Time, se *serviceEntry) (*entry, error) {
	body := &anypb.Any{}
	if err := anypb.MarshalFrom(body, se.spec, deterministic); err != nil {
		return nil, fmt.Errorf("marshalling ServiceEntry %s: %w", name, err)
	}
	res := &mcpapi.Resource{
		Metadata: &mcpapi.Metadata{Name: name, Version: version, CreateTime: timestamppb.New(created), Labels: se.labels},
		Body:     body,
	}
	value, err := deterministic.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("marshalling the envelope of %s: %w", name, err)
	}
	return &entry{name: name, version: version, created: created, any: &anypb.Any{TypeUrl: ResourceType, Value: value}}, nil
}
