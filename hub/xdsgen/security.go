package xdsgen

import (
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub/authz"
)

// inboundKey names a memoised inbound listener: its name and the key of
// the policies that select its server (authz.Selection.Key).
type inboundKey struct {
	name, policies string
}

// AwaitSecurity says the Generator's policies are to come (SetSecurity):
// until they do, no inbound listener is built (a server without its
// policies would serve unprotected): it is Kept, and the hub withholds a
// whole-state LDS response that would lack it, so that a server keeps
// what it had (e.g. across a hub restart). Call it before the Generator
// serves anything.
func (g *Generator) AwaitSecurity() {
	g.mu.Lock()
	g.securityPending = true
	g.mu.Unlock()
}

// SecurityChange is what replacing the policies (SetSecurity) changed.
type SecurityChange struct {
	// MeshMode says the mesh-wide mTLS mode changed: every proxyless
	// client's Clusters may have (the caller invalidates every hostname).
	MeshMode bool
	// Problems are what the new policies ask that proxyless gRPC servers
	// cannot enforce as Istio means it (see authz.Set.Problems).
	Problems []authz.Problem
	prev     *authz.Set // nil: there were none (awaited)
	next     *authz.Set
}

// Affects reports whether a server's inbound listeners changed: whether
// the policies that select w did (every server's, when there were none).
func (c SecurityChange) Affects(w authz.Workload) bool {
	if c.prev == nil {
		return true
	}
	return c.prev.Select(w).Key() != c.next.Select(w).Key()
}

// SetSecurity replaces the AuthorizationPolicies and PeerAuthentications
// the Generator applies to proxyless gRPC servers (distribute.Source.Rules
// of authz.AuthorizationPolicyKind and authz.PeerAuthenticationKind) and
// returns what that changed.
func (g *Generator) SetSecurity(authzObjs, peerObjs []distribute.Object) SecurityChange {
	g.mu.Lock()
	prev := g.security // while pending, the defaults (SetMTLS), which Clusters were built with
	g.mu.Unlock()
	next := authz.NextSet(prev, g.rootNamespace, g.meshDefault, g.trustDomains(), authzObjs, peerObjs)
	g.mu.Lock()
	change := SecurityChange{Problems: next.Problems(), MeshMode: prev.MeshMode() != next.MeshMode(), prev: prev, next: next}
	if g.securityPending {
		change.prev = nil // every server's inbound listeners are new
	}
	g.security, g.securityPending = next, false
	clear(g.inbound)
	g.mu.Unlock()
	return change
}

// Security returns the policies applied now and whether they are known
// yet (see AwaitSecurity).
func (g *Generator) Security() (*authz.Set, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.security, !g.securityPending
}

// clientMTLSLocked reports whether proxyless gRPC clients reach port of
// the service a DestinationRule (nil: none) applies to with mTLS: as the
// rule's tls.mode says (its first portLevelSettings entry for the port
// replaces the whole policy, as in Istio), ISTIO_MUTUAL yes, any other
// mode no (istiod's proxyless generator supports no other); without one,
// when the mesh-wide mode is STRICT. Never without our trust domain,
// whose identities the clients accept. g.mu is held.
func (g *Generator) clientMTLSLocked(rule *networking.DestinationRule, port int32) bool {
	if g.trustDomain == "" {
		return false
	}
	tls := rule.GetTrafficPolicy().GetTls()
	if pl := portLevel(rule, port); pl != nil {
		tls = pl.GetTls()
	}
	if tls != nil {
		return tls.GetMode() == networking.ClientTLSSettings_ISTIO_MUTUAL
	}
	return g.security.MeshMode() == MTLSStrict
}

// envoyMTLSLocked reports whether an Envoy reaches a service port with
// Istio's auto mTLS (the endpoints' tlsMode decides, see
// envoyTransportSockets), as an Istio sidecar does: unless a
// DestinationRule's TLS mode for it is other than ISTIO_MUTUAL (DISABLE:
// plaintext; SIMPLE and MUTUAL need certificates the hub does not
// distribute, so plaintext too, and ClientTLSNotes says so), or the hub has
// no trust domain. With g.mu held.
func (g *Generator) envoyMTLSLocked(rule *networking.DestinationRule, port int32) bool {
	if g.trustDomain == "" {
		return false
	}
	tls := rule.GetTrafficPolicy().GetTls()
	if pl := portLevel(rule, port); pl != nil {
		tls = pl.GetTls()
	}
	return tls == nil || tls.GetMode() == networking.ClientTLSSettings_ISTIO_MUTUAL
}

// inboundListener returns a proxyless gRPC server's inbound listener, or
// nil when the name is not one (see parseInboundName): its mTLS mode and
// RBAC filters from the policies that select the server (w; nil: one no
// selector selects). While the policies are awaited it is Kept.
func (g *Generator) inboundListener(name string, w *authz.Workload) (*Resource, error) {
	addr, ok := ParseInboundName(name)
	if !ok {
		return nil, nil
	}
	if w == nil {
		w = &authz.Workload{}
	}
	g.mu.Lock()
	set, pending := g.security, g.securityPending
	if pending {
		g.mu.Unlock()
		return &Resource{Name: name, Kept: true}, nil
	}
	sel := set.Select(*w)
	key := inboundKey{name: name, policies: sel.Key()}
	r := g.inbound[key]
	g.mu.Unlock()
	if r != nil {
		return r, nil
	}
	deny, allow := sel.RBAC()
	r, err := Marshal(name, resourcev3.ListenerType, buildInboundListener(name, addr, sel.ServerMode(uint32(addr.Port())), deny, allow))
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	if g.security == set { // not replaced meanwhile
		if len(g.inbound) >= maxInbound {
			clear(g.inbound)
		}
		g.inbound[key] = r
	}
	g.mu.Unlock()
	return r, nil
}

// Hostnames lists every hostname the Generator builds resources of.
func (g *Generator) Hostnames() []string { return g.index.Hostnames() }

// ClientTLSNotes lists the DestinationRules whose client TLS mode
// proxyless gRPC clients do not follow (as istiod's grpcgen, which
// supports ISTIO_MUTUAL and DISABLE only): they connect in plaintext.
func ClientTLSNotes(objs []distribute.Object) []Refused {
	var out []Refused
	for _, o := range objs {
		dr, ok := o.Spec.(*networking.DestinationRule)
		if !ok {
			continue
		}
		modes := []*networking.ClientTLSSettings{dr.GetTrafficPolicy().GetTls()}
		for _, pl := range dr.GetTrafficPolicy().GetPortLevelSettings() {
			modes = append(modes, pl.GetTls())
		}
		for _, tls := range modes {
			if m := tls.GetMode(); m == networking.ClientTLSSettings_SIMPLE || m == networking.ClientTLSSettings_MUTUAL {
				out = append(out, Refused{Rule: o.Namespace + "/" + o.Name, Reason: "tls.mode " + m.String() +
					" is not supported for proxyless gRPC clients (as in istiod) nor for hub-fed Envoys: they connect to the host in plaintext"})
				break
			}
		}
	}
	return out
}
