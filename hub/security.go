package hub

import (
	"strings"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/hubmesh/hub/hub/authz"
	"github.com/hubmesh/hub/hub/xdsgen"
)

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
