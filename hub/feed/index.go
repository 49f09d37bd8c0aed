package feed

import (
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/hubmesh/hub/clusters"
)

// Index is the federated index: every member's services, grouped by service
// hostname. It implements clusters.Sink and reports the hostnames whose
// federated view changed to the hub's change feed. It is independent of xDS
// so that other generators (the Istio config of package mcp, docs/architecture.md §3.7)
// read it too.
type Index struct {
	domainSuffix string
	changes      *Changes

	mu        sync.RWMutex
	byHost    map[string]map[string]*clusters.Service // hostname → member → view
	byCluster map[string]map[clusters.ServiceKey]*clusters.Service
	// networks is each member's network as its last view set says, and
	// gateways its gateways (every view of a member carries them).
	networks map[string]string
	gateways map[string][]clusters.Gateway
	// demoted are the members that are not healthy, with their state.
	demoted map[string]clusters.State
	// localities counts the stored views with endpoints in each region
	// ("region") and zone ("region/zone"): the client localities that mean
	// something (KnownLocality).
	localities map[string]int
	// restricted counts, per hostname, the views some other member may
	// not have (clusters.Service.Restricted): only those hostnames'
	// resources differ between members (Audience).
	restricted map[string]int
	// named counts, per member ID, the views whose export-to lists name it
	// (clusters.Service.ExportTo): such a member is known (KnownMember)
	// even before it has views of its own.
	named map[string]int
}

// NewIndex creates an empty index that reports the hostnames whose view
// changed to changes (outside the index's lock; nil: to nobody).
func NewIndex(domainSuffix string, changes *Changes) *Index {
	return &Index{
		domainSuffix: domainSuffix,
		changes:      changes,
		byHost:       map[string]map[string]*clusters.Service{},
		byCluster:    map[string]map[clusters.ServiceKey]*clusters.Service{},
		networks:     map[string]string{},
		gateways:     map[string][]clusters.Gateway{},
		demoted:      map[string]clusters.State{},
		localities:   map[string]int{},
		restricted:   map[string]int{},
		named:        map[string]int{},
	}
}

// DomainSuffix is the suffix of the hostnames (see Hostname).
func (x *Index) DomainSuffix() string { return x.domainSuffix }

// Hostname is a Service's federated hostname: <name>.<namespace>.svc.<suffix>.
func (x *Index) Hostname(namespace, name string) string {
	return name + "." + namespace + ".svc." + x.domainSuffix
}

var _ clusters.Sink = (*Index)(nil)

// ReplaceCluster implements clusters.Sink.
func (x *Index) ReplaceCluster(cluster string, services []*clusters.Service) {
	next := make(map[clusters.ServiceKey]*clusters.Service, len(services))
	for _, s := range services {
		next[clusters.ServiceKey{Namespace: s.Namespace, Name: s.Name}] = s
	}
	x.mu.Lock()
	var changed []string
	for key := range x.byCluster[cluster] {
		if _, ok := next[key]; !ok {
			changed = x.setLocked(cluster, key, nil, changed)
		}
	}
	for key, s := range next {
		changed = x.setLocked(cluster, key, s, changed)
	}
	x.mu.Unlock()
	x.notify(changed)
}

// UpdateService implements clusters.Sink.
func (x *Index) UpdateService(cluster string, key clusters.ServiceKey, svc *clusters.Service) {
	x.mu.Lock()
	changed := x.setLocked(cluster, key, svc, nil)
	x.mu.Unlock()
	x.notify(changed)
}

// RemoveCluster implements clusters.Sink.
func (x *Index) RemoveCluster(cluster string) {
	x.mu.Lock()
	var changed []string
	for key := range x.byCluster[cluster] {
		changed = x.setLocked(cluster, key, nil, changed)
	}
	delete(x.byCluster, cluster)
	if len(x.gateways[cluster]) > 0 {
		changed = x.networkHostsLocked(x.networks[cluster], changed)
	}
	delete(x.networks, cluster)
	delete(x.gateways, cluster)
	delete(x.demoted, cluster)
	x.mu.Unlock()
	x.notify(changed)
}

// MemberState records a member's state (clusters.StateObserver): a member
// that is Stale, Unreachable or TimedOut is demoted (its endpoints go
// behind the healthy members', see Demoted), and every hostname it serves
// changes when it is demoted or restored.
func (x *Index) MemberState(cluster string, st clusters.State) {
	bad := st == clusters.StateStale || st == clusters.StateUnreachable || st == clusters.StateTimedOut
	x.mu.Lock()
	_, was := x.demoted[cluster]
	if bad {
		x.demoted[cluster] = st
	} else {
		delete(x.demoted, cluster)
	}
	var changed []string
	if bad != was {
		for key := range x.byCluster[cluster] {
			changed = append(changed, x.Hostname(key.Namespace, key.Name))
		}
	}
	x.mu.Unlock()
	x.notify(changed)
}

// Demoted reports whether a member is demoted and in which state.
func (x *Index) Demoted(cluster string) (clusters.State, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	st, ok := x.demoted[cluster]
	return st, ok
}

// KnownNetwork reports whether some member's Services are on network.
func (x *Index) KnownNetwork(network string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, nw := range x.networks {
		if nw == network {
			return true
		}
	}
	return false
}

// NetworkGateways are the gateways of every member on a network, in the
// order of the members' IDs, each once.
func (x *Index) NetworkGateways(network string) []clusters.Gateway {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var ids []string
	for id, nw := range x.networks {
		if nw == network && network != "" {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	var out []clusters.Gateway
	seen := map[clusters.Gateway]bool{}
	for _, id := range ids {
		for _, g := range x.gateways[id] {
			if !seen[g] {
				seen[g] = true
				out = append(out, g)
			}
		}
	}
	return out
}

// MemberNetwork is a member's Istio network as its Services say ("" when
// it has none or no Services yet).
func (x *Index) MemberNetwork(cluster string) string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.networks[cluster]
}

// setLocked stores one member's view of one service and appends its hostname
// to changed if the view differs from what was stored.
func (x *Index) setLocked(cluster string, key clusters.ServiceKey, svc *clusters.Service, changed []string) []string {
	old := x.byCluster[cluster][key]
	if svc == nil && old == nil || svc != nil && old != nil && reflect.DeepEqual(svc, old) {
		return changed
	}
	host := x.Hostname(key.Namespace, key.Name)
	x.countLocalitiesLocked(old, -1)
	x.countLocalitiesLocked(svc, 1)
	if old != nil && old.Restricted() {
		if x.restricted[host]--; x.restricted[host] == 0 {
			delete(x.restricted, host)
		}
		for _, id := range old.ExportTo {
			if x.named[id]--; x.named[id] == 0 {
				delete(x.named, id)
			}
		}
	}
	if svc != nil && svc.Restricted() {
		x.restricted[host]++
		for _, id := range svc.ExportTo {
			x.named[id]++
		}
	}
	if svc == nil {
		delete(x.byCluster[cluster], key)
		delete(x.byHost[host], cluster)
		if len(x.byHost[host]) == 0 {
			delete(x.byHost, host)
		}
	} else {
		if x.byCluster[cluster] == nil {
			x.byCluster[cluster] = map[clusters.ServiceKey]*clusters.Service{}
		}
		if x.byHost[host] == nil {
			x.byHost[host] = map[string]*clusters.Service{}
		}
		x.byCluster[cluster][key] = svc
		x.byHost[host][cluster] = svc
		x.networks[cluster] = svc.Network
		if !slices.Equal(x.gateways[cluster], svc.Gateways) {
			x.gateways[cluster] = svc.Gateways
			changed = x.networkHostsLocked(svc.Network, changed)
		}
	}
	return append(changed, host)
}

// networkHostsLocked appends the hostnames of every member on network: a
// network's gateways stand in for all of them (see NetworkGateways).
func (x *Index) networkHostsLocked(network string, changed []string) []string {
	if network == "" {
		return changed
	}
	for id, nw := range x.networks {
		if nw != network {
			continue
		}
		for key := range x.byCluster[id] {
			changed = append(changed, x.Hostname(key.Namespace, key.Name))
		}
	}
	return changed
}

// countLocalitiesLocked adds by to the count of each region and zone svc
// has endpoints in (once per view).
func (x *Index) countLocalitiesLocked(svc *clusters.Service, by int) {
	if svc == nil {
		return
	}
	seen := map[string]struct{}{}
	for _, ep := range svc.Endpoints {
		for _, k := range [2]string{ep.Region, ep.Region + "/" + ep.Zone} {
			if _, ok := seen[k]; !ok {
				seen[k] = struct{}{}
				if x.localities[k] += by; x.localities[k] <= 0 {
					delete(x.localities, k)
				}
			}
		}
	}
}

// KnownLocality is a client's region and zone as far as some member's
// endpoints share them: a region no endpoint is in is UnknownLocality
// (with no zone), a zone no endpoint of the region is in is
// UnknownLocality. A client's locality only ranks endpoints by what it
// shares with theirs, so nothing is lost, and clients cannot make the hub
// keep a variant per made-up name.
func (x *Index) KnownLocality(region, zone string) (string, string) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if x.localities[region] == 0 {
		return UnknownLocality, ""
	}
	if x.localities[region+"/"+zone] == 0 {
		return region, UnknownLocality
	}
	return region, zone
}

// UnknownLocality stands for a region or zone no endpoint is in (it is not
// a valid label value, so no endpoint is in it).
const UnknownLocality = "(other)"

// KnownMember reports whether a member has views in the index, or is named
// by a view's export-to list (a client of it gets what is exported to it).
func (x *Index) KnownMember(cluster string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	_, ok := x.byCluster[cluster]
	return ok || x.named[cluster] > 0
}

func (x *Index) notify(changed []string) {
	if len(changed) > 0 && x.changes != nil {
		x.changes.HostnamesChanged(changed)
	}
}

// Service returns every member's view of one hostname, by member ID. The
// views are shared and must not be modified.
func (x *Index) Service(hostname string) map[string]*clusters.Service {
	x.mu.RLock()
	defer x.mu.RUnlock()
	members := x.byHost[hostname]
	if members == nil {
		return nil
	}
	out := make(map[string]*clusters.Service, len(members))
	for id, s := range members {
		out[id] = s
	}
	return out
}

// AnyRestricted reports whether some view is not offered to every member
// (then members' views of the mesh differ).
func (x *Index) AnyRestricted() bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.restricted) > 0
}

// Audience names what a client of member gets of a hostname: "" when
// every member gets every view of it, else the member IDs whose views it
// gets (its own, and those exported to it), comma-separated, sorted, and
// "-" for none. Clients with the same audience get the same resources.
func (x *Index) Audience(hostname, member string) string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if x.restricted[hostname] == 0 {
		return ""
	}
	var ids []string
	for id, s := range x.byHost[hostname] {
		if id == member || s.ExportedTo(member) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return "-"
	}
	sort.Strings(ids)
	return strings.Join(ids, ",")
}

// Visible is the views of a hostname a client of member gets (its
// member's own and those exported to it): members itself when none is
// restricted. Shared: read only.
func Visible(members map[string]*clusters.Service, member string) map[string]*clusters.Service {
	restricted := false
	for _, s := range members {
		if s.Restricted() {
			restricted = true
			break
		}
	}
	if !restricted {
		return members
	}
	out := make(map[string]*clusters.Service, len(members))
	for id, s := range members {
		if id == member || s.ExportedTo(member) {
			out[id] = s
		}
	}
	return out
}

// Has reports whether a hostname is federated: some member has it and
// does not keep it home (clusters.Service.NotExported).
func (x *Index) Has(hostname string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, s := range x.byHost[hostname] {
		if !s.NotExported {
			return true
		}
	}
	return false
}

// FederatedHostnames returns the hostnames Has reports, sorted: those with
// a view some member exports.
func (x *Index) FederatedHostnames() []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []string
	for h, views := range x.byHost {
		for _, s := range views {
			if !s.NotExported {
				out = append(out, h)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// Hostnames returns every federated hostname, sorted.
func (x *Index) Hostnames() []string {
	x.mu.RLock()
	out := make([]string, 0, len(x.byHost))
	for h := range x.byHost {
		out = append(out, h)
	}
	x.mu.RUnlock()
	sort.Strings(out)
	return out
}
