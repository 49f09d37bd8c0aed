package xdsgen

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbachttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rawbufferv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/authz"
)

// MTLSMode is a mutual-TLS mode of proxyless gRPC workloads, as Istio's
// PeerAuthentication modes apply to them (docs/architecture.md §3.8; see authz.Mode).
type MTLSMode = authz.Mode

// The modes. The mesh-wide mode (a PeerAuthentication without selector in
// the root namespace, else the Generator's default, see SetMTLS) decides
// whether proxyless gRPC clients use mTLS where no DestinationRule says
// (tls.mode ISTIO_MUTUAL or DISABLE; istiod's proxyless generator uses
// mTLS only where one says ISTIO_MUTUAL); each server's own
// PeerAuthentications decide its inbound listeners (see authz.Selection).
const (
	MTLSStrict     = authz.Strict
	MTLSPermissive = authz.Permissive
	MTLSDisable    = authz.Disable
)

// DefaultMTLSMode is PERMISSIVE, Istio's mesh-wide default (no
// PeerAuthentication), which for proxyless gRPC means plaintext on both
// ends: workloads that do not use xDS credentials keep working.
const DefaultMTLSMode = MTLSPermissive

// ParseMTLSMode reads a mode name (case-insensitive); "" is DefaultMTLSMode.
func ParseMTLSMode(s string) (MTLSMode, error) {
	switch m := MTLSMode(strings.ToUpper(strings.TrimSpace(s))); m {
	case "":
		return DefaultMTLSMode, nil
	case MTLSStrict, MTLSPermissive, MTLSDisable:
		return m, nil
	}
	return "", fmt.Errorf("mTLS mode %q: must be STRICT, PERMISSIVE or DISABLE", s)
}

// Flavour is the shape of the generated resources a client gets where
// client kinds differ; resources of every flavour are marshalled once and
// shared by the streams of that flavour.
type Flavour uint8

const (
	// FlavourPlain is what istiod, Istio's adsc and every other client
	// that is neither Envoy nor proxyless gRPC get, and proxyless gRPC
	// clients of services they reach without mTLS.
	FlavourPlain Flavour = iota
	// FlavourGRPC is a proxyless gRPC client: its Clusters of services it
	// reaches with mTLS (see Generator.clientMTLSLocked) carry an
	// UpstreamTlsContext built on certificate provider instances (grpc-go
	// has no SDS); the others are FlavourPlain's.
	FlavourGRPC
	// FlavourEnvoy is an Envoy with its own listeners (an edge or ingress
	// Envoy, a non-Istio Envoy fleet; docs/architecture.md §3.6): its
	// Clusters use Istio mTLS where the endpoint says tlsMode istio, as
	// istiod builds them (transport_socket_matches, certificate and roots
	// by SDS from the hub, see envoyTransportSockets), it gets other
	// networks' endpoints through their gateways, and no Listener (the
	// proxyless api_listeners are not for Envoy, which skips them).
	FlavourEnvoy
	// FlavourEnvoyPlaintext is an Envoy whose stream proves no identity of
	// our trust domain (the plaintext port): SDS serves it no certificate,
	// so its Clusters are FlavourPlain's (plaintext to every endpoint, none
	// through gateways) and, as FlavourEnvoy, it gets no Listener.
	FlavourEnvoyPlaintext
)

// FlavourOf is the flavour of a client: a proxyless gRPC client (node
// metadata GENERATOR=grpc, which Istio's agent writes into the gRPC
// bootstrap, or a gRPC library's user agent, e.g. "gRPC Go") gets
// FlavourGRPC, an Envoy (user_agent_name "envoy", which every Envoy
// sends) FlavourEnvoy, every other client FlavourPlain.
func FlavourOf(node *corev3.Node) Flavour {
	switch {
	case Proxyless(node):
		return FlavourGRPC
	case node.GetUserAgentName() == "envoy":
		return FlavourEnvoy
	}
	return FlavourPlain
}

// The SDS resource names of a hub-fed Envoy's Istio mTLS, as Istio names
// them: its workload certificate and our roots, both from the hub over
// ADS (the hub's responder.secretResources; "default" from its workload
// certificates).
const (
	SDSWorkloadCert = "default"
	SDSRoots        = "ROOTCA"
)

// Istio's ALPN of in-mesh traffic without metadata exchange (istiod's
// ALPNInMesh and ALPNInMeshH2): what an east-west gateway's AUTO_PASSTHROUGH
// chains and a sidecar's inbound mTLS chains match.
var (
	alpnInMesh   = []string{"istio"}
	alpnInMeshH2 = []string{"istio", "h2"}
)

// envoyTransportSockets is Istio's auto mTLS for an Envoy's Cluster, as
// istiod builds it (cluster_tls.go): endpoints whose metadata says
// tlsMode istio (envoy.transport_socket_match) get Istio mTLS with the
// workload certificate and roots by SDS over ADS, Istio's SNI and the
// destination's identities verified (peerSANs); every other endpoint
// plaintext.
func envoyTransportSockets(sans []*matcherv3.StringMatcher, sni string, h2 bool) []*clusterv3.Cluster_TransportSocketMatch {
	alpn := alpnInMesh
	if h2 {
		alpn = alpnInMeshH2
	}
	sds := func(name string) *tlsv3.SdsSecretConfig {
		return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: adsSource}
	}
	typed := make([]*tlsv3.SubjectAltNameMatcher, len(sans))
	for i, m := range sans {
		typed[i] = &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI, Matcher: m}
	}
	mtls := &tlsv3.UpstreamTlsContext{
		CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sds(SDSWorkloadCert)},
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: typed},
				ValidationContextSdsSecretConfig: sds(SDSRoots),
			}},
			AlpnProtocols: alpn,
		},
		Sni: sni,
	}
	return []*clusterv3.Cluster_TransportSocketMatch{
		{
			Name:  "tlsMode-" + tlsModeIstio,
			Match: &structpb.Struct{Fields: map[string]*structpb.Value{tlsModeKey: structpb.NewStringValue(tlsModeIstio)}},
			TransportSocket: &corev3.TransportSocket{
				Name:       transportSocketName,
				ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(mtls)},
			},
		},
		{
			Name: "tlsMode-disabled",
			TransportSocket: &corev3.TransportSocket{
				Name:       "envoy.transport_sockets.raw_buffer",
				ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&rawbufferv3.RawBuffer{})},
			},
		},
	}
}

// Proxyless reports whether a node is a proxyless gRPC client.
func Proxyless(node *corev3.Node) bool {
	if node.GetMetadata().GetFields()["GENERATOR"].GetStringValue() == "grpc" {
		return true
	}
	return strings.HasPrefix(node.GetUserAgentName(), "gRPC ")
}

// transportSocketName is the only transport socket name grpc-go accepts
// (gRFC A29; Istio's grpcgen uses it too).
const transportSocketName = "envoy.transport_sockets.tls"

// Certificate provider names, as Istio's agent writes them into the gRPC
// bootstrap: one file_watcher instance "default" holds the workload's key,
// certificate chain and roots; the certificate names "default" (identity)
// and "ROOTCA" (roots) are passed to it and ignored by file_watcher.
const (
	certProviderInstance = "default"
	identityCertName     = "default"
	rootCertName         = "ROOTCA"
)

// commonTLSContext is Istio's grpcgen buildCommonTLSContext in the shape
// every generated resource must have to pass Envoy's validation: the
// identity and roots from certificate provider instances (gRFC A29's
// fields, which grpc-go reads first), the roots and the peer SAN matchers
// (clients only: a gRPC server NACKs them) in a validation_context. Istio
// puts them in a combined_validation_context without an SDS config, with
// its deprecated provider fields beside them for gRPC clients older than
// 1.66; Envoy's validation refuses a combined context without SDS, so the
// hub sends only the current fields.
func commonTLSContext(sans []*matcherv3.StringMatcher) *tlsv3.CommonTlsContext {
	return &tlsv3.CommonTlsContext{
		TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{
			InstanceName: certProviderInstance, CertificateName: identityCertName,
		},
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			//lint:ignore SA1019 grpc-go (1.85) reads only match_subject_alt_names, not the typed matchers that replace it
			MatchSubjectAltNames: sans,
			CaCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{
				InstanceName: certProviderInstance, CertificateName: rootCertName,
			},
		}},
	}
}

// upstreamTLS is the transport socket of a proxyless gRPC client's
// Cluster of a service it reaches with mTLS: the peer must present a certificate our roots
// validate with one of sans.
func upstreamTLS(sans []*matcherv3.StringMatcher, sni string) *corev3.TransportSocket {
	return &corev3.TransportSocket{
		Name: transportSocketName,
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&tlsv3.UpstreamTlsContext{
			CommonTlsContext: commonTLSContext(sans),
			Sni:              sni,
		})},
	}
}

// peerSANs are the identities a client accepts from a service's
// endpoints, as istiod derives them: exactly the service accounts of the
// mesh pods behind every member's view, with those the Service declares
// (Istio's service-account annotations), when every member's view names
// some; else any identity of our trust domain (a prefix match on
// spiffe://<td>/: a view with no mesh pod known, e.g. a member whose
// credentials may not list pods). Our CA issues every member's workloads
// certificates of our trust domain, so a peer of a federated trust domain
// never serves one of our clusters; with exact identities, neither does
// another workload of ours (a gateway that terminates TLS, say).
func peerSANs(trustDomain string, members map[string]*clusters.Service) []*matcherv3.StringMatcher {
	exact, declared := clusters.PeerIdentities(trustDomain, members)
	if !declared {
		return []*matcherv3.StringMatcher{{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://" + trustDomain + "/"}}}
	}
	out := make([]*matcherv3.StringMatcher, 0, len(exact))
	for _, id := range exact {
		out = append(out, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: id}})
	}
	return out
}

// InboundListenerPrefix starts the name of the Listener a proxyless gRPC
// server asks for (Istio's agent writes
// server_listener_resource_name_template "xds.istio.io/grpc/lds/inbound/%s"
// into the gRPC bootstrap; grpc-go puts its listening ip:port in place of %s).
const InboundListenerPrefix = "xds.istio.io/grpc/lds/inbound/"

// maxInboundNameBytes bounds an inbound listener name: the prefix and the
// longest ip:port ("[" IPv6 "]:" port) without a zone.
const maxInboundNameBytes = len(InboundListenerPrefix) + len("[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535")

// ParseInboundName reads the address of an inbound listener name: an IPv4
// or IPv6 address (no zone; unspecified addresses too, for servers
// listening on every interface) and a port 1–65535. Anything else is not an
// inbound listener the hub serves.
func ParseInboundName(name string) (netip.AddrPort, bool) {
	rest, ok := strings.CutPrefix(name, InboundListenerPrefix)
	if !ok || len(name) > maxInboundNameBytes {
		return netip.AddrPort{}, false
	}
	ap, err := netip.ParseAddrPort(rest)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" || ap.String() != rest {
		return netip.AddrPort{}, false
	}
	return ap, true
}

// buildInboundListener is Istio's grpcgen inbound listener for a proxyless
// gRPC server: the address it listens on, one filter chain (mTLS requiring
// a client certificate in STRICT, plaintext otherwise) whose HCM has an
// inline route (virtual host "*", prefix "/", non_forwarding_action), the
// RBAC filters (DENY, then ALLOW; nil: none) and the router filter last. The
// server's certificate and the roots it checks clients with come from its
// certificate provider instance; a client of a federated trust domain is
// accepted when those roots hold that domain's.
func buildInboundListener(name string, addr netip.AddrPort, mode MTLSMode, deny, allow *rbacpb.RBAC) *listenerv3.Listener {
	suffix := "plaintext"
	var ts *corev3.TransportSocket
	if mode == MTLSStrict {
		suffix = "mtls"
		ts = &corev3.TransportSocket{
			Name: transportSocketName,
			ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&tlsv3.DownstreamTlsContext{
				CommonTlsContext:         commonTLSContext(nil),
				RequireClientCertificate: wrapperspb.Bool(true),
			})},
		}
	}
	var filters []*hcmv3.HttpFilter
	if deny != nil {
		filters = append(filters, &hcmv3.HttpFilter{Name: RBACFilterNameDeny, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&rbachttpv3.RBAC{Rules: deny})}})
	}
	if allow != nil {
		filters = append(filters, &hcmv3.HttpFilter{Name: RBACFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&rbachttpv3.RBAC{Rules: allow})}})
	}
	filters = append(filters, &hcmv3.HttpFilter{
		Name:       "envoy.filters.http.router",
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
	})
	hcm := &hcmv3.HttpConnectionManager{
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		StatPrefix: "inbound_" + strconv.Itoa(int(addr.Port())),
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: "inbound",
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    "inbound",
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_NonForwardingAction{NonForwardingAction: &routev3.NonForwardingAction{}},
				}},
			}},
		}},
		HttpFilters: filters,
	}
	return &listenerv3.Listener{
		Name: name,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address:       addr.Addr().String(),
			PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(addr.Port())},
		}}},
		FilterChains: []*listenerv3.FilterChain{{
			Name: "inbound-" + suffix,
			Filters: []*listenerv3.Filter{{
				Name:       "inbound-hcm" + suffix,
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)},
			}},
			TransportSocket: ts,
		}},
	}
}

// The names of the RBAC filters of an inbound listener, as istiod's grpcgen
// names them.
const (
	RBACFilterName     = "envoy.filters.http.rbac"
	RBACFilterNameDeny = "envoy.filters.http.rbac.DENY"
)

// TrustDomainSource tells the Generator our trust domain, whose
// identities proxyless gRPC clients accept under STRICT (the hub's
// authn.RootSource is one).
type TrustDomainSource interface {
	// LocalTrustDomain is our trust domain's name.
	LocalTrustDomain() string
}

// SetMTLS sets the Generator's mesh-wide mTLS mode where no
// PeerAuthentication sets one (see SetSecurity) and Istio's root namespace
// (whose policies apply mesh-wide), before it serves anything; roots (nil: none) gives our trust domain, which mTLS needs:
// without it, proxyless gRPC clients never use mTLS.
func (g *Generator) SetMTLS(mode MTLSMode, roots TrustDomainSource, rootNamespace string) error {
	mode, err := ParseMTLSMode(string(mode))
	if err != nil {
		return err
	}
	if roots != nil {
		g.trustDomain = roots.LocalTrustDomain()
	}
	if mode == MTLSStrict && g.trustDomain == "" {
		return errors.New("mTLS mode STRICT needs the local trust domain (Options.Roots)")
	}
	g.meshDefault, g.rootNamespace = mode, rootNamespace
	g.security = authz.NewSet(g.rootNamespace, mode, g.trustDomains(), nil, nil)
	return nil
}

// trustDomains is the bundle principals are mapped with: ours, for
// which Istio's "cluster.local" stands.
func (g *Generator) trustDomains() authz.TrustDomainBundle {
	if g.trustDomain == "" {
		return authz.TrustDomainBundle{}
	}
	return authz.TrustDomainBundle{TrustDomains: []string{g.trustDomain}}
}
