// Package xdsstatus is what the hub shows of its xDS streams: each
// stream's status (Proxy, Type) and what it holds (Config), the streams
// it refused (Refusals), how long a change takes to reach the streams
// (PushLatency) and how many responses go out each second (PerSecond).
// The stream loops write these; the API, the dashboard and TypeSyncz read
// them.
package xdsstatus

import (
	"time"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hubmesh/hub/hub/authz"
)

// Type is the protocol state of one resource type on one stream.
type Type struct {
	TypeURL       string
	SentVersion   string
	SentNonce     string
	SentAt        time.Time
	Resources     int
	Sends         int
	AckedVersion  string
	AckedNonce    string // the nonce of the response AckedVersion was sent in
	AckedAt       time.Time
	NackedVersion string
	NackError     string
	NackedAt      time.Time
	Nacks         int
}

// Proxy is what the hub knows about one connected xDS stream.
type Proxy struct {
	ID        string // node.id
	Stream    int64
	Cluster   string // member cluster from node metadata CLUSTER_ID
	Namespace string // node metadata NAMESPACE
	Address   string // peer address
	Identity  string // SPIFFE ID of a verified client certificate, if any
	// ConfigSubscriber says the stream is an istiod reading Istio config
	// (node metadata GENERATOR=api, docs/architecture.md §3.7), not a proxy;
	// IstioVersion is its ISTIO_VERSION metadata (as sent, truncated).
	ConfigSubscriber bool
	IstioVersion     string
	// Proxyless says the stream is a proxyless gRPC client (node metadata
	// GENERATOR=grpc or a gRPC library's user agent), not an Envoy.
	Proxyless bool
	// Warning says why the proxy gets less than it asks for, e.g. a member
	// claim that its credential does not prove.
	Warning string
	// Unserved counts the stream's requests for types the hub does not
	// serve (e.g. pilot-agent's NDS): ignored, as istiod ignores them.
	Unserved uint64
	// Server is, for a proxyless gRPC server (a stream asking for inbound
	// listeners), what the policies make of them.
	Server      *ServerSecurity
	ConnectedAt time.Time
	Types       []Type // by type URL
}

// ProxyConfig is what a stream holds of each type: the last response's
// resources, merged with earlier ones where responses carry only what
// changed (Delta; SotW EDS, RDS and SDS by name).
type ProxyConfig struct {
	Proxy     Proxy
	Resources map[string][]*anypb.Any // by type URL; shared, do not modify
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
