package clusters

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
)

// Annotations of a remote Secret that widen or narrow the workload
// identities its members may assert (certificates from the hub's CA, and
// Kubernetes Secrets over SDS). They are read whenever the Secret changes:
// a change applies without a restart.
const (
	// AnnotationAllowRootNamespaceIdentities set to "true" lets the
	// Secret's members assert identities in Istio's root namespace
	// (--root-namespace, where ingress and egress gateways run). Any other
	// value, or none, refuses them.
	AnnotationAllowRootNamespaceIdentities = "hub.federation/allow-root-namespace-identities"
	// AnnotationIdentityNamespaces, if present, is a comma-separated list
	// of the only namespaces (other than the root namespace, which the
	// annotation above governs) in which the Secret's members may assert
	// identities. A list with a name that is not a namespace name refuses
	// every namespace (it fails closed).
	AnnotationIdentityNamespaces = "hub.federation/identity-namespaces"
)

// IdentityScope is what a member may assert about its workloads: the
// hub's CA signs, and SDS serves Secrets to, an identity of the member
// only within it.
type IdentityScope struct {
	// Home is the home cluster (no remote Secret: the operator's own).
	Home bool
	// Synced: the member's current client has listed the member's
	// Services, EndpointSlices and Nodes at least once since this replica
	// started (a view restored from persistence does not count), and the
	// member is not stopped for exceeding its object cap. State is the
	// member's state as shown.
	Synced bool
	State  State
	// AllowRootNamespace is AnnotationAllowRootNamespaceIdentities.
	AllowRootNamespace bool
	// Namespaces is AnnotationIdentityNamespaces: nil means any.
	Namespaces []string
	// Invalid says why AnnotationIdentityNamespaces was not understood
	// (then Namespaces is empty, not nil: no namespace is allowed).
	Invalid string
}

// identityAnnotations are a remote Secret's identity annotations as read.
type identityAnnotations struct {
	allowRoot  bool
	namespaces []string // nil: not set
	invalid    string
}

// readIdentityAnnotations reads a remote Secret's identity annotations
// (nil: none).
func readIdentityAnnotations(s *corev1.Secret) identityAnnotations {
	var a identityAnnotations
	if s == nil {
		return a
	}
	a.allowRoot = s.Annotations[AnnotationAllowRootNamespaceIdentities] == "true"
	list, ok := s.Annotations[AnnotationIdentityNamespaces]
	if !ok {
		return a
	}
	a.namespaces = []string{}
	for _, ns := range strings.Split(list, ",") {
		ns = strings.TrimSpace(ns)
		if ns == "" {
			continue
		}
		if errs := k8svalidation.IsDNS1123Label(ns); len(errs) > 0 {
			a.namespaces, a.invalid = []string{}, fmt.Sprintf("annotation %s: %q is not a namespace name: %s", AnnotationIdentityNamespaces, truncateName(ns), errs[0])
			return a
		}
		a.namespaces = append(a.namespaces, ns)
	}
	return a
}

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func (a identityAnnotations) equal(b identityAnnotations) bool {
	return a.allowRoot == b.allowRoot && a.invalid == b.invalid && (a.namespaces == nil) == (b.namespaces == nil) &&
		strings.Join(a.namespaces, ",") == strings.Join(b.namespaces, ",")
}

// IdentityScope returns what cluster may assert about its workloads, or
// ErrUnknownCluster when it is neither the home cluster nor a current
// member. It reads memory only (no request to any API server).
func (r *Registry) IdentityScope(cluster string) (IdentityScope, error) {
	if cluster == r.cfg.HomeID {
		synced, st := r.home.identitySynced()
		return IdentityScope{Home: true, Synced: synced, State: st, AllowRootNamespace: true}, nil
	}
	r.mu.Lock()
	m := r.members[cluster]
	var ann identityAnnotations
	var active *Cluster
	if m != nil {
		ann, active = m.identity, m.active
	}
	r.mu.Unlock()
	if m == nil {
		return IdentityScope{}, fmt.Errorf("%w %q", ErrUnknownCluster, cluster)
	}
	synced, st := active.identitySynced()
	return IdentityScope{Synced: synced, State: st, AllowRootNamespace: ann.allowRoot, Namespaces: ann.namespaces, Invalid: ann.invalid}, nil
}

// identitySynced reports whether the cluster's informers have synced since
// it started and it is not stopped for overflow, and its shown state.
func (c *Cluster) identitySynced() (bool, State) {
	synced, shown := c.health.identity()
	return synced && !c.objects.overflowed.Load(), shown
}
