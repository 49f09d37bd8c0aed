package clusters

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// ServiceExport conditions the hub writes back (export mode serviceexport),
// as the Multi-Cluster Services API defines them (KEP-1645): Valid says
// whether the export can be honoured (its Service exists in the member),
// Conflict whether the member's Service disagrees with another exporting
// member's on a port's protocol.
const (
	ConditionValid    = "Valid"
	ConditionConflict = "Conflict"
)

// ExportCondition is one ServiceExport condition the hub works out.
type ExportCondition struct {
	Type    string
	Status  metav1.ConditionStatus
	Reason  string
	Message string
}

// ExportStatus is what the hub made of one member's ServiceExport: its
// conditions and whether they were written to the ServiceExport's status
// (WriteError says why not, e.g. the member's credentials may not update
// serviceexports/status).
type ExportStatus struct {
	Conditions []ExportCondition
	Written    bool
	WriteError string
	// resourceVersion is the ServiceExport's after the hub wrote (or
	// found) these conditions: while the cache still has it and the
	// conditions are the same, nothing is read or written.
	resourceVersion string
}

// exportStatus sits in front of the Sink (export mode serviceexport): it
// keeps, per Service, the ports of every member's exported view, and
// works out and writes back the conditions of the members' ServiceExports
// of the Services that changed (on the leader; failures are kept for the
// API, not retried until the Service changes again).
type exportStatus struct {
	next     Sink
	members  func() []*Cluster
	isLeader func() bool
	log      *slog.Logger

	mu      sync.Mutex
	ports   map[ServiceKey]map[string]exportedView // exported views' ports, by member
	dirty   map[ServiceKey]struct{}
	results map[string]map[ServiceKey]ExportStatus // by member
	kick    chan struct{}
}

func newExportStatus(next Sink, log *slog.Logger) *exportStatus {
	return &exportStatus{next: next, log: log, ports: map[ServiceKey]map[string]exportedView{},
		dirty: map[ServiceKey]struct{}{}, results: map[string]map[ServiceKey]ExportStatus{}, kick: make(chan struct{}, 1)}
}

// ReplaceCluster implements Sink.
func (e *exportStatus) ReplaceCluster(cluster string, services []*Service) {
	e.next.ReplaceCluster(cluster, services)
	e.mu.Lock()
	seen := make(map[ServiceKey]bool, len(services))
	for _, s := range services {
		key := ServiceKey{Namespace: s.Namespace, Name: s.Name}
		seen[key] = true
		e.setLocked(cluster, key, s)
	}
	for key, byMember := range e.ports {
		if _, ok := byMember[cluster]; ok && !seen[key] {
			e.setLocked(cluster, key, nil)
		}
	}
	for key := range e.results[cluster] {
		e.dirty[key] = struct{}{} // a new client: its ServiceExports may differ
	}
	e.mu.Unlock()
	e.wake()
}

// UpdateService implements Sink.
func (e *exportStatus) UpdateService(cluster string, key ServiceKey, svc *Service) {
	e.next.UpdateService(cluster, key, svc)
	e.mu.Lock()
	e.setLocked(cluster, key, svc)
	e.mu.Unlock()
	e.wake()
}

// RemoveCluster implements Sink.
func (e *exportStatus) RemoveCluster(cluster string) {
	e.next.RemoveCluster(cluster)
	e.mu.Lock()
	for key, byMember := range e.ports {
		if _, ok := byMember[cluster]; ok {
			e.setLocked(cluster, key, nil)
		}
	}
	delete(e.results, cluster)
	e.mu.Unlock()
	e.wake()
}

// setLocked records a member's view of a Service and marks the Service:
// every call may change a condition (the Service or its ServiceExport came
// or went), so every one marks it.
func (e *exportStatus) setLocked(cluster string, key ServiceKey, svc *Service) {
	e.dirty[key] = struct{}{}
	byMember := e.ports[key]
	if svc == nil || svc.NotExported {
		delete(byMember, cluster)
		if len(byMember) == 0 {
			delete(e.ports, key)
		}
		return
	}
	if byMember == nil {
		byMember = map[string]exportedView{}
		e.ports[key] = byMember
	}
	byMember[cluster] = exportedView{ports: svc.Ports, exportTo: svc.ExportTo}
}

// exportedView is what a member's ServiceExport conditions compare of
// another member's exported view: its ports, and the members it is
// exported to (Service.ExportTo; nil: every member).
type exportedView struct {
	ports    []ServicePort
	exportTo []string
}

// visibleTo reports whether member may be told of the view.
func (v exportedView) visibleTo(member string) bool {
	return v.exportTo == nil || slices.Contains(v.exportTo, member)
}

func (e *exportStatus) wake() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// exportStatusRetry is how often conditions that could not be written
// (or were marked while this replica did not lead) are tried again.
const exportStatusRetry = 30 * time.Second

// run works out and writes conditions as Services change, until ctx ends.
func (e *exportStatus) run(ctx context.Context) {
	t := time.NewTicker(exportStatusRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.kick:
		case <-t.C:
		}
		if e.isLeader != nil && !e.isLeader() {
			continue // marks stay: a replica that becomes leader writes them
		}
		e.mu.Lock()
		keys := slices.Collect(maps.Keys(e.dirty))
		clear(e.dirty)
		e.mu.Unlock()
		// Members in parallel (each its own API server and client), each
		// member's Services one after the other.
		members := make(chan *Cluster)
		var wg sync.WaitGroup
		for range exportStatusWriters {
			wg.Go(func() {
				for c := range members {
					for _, key := range keys {
						if ctx.Err() != nil {
							break
						}
						e.reconcile(ctx, c, key)
					}
				}
			})
		}
		for _, c := range e.members() {
			members <- c
		}
		close(members)
		wg.Wait()
	}
}

// exportStatusWriters bounds the members whose ServiceExports are worked
// on at once.
const exportStatusWriters = 8

// reconcile works out the conditions of one member's ServiceExport of a
// Service (none: nothing to do) and writes them when they changed.
func (e *exportStatus) reconcile(ctx context.Context, c *Cluster, key ServiceKey) {
	exported, listed := c.ns.serviceExported(key.Namespace, key.Name)
	if !listed || !exported {
		e.mu.Lock()
		delete(e.results[c.id], key)
		e.mu.Unlock()
		return
	}
	e.mu.Lock()
	others := maps.Clone(e.ports[key])
	e.mu.Unlock()
	_, err := c.services.Services(key.Namespace).Get(key.Name)
	conds := exportConditions(c.id, apierrors.IsNotFound(err) || !c.ns.federates(key.Namespace), others)
	cached := c.ns.serviceExportVersion(key)
	e.mu.Lock()
	prev, had := e.results[c.id][key]
	e.mu.Unlock()
	if had && prev.Written && prev.resourceVersion == cached && slices.Equal(prev.Conditions, conds) {
		return // written, and the ServiceExport has not changed since
	}
	st := ExportStatus{Conditions: conds}
	rv, werr := c.api.writeExportStatus(ctx, key, conds)
	st.resourceVersion = rv
	if werr != nil {
		st.WriteError = werr.Error()
		e.log.Warn("writing ServiceExport status", "cluster", c.id, "service", key, "error", werr)
	} else {
		st.Written = true
	}
	e.mu.Lock()
	if werr != nil {
		e.dirty[key] = struct{}{} // tried again on the next round
	}
	if e.results[c.id] == nil {
		e.results[c.id] = map[ServiceKey]ExportStatus{}
	}
	e.results[c.id][key] = st
	e.mu.Unlock()
}

// exportConditions are the conditions of member's ServiceExport: Valid
// unless it has no Service of the name; Conflict when a port number of its
// Service has another protocol in another exporting member's view that is
// exported to it (a ServiceExport's status is read in the member: it names
// no member, port or protocol that hub.federation/export-to keeps from it).
func exportConditions(member string, noService bool, ports map[string]exportedView) []ExportCondition {
	if noService {
		return []ExportCondition{
			{Type: ConditionValid, Status: metav1.ConditionFalse, Reason: "NoService", Message: "the member has no Service of this name in a watched namespace"},
			{Type: ConditionConflict, Status: metav1.ConditionFalse, Reason: "NoService", Message: "nothing to compare"},
		}
	}
	valid := ExportCondition{Type: ConditionValid, Status: metav1.ConditionTrue, Reason: "ServiceExported", Message: "the Service is federated to the other members"}
	mine := map[int32]string{}
	for _, p := range ports[member].ports {
		mine[p.Port] = p.Protocol
	}
	var clashes []string
	for _, id := range slices.Sorted(maps.Keys(ports)) {
		if id == member || !ports[id].visibleTo(member) {
			continue
		}
		for _, p := range ports[id].ports {
			if proto, ok := mine[p.Port]; ok && proto != p.Protocol {
				clashes = append(clashes, fmt.Sprintf("port %d is %s here and %s in %s", p.Port, proto, p.Protocol, id))
			}
		}
	}
	if len(clashes) == 0 {
		return []ExportCondition{valid, {Type: ConditionConflict, Status: metav1.ConditionFalse, Reason: "NoConflicts", Message: "every exporting member agrees on the ports' protocols"}}
	}
	sort.Strings(clashes)
	if len(clashes) > 10 {
		clashes = append(clashes[:10], fmt.Sprintf("and %d more", len(clashes)-10))
	}
	return []ExportCondition{valid, {Type: ConditionConflict, Status: metav1.ConditionTrue, Reason: "PortConflict", Message: strings.Join(clashes, "; ")}}
}

// writeExportStatus writes conditions into the status of the member's
// ServiceExport key, keeping each unchanged condition's transition time;
// nothing when they are already there. It is optional for the member's
// state: a member that may not write it stays Ready.
func (a *memberAPI) writeExportStatus(ctx context.Context, key ServiceKey, conds []ExportCondition) (resourceVersion string, err error) {
	ctx, cancel := context.WithTimeout(optionalRequest(ctx), 10*time.Second)
	defer cancel()
	res := a.dynamic.Resource(ServiceExportGVR).Namespace(key.Namespace)
	cur, err := res.Get(ctx, key.Name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading ServiceExport %s: %w", key, err)
	}
	have, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
	now := metav1.Now().UTC().Format(time.RFC3339)
	out := make([]any, 0, len(conds))
	same := len(have) == len(conds)
	for i, cond := range conds {
		m := map[string]any{"type": cond.Type, "status": string(cond.Status), "reason": cond.Reason, "message": cond.Message, "lastTransitionTime": now}
		if i < len(have) {
			if h, ok := have[i].(map[string]any); ok && h["type"] == cond.Type && h["status"] == string(cond.Status) {
				if t, ok := h["lastTransitionTime"].(string); ok {
					m["lastTransitionTime"] = t
				}
				if h["reason"] != cond.Reason || h["message"] != cond.Message {
					same = false
				}
			} else {
				same = false
			}
		}
		out = append(out, m)
	}
	if same {
		return cur.GetResourceVersion(), nil
	}
	if err := unstructured.SetNestedSlice(cur.Object, out, "status", "conditions"); err != nil {
		return "", err
	}
	updated, err := res.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		return "", fmt.Errorf("writing ServiceExport %s status: %w", key, err)
	}
	return updated.GetResourceVersion(), nil
}

// serviceExportVersion is the resource version the cache has of the
// member's ServiceExport key ("" when none).
func (n *namespaceWatches) serviceExportVersion(key ServiceKey) string {
	w := n.of(key.Namespace)
	if w == nil || w.exports == nil {
		return ""
	}
	obj, ok, _ := w.exports.inf.GetStore().GetByKey(key.Namespace + "/" + key.Name)
	if m, isMeta := obj.(metav1.Object); ok && isMeta {
		return m.GetResourceVersion()
	}
	return ""
}

// exportStatuses is what the hub made of a member's ServiceExports.
func (e *exportStatus) exportStatuses(member string) map[ServiceKey]ExportStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.results[member])
}
