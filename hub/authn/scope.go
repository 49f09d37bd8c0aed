package authn

import (
	"errors"
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/internal/clip"
)

// IdentityScopes tells what each member may assert about its workloads
// (clusters.Registry implements it): whether it has synced, and its remote
// Secret's identity annotations.
type IdentityScopes interface {
	IdentityScope(cluster string) (clusters.IdentityScope, error)
}

// Why a member may not assert an identity (ScopeError.Reason): label
// values of hub_identity_scope_refusals_total and of
// hub_ca_requests_failed_total.
const (
	ScopeMemberNotSynced     = "member_not_synced"     // the member has not synced since this replica started
	ScopeMemberUnknown       = "member_unknown"        // no such member: removed (a certificate outlives it) or never registered
	ScopeHubNamespace        = "hub_namespace"         // the hub's own namespace (--namespace): never
	ScopeRootNamespace       = "root_namespace"        // Istio's root namespace without the member's annotation
	ScopeNamespaceNotAllowed = "namespace_not_allowed" // not in the member's hub.federation/identity-namespaces
)

var scopeReasons = []string{ScopeMemberNotSynced, ScopeMemberUnknown, ScopeHubNamespace, ScopeRootNamespace, ScopeNamespaceNotAllowed}

// ScopeError is an identity its member may not assert (PermissionDenied).
type ScopeError struct {
	// Reason is why, one of the Scope* constants.
	Reason string
	msg    string
}

// Error says who may not assert what, and why.
func (e *ScopeError) Error() string { return e.msg }

// Scope decides which identities a member may assert (docs/architecture.md §3.8,
// docs/security.md "Which identities a member may assert"): a member asserts nothing until it has synced;
// nobody asserts identities of the hub's own namespace; only the home
// cluster, and members whose remote Secret says so, assert identities of
// Istio's root namespace; a member whose Secret lists namespaces asserts
// only those. It reads memory only, so it may run under no lock concern.
// A nil Scope allows every identity.
type Scope struct {
	scopes        IdentityScopes // nil: every member synced, without annotations
	hubNamespace  string         // "": none
	rootNamespace string         // "": none
	refused       *prometheus.CounterVec
}

// NewScope decides with scopes (nil: every member synced, without
// annotations) and the hub's own and Istio's root namespace ("": none).
func NewScope(scopes IdentityScopes, hubNamespace, rootNamespace string) *Scope {
	s := &Scope{scopes: scopes, hubNamespace: hubNamespace, rootNamespace: rootNamespace,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_identity_scope_refusals_total",
			Help: "Workload identities a member asserted but may not (hub namespace, root namespace without the annotation, a namespace its remote Secret does not list, a member that has not synced), by where (ca, sds) and reason.",
		}, []string{"surface", "reason"}),
	}
	for _, surface := range []string{"ca", "sds"} {
		for _, r := range scopeReasons {
			s.refused.WithLabelValues(surface, r)
		}
	}
	return s
}

// lookup returns cluster's scope; an unknown cluster gets the zero scope
// with ok false (whoever asks it refuses it on its own terms).
func (s *Scope) lookup(cluster string) (clusters.IdentityScope, bool) {
	if s.scopes == nil {
		return clusters.IdentityScope{Synced: true}, true
	}
	sc, err := s.scopes.IdentityScope(cluster)
	return sc, err == nil
}

// memberMay refuses a member that may assert no identity at all yet: one
// that has not synced since this replica started. An unknown member is not
// refused here (its token review fails as such).
func (s *Scope) memberMay(cluster string) error {
	if s == nil {
		return nil
	}
	sc, ok := s.lookup(cluster)
	if !ok || sc.Synced {
		return nil
	}
	return &ScopeError{Reason: ScopeMemberNotSynced, msg: fmt.Sprintf(
		"member %s has not synced since this hub started (state %s): it asserts no workload identity until it has", clip.String(cluster, 64), sc.State)}
}

// Allow reports whether cluster may assert an identity in namespace: nil,
// or a *ScopeError saying why not. A member that is not registered (a
// certificate bound to it outlives its removal) asserts nothing; cluster ""
// (a certificate bound to no member) is checked for the hub's namespace
// only.
func (s *Scope) Allow(cluster, namespace string) error {
	if s == nil {
		return nil
	}
	if err := s.memberMay(cluster); err != nil {
		return err
	}
	if namespace == s.hubNamespace && s.hubNamespace != "" {
		return &ScopeError{Reason: ScopeHubNamespace, msg: fmt.Sprintf(
			"identities of namespace %s, the hub's own, are never issued or served, whatever member asserts them", namespace)}
	}
	sc, ok := s.lookup(cluster)
	switch {
	case !ok && cluster != "":
		// A certificate bound to a member outlives its removal: the
		// member's consent ended with it.
		return &ScopeError{Reason: ScopeMemberUnknown, msg: fmt.Sprintf(
			"member %s is not registered (removed, or never was): it asserts no workload identity", clip.String(cluster, 64))}
	case !ok:
		return nil
	}
	if namespace == s.rootNamespace && s.rootNamespace != "" {
		if sc.Home || sc.AllowRootNamespace {
			return nil
		}
		return &ScopeError{Reason: ScopeRootNamespace, msg: fmt.Sprintf(
			"member %s may not assert identities of Istio's root namespace %s: its remote Secret lacks the annotation %s: \"true\"",
			clip.String(cluster, 64), namespace, clusters.AnnotationAllowRootNamespaceIdentities)}
	}
	if sc.Namespaces != nil && !slices.Contains(sc.Namespaces, namespace) {
		why := fmt.Sprintf("its remote Secret's annotation %s does not list it", clusters.AnnotationIdentityNamespaces)
		if sc.Invalid != "" {
			why = "its remote Secret's annotation is invalid (" + sc.Invalid + "), so no namespace is allowed"
		}
		return &ScopeError{Reason: ScopeNamespaceNotAllowed, msg: fmt.Sprintf(
			"member %s may not assert identities of namespace %s: %s", clip.String(cluster, 64), namespace, why)}
	}
	return nil
}

// Count records a refusal of err (a ScopeError) on surface ("ca" or
// "sds", the label of hub_identity_scope_refusals_total).
func (s *Scope) Count(surface string, err error) {
	var se *ScopeError
	if s != nil && errors.As(err, &se) {
		s.refused.WithLabelValues(surface, se.Reason).Inc()
	}
}

// Collectors are the scope's metric: hub_identity_scope_refusals_total.
func (s *Scope) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.refused}
}
