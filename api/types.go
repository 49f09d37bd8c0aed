package api

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub"
	"github.com/hubmesh/hub/hub/ca"
	"github.com/hubmesh/hub/hub/xdsstatus"
)

// List is the envelope of every list response.
type List[T any] struct {
	Items []T `json:"items"`
}

// Problem is an RFC 9457 problem document.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Cluster is the JSON form of a member cluster (docs/architecture.md §3.3).
type Cluster struct {
	ID      string `json:"id"`
	Secret  string `json:"secret"`
	State   string `json:"state"`
	Message string `json:"message"`
	Server  string `json:"server"`
	// KubeconfigSHA256 is the SHA-256 (hex) of the kubeconfig the
	// member's active client runs (absent for the home cluster).
	KubeconfigSHA256 string     `json:"kubeconfigSHA256,omitempty"`
	Services         int        `json:"services"`
	Endpoints        int        `json:"endpoints"`
	LastSyncTime     *time.Time `json:"lastSyncTime"`
	// Warnings are accepted but risky settings of the member's kubeconfig.
	Warnings []string `json:"warnings,omitempty"`
	// Credentials are when the inline credentials of the member's
	// kubeconfig expire (absent: none with a known expiry).
	Credentials []CredentialExpiry `json:"credentials,omitempty"`
	// Network is the member's Istio network (absent: none).
	Network string `json:"network,omitempty"`
	// Gateways are the member's east-west gateways, and GatewaysRefused
	// why others were not accepted (at most 32 reasons and a count of the
	// rest; GatewaysRefusedCount counts them all).
	Gateways             []Gateway `json:"gateways,omitempty"`
	GatewaysRefused      []string  `json:"gatewaysRefused,omitempty"`
	GatewaysRefusedCount int       `json:"gatewaysRefusedCount,omitempty"`
	// CrossNetworkWithheld counts the member's endpoints that proxies on
	// other networks do not get (no gateway, or not Istio mTLS).
	CrossNetworkWithheld int `json:"crossNetworkWithheld"`
	// ProxylessWithheld counts the member's endpoints that proxyless gRPC
	// clients on other networks do not get (also when no gateway of its
	// network admits them).
	ProxylessWithheld int `json:"proxylessWithheld"`
	// GatewayServices are the Services the hub wrote into the member's
	// istio-system for its istiod (other networks' gateways), and
	// GatewayServicesError why the last write failed.
	GatewayServices      []string `json:"gatewayServices,omitempty"`
	GatewayServicesError string   `json:"gatewayServicesError,omitempty"`
	// Demoted says why the member's endpoints are served behind the
	// healthy members' (absent: they are not).
	Demoted string `json:"demoted,omitempty"`
	// WatchScope says what the hub watches in the member ("all
	// namespaces", "namespaces a,b", "namespaces selected by k=v"; the
	// remote Secret's hub.federation/watch-namespaces or
	// watch-namespace-selector), WatchedNamespaces the namespaces watched
	// now (absent: every namespace), WatchRefused how many selected
	// namespaces were not watched for the bound of 256, and Objects the
	// objects its informers hold, by kind (Service, EndpointSlice,
	// MeshPod, Node, Secret).
	WatchScope        string         `json:"watchScope"`
	WatchedNamespaces []string       `json:"watchedNamespaces,omitempty"`
	WatchRefused      int            `json:"watchRefused,omitempty"`
	Objects           map[string]int `json:"objects,omitempty"`
	// ServiceExports are, with --export-mode=serviceexport, the member's
	// ServiceExports with the conditions the hub works out (Valid,
	// Conflict) and whether it wrote them into their status.
	ServiceExports []ServiceExportStatus `json:"serviceExports,omitempty"`
	// Exchange is what the member exports and imports (GET
	// /api/v1/clusters/{id} only: it is worked out over every service).
	Exchange *MemberExchange `json:"exchange,omitempty"`
}

// MemberExchange is what a member exports to the other members and
// imports from them, in services.
type MemberExchange struct {
	Exported       int `json:"exported"`
	ExportedToSome int `json:"exportedToSome"`
	NotExported    int `json:"notExported"`
	Imported       int `json:"imported"`
	ImportedOnly   int `json:"importedOnly"`
}

// ToExchange converts a member's exchange.
func ToExchange(e hub.MemberExchange) MemberExchange { return MemberExchange(e) }

// ServiceExportStatus is one ServiceExport of a member as the hub sees it.
type ServiceExportStatus struct {
	Namespace  string      `json:"namespace"`
	Name       string      `json:"name"`
	Conditions []Condition `json:"conditions"`
	Written    bool        `json:"written"`
	WriteError string      `json:"writeError,omitempty"`
}

// Condition is a Kubernetes-style condition.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Gateway is an east-west gateway of a member.
type Gateway struct {
	Address string `json:"address"`
	Port    int32  `json:"port"`
	Source  string `json:"source"`
	// Proxyless says it admits proxyless gRPC (clusters.AnnotationProxylessALPN).
	Proxyless bool `json:"proxyless,omitempty"`
}

// ToCluster converts a member status.
func ToCluster(st clusters.Status) Cluster {
	c := Cluster{
		ID: st.ID, Secret: st.Secret, State: string(st.State), Message: st.Message,
		Server: st.Server, KubeconfigSHA256: st.KubeconfigSHA256, Services: st.Services, Endpoints: st.Endpoints, LastSyncTime: timePtr(st.LastSyncTime),
		Warnings: st.Warnings, Network: st.Network, GatewaysRefused: st.GatewaysRefused, GatewaysRefusedCount: st.GatewaysRefusedCount,
		CrossNetworkWithheld: st.CrossNetworkWithheld, ProxylessWithheld: st.ProxylessWithheld, Demoted: st.Demoted,
		GatewayServices: st.GatewayServices, GatewayServicesError: st.GatewayServicesError,
		WatchScope: st.WatchScope.String(), WatchedNamespaces: st.WatchedNamespaces, WatchRefused: st.WatchRefused,
		Objects: st.Objects, Credentials: ToCredentialExpiries(st.Credentials),
	}
	for _, g := range st.Gateways {
		c.Gateways = append(c.Gateways, Gateway(g))
	}
	for key, es := range st.ServiceExports {
		out := ServiceExportStatus{Namespace: key.Namespace, Name: key.Name, Written: es.Written, WriteError: es.WriteError}
		for _, cond := range es.Conditions {
			out.Conditions = append(out.Conditions, Condition{Type: cond.Type, Status: string(cond.Status), Reason: cond.Reason, Message: cond.Message})
		}
		c.ServiceExports = append(c.ServiceExports, out)
	}
	slices.SortFunc(c.ServiceExports, func(a, b ServiceExportStatus) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return c
}

// Port is a service port.
type Port struct {
	Name        string `json:"name"`
	Port        int32  `json:"port"`
	Protocol    string `json:"protocol"`
	AppProtocol string `json:"appProtocol,omitempty"`
}

// Service is a federated service with its endpoint count per member.
type Service struct {
	Hostname  string         `json:"hostname"`
	Namespace string         `json:"namespace"`
	Name      string         `json:"name"`
	Ports     []Port         `json:"ports"`
	Endpoints map[string]int `json:"endpoints"`
	// Exports are, by member, the views not offered to every other member
	// (absent: every member offers its view to every other).
	Exports map[string]ServiceExport `json:"exports,omitempty"`
	// Routed and Withheld answer GET /api/v1/services?member=<id>:
	// whether that member's proxies get the service from the hub (its own
	// view or one exported to it), and, for each member whose view they do
	// not get, why ("why not routed").
	Routed   *bool             `json:"routed,omitempty"`
	Withheld map[string]string `json:"withheld,omitempty"`
}

// RoutedFor fills Routed and Withheld for the proxies of member.
func (s *Service) RoutedFor(member string, sum hub.ServiceSummary) {
	routed := false
	for id := range sum.Endpoints {
		v, restricted := sum.Restricted[id]
		switch {
		case id == member || !restricted || v.ExportedTo(member):
			routed = true
		case v.NotExported:
			s.addWithheld(id, "not exported: "+v.ExportReason)
		default:
			s.addWithheld(id, "exported to "+strings.Join(v.ExportTo, ", ")+" only (hub.federation/export-to)")
		}
	}
	s.Routed = &routed
}

func (s *Service) addWithheld(id, why string) {
	if s.Withheld == nil {
		s.Withheld = map[string]string{}
	}
	s.Withheld[id] = why
}

// ServiceExport is one member's export of a Service that is not offered
// to every other member: not at all (Exported false, with the reason), or
// to the members of ExportTo only (hub.federation/export-to). Its own
// member's proxies always get it; member istiods get only views offered
// to every member.
type ServiceExport struct {
	Exported bool     `json:"exported"`
	ExportTo []string `json:"exportTo,omitempty"`
	Reason   string   `json:"reason,omitempty"`
}

// ToService converts a service summary.
func ToService(s hub.ServiceSummary) Service {
	out := Service{Hostname: s.Hostname, Namespace: s.Namespace, Name: s.Name, Ports: []Port{}, Endpoints: s.Endpoints}
	for id, v := range s.Restricted {
		if out.Exports == nil {
			out.Exports = map[string]ServiceExport{}
		}
		reason := v.ExportReason
		if !v.NotExported {
			reason = "annotated hub.federation/export-to: offered to these members only"
		}
		out.Exports[id] = ServiceExport{Exported: !v.NotExported, ExportTo: v.ExportTo, Reason: reason}
	}
	for _, p := range s.Ports {
		out.Ports = append(out.Ports, Port{Name: p.Name, Port: p.Port, Protocol: p.Protocol, AppProtocol: p.AppProtocol})
	}
	return out
}

// TypeStatus is the xDS protocol state of one resource type on a stream.
type TypeStatus struct {
	Type          string     `json:"type"`
	TypeURL       string     `json:"typeUrl"`
	SentVersion   string     `json:"sentVersion"`
	SentNonce     string     `json:"sentNonce"`
	SentAt        *time.Time `json:"sentAt"`
	Resources     int        `json:"resources"`
	Sends         int        `json:"sends"`
	AckedVersion  string     `json:"ackedVersion"`
	AckedAt       *time.Time `json:"ackedAt"`
	NackedVersion string     `json:"nackedVersion"`
	NackError     string     `json:"nackError"`
	NackedAt      *time.Time `json:"nackedAt"`
	Nacks         int        `json:"nacks"`
}

// Proxy is a connected xDS client (one ADS stream).
type Proxy struct {
	ID        string `json:"id"`
	Stream    int64  `json:"stream"`
	Cluster   string `json:"cluster"`
	Namespace string `json:"namespace"`
	Address   string `json:"address"`
	Identity  string `json:"identity,omitempty"` // verified SPIFFE ID (client certificate or service-account token)
	// ConfigSubscriber: an istiod reading Istio config (MCP-over-XDS), not
	// a proxy; IstioVersion: its ISTIO_VERSION, as it sent it.
	ConfigSubscriber bool   `json:"configSubscriber,omitempty"`
	IstioVersion     string `json:"istioVersion,omitempty"`
	Warning          string `json:"warning,omitempty"` // why it gets less than it asks for (e.g. a member claim its certificate does not prove)
	// Unserved counts its requests for types the hub does not serve
	// (e.g. pilot-agent's NDS), ignored as istiod ignores them.
	Unserved    uint64       `json:"unserved,omitempty"`
	ConnectedAt *time.Time   `json:"connectedAt"`
	Types       []TypeStatus `json:"types"`
	// Server is, for a proxyless gRPC server, what the distributed
	// AuthorizationPolicies and PeerAuthentications make of its inbound
	// listeners.
	Server *ProxyServer `json:"server,omitempty"`
}

// RefusedStream is an xDS stream the hub ended because of what its client
// sent, newest first: the gRPC status the client got.
type RefusedStream struct {
	At       time.Time `json:"at"`
	ID       string    `json:"id"` // the node ID as sent (clipped)
	Address  string    `json:"address"`
	Identity string    `json:"identity,omitempty"`
	Code     string    `json:"code"` // gRPC status code, e.g. InvalidArgument
	Message  string    `json:"message"`
}

// ProxyServer is what the policies make of a proxyless gRPC server.
type ProxyServer struct {
	Workload ServerWorkload `json:"workload"`
	// Pending: the policies have not been read yet; no inbound listener
	// is served until they are.
	Pending bool `json:"pending,omitempty"`
	// FailClosed says what the hub enforces on it whatever its policies
	// say, and why: every request denied and mTLS required (its labels
	// were not all read), or mTLS required (a PeerAuthentication that
	// could select it cannot be read).
	FailClosed string `json:"failClosed,omitempty"`
	// PeerAuthentications decide its mTLS modes (namespace/name: mesh,
	// namespace, workload level).
	PeerAuthentications []string `json:"peerAuthentications"`
	// The AuthorizationPolicies (namespace/name) that select it, by
	// action. CUSTOM ones are enforced as DENY of what their rules match
	// (proxyless gRPC cannot call an external authorizer); AUDIT ones
	// change nothing.
	Allow  []string `json:"allow"`
	Deny   []string `json:"deny"`
	Custom []string `json:"custom,omitempty"`
	Audit  []string `json:"audit,omitempty"`
	// Listeners are its inbound listeners and their modes.
	Listeners []InboundListener `json:"listeners"`
}

// ServerWorkload is the workload behind a proxyless gRPC server, as the
// policies select it.
type ServerWorkload struct {
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount,omitempty"`
	Member         string `json:"member,omitempty"`
	// Labels is how many labels its node carries (their values are the
	// proxy's words; see the proxy's configuration for them).
	Labels int `json:"labels"`
	// Verified: namespace and service account come from its verified
	// identity; otherwise from its node metadata (plaintext xDS).
	Verified bool `json:"verified"`
	// ClaimedNamespace is another namespace its node claimed, which the
	// hub did not take (its identity's wins).
	ClaimedNamespace string `json:"claimedNamespace,omitempty"`
}

// InboundListener is one inbound listener of a proxyless gRPC server.
type InboundListener struct {
	Name string `json:"name"`
	Port uint32 `json:"port"`
	// Mode is how it is served: STRICT (client certificates required) or
	// DISABLE (plaintext); PolicyMode is what the PeerAuthentications say
	// (PERMISSIVE is served in plaintext, or STRICT for a workload
	// labelled security.istio.io/tlsMode=istio, as istiod does).
	Mode       string `json:"mode"`
	PolicyMode string `json:"policyMode"`
}

// MaxNackError bounds the NACK text a proxy status shows: the text is the
// proxy's own (up to a whole gRPC message) and is shown on every list.
const MaxNackError = 1024

// ToProxy converts a proxy status.
func ToProxy(p xdsstatus.Proxy) Proxy {
	out := Proxy{ID: p.ID, Stream: p.Stream, Cluster: p.Cluster, Namespace: p.Namespace, Address: p.Address,
		Identity: p.Identity, ConfigSubscriber: p.ConfigSubscriber, IstioVersion: p.IstioVersion,
		Warning: p.Warning, Unserved: p.Unserved, ConnectedAt: timePtr(p.ConnectedAt), Types: []TypeStatus{}}
	for _, t := range p.Types {
		out.Types = append(out.Types, TypeStatus{
			Type: ShortType(t.TypeURL), TypeURL: t.TypeURL,
			SentVersion: t.SentVersion, SentNonce: t.SentNonce, SentAt: timePtr(t.SentAt), Resources: t.Resources, Sends: t.Sends,
			AckedVersion: t.AckedVersion, AckedAt: timePtr(t.AckedAt),
			NackedVersion: t.NackedVersion, NackError: truncate(t.NackError, MaxNackError), NackedAt: timePtr(t.NackedAt), Nacks: t.Nacks,
		})
	}
	if s := p.Server; s != nil {
		w := s.Workload
		out.Server = &ProxyServer{
			Workload: ServerWorkload{Namespace: w.Namespace, ServiceAccount: w.ServiceAccount, Member: w.Member, Labels: len(w.Labels),
				Verified: w.Verified, ClaimedNamespace: w.Claimed},
			Pending: s.Pending, FailClosed: s.FailClosed, PeerAuthentications: nonNil(s.PeerAuthentications),
			Allow: nonNil(s.Policies.Allow), Deny: nonNil(s.Policies.Deny), Custom: s.Policies.Custom, Audit: s.Policies.Audit,
			Listeners: []InboundListener{},
		}
		for _, l := range s.Listeners {
			out.Server.Listeners = append(out.Server.Listeners, InboundListener{Name: l.Name, Port: l.Port, Mode: string(l.Mode), PolicyMode: string(l.PolicyMode)})
		}
	}
	return out
}

// nonNil is s, or an empty list for nil (JSON [] rather than null).
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// truncate cuts s to at most n bytes on a character boundary, marking the
// cut with an ellipsis.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// ShortType names an xDS type URL the way people do.
func ShortType(typeURL string) string {
	switch typeURL {
	case resourcev3.ListenerType:
		return "LDS"
	case resourcev3.RouteType:
		return "RDS"
	case resourcev3.ClusterType:
		return "CDS"
	case resourcev3.EndpointType:
		return "EDS"
	case resourcev3.SecretType:
		return "SDS"
	}
	return typeURL
}

// ProxyConfig is what a proxy currently holds of each type (see
// xdsstatus.ProxyConfig), as Envoy JSON. Secrets are redacted.
type ProxyConfig struct {
	Proxy     Proxy                        `json:"proxy"`
	Resources map[string][]json.RawMessage `json:"resources"`
}

// ToProxyConfig renders a proxy's resources.
func ToProxyConfig(c xdsstatus.ProxyConfig) (ProxyConfig, error) {
	out := ProxyConfig{Proxy: ToProxy(c.Proxy), Resources: map[string][]json.RawMessage{}}
	for typeURL, anys := range c.Resources {
		list := []json.RawMessage{}
		for _, a := range anys {
			if typeURL == resourcev3.SecretType {
				list = append(list, json.RawMessage(`{"redacted":true}`))
				continue
			}
			b, err := protojson.Marshal(a)
			if err != nil {
				return ProxyConfig{}, fmt.Errorf("rendering %s: %w", typeURL, err)
			}
			list = append(list, b)
		}
		out.Resources[ShortType(typeURL)] = list
	}
	return out, nil
}

// Certificates is what the hub's CA (Istio's CA API on the mTLS xDS port)
// issued and refused since this replica started (see ca.CertificateStats).
type Certificates struct {
	// DefaultTTLSeconds is the lifetime of a certificate whose request asks
	// for none; MaxTTLSeconds the longest issued (--max-workload-cert-ttl).
	DefaultTTLSeconds int64              `json:"defaultTTLSeconds"`
	MaxTTLSeconds     int64              `json:"maxTTLSeconds"`
	Issued            []CertificateGroup `json:"issued"`
	Failures          []CAFailure        `json:"failures"`
}

// CertificateGroup is the certificates issued for one namespace of one
// member.
type CertificateGroup struct {
	Member    string `json:"member"`
	Namespace string `json:"namespace"`
	Issued    uint64 `json:"issued"`
	// Valid counts the identities whose latest certificate has not expired;
	// NextExpiry is the soonest expiry among those latest certificates.
	Valid      int        `json:"valid"`
	NextExpiry *time.Time `json:"nextExpiry"`
}

// CAFailure counts the certificate requests refused for one reason.
type CAFailure struct {
	Reason      string     `json:"reason"`
	Total       uint64     `json:"total"`
	LastHour    uint64     `json:"lastHour"`
	Last        *time.Time `json:"last"`
	LastMessage string     `json:"lastMessage,omitempty"`
}

// ToCertificates converts the CA's read model.
func ToCertificates(st ca.CertificateStats) Certificates {
	out := Certificates{DefaultTTLSeconds: int64(st.DefaultTTL.Seconds()), MaxTTLSeconds: int64(st.MaxTTL.Seconds()),
		Issued: []CertificateGroup{}, Failures: []CAFailure{}}
	for _, g := range st.Groups {
		out.Issued = append(out.Issued, CertificateGroup{Member: g.Member, Namespace: g.Namespace, Issued: g.Issued, Valid: g.Valid, NextExpiry: timePtr(g.NextExpiry)})
	}
	for _, f := range st.Failures {
		out.Failures = append(out.Failures, CAFailure{Reason: f.Reason, Total: f.Total, LastHour: f.LastHour, Last: timePtr(f.Last), LastMessage: f.LastMessage})
	}
	return out
}
