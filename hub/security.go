package hub

import (
	"fmt"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/authz"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/xdsgen"
)

// serverOf is the workload behind rec's stream, for the inbound listeners
// of a proxyless gRPC server (see authz.WorkloadOf): worked out once per
// identity the stream proves, so that every watch of the stream has the
// same one (a new one would make its next evaluation full).
func (w *watcher) serverOf(rec *streamRecord, node *corev3.Node, ident authn.Identity) *authz.Workload {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rec.server != nil && rec.serverFor == ident {
		return rec.server
	}
	var proven authz.Proven
	if !ident.SpiffeID.IsZero() {
		// A proven identity stands, whatever the node says; one of
		// another trust domain, or without /ns/<ns>/sa/<sa>, selects
		// no namespace's policies.
		proven = authz.Proven{Verified: true, Member: ident.Cluster}
		if w.roots != nil && ident.Verified(w.roots.LocalTrustDomain()) {
			proven.Namespace, proven.ServiceAccount = ident.Namespace, authn.ServiceAccountOf(ident.SpiffeID)
		}
	}
	wl := authz.WorkloadOf(node, proven)
	rec.server, rec.serverFor = &wl, ident
	return rec.server
}

// inboundNames lists the inbound listener names of an LDS subscription
// (its names that name no hostname come after those that do).
func inboundNames(s *subscriber) []string {
	if s == nil || s.typeURL != resourcev3.ListenerType || s.idx == nil {
		return nil
	}
	var names []string
	for _, name := range s.idx.list[s.idx.hosted:] {
		if strings.HasPrefix(name, xdsgen.InboundListenerPrefix) {
			names = append(names, name)
		}
	}
	return names
}

// isServer reports whether an LDS subscription names an inbound listener.
func isServer(s *subscriber) bool { return len(inboundNames(s)) > 0 }

// applySecurity reads the distributed AuthorizationPolicies and
// PeerAuthentications into the Generator when b changed either kind (and
// both are ready), and returns the servers whose inbound listeners that
// changes, to be re-evaluated. A change of the mesh-wide mode changes
// every proxyless client's Clusters: every hostname joins b.
func (w *watcher) applySecurity(b *feed.Batch) (affected []*subscriber) {
	_, a := b.Kinds[authz.AuthorizationPolicyKind]
	_, p := b.Kinds[authz.PeerAuthenticationKind]
	if (!a && !p) || w.rules == nil || w.gen == nil {
		return nil
	}
	authzObjs, ready := w.rules.Rules(authz.AuthorizationPolicyKind)
	if !ready {
		return nil
	}
	peerObjs, ready := w.rules.Rules(authz.PeerAuthenticationKind)
	if !ready {
		return nil
	}
	change := w.gen.SetSecurity(authzObjs, peerObjs)
	notes := map[string][]distribute.Note{authz.AuthorizationPolicyKind: nil, authz.PeerAuthenticationKind: nil}
	for _, p := range change.Problems {
		msg := p.Message
		if p.Rule >= 0 {
			msg = fmt.Sprintf("rule %d: %s", p.Rule, msg)
		}
		notes[p.Kind] = append(notes[p.Kind], distribute.Note{Object: p.Policy, Message: msg})
	}
	if len(change.Problems) > 0 {
		w.log.Warn("policies proxyless gRPC servers cannot enforce as Istio means them (see /api/v1/distribution)", "notes", len(change.Problems))
	}
	for kind, n := range notes {
		w.rules.SetNotes(kind, n)
	}
	if change.MeshMode {
		if b.Hosts == nil {
			b.Hosts = map[string]struct{}{}
		}
		for _, host := range w.gen.Hostnames() {
			b.Hosts[host] = struct{}{}
		}
	}
	// The servers, then what the change does to each kind of workload
	// (namespace and labels), outside the lock every watch needs.
	type server struct {
		s  *subscriber
		wl *authz.Workload
	}
	w.mu.Lock()
	servers := make([]server, 0, len(w.index.byServer))
	for s := range w.index.byServer {
		servers = append(servers, server{s, s.view.Server})
	}
	w.mu.Unlock()
	affects := map[string]bool{}
	for _, sv := range servers {
		wl := authz.Workload{}
		if sv.wl != nil {
			wl = *sv.wl
		}
		key := strconv.Quote(wl.Namespace) + strconv.FormatBool(wl.Truncated) + wl.LabelsKey()
		a, ok := affects[key]
		if !ok {
			a = change.Affects(wl)
			affects[key] = a
		}
		if a {
			affected = append(affected, sv.s)
		}
	}
	return affected
}

// ServerSecurity is what the policies make of a proxyless gRPC server's
// inbound listeners (the stream's LDS names under
// xdsgen.InboundListenerPrefix).
type ServerSecurity struct {
	// Workload is the server's workload as the policies select it.
	Workload authz.Workload
	// Listeners are its inbound listeners with their modes.
	Listeners []InboundListener
	// PeerAuthentications decide the modes (mesh, namespace, workload
	// level); Policies are the AuthorizationPolicies that select it.
	PeerAuthentications []string
	Policies            authz.Applied
	// Pending says the policies have not been read yet: no inbound
	// listener is served until they are.
	Pending bool
	// FailClosed says what the hub enforces on it whatever its policies
	// say, and why, if anything (authz.Selection.FailsClosed).
	FailClosed string
}

// InboundListener is one inbound listener of a proxyless gRPC server.
type InboundListener struct {
	Name string
	Port uint32
	// Mode is how it is served: STRICT (client certificates required)
	// or DISABLE (plaintext); PolicyMode is what the PeerAuthentications
	// say (PERMISSIVE is served as DISABLE, see authz.Selection.ServerMode).
	Mode, PolicyMode authz.Mode
}

// serverSecurity is what the policies make of rec's stream's inbound
// listeners; nil when it asks for none.
func (w *watcher) serverSecurity(rec *streamRecord) *ServerSecurity {
	w.mu.Lock()
	names, wl := inboundNames(rec.subs[resourcev3.ListenerType]), rec.server
	w.mu.Unlock()
	if len(names) == 0 || w.gen == nil {
		return nil
	}
	out := &ServerSecurity{}
	if wl != nil {
		out.Workload = *wl
	}
	set, known := w.gen.Security()
	out.Pending = !known
	sel := set.Select(out.Workload)
	out.PeerAuthentications, out.Policies, out.FailClosed = sel.PeerAuthentications(), sel.Policies(), sel.FailsClosed()
	for _, name := range names {
		ap, ok := xdsgen.ParseInboundName(name)
		if !ok {
			continue
		}
		port := uint32(ap.Port())
		out.Listeners = append(out.Listeners, InboundListener{Name: name, Port: port, Mode: sel.ServerMode(port), PolicyMode: sel.PolicyMode(port)})
	}
	return out
}
