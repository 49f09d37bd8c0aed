package clusters

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// ServiceKey names a Service inside one member cluster.
type ServiceKey = types.NamespacedName

// Service is one member's view of a Kubernetes Service and its endpoints,
// with Kubernetes types already resolved away. Values handed to a Sink are
// never modified afterwards.
type Service struct {
	Namespace string
	Name      string
	// Created is the Service's creationTimestamp in this member (UTC,
	// whole seconds; zero when unknown). The oldest across members stamps
	// the generated ServiceEntry, so its age survives restarts.
	Created time.Time
	Ports   []ServicePort
	// Endpoints holds one entry per (address, service port).
	Endpoints []Endpoint
	// NotExported says the Service is not offered to other members (their
	// proxies and istiods): labelled hub.federation/export: "false"
	// (LabelExport), or, in export mode serviceexport, without a
	// ServiceExport; ExportTo, if not nil, are the only other members it
	// is offered to (AnnotationExportTo, sorted); ExportReason says why
	// it is not exported ("" when it is). See ExportedTo.
	NotExported  bool
	ExportTo     []string
	ExportReason string
	// Network is the member's Istio network: the topology.istio.io/network
	// label of its system namespace (SystemNamespace), "" when unset.
	Network string
	// Gateways are the member's east-west gateways into its network
	// (discoverGateways), the same for every Service of the member and
	// shared between them: proxies of other networks reach the endpoints
	// through them. Nil when the member has none.
	Gateways []Gateway
	// KubernetesServiceAccounts and CanonicalServiceAccounts are the
	// workload identities the Service declares for its endpoints with
	// Istio's annotations (AnnotationKubernetesServiceAccounts: service
	// account names in the Service's namespace; AnnotationCanonical
	// ServiceAccounts: identities as they are), sorted, without duplicates,
	// at most MaxDeclaredServiceAccounts of each; nil when not annotated.
	KubernetesServiceAccounts []string
	CanonicalServiceAccounts  []string
	// PodServiceAccounts are the service accounts of the mesh pods behind
	// the view's mTLS endpoints (what istiod derives a service's identities
	// from), sorted, without duplicates; nil when there are none, or more
	// than MaxDeclaredServiceAccounts (TooManyPodServiceAccounts).
	PodServiceAccounts        []string
	TooManyPodServiceAccounts bool
}

// Istio's Service annotations that declare the identities of its
// endpoints (comma-separated): clients check the server's certificate
// against them.
const (
	AnnotationKubernetesServiceAccounts = "alpha.istio.io/kubernetes-serviceaccounts"
	AnnotationCanonicalServiceAccounts  = "alpha.istio.io/canonical-serviceaccounts"
)

// PeerIdentities are the SPIFFE IDs (of trustDomain) the endpoints of a
// service's views may present, as istiod derives them: its mesh pods'
// service accounts and those Istio's annotations declare, sorted, without
// duplicates. A view without endpoints and without annotations presents
// nothing and is passed over (a member where the service is scaled to
// zero does not loosen the others'). known is false when a view with
// endpoints names none (no mesh pod known, too many service accounts,
// nothing declared), or no view names any: then any identity of the trust
// domain may serve the service.
func PeerIdentities(trustDomain string, views map[string]*Service) (ids []string, known bool) {
	for _, svc := range views {
		declared := len(svc.KubernetesServiceAccounts) > 0 || len(svc.CanonicalServiceAccounts) > 0
		switch {
		case svc.TooManyPodServiceAccounts:
			return nil, false
		case !declared && len(svc.PodServiceAccounts) == 0 && len(svc.Endpoints) == 0:
			continue
		case !declared && len(svc.PodServiceAccounts) == 0:
			return nil, false
		}
		for _, sa := range svc.KubernetesServiceAccounts {
			ids = append(ids, "spiffe://"+trustDomain+"/ns/"+svc.Namespace+"/sa/"+sa)
		}
		for _, sa := range svc.PodServiceAccounts {
			ids = append(ids, "spiffe://"+trustDomain+"/ns/"+svc.Namespace+"/sa/"+sa)
		}
		ids = append(ids, svc.CanonicalServiceAccounts...)
	}
	if len(ids) == 0 {
		return nil, false
	}
	slices.Sort(ids)
	return slices.Compact(ids), true
}

// MaxDeclaredServiceAccounts bounds the identities read from each
// annotation, and a view's mesh pods' service accounts; an annotation with
// more, or with a value longer than maxServiceAccountBytes, declares
// nothing, and a view with more pod service accounts names none
// (TooManyPodServiceAccounts): clients then accept any identity of the
// trust domain.
const MaxDeclaredServiceAccounts = 32

// LabelExport on a Service set to "false" keeps it out of the config the
// hub serves to member istiods (Service.NotExported).
const LabelExport = "hub.federation/export"

// ServicePort is one port of a Service.
type ServicePort struct {
	Name        string
	Port        int32
	Protocol    string // TCP, UDP or SCTP
	AppProtocol string // the Service port's appProtocol, if any
}

// Health is the health of one endpoint as derived from EndpointSlice conditions.
type Health int

const (
	// Healthy endpoints are ready.
	Healthy Health = iota
	// Draining endpoints are serving but terminating.
	Draining
)

// Endpoint is one address serving one port of a Service.
type Endpoint struct {
	Address     string
	Port        int32 // the target port on Address
	ServicePort int32 // the Service port this endpoint serves
	Health      Health
	Region      string
	Zone        string
	// MTLS says the endpoint accepts Istio mTLS: its pod is labelled
	// security.istio.io/tlsMode=istio (Istio's injection sets it), as
	// istiod reads it. Only such endpoints are reached across networks:
	// the gateway routes by the SNI of Istio's mTLS.
	MTLS bool
	// Workload is, for a mesh pod's endpoint, what Istio's telemetry knows
	// it by, as istiod's endpoint metadata istio.workload says it without
	// the member: "<workload>;<namespace>;<canonical-name>;<canonical-revision>"
	// (see podWorkload); "" when not known (not a mesh pod).
	Workload string
}

// State is the lifecycle state of a member cluster (docs/architecture.md §3.3).
type State string

// Member states.
const (
	StatePending     State = "Pending"
	StateSyncing     State = "Syncing"
	StateReady       State = "Ready"
	StateStale       State = "Stale"
	StateUnreachable State = "Unreachable"
	StateTimedOut    State = "TimedOut"
	StateInvalid     State = "Invalid"
	StateConflict    State = "Conflict"
)

// Status is what the hub reports about one member cluster. It never contains
// credentials.
type Status struct {
	ID      string
	Secret  string // namespace/name of the remote Secret; empty for the home cluster
	State   State
	Message string
	Server  string // API server URL
	// KubeconfigSHA256 is the SHA-256 (hex) of the kubeconfig the member's
	// active client runs ("" for the home cluster): whoever wrote the
	// remote Secret can tell when the hub has switched to it.
	KubeconfigSHA256 string
	Services         int
	Endpoints        int
	LastSyncTime     time.Time
	// SyncDuration is how long the first full sync of the current client took.
	SyncDuration time.Duration
	// Warnings are accepted but risky settings of the member's kubeconfig
	// (e.g. insecure-skip-tls-verify).
	Warnings []string
	// Credentials are when the inline credentials of the member's
	// kubeconfig expire, graded against Config.ExpiryWarning (none for the
	// home cluster, or when no expiry is known).
	Credentials []CredentialExpiry
	// Network is the member's Istio network ("" when its system
	// namespace has no topology.istio.io/network label).
	Network string
	// Gateways are the member's accepted east-west gateways and
	// GatewaysRefused why others were not accepted (at most 33 reasons,
	// the last counting the rest); GatewaysRefusedCount counts them all.
	Gateways             []Gateway
	GatewaysRefused      []string
	GatewaysRefusedCount int
	// CrossNetworkWithheld counts the member's endpoints that proxies on
	// other networks do not get: all of them when the member has a network
	// on which no member has a gateway, else those that do not accept
	// Istio mTLS.
	CrossNetworkWithheld int
	// ProxylessWithheld counts the member's endpoints that proxyless gRPC
	// clients on other networks do not get: those of CrossNetworkWithheld,
	// or all of them when no gateway of its network admits proxyless gRPC
	// (AnnotationProxylessALPN).
	ProxylessWithheld int
	// GatewayServices are the Services the hub wrote into the member's
	// istio-system for its istiod (other networks' gateways), and
	// GatewayServicesError why the last attempt failed ("" when it did not).
	GatewayServices      []string
	GatewayServicesError string
	// Demoted says why the member's endpoints are served one priority
	// behind the healthy members' ("" when they are not).
	Demoted string
	// WatchScope is what the hub watches in the member (its remote
	// Secret's watch annotations), WatchedNamespaces the namespaces
	// watched now (nil: every namespace; the system namespace is always
	// watched for gateways), WatchRefused how many selected namespaces
	// were not watched for the bound, and Objects how many objects the
	// member's informers hold, by kind.
	WatchScope        WatchScope
	WatchedNamespaces []string
	WatchRefused      int
	Objects           map[string]int
	// ServiceExports are, in export mode serviceexport, the conditions of
	// the member's ServiceExports and whether they were written back.
	ServiceExports map[ServiceKey]ExportStatus
}

// StateObserver is told the state changes of members (the federated index
// demotes members that are not healthy).
type StateObserver interface {
	MemberState(cluster string, st State)
}

// Sink receives every member's service view. The hub's federated index
// implements it; calls for one member never overlap.
type Sink interface {
	// ReplaceCluster sets the complete service view of a member, replacing
	// whatever it had before (used on first sync and on credential rotation,
	// so that served endpoints never go through an empty state).
	ReplaceCluster(cluster string, services []*Service)
	// UpdateService sets one service of a member; svc nil removes it.
	UpdateService(cluster string, key ServiceKey, svc *Service)
	// RemoveCluster drops every service of a member.
	RemoveCluster(cluster string)
}
