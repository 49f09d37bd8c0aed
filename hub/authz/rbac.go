package authz

// AuthorizationPolicy → Envoy RBAC, as istiod's proxyless gRPC generator
// (pilot/pkg/networking/grpcgen/lds.go, buildRBAC) makes it with
// pilot/pkg/security/authz/model (New, then Generate(forTCP=false,
// useAuthenticated=true, action)), ported from istio.io/istio without
// importing it. Only the HTTP side is ported; every attribute Istio knows is.
//
// Where istiod would emit something grpc-go's RBAC refuses (which would
// make grpc-go NACK the whole Listener and the server stop serving), the
// hub does not: see ruleContext.check and ruleContext.enforceable.

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	matcherpb "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	securityv1beta1 "istio.io/api/security/v1beta1"
)

// Policy is one AuthorizationPolicy as the hub read it.
type Policy struct {
	Namespace, Name string
	Spec            *securityv1beta1.AuthorizationPolicy
}

// Problem is something in a policy a proxyless gRPC server cannot enforce
// as Istio means it, and what the hub did instead.
type Problem struct {
	// Kind is the policy's kind (AuthorizationPolicyKind or
	// PeerAuthenticationKind).
	Kind    string
	Policy  string // "<namespace>/<name>"
	Rule    int    // index in spec.rules, -1 for the whole policy
	Message string // one sentence, e.g. `path "/a/{*}": path templates are not supported by gRPC's RBAC; the rule is not applied (ALLOW)`
}

// TrustDomainBundle is the local trust domain and its aliases (Istio's
// trustdomain.Bundle): TrustDomains[0] is the local one. The zero value
// maps nothing, as istiod's proxyless generator does.
type TrustDomainBundle struct{ TrustDomains []string }

// BuildRBAC is istiod grpcgen's buildRBAC for one action (ALLOW or DENY;
// any other action is built as Istio builds every non-ALLOW one, like
// DENY): one rbacpb.Policy per rule, named "<ns>-<name>-<index>" (a later
// rule of the same name replaces an earlier one, as in istiod), with
// principals' trust domains mapped as Istio's sidecar builder maps them
// with trustdomain.Bundle td ("cluster.local" stands for the local trust
// domain) when td has trust domains, and not at all (as grpcgen) when it
// has none. The caller passes the policies to enforce with action; their
// spec.action and selector are not looked at.
//
// It returns nil when no rule yields a policy (a policy without rules
// yields none; nor does a rule skipped or not applied), and the problems
// found, in policy and rule order. A rule is skipped when it is invalid
// (e.g. an unknown `when` key), as in istiod. A value Istio cannot turn
// into a matcher (e.g. a malformed IP) is treated as Istio treats it: for
// ALLOW, the rule is not applied (istiod emits an empty policy for it,
// which never matches; the hub leaves it out); for DENY, the value is
// ignored. Where grpc-go refuses what Istio would emit (a path template,
// a header matcher on ":scheme" or a "grpc-" header), an ALLOW rule is
// not applied and a DENY rule matches as if the condition were absent
// (denying more, never less); so does a rule whose policy would still be
// invalid (see ruleContext.enforceable). What grpc-go accepts but cannot
// evaluate as Envoy would (JWT and other metadata matchers,
// connection.sni, remote.ip) is kept as istiod emits it and reported.
// An ALLOW policy none of whose rules yields a policy allows nothing:
// enforcing that (with an ALLOW RBAC without policies) is the caller's.
func BuildRBAC(action rbacpb.RBAC_Action, policies []Policy, td TrustDomainBundle) (*rbacpb.RBAC, []Problem) {
	out := &rbacpb.RBAC{Action: action, Policies: map[string]*rbacpb.Policy{}}
	var problems []Problem
	for _, p := range policies {
		id := p.Namespace + "/" + p.Name
		for i, r := range p.Spec.GetRules() {
			name := fmt.Sprintf("%s-%s-%d", p.Namespace, p.Name, i)
			policy, messages := buildRule(action, p.Namespace, r, td)
			if _, dup := out.Policies[name]; dup && policy != nil {
				messages = append(messages, fmt.Sprintf("RBAC policy name %q is also an earlier rule's; this rule replaces it, as in istiod", name))
			}
			for _, m := range messages {
				problems = append(problems, Problem{Kind: AuthorizationPolicyKind, Policy: id, Rule: i, Message: m})
			}
			if policy != nil {
				out.Policies[name] = policy
			}
		}
	}
	if len(out.Policies) == 0 {
		return nil, problems
	}
	return out, problems
}

// buildRule is one rule of a policy in namespace as an RBAC policy (nil
// when it yields none), and the problems found in it.
func buildRule(action rbacpb.RBAC_Action, namespace string, r *securityv1beta1.Rule, td TrustDomainBundle) (*rbacpb.Policy, []string) {
	if r == nil {
		return nil, []string{"the rule is null; it is skipped, as istiod's sidecar builder does"}
	}
	m, err := newModel(namespace, r)
	if err != nil {
		return nil, []string{fmt.Sprintf("invalid rule: %v; it is skipped, as in istiod", err)}
	}
	if len(td.TrustDomains) > 0 {
		m.migrateTrustDomain(td)
	}
	c := &ruleContext{action: action}
	policy, err := m.generate(c)
	if err != nil {
		how := ", as in istiod"
		if u := (*unsupportedError)(nil); errors.As(err, &u) {
			how = ""
		}
		return nil, []string{fmt.Sprintf("%v; the rule is not applied%s (%s)", err, how, action)}
	}
	return c.enforceable(policy), c.problems
}

// ruleContext is what generating one rule needs besides the model: the
// action (it decides what an error does) and the problems found.
type ruleContext struct {
	action   rbacpb.RBAC_Action
	problems []string
}

// unsupportedError is a value Istio turns into a matcher grpc-go refuses.
type unsupportedError struct{ reason string }

func (e *unsupportedError) Error() string { return e.reason }

// errWiden tells attrRule.generate that a (non-ALLOW) rule key had a value
// grpc-go refuses: the key must match anything.
var errWiden = errors.New("the condition matches anything")

// report records a problem once.
func (c *ruleContext) report(format string, args ...any) {
	if m := fmt.Sprintf(format, args...); !slices.Contains(c.problems, m) {
		c.problems = append(c.problems, m)
	}
}

// check is Istio's rule.checkError for err, the error generating
// values of key (negated: its notValues), with the hub's change. For
// ALLOW, an error is returned (with context): the rule is not applied, a
// smaller allow. Otherwise the value is ignored, as in Istio: a malformed
// value would match nothing, so leaving it out of an OR changes nothing,
// and a key left without values no longer restricts the rule (a wider
// deny). The change: a value grpc-go refuses (unsupportedError) is
// well-formed and would match requests, so ignoring only it could make
// the deny narrower (fail open: "deny paths /a and /b/{*}" would deny
// only /a); errWiden makes the whole key match anything instead, a wider
// deny.
func (c *ruleContext) check(key string, values []string, negated bool, err error) error {
	if err == nil {
		return nil
	}
	what := describeValues(key, values, negated)
	if c.action == rbacpb.RBAC_ALLOW {
		return fmt.Errorf("%s: %w", what, err)
	}
	if u := (*unsupportedError)(nil); errors.As(err, &u) {
		c.report("%s: %v; the rule matches any %s instead (%s)", what, err, displayName(key), c.action)
		return errWiden
	}
	c.report("%s: %v; the value is ignored, as in istiod (%s)", what, err, c.action)
	return nil
}

// enforceable is p, unless it fails its own validation (Envoy's
// protoc-gen-validate rules, which istiod does not check) or grpc-go
// would refuse it anyway (grpcRefusal), which the generators prevent for
// valid policies: then, for ALLOW, nil (the rule is not applied); for
// DENY, a policy matching every request (the rule denies more, never
// less).
func (c *ruleContext) enforceable(p *rbacpb.Policy) *rbacpb.Policy {
	err := p.ValidateAll()
	if err == nil {
		err = grpcRefusal(p)
	}
	if err == nil {
		return p
	}
	if c.action == rbacpb.RBAC_ALLOW {
		c.report("the rule's RBAC policy would be invalid: %v; the rule is not applied (%s)", err, c.action)
		return nil
	}
	c.report("the rule's RBAC policy would be invalid: %v; the rule matches every request instead (%s)", err, c.action)
	return &rbacpb.Policy{Permissions: []*rbacpb.Permission{permissionAny()}, Principals: []*rbacpb.Principal{principalAny()}}
}

// caveat reports, once per rule, an attribute gRPC accepts but does not
// evaluate as Envoy does.
func (c *ruleContext) caveat(key string) {
	var why string
	switch {
	case key == attrRequestPrincipal, key == attrRequestAudiences, key == attrRequestPresenter, strings.HasPrefix(key, attrRequestClaims):
		why = "proxyless gRPC servers do not authenticate JWTs and gRPC's RBAC never matches metadata (a negated one always matches)"
	case strings.HasPrefix(key, attrEnvoyFilter):
		why = "gRPC's RBAC never matches filter metadata (a negated one always matches)"
	case key == attrConnSNI:
		why = "gRPC's RBAC matches it against an empty server name"
	case key == attrRemoteIP:
		why = "gRPC's RBAC matches it against the direct peer address (no X-Forwarded-For or PROXY protocol)"
	default:
		return
	}
	c.report("%s: %s; kept as istiod emits it (%s)", key, why, c.action)
}

// describeValues names values of key for a problem, e.g. `path "/a"` or
// `not request.headers[x] ["a" "b"]`.
func describeValues(key string, values []string, negated bool) string {
	name := displayName(key)
	if negated {
		name = "not " + name
	}
	if len(values) == 1 {
		return fmt.Sprintf("%s %q", name, values[0])
	}
	return fmt.Sprintf("%s %q", name, values)
}

// displayName is the attribute a model key stands for.
func displayName(key string) string {
	switch key {
	case pathKey:
		return "path"
	case methodHeader:
		return "method"
	case hostHeader:
		return "host"
	}
	return key
}

// The attributes (Istio's model package).
const (
	attrRequestHeader     = "request.headers"             // header name is surrounded by brackets, e.g. "request.headers[User-Agent]".
	attrSrcIP             = "source.ip"                   // supports both single ip and cidr, e.g. "10.1.2.3" or "10.1.0.0/16".
	attrRemoteIP          = "remote.ip"                   // original client ip determined from x-forwarded-for or proxy protocol.
	attrSrcNamespace      = "source.namespace"            // e.g. "default".
	attrSrcServiceAccount = "source.serviceAccount"       // e.g. "default/productpage".
	attrSrcTrustDomain    = "source.trustDomain"          // trust domain portion of the source SPIFFE identity.
	attrSrcPrincipal      = "source.principal"            // source identity, e,g, "cluster.local/ns/default/sa/productpage".
	attrRequestPrincipal  = "request.auth.principal"      // authenticated principal of the request.
	attrRequestAudiences  = "request.auth.audiences"      // intended audience(s) for this authentication information.
	attrRequestPresenter  = "request.auth.presenter"      // authorized presenter of the credential.
	attrRequestClaims     = "request.auth.claims"         // claim name is surrounded by brackets, e.g. "request.auth.claims[iss]".
	attrDestIP            = "destination.ip"              // supports both single ip and cidr, e.g. "10.1.2.3" or "10.1.0.0/16".
	attrDestPort          = "destination.port"            // must be in the range [0, 65535].
	attrConnSNI           = "connection.sni"              // server name indication, e.g. "www.example.com".
	attrEnvoyFilter       = "experimental.envoy.filters." // an experimental attribute for checking Envoy Metadata directly.

	// Keys of the operation fields (Istio's internal names).
	methodHeader = ":method"
	pathKey      = "path-matcher"
	hostHeader   = ":authority"

	// clusterLocal stands for the local trust domain in principals
	// (Istio's constants.DefaultClusterLocalDomain).
	clusterLocal = "cluster.local"
)

// rbacNode is what an attribute generates: a permission or a principal.
type rbacNode interface {
	*rbacpb.Permission | *rbacpb.Principal
}

// nodeOps are the combinators of a node type.
type nodeOps[T rbacNode] struct {
	any func() T
	and func([]T) T
	or  func([]T) T
	not func(T) T
}

var (
	permissionOps = nodeOps[*rbacpb.Permission]{any: permissionAny, and: permissionAnd, or: permissionOr, not: permissionNot}
	principalOps  = nodeOps[*rbacpb.Principal]{any: principalAny, and: principalAnd, or: principalOr, not: principalNot}
)

// attrRule is one attribute of a rule and its values (Istio's model.rule):
// gen makes a node per value (OR-ed), or, for Istio's extended
// generators, all makes one node of all values.
type attrRule[T rbacNode] struct {
	key               string
	values, notValues []string
	gen               func(key, value string) (T, error)
	all               func(key string, values []string) (T, error)
}

func perValue[T rbacNode](key string, values, notValues []string, gen func(key, value string) (T, error)) *attrRule[T] {
	return &attrRule[T]{key: key, values: values, notValues: notValues, gen: gen}
}

func allValues[T rbacNode](key string, values, notValues []string, all func(key string, values []string) (T, error)) *attrRule[T] {
	return &attrRule[T]{key: key, values: values, notValues: notValues, all: all}
}

// attrList is the attributes that make one permission or principal (AND).
// Its rules are shared between the copies Istio makes of it.
type attrList[T rbacNode] struct{ rules []*attrRule[T] }

func (l *attrList[T]) copy() attrList[T] { return attrList[T]{rules: slices.Clone(l.rules)} }

func (l *attrList[T]) appendLast(r *attrRule[T]) {
	if len(r.values) > 0 || len(r.notValues) > 0 {
		l.rules = append(l.rules, r)
	}
}

func (l *attrList[T]) insertFront(r *attrRule[T]) {
	if len(r.values) > 0 || len(r.notValues) > 0 {
		l.rules = append([]*attrRule[T]{r}, l.rules...)
	}
}

// ruleModel is one rule of a policy (Istio's model.Model): its conditions as
// permissions (any of which) and principals (any of which).
type ruleModel struct {
	permissions []attrList[*rbacpb.Permission]
	principals  []attrList[*rbacpb.Principal]
}

// newModel is Istio's model.New for a rule of a policy in namespace.
func newModel(namespace string, r *securityv1beta1.Rule) (*ruleModel, error) {
	var basePermission attrList[*rbacpb.Permission]
	var basePrincipal attrList[*rbacpb.Principal]
	for _, when := range r.GetWhen() {
		if err := addCondition(&basePermission, &basePrincipal, namespace, when); err != nil {
			return nil, err
		}
	}
	m := &ruleModel{}
	for _, from := range r.GetFrom() {
		m.principals = append(m.principals, sourcePrincipal(basePrincipal.copy(), namespace, from.GetSource()))
	}
	if len(r.GetFrom()) == 0 {
		m.principals = append(m.principals, basePrincipal)
	}
	for _, to := range r.GetTo() {
		m.permissions = append(m.permissions, operationPermission(basePermission.copy(), to.GetOperation()))
	}
	if len(r.GetTo()) == 0 {
		m.permissions = append(m.permissions, basePermission)
	}
	return m, nil
}

// addCondition adds a `when` condition to the permission or principal
// side, as Istio's model.New does.
func addCondition(perm *attrList[*rbacpb.Permission], princ *attrList[*rbacpb.Principal], namespace string, when *securityv1beta1.Condition) error {
	k, vs, nvs := when.GetKey(), when.GetValues(), when.GetNotValues()
	switch {
	case k == attrDestIP:
		perm.appendLast(perValue(k, vs, nvs, destIPGen))
	case k == attrDestPort:
		perm.appendLast(perValue(k, vs, nvs, destPortGen))
	case k == attrConnSNI:
		perm.appendLast(perValue(k, vs, nvs, connSNIGen))
	case strings.HasPrefix(k, attrEnvoyFilter):
		perm.appendLast(allValues(k, vs, nvs, envoyFilterGen))
	case k == attrSrcIP:
		princ.appendLast(perValue(k, vs, nvs, srcIPGen))
	case k == attrRemoteIP:
		princ.appendLast(perValue(k, vs, nvs, remoteIPGen))
	case k == attrSrcNamespace:
		princ.appendLast(perValue(k, vs, nvs, srcNamespaceGen))
	case k == attrSrcTrustDomain:
		princ.appendLast(perValue(k, vs, nvs, srcTrustDomainGen))
	case k == attrSrcServiceAccount:
		princ.appendLast(perValue(k, vs, nvs, srcServiceAccountGen(namespace)))
	case k == attrSrcPrincipal:
		princ.appendLast(perValue(k, vs, nvs, srcPrincipalGen))
	case k == attrRequestPrincipal:
		princ.appendLast(allValues(k, vs, nvs, requestPrincipalsGen))
	case k == attrRequestAudiences:
		princ.appendLast(allValues(k, vs, nvs, requestAudiencesGen))
	case k == attrRequestPresenter:
		princ.appendLast(allValues(k, vs, nvs, requestPresenterGen))
	case strings.HasPrefix(k, attrRequestHeader):
		princ.appendLast(perValue(k, vs, nvs, requestHeaderGen))
	case strings.HasPrefix(k, attrRequestClaims):
		princ.appendLast(allValues(k, vs, nvs, requestClaimGen))
	default:
		return fmt.Errorf("unknown attribute %s", k)
	}
	return nil
}

// sourcePrincipal puts a `from` source's fields in front of the `when`
// conditions of merged, in Istio's order.
func sourcePrincipal(merged attrList[*rbacpb.Principal], namespace string, s *securityv1beta1.Source) attrList[*rbacpb.Principal] {
	if s == nil {
		return merged
	}
	merged.insertFront(perValue(attrSrcIP, s.GetIpBlocks(), s.GetNotIpBlocks(), srcIPGen))
	merged.insertFront(perValue(attrRemoteIP, s.GetRemoteIpBlocks(), s.GetNotRemoteIpBlocks(), remoteIPGen))
	merged.insertFront(perValue(attrSrcNamespace, s.GetNamespaces(), s.GetNotNamespaces(), srcNamespaceGen))
	merged.insertFront(perValue(attrSrcTrustDomain, s.GetTrustDomains(), s.GetNotTrustDomains(), srcTrustDomainGen))
	merged.insertFront(perValue(attrSrcServiceAccount, s.GetServiceAccounts(), s.GetNotServiceAccounts(), srcServiceAccountGen(namespace)))
	merged.insertFront(allValues(attrRequestPrincipal, s.GetRequestPrincipals(), s.GetNotRequestPrincipals(), requestPrincipalsGen))
	merged.insertFront(perValue(attrSrcPrincipal, s.GetPrincipals(), s.GetNotPrincipals(), srcPrincipalGen))
	return merged
}

// operationPermission puts a `to` operation's fields in front of the
// `when` conditions of merged, in Istio's order.
func operationPermission(merged attrList[*rbacpb.Permission], o *securityv1beta1.Operation) attrList[*rbacpb.Permission] {
	if o == nil {
		return merged
	}
	merged.insertFront(perValue(attrDestPort, o.GetPorts(), o.GetNotPorts(), destPortGen))
	merged.insertFront(perValue(pathKey, o.GetPaths(), o.GetNotPaths(), pathGen))
	merged.insertFront(perValue(methodHeader, o.GetMethods(), o.GetNotMethods(), methodGen))
	merged.insertFront(perValue(hostHeader, o.GetHosts(), o.GetNotHosts(), hostGen))
	return merged
}

// generate is Istio's Model.Generate(forTCP=false, useAuthenticated=true,
// action), with c.check's changes to errors.
func (m *ruleModel) generate(c *ruleContext) (*rbacpb.Policy, error) {
	permissions, err := generateLists(m.permissions, permissionOps, c)
	if err != nil {
		return nil, err
	}
	if len(permissions) == 0 {
		return nil, errors.New("must have at least 1 permission")
	}
	principals, err := generateLists(m.principals, principalOps, c)
	if err != nil {
		return nil, err
	}
	if len(principals) == 0 {
		return nil, errors.New("must have at least 1 principal")
	}
	return &rbacpb.Policy{Permissions: permissions, Principals: principals}, nil
}

func generateLists[T rbacNode](lists []attrList[T], o nodeOps[T], c *ruleContext) ([]T, error) {
	var out []T
	for _, l := range lists {
		n, err := l.generate(o, c)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// generate is the AND of the list's rules (any when none): Istio's
// generatePermission and generatePrincipal.
func (l attrList[T]) generate(o nodeOps[T], c *ruleContext) (T, error) {
	var and []T
	for _, r := range l.rules {
		ns, err := r.generate(o, c)
		if err != nil {
			var zero T
			return zero, err
		}
		and = append(and, ns...)
	}
	if len(and) == 0 {
		and = append(and, o.any())
	}
	return o.and(and), nil
}

// generate is Istio's rule.permission / rule.principal: a node matching
// one of the values, then one matching none of the notValues, each when
// there are some. When a value grpc-go refuses widens the rule (errWiden,
// see check), the key is any instead.
func (r *attrRule[T]) generate(o nodeOps[T], c *ruleContext) ([]T, error) {
	var out []T
	pos, err := r.generateValues(o, c, r.values, false)
	if err == nil {
		var neg T
		neg, err = r.generateValues(o, c, r.notValues, true)
		out = appendNonNil(out, pos)
		if neg != nil {
			out = append(out, o.not(neg))
		}
	}
	switch {
	case errors.Is(err, errWiden):
		return []T{o.any()}, nil
	case err != nil:
		return nil, err
	}
	c.caveat(r.key)
	return out, nil
}

func appendNonNil[T rbacNode](out []T, n T) []T {
	if n != nil {
		out = append(out, n)
	}
	return out
}

// generateValues is the node matching one of values (negated: they are
// notValues), or nil.
func (r *attrRule[T]) generateValues(o nodeOps[T], c *ruleContext, values []string, negated bool) (T, error) {
	var zero T
	if len(values) == 0 {
		return zero, nil
	}
	if r.all != nil {
		n, err := r.all(r.key, values)
		if err := c.check(r.key, values, negated, err); err != nil {
			return zero, err
		}
		return n, nil
	}
	var or []T
	for _, v := range values {
		n, err := r.gen(r.key, v)
		if err := c.check(r.key, []string{v}, negated, err); err != nil {
			return zero, err
		}
		or = appendNonNil(or, n)
	}
	if len(or) == 0 {
		return zero, nil
	}
	return o.or(or), nil
}

// The generators (Istio's, HTTP only, useAuthenticated). Each makes the
// node for one value (or, for the "all" ones, all values) of an attribute.

func destIPGen(_, value string) (*rbacpb.Permission, error) {
	cidr, err := addrStrToCidrRange(value)
	if err != nil {
		return nil, err
	}
	return permissionDestinationIP(cidr), nil
}

func destPortGen(_, value string) (*rbacpb.Permission, error) {
	port, err := convertToPort(value)
	if err != nil {
		return nil, err
	}
	return permissionDestinationPort(port), nil
}

func connSNIGen(_, value string) (*rbacpb.Permission, error) {
	return permissionRequestedServerName(stringMatcher(value)), nil
}

// envoyFilterGen matches "experimental.envoy.filters.a.b[c]": key c of
// filter envoy.filters.a.b's metadata is one of values ("[v]": a list
// with an item v).
func envoyFilterGen(key string, values []string) (*rbacpb.Permission, error) {
	// "experimental.envoy.filters.a.b[c]" → "envoy.filters.a.b", "c".
	parts := strings.SplitN(strings.TrimSuffix(strings.TrimPrefix(key, "experimental."), "]"), "[", 2)
	if len(parts) != 2 {
		return nil, fmt.Errorf("invalid key: %v", key)
	}
	matchers := []*matcherpb.ValueMatcher{}
	for _, value := range values {
		m := stringValueMatcher(value)
		if strings.HasPrefix(value, "[") && strings.HasSuffix(value, "]") {
			m = &matcherpb.ValueMatcher{MatchPattern: &matcherpb.ValueMatcher_ListMatch{ListMatch: &matcherpb.ListMatcher{
				MatchPattern: &matcherpb.ListMatcher_OneOf{OneOf: stringValueMatcher(strings.Trim(value, "[]"))},
			}}}
		}
		matchers = append(matchers, m)
	}
	return permissionMetadata(metadataValueMatcher(parts[0], parts[1], orMatcher(matchers))), nil
}

func srcIPGen(_, value string) (*rbacpb.Principal, error) {
	cidr, err := addrStrToCidrRange(value)
	if err != nil {
		return nil, err
	}
	return principalDirectRemoteIP(cidr), nil
}

func remoteIPGen(_, value string) (*rbacpb.Principal, error) {
	cidr, err := addrStrToCidrRange(value)
	if err != nil {
		return nil, err
	}
	return principalRemoteIP(cidr), nil
}

// srcNamespaceGen matches the peer's SPIFFE identity's namespace ("*" any
// characters).
func srcNamespaceGen(_, value string) (*rbacpb.Principal, error) {
	literalParts := strings.Split(value, "*")
	for i, lp := range literalParts {
		literalParts[i] = regexp.QuoteMeta(lp)
	}
	regexNamespace := strings.Join(literalParts, ".*")
	return principalAuthenticated(stringMatcherRegex(fmt.Sprintf(".*/ns/%s/.*", regexNamespace))), nil
}

// srcServiceAccountGen matches the peer's ServiceAccount, "<ns>/<name>" or
// "<name>" (of the policy's namespace).
func srcServiceAccountGen(namespace string) func(_, value string) (*rbacpb.Principal, error) {
	return func(_, value string) (*rbacpb.Principal, error) {
		return principalAuthenticated(stringMatcherRegex(serviceAccountRegex(namespace, value))), nil
	}
}

// serviceAccountRegex is Istio's: "spiffe://" then a trust domain and
// arbitrary k/v pairs, "/ns/<namespace>/", optional k/v pairs,
// "/sa/<serviceAccount>", then the end or "/" and more pairs.
func serviceAccountRegex(defaultNamespace, value string) string {
	ns, sa, ok := strings.Cut(value, "/")
	if !ok {
		ns, sa = defaultNamespace, value
	}
	return fmt.Sprintf("spiffe://.+/ns/%s/(.+/|)sa/%s(/.+)?", regexp.QuoteMeta(ns), regexp.QuoteMeta(sa))
}

// srcTrustDomainGen matches the peer's SPIFFE trust domain ("*" any; one "*"
// within it, any characters but "/").
func srcTrustDomainGen(_, value string) (*rbacpb.Principal, error) {
	var m *matcherpb.StringMatcher
	switch {
	case value == "*":
		m = stringMatcherPrefix(spiffeURIPrefix, false)
	case !strings.Contains(value, "*"):
		m = stringMatcherPrefix(spiffeURIPrefix+value+"/", false)
	default:
		parts := strings.SplitN(value, "*", 2)
		escaped := regexp.QuoteMeta(parts[0]) + "[^/]*" + regexp.QuoteMeta(parts[1])
		m = stringMatcherRegex(fmt.Sprintf("spiffe://%s/.*", escaped))
	}
	return principalAuthenticated(m), nil
}

func srcPrincipalGen(_, value string) (*rbacpb.Principal, error) {
	return principalAuthenticated(stringMatcherWithPrefix(value, spiffeURIPrefix)), nil
}

// requestPrincipalsGen matches the JWT's "<iss>/<sub>" (one of values).
func requestPrincipalsGen(_ string, values []string) (*rbacpb.Principal, error) {
	var or []*rbacpb.Principal
	for _, value := range values {
		iss, sub := requestPrincipalMatchers(value)
		or = append(or, principalAnd([]*rbacpb.Principal{
			principalMetadata(metadataStringMatcherForJWTClaim("iss", iss)),
			principalMetadata(metadataStringMatcherForJWTClaim("sub", sub)),
		}))
	}
	switch {
	case len(or) == 1:
		return or[0], nil
	case len(or) > 0:
		return principalOr(or), nil
	}
	return nil, nil
}

// requestPrincipalMatchers are the matchers of a request principal's
// issuer and subject, split at the last "/" (an issuer may be a URL).
func requestPrincipalMatchers(value string) (iss, sub *matcherpb.StringMatcher) {
	idx := strings.LastIndex(value, "/")
	found := idx >= 0
	issuer, subject := value, ""
	if found {
		issuer, subject = value[:idx], value[idx+1:]
	}
	switch {
	case value == "*":
		return matchAny(), matchAny()
	case strings.HasPrefix(value, "*") && found:
		if issuer == "*" {
			return matchAny(), stringMatcherExact(subject, false)
		}
		return stringMatcherSuffix(strings.TrimPrefix(issuer, "*"), false), stringMatcherExact(subject, false)
	case strings.HasPrefix(value, "*"):
		return matchAny(), stringMatcherSuffix(strings.TrimPrefix(value, "*"), false)
	case strings.HasSuffix(value, "*") && found:
		if subject == "*" {
			return stringMatcherExact(issuer, false), matchAny()
		}
		return stringMatcherExact(issuer, false), stringMatcherPrefix(strings.TrimSuffix(subject, "*"), false)
	case strings.HasSuffix(value, "*"):
		return stringMatcherPrefix(strings.TrimSuffix(value, "*"), false), matchAny()
	default:
		return stringMatcherExact(issuer, false), stringMatcherExact(subject, false)
	}
}

// matchAny is Istio's matchAny (a fresh copy each time: Istio shares one).
func matchAny() *matcherpb.StringMatcher { return stringMatcherRegex(".+") }

func requestAudiencesGen(_ string, values []string) (*rbacpb.Principal, error) {
	return principalMetadata(metadataListValueMatcherForJWTClaims([]string{"aud"}, stringOrMatcher(values))), nil
}

func requestPresenterGen(_ string, values []string) (*rbacpb.Principal, error) {
	return principalMetadata(metadataListValueMatcherForJWTClaims([]string{"azp"}, stringOrMatcher(values))), nil
}

// requestHeaderGen matches "request.headers[<name>]". grpc-go refuses a
// matcher on some headers: those are unsupportedError.
func requestHeaderGen(key, value string) (*rbacpb.Principal, error) {
	header, err := extractNameInBrackets(strings.TrimPrefix(key, attrRequestHeader))
	if err != nil {
		return nil, err
	}
	if err := grpcHeaderNameRefusal(header); err != nil {
		return nil, &unsupportedError{reason: err.Error()}
	}
	return principalHeader(headerMatcher(header, value)), nil
}

// requestClaimGen matches "request.auth.claims[<claim>]..." (nested claims).
func requestClaimGen(key string, values []string) (*rbacpb.Principal, error) {
	claims, err := extractNameInNestedBrackets(strings.TrimPrefix(key, attrRequestClaims))
	if err != nil {
		return nil, err
	}
	return principalMetadata(metadataListValueMatcherForJWTClaims(claims, stringOrMatcher(values))), nil
}

func hostGen(_, value string) (*rbacpb.Permission, error) {
	return permissionHeader(hostMatcher(hostHeader, value)), nil
}

// pathGen matches the request path. Istio matches a path template ("{*}",
// "{**}") with a uri_template permission, which grpc-go refuses: that is
// an unsupportedError.
func pathGen(_, value string) (*rbacpb.Permission, error) {
	if containsPathTemplate(value) {
		return nil, &unsupportedError{reason: "path templates are not supported by gRPC's RBAC"}
	}
	return permissionPath(pathMatcher(value)), nil
}

func methodGen(_, value string) (*rbacpb.Permission, error) {
	return permissionHeader(headerMatcher(methodHeader, value)), nil
}

// migrateTrustDomain is Istio's Model.MigrateTrustDomain: source
// principals get td's aliases, source trust domains its other names.
// Like Istio's, it works on rules shared between principals (a `when`
// condition is in each), so those are mapped once per principal.
func (m *ruleModel) migrateTrustDomain(td TrustDomainBundle) {
	for _, l := range m.principals {
		for _, r := range l.rules {
			switch r.key {
			case attrSrcPrincipal:
				r.values = mapNonEmpty(r.values, td.replaceTrustDomainAliases)
				r.notValues = mapNonEmpty(r.notValues, td.replaceTrustDomainAliases)
			case attrSrcTrustDomain:
				r.values = mapNonEmpty(r.values, td.expandTrustDomainAliases)
				r.notValues = mapNonEmpty(r.notValues, td.expandTrustDomainAliases)
			}
		}
	}
}

func mapNonEmpty(values []string, f func([]string) []string) []string {
	if len(values) == 0 {
		return values
	}
	return f(values)
}

// replaceTrustDomainAliases is Istio's Bundle.ReplaceTrustDomainAliases:
// a principal "<td>/ns/<ns>/sa/<sa>" whose trust domain is one of t's (or
// "cluster.local") becomes one principal per trust domain of t; others
// stay as they are.
func (t TrustDomainBundle) replaceTrustDomainAliases(principals []string) []string {
	out := []string{}
	for _, principal := range principals {
		td, ok := trustDomainOf(principal)
		if !ok || td == "*" || (!matchesAny(td, t.TrustDomains) && td != clusterLocal) {
			out = append(out, principal)
			continue
		}
		out = append(out, t.replaceTrustDomains(principal, td)...)
	}
	return out
}

// replaceTrustDomains is principal (of trust domain td) in each of t's
// trust domains, kept as it is for one its (wildcard) td matches.
func (t TrustDomainBundle) replaceTrustDomains(principal, td string) []string {
	out := []string{}
	for _, newTD := range t.TrustDomains {
		p := principal
		if !suffixMatch(newTD, td) {
			p = newTD + principal[len(td):]
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// expandTrustDomainAliases is Istio's Bundle.ExpandTrustDomainAliases: a
// trust domain of t becomes all of t's; duplicates go.
func (t TrustDomainBundle) expandTrustDomainAliases(values []string) []string {
	var all []string
	for _, v := range values {
		if slices.Contains(t.TrustDomains, v) {
			all = append(all, t.TrustDomains...)
		} else {
			all = append(all, v)
		}
	}
	out := make([]string, 0, len(all))
	for _, v := range all {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// trustDomainOf is the trust domain of "<td>/ns/<ns>/sa/<sa>"; false
// when principal has not 5 "/"-separated parts.
func trustDomainOf(principal string) (string, bool) {
	parts := strings.Split(principal, "/")
	if len(parts) != 5 {
		return "", false
	}
	return parts[0], true
}

// matchesAny is Istio's trustdomain.stringMatch: a equals, or matches
// with a leading or trailing "*" of its own or of, one of list.
func matchesAny(a string, list []string) bool {
	for _, s := range list {
		if a == s || s == "*" || prefixMatch(a, s) || prefixMatch(s, a) || suffixMatch(a, s) || suffixMatch(s, a) {
			return true
		}
	}
	return false
}

// prefixMatch reports whether pattern ends with "*" and a starts with the rest.
func prefixMatch(a, pattern string) bool {
	rest, ok := strings.CutSuffix(pattern, "*")
	return ok && strings.HasPrefix(a, rest)
}

// suffixMatch reports whether pattern starts with "*" and a ends with the rest.
func suffixMatch(a, pattern string) bool {
	rest, ok := strings.CutPrefix(pattern, "*")
	return ok && strings.HasSuffix(a, rest)
}
