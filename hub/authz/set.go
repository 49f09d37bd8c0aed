package authz

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	securityv1beta1 "istio.io/api/security/v1beta1"

	"github.com/hubmesh/hub/distribute"
)

// The kinds (as distribute.Source names them) whose objects a Set is made of.
const (
	AuthorizationPolicyKind = "security.istio.io/v1/AuthorizationPolicy"
	PeerAuthenticationKind  = "security.istio.io/v1/PeerAuthentication"
)

// Mode is a mutual-TLS mode, as PeerAuthentication names them.
type Mode string

// The modes. Istio's proxyless generator serves a port whose policy is
// PERMISSIVE in plaintext (a gRPC server cannot tell TLS from plaintext on
// one port: gRFC A36's filter chain match has no useful
// transport_protocol), unless the workload carries the label
// security.istio.io/tlsMode=istio (its clients would then try mTLS), which
// makes it STRICT.
const (
	Strict     Mode = "STRICT"
	Permissive Mode = "PERMISSIVE"
	Disable    Mode = "DISABLE"
)

// Set is the distributed AuthorizationPolicies and PeerAuthentications,
// compiled: which of them select a workload (Select) and what they make of
// its inbound listener. Immutable once made.
type Set struct {
	rootNamespace string
	meshDefault   Mode
	authz         map[string][]*compiledPolicy // by namespace
	byID          map[string]*compiledPolicy   // the readable ones, by namespace/name
	peer          map[string][]peerPolicy      // by namespace
	mesh          *peerPolicy                  // the mesh-wide PeerAuthentication, if any
	// unreadablePeer are the PeerAuthentications whose spec did not
	// convert, by namespace: they make the servers they could select
	// STRICT (failing closed).
	unreadablePeer map[string][]string
	problems       []Problem
	td             TrustDomainBundle // what principals were mapped with
}

// compiledPolicy is one AuthorizationPolicy and its rules as RBAC
// policies of the action the hub enforces it with.
type compiledPolicy struct {
	id       string // namespace/name
	version  string
	action   securityv1beta1.AuthorizationPolicy_Action
	selector func(Workload) bool
	// rules are its RBAC policies, by name ("<ns>-<name>-<rule>"), of
	// action enforce; none for AUDIT.
	rules   map[string]*rbacpb.Policy
	enforce rbacpb.RBAC_Action
	// problems are what it asks that the hub enforces otherwise.
	problems []Problem
}

// peerPolicy is one PeerAuthentication.
type peerPolicy struct {
	id, version string
	created     int64
	spec        *securityv1beta1.PeerAuthentication
}

// NewSet compiles the distributed policies (distribute.Source.Rules of
// AuthorizationPolicyKind and PeerAuthenticationKind): those in
// rootNamespace apply mesh-wide, the others in their namespace.
// meshDefault is the mode when no mesh-wide PeerAuthentication sets one
// (Istio's is PERMISSIVE). td maps principals' trust domains (see
// TrustDomainBundle).
func NewSet(rootNamespace string, meshDefault Mode, td TrustDomainBundle, authzObjs, peerObjs []distribute.Object) *Set {
	return NextSet(nil, rootNamespace, meshDefault, td, authzObjs, peerObjs)
}

// NextSet is NewSet reusing what prev (nil: none) compiled of the
// AuthorizationPolicies that did not change, when it mapped principals
// with the same trust domains: a policy edit compiles that policy alone.
func NextSet(prev *Set, rootNamespace string, meshDefault Mode, td TrustDomainBundle, authzObjs, peerObjs []distribute.Object) *Set {
	if prev != nil && !slices.Equal(prev.td.TrustDomains, td.TrustDomains) {
		prev = nil // compiled with other trust domains
	}
	s := &Set{rootNamespace: rootNamespace, meshDefault: meshDefault, authz: map[string][]*compiledPolicy{}, byID: map[string]*compiledPolicy{}, peer: map[string][]peerPolicy{},
		unreadablePeer: map[string][]string{}, td: td}
	for _, o := range authzObjs {
		if o.Spec == nil {
			s.authz[o.Namespace] = append(s.authz[o.Namespace], s.unreadable(o))
			continue
		}
		spec, ok := o.Spec.(*securityv1beta1.AuthorizationPolicy)
		if !ok || len(spec.GetTargetRefs()) > 0 || spec.GetTargetRef() != nil {
			continue // targetRefs attach a policy to gateways and waypoints, never to a workload (istiod: ShouldAttachPolicy)
		}
		c := prev.compiled(o)
		if c == nil {
			c = s.compile(o, spec, td)
		}
		s.byID[c.id] = c
		s.problems = append(s.problems, c.problems...)
		s.authz[o.Namespace] = append(s.authz[o.Namespace], c)
	}
	for _, o := range peerObjs {
		if o.Spec == nil {
			s.unreadablePeer[o.Namespace] = append(s.unreadablePeer[o.Namespace], o.Namespace+"/"+o.Name+"@"+o.Version)
			s.problems = append(s.problems, Problem{Kind: PeerAuthenticationKind, Policy: o.Namespace + "/" + o.Name, Rule: -1,
				Message: "its spec does not convert (see its DistributionRejected Event); proxyless gRPC servers it could select require mTLS (STRICT) until it is fixed"})
			continue
		}
		spec, ok := o.Spec.(*securityv1beta1.PeerAuthentication)
		if !ok {
			continue
		}
		p := peerPolicy{id: o.Namespace + "/" + o.Name, version: o.Version, created: o.CreationTimestamp.UnixNano(), spec: spec}
		s.peer[o.Namespace] = append(s.peer[o.Namespace], p)
		if o.Namespace == rootNamespace && len(spec.GetSelector().GetMatchLabels()) == 0 && (s.mesh == nil || p.older(*s.mesh)) {
			s.mesh = &p
		}
	}
	for _, ps := range s.authz {
		sort.Slice(ps, func(i, j int) bool { return ps[i].id < ps[j].id })
	}
	return s
}

// compile turns one AuthorizationPolicy into the RBAC policies the hub
// enforces it with: ALLOW and DENY as istiod's proxyless generator does;
// CUSTOM (an external authorizer, which proxyless gRPC cannot call) as
// DENY of what its rules match, failing closed as istiod's sidecar builder
// does for a provider it cannot use; AUDIT not at all (it never changes
// access, and proxyless gRPC has no audit logger Istio configures).
func (s *Set) compile(o distribute.Object, spec *securityv1beta1.AuthorizationPolicy, td TrustDomainBundle) *compiledPolicy {
	c := &compiledPolicy{id: o.Namespace + "/" + o.Name, version: o.Version, action: spec.GetAction()}
	sel := spec.GetSelector()
	c.selector = func(w Workload) bool { return w.selects(sel) }
	p := []Policy{{Namespace: o.Namespace, Name: o.Name, Spec: spec}}
	var rbac *rbacpb.RBAC
	var problems []Problem
	switch spec.GetAction() {
	case securityv1beta1.AuthorizationPolicy_ALLOW:
		c.enforce = rbacpb.RBAC_ALLOW
		rbac, problems = BuildRBAC(rbacpb.RBAC_ALLOW, p, td)
	case securityv1beta1.AuthorizationPolicy_DENY:
		c.enforce = rbacpb.RBAC_DENY
		rbac, problems = BuildRBAC(rbacpb.RBAC_DENY, p, td)
	case securityv1beta1.AuthorizationPolicy_CUSTOM:
		c.enforce = rbacpb.RBAC_DENY
		rbac, problems = BuildRBAC(rbacpb.RBAC_DENY, p, td)
		problems = append(problems, Problem{Kind: AuthorizationPolicyKind, Policy: c.id, Rule: -1, Message: fmt.Sprintf(
			"CUSTOM (extension provider %q): proxyless gRPC cannot call an external authorizer; requests its rules match are denied", spec.GetProvider().GetName())})
	case securityv1beta1.AuthorizationPolicy_AUDIT:
		problems = append(problems, Problem{Kind: AuthorizationPolicyKind, Policy: c.id, Rule: -1, Message: "AUDIT: proxyless gRPC servers do not log audits; the policy does not change access"})
	default: // a value newer than the hub's Istio API: what it means cannot be known
		c.action, c.enforce = securityv1beta1.AuthorizationPolicy_DENY, rbacpb.RBAC_DENY
		c.selector = func(Workload) bool { return true }
		rbac = &rbacpb.RBAC{Policies: map[string]*rbacpb.Policy{o.Namespace + "-" + o.Name + "-unreadable": denyAll()}}
		problems = append(problems, Problem{Kind: AuthorizationPolicyKind, Policy: c.id, Rule: -1, Message: fmt.Sprintf(
			"action %v is not known to the hub; every request to %s proxyless gRPC servers is denied until it is one the hub knows", spec.GetAction(), s.scopeOf(o.Namespace))})
	}
	c.rules, c.problems = rbac.GetPolicies(), problems
	return c
}

// compiled is what s compiled of o, if o has not changed since; nil
// otherwise (or when s is nil).
func (s *Set) compiled(o distribute.Object) *compiledPolicy {
	if s == nil {
		return nil
	}
	if c := s.byID[o.Namespace+"/"+o.Name]; c != nil && c.version == o.Version {
		return c
	}
	return nil
}

// unreadable stands for an AuthorizationPolicy whose spec did not convert
// (distribute.Source.Rules gives it with a nil Spec): the hub cannot know
// what it selects or allows, so it denies every request to every server
// it could select (those of its namespace; of the mesh in the root
// namespace), failing closed, until it is fixed.
func (s *Set) unreadable(o distribute.Object) *compiledPolicy {
	c := &compiledPolicy{id: o.Namespace + "/" + o.Name, version: o.Version, action: securityv1beta1.AuthorizationPolicy_DENY,
		selector: func(Workload) bool { return true }, enforce: rbacpb.RBAC_DENY,
		rules: map[string]*rbacpb.Policy{o.Namespace + "-" + o.Name + "-unreadable": denyAll()}}
	s.problems = append(s.problems, Problem{Kind: AuthorizationPolicyKind, Policy: c.id, Rule: -1, Message: fmt.Sprintf(
		"its spec does not convert (see its DistributionRejected Event); every request to %s proxyless gRPC servers is denied until it is fixed", s.scopeOf(o.Namespace))})
	return c
}

// scopeOf names the servers a policy of namespace ns may select.
func (s *Set) scopeOf(ns string) string {
	if ns == s.rootNamespace {
		return "the mesh's"
	}
	return "its namespace's"
}

// denyAll is an RBAC policy that matches every request.
func denyAll() *rbacpb.Policy {
	return &rbacpb.Policy{
		Permissions: []*rbacpb.Permission{{Rule: &rbacpb.Permission_Any{Any: true}}},
		Principals:  []*rbacpb.Principal{{Identifier: &rbacpb.Principal_Any{Any: true}}},
	}
}

// older reports whether p takes precedence over q: the older one, as
// istiod prefers, then the name.
func (p peerPolicy) older(q peerPolicy) bool {
	if p.created != q.created {
		return p.created < q.created
	}
	return p.id < q.id
}

// Problems lists what the Set's policies ask that proxyless gRPC servers
// cannot enforce as Istio means it, and what the hub does instead.
func (s *Set) Problems() []Problem { return s.problems }

// MeshMode is the mesh-wide mode: the oldest PeerAuthentication in the
// root namespace without a selector, unless its mode is UNSET, else the
// default NewSet was given; STRICT while a PeerAuthentication of the root
// namespace cannot be read.
func (s *Set) MeshMode() Mode {
	if len(s.unreadablePeer[s.rootNamespace]) > 0 {
		return Strict // failing closed: the servers are STRICT (Selection.ServerMode), so are their clients
	}
	if s.mesh != nil {
		if m, ok := modeOf(s.mesh.spec.GetMtls()); ok {
			return m
		}
	}
	return s.meshDefault
}

// modeOf is a PeerAuthentication mTLS setting's mode; false when UNSET
// (inherited).
func modeOf(m *securityv1beta1.PeerAuthentication_MutualTLS) (Mode, bool) {
	switch m.GetMode() {
	case securityv1beta1.PeerAuthentication_MutualTLS_STRICT:
		return Strict, true
	case securityv1beta1.PeerAuthentication_MutualTLS_PERMISSIVE:
		return Permissive, true
	case securityv1beta1.PeerAuthentication_MutualTLS_DISABLE:
		return Disable, true
	}
	return "", false
}

// Selection is what applies to one workload: its PeerAuthentications and
// AuthorizationPolicies.
type Selection struct {
	// mesh, namespace and workload are the PeerAuthentications that
	// decide its mode, each the oldest of its level (nil: none).
	mesh, namespace, workload *peerPolicy
	meshDefault               Mode
	autoMTLS                  bool // label security.istio.io/tlsMode=istio
	policies                  []*compiledPolicy
	// unreadable are the PeerAuthentications that could select it but
	// could not be read (they make it STRICT).
	unreadable []string
	// truncated says the workload's labels were more than the hub reads
	// (Workload.Truncated): no selector can be trusted, so every request
	// is denied and mTLS required.
	truncated bool
}

// Select is what applies to w: the PeerAuthentications of the root
// namespace and of w's namespace that select it, and its
// AuthorizationPolicies (those of the root namespace and of w's namespace
// whose selector selects it), as istiod selects them.
func (s *Set) Select(w Workload) Selection {
	sel := Selection{meshDefault: s.meshDefault, mesh: s.mesh, autoMTLS: w.Labels["security.istio.io/tlsMode"] == "istio", truncated: w.Truncated}
	sel.unreadable = append(sel.unreadable, s.unreadablePeer[s.rootNamespace]...)
	if w.Namespace != s.rootNamespace {
		sel.unreadable = append(sel.unreadable, s.unreadablePeer[w.Namespace]...)
	}
	if w.Namespace != s.rootNamespace {
		for i, p := range s.peer[w.Namespace] {
			switch {
			case len(p.spec.GetSelector().GetMatchLabels()) == 0:
				if sel.namespace == nil || p.older(*sel.namespace) {
					sel.namespace = &s.peer[w.Namespace][i]
				}
			case w.selects(p.spec.GetSelector()):
				if sel.workload == nil || p.older(*sel.workload) {
					sel.workload = &s.peer[w.Namespace][i]
				}
			}
		}
	}
	namespaces := []string{s.rootNamespace}
	if w.Namespace != s.rootNamespace {
		namespaces = append(namespaces, w.Namespace)
	}
	for _, ns := range namespaces {
		for _, p := range s.authz[ns] {
			if p.selector(w) {
				sel.policies = append(sel.policies, p)
			}
		}
	}
	return sel
}

// Key identifies what the selection makes of a workload's listeners: two
// workloads with the same key get the same inbound listeners.
func (sel Selection) Key() string {
	var b strings.Builder
	b.WriteString(string(sel.meshDefault))
	for _, p := range []*peerPolicy{sel.mesh, sel.namespace, sel.workload} {
		b.WriteByte(0)
		if p != nil {
			b.WriteString(p.id + "@" + p.version)
		}
	}
	b.WriteByte(0)
	b.WriteString(strconv.FormatBool(sel.autoMTLS))
	b.WriteString(strconv.FormatBool(sel.truncated))
	for _, id := range sel.unreadable {
		b.WriteByte(0)
		b.WriteString(id)
	}
	b.WriteByte(1)
	for _, p := range sel.policies {
		b.WriteByte(0)
		b.WriteString(p.id + "@" + p.version)
	}
	return b.String()
}

// PolicyMode is the mode the PeerAuthentications give port (the port the
// server listens on: Istio's portLevelMtls names target ports), as
// istiod's ComposePeerAuthentication: mesh, then namespace, then workload
// level, UNSET inheriting; a workload policy's portLevelMtls for the port
// last. The default is NewSet's meshDefault.
func (sel Selection) PolicyMode(port uint32) Mode {
	mode := sel.meshDefault
	for _, p := range []*peerPolicy{sel.mesh, sel.namespace, sel.workload} {
		if p == nil {
			continue
		}
		if m, ok := modeOf(p.spec.GetMtls()); ok {
			mode = m
		}
	}
	if sel.workload != nil {
		if pl, ok := sel.workload.spec.GetPortLevelMtls()[port]; ok {
			if m, ok := modeOf(pl); ok {
				mode = m
			}
		}
	}
	return mode
}

// ServerMode is the mode a proxyless gRPC server's inbound listener on
// port is rendered in, as istiod's grpcgen: STRICT requires client
// certificates; PERMISSIVE is served as DISABLE (plaintext), or as STRICT
// when the workload carries security.istio.io/tlsMode=istio.
func (sel Selection) ServerMode(port uint32) Mode {
	switch m := sel.PolicyMode(port); {
	case sel.truncated, len(sel.unreadable) > 0:
		return Strict // failing closed: see Selection.unreadable, truncated
	case m == Strict, m == Permissive && sel.autoMTLS:
		return Strict
	default:
		return Disable
	}
}

// FailsClosed says what the hub enforces on the workload whatever its
// policies say, and why ("" when nothing): with labels it did not all
// read, every request is denied and mTLS required; with a
// PeerAuthentication that could select it unreadable, mTLS is required.
// (An unreadable AuthorizationPolicy is among Policies().Deny.)
func (sel Selection) FailsClosed() string {
	switch {
	case sel.truncated:
		return fmt.Sprintf("every request denied, mTLS required: its node's labels exceed what the hub reads (%d labels, %d bytes, strings only), so the policies that select it cannot be known", MaxLabels, MaxLabelBytes)
	case len(sel.unreadable) > 0:
		return "mTLS required: a PeerAuthentication that could select it cannot be read"
	}
	return ""
}

// PeerAuthentications names the PeerAuthentications that decide the mode
// (mesh, namespace, workload level; those absent left out).
func (sel Selection) PeerAuthentications() []string {
	var out []string
	for _, p := range []*peerPolicy{sel.mesh, sel.namespace, sel.workload} {
		if p != nil {
			out = append(out, p.id)
		}
	}
	return out
}

// Applied lists the AuthorizationPolicies selected, by the action they are
// enforced with.
type Applied struct {
	Allow, Deny, Custom, Audit []string
}

// Policies lists the AuthorizationPolicies that apply, by action.
func (sel Selection) Policies() Applied {
	var a Applied
	for _, p := range sel.policies {
		switch p.action {
		case securityv1beta1.AuthorizationPolicy_ALLOW:
			a.Allow = append(a.Allow, p.id)
		case securityv1beta1.AuthorizationPolicy_DENY:
			a.Deny = append(a.Deny, p.id)
		case securityv1beta1.AuthorizationPolicy_CUSTOM:
			a.Custom = append(a.Custom, p.id)
		case securityv1beta1.AuthorizationPolicy_AUDIT:
			a.Audit = append(a.Audit, p.id)
		}
	}
	return a
}

// RBAC is the RBAC configurations of the selection, in the order Istio
// evaluates them: DENY (with the CUSTOM policies' rules), then ALLOW. Each
// is nil when it has nothing to do: DENY without rules; ALLOW when no ALLOW
// policy applies. An ALLOW policy that applies with no rule the hub could
// build allows nothing, as in Istio (istiod's proxyless generator leaves
// the filter out then, allowing everything).
//
// Rules of different policies whose names collide ("<ns>-<name>-<i>":
// "istio-system/deny" and "istio/system-deny" both make
// "istio-system-deny-0") are both kept, the later under a name of its
// own: a namespace's policy cannot replace a mesh-wide rule.
func (sel Selection) RBAC() (deny, allow *rbacpb.RBAC) {
	if sel.truncated {
		return &rbacpb.RBAC{Action: rbacpb.RBAC_DENY, Policies: map[string]*rbacpb.Policy{"hub-labels-unread": denyAll()}}, nil
	}
	for _, p := range sel.policies {
		switch {
		case p.enforce == rbacpb.RBAC_DENY && len(p.rules) > 0:
			if deny == nil {
				deny = &rbacpb.RBAC{Action: rbacpb.RBAC_DENY, Policies: map[string]*rbacpb.Policy{}}
			}
			merge(deny.Policies, p)
		case p.enforce == rbacpb.RBAC_ALLOW && p.action == securityv1beta1.AuthorizationPolicy_ALLOW:
			if allow == nil {
				allow = &rbacpb.RBAC{Action: rbacpb.RBAC_ALLOW, Policies: map[string]*rbacpb.Policy{}}
			}
			merge(allow.Policies, p)
		}
	}
	return deny, allow
}

// merge adds p's rules to into, a rule whose name another policy's rule
// has taken under "<name>~<namespace>/<policy>".
func merge(into map[string]*rbacpb.Policy, p *compiledPolicy) {
	for _, name := range slices.Sorted(maps.Keys(p.rules)) {
		key := name
		if _, taken := into[key]; taken {
			key = name + "~" + p.id
		}
		into[key] = p.rules[name]
	}
}
