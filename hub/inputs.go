package hub

import (
	"fmt"
	"log/slog"

	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub/authz"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/mcp"
)

// RuleSource has the Istio objects of a kind the hub's own xDS reads
// (distribute.Source.Rules), and is told what the hub's xDS does with them
// that its clients cannot do as Istio means it (distribute.Source.SetNotes).
type RuleSource interface {
	Rules(kind string) ([]distribute.Object, bool)
	SetNotes(kind string, notes []distribute.Note)
}

// generatorInputs applies what a batch changed of the generators' inputs
// before the watcher routes the batch to the streams (Hub.push): the
// DestinationRules and the security policies distributed from the home
// cluster, whose problems it notes back to the distribution, and the
// changed hostnames, whose resources it forgets (xDS and Istio config are
// rebuilt when a watch is evaluated, not here). Only the change feed's
// goroutine calls it.
type generatorInputs struct {
	gen    *xdsgen.Generator // nil: no xDS inputs to apply
	config *mcp.Generator    // Istio config for member istiods (may be nil)
	rules  RuleSource        // may be nil: none
	log    *slog.Logger
}

// apply applies what b changed; the hostnames whose resources a
// DestinationRule or the mesh-wide mode changed join b.Hosts. It returns
// what the security policies changed, if they did (nil: nothing), for the
// watcher to find the proxyless servers it concerns.
func (in *generatorInputs) apply(b *feed.Batch) *xdsgen.SecurityChange {
	if _, ok := b.Kinds[xdsgen.DestinationRuleKind]; ok && in.rules != nil && in.gen != nil {
		if objs, ready := in.rules.Rules(xdsgen.DestinationRuleKind); ready {
			for _, host := range in.applyDestinationRules(objs) {
				b.AddHost(host)
			}
		}
	}
	security := in.applySecurity(b)
	if in.gen != nil {
		in.gen.Invalidate(b.Hosts)
	}
	if in.config != nil {
		in.config.Invalidate(b.Hosts)
	}
	return security
}

// applyDestinationRules hands the generator the DestinationRules, tells
// the distribution what it could not apply, and returns the hostnames
// whose resources changed.
func (in *generatorInputs) applyDestinationRules(objs []distribute.Object) []string {
	changed, refused := in.gen.SetDestinationRules(objs)
	notes := make([]distribute.Note, 0, len(refused))
	for _, r := range refused {
		in.log.Warn("DestinationRule's load balancing not applied by the hub's xDS", "rule", r.Rule, "reason", r.Reason)
		notes = append(notes, distribute.Note{Object: r.Rule, Message: "load balancing not applied: " + r.Reason})
	}
	for _, r := range xdsgen.ClientTLSNotes(objs) {
		notes = append(notes, distribute.Note{Object: r.Rule, Message: r.Reason})
	}
	in.rules.SetNotes(xdsgen.DestinationRuleKind, notes)
	return changed
}

// applySecurity reads the distributed AuthorizationPolicies and
// PeerAuthentications into the generator when b changed either kind (and
// both are ready), tells the distribution what proxyless servers cannot
// enforce, and returns the change (nil: none). A change of the mesh-wide
// mode changes every proxyless client's Clusters: every hostname joins b.
func (in *generatorInputs) applySecurity(b *feed.Batch) *xdsgen.SecurityChange {
	_, a := b.Kinds[authz.AuthorizationPolicyKind]
	_, p := b.Kinds[authz.PeerAuthenticationKind]
	if (!a && !p) || in.rules == nil || in.gen == nil {
		return nil
	}
	authzObjs, ready := in.rules.Rules(authz.AuthorizationPolicyKind)
	if !ready {
		return nil
	}
	peerObjs, ready := in.rules.Rules(authz.PeerAuthenticationKind)
	if !ready {
		return nil
	}
	change := in.gen.SetSecurity(authzObjs, peerObjs)
	notes := map[string][]distribute.Note{authz.AuthorizationPolicyKind: nil, authz.PeerAuthenticationKind: nil}
	for _, p := range change.Problems {
		msg := p.Message
		if p.Rule >= 0 {
			msg = fmt.Sprintf("rule %d: %s", p.Rule, msg)
		}
		notes[p.Kind] = append(notes[p.Kind], distribute.Note{Object: p.Policy, Message: msg})
	}
	if len(change.Problems) > 0 {
		in.log.Warn("policies proxyless gRPC servers cannot enforce as Istio means them (see /api/v1/distribution)", "notes", len(change.Problems))
	}
	for kind, n := range notes {
		in.rules.SetNotes(kind, n)
	}
	if change.MeshMode {
		for _, host := range in.gen.Hostnames() {
			b.AddHost(host)
		}
	}
	return &change
}
