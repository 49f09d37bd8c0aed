package envoy

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// XDSCluster is the name of the static cluster ADS bootstraps reach the xDS
// server through.
const XDSCluster = "xds-grpc"

// ADS builds the bootstrap of an Envoy that gets its config over ADS from
// one xDS server (the hub): CDS always, LDS when LDS is set, and EDS and RDS
// as the clusters and listeners ask.
type ADS struct {
	NodeID, NodeCluster string
	// Metadata is the node's metadata, e.g. CLUSTER_ID, NAMESPACE, NETWORK.
	Metadata map[string]string
	Locality Locality
	// XDSAddr is the xDS server, "host:port" (an IP, or a name Envoy
	// resolves with DNS).
	XDSAddr string
	// Delta selects incremental xDS (DELTA_GRPC) over state of the world
	// (GRPC).
	Delta                     bool
	SetNodeOnFirstMessageOnly bool
	// TLS, when set, makes the xDS connection TLS (mTLS with a client
	// certificate); nil means plaintext.
	TLS *TLSFiles
	// InitialFetchTimeout, when set, is CDS's and LDS's initial fetch
	// timeout (0 waits forever); nil leaves Envoy's default (15 s).
	InitialFetchTimeout *time.Duration
	// LDS sets lds_config to ADS; without it Envoy asks for no listeners.
	LDS bool
	// StaticListeners and StaticClusters go in static_resources (after
	// XDSCluster).
	StaticListeners []*listenerv3.Listener
	StaticClusters  []*clusterv3.Cluster
}

// Locality is a node's or a host's locality.
type Locality struct {
	Region, Zone, SubZone string
}

// TLSFiles are the PEM files of an xDS connection's TLS.
type TLSFiles struct {
	// CertFile and KeyFile are the client certificate (chain) and its key;
	// empty means no client certificate.
	CertFile, KeyFile string
	// CAFile holds the roots the server's certificate must chain to; empty
	// means the server's certificate is not verified.
	CAFile string
	// ServerName is sent as SNI.
	ServerName string
}

// LoopbackAdmin is the admin every bootstrap here uses: 127.0.0.1, port 0
// (Start reads the port Envoy chose from the admin address file).
func LoopbackAdmin() *bootstrapv3.Admin {
	return &bootstrapv3.Admin{Address: SocketAddress("127.0.0.1", 0)}
}

// Marshal renders a bootstrap as JSON (proto field names, indented), for
// Options.Bootstrap.
func Marshal(b *bootstrapv3.Bootstrap) ([]byte, error) {
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("invalid bootstrap: %w", err)
	}
	return protojson.MarshalOptions{UseProtoNames: true, Indent: "  "}.Marshal(b)
}

// Bootstrap returns the bootstrap proto.
func (a ADS) Bootstrap() (*bootstrapv3.Bootstrap, error) {
	if a.XDSAddr == "" {
		return nil, errors.New("envoy: ADS.XDSAddr is empty")
	}
	host, portStr, err := net.SplitHostPort(a.XDSAddr)
	if err != nil {
		return nil, fmt.Errorf("envoy: ADS.XDSAddr %q: %w", a.XDSAddr, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("envoy: ADS.XDSAddr %q: bad port: %w", a.XDSAddr, err)
	}
	node := &corev3.Node{Id: a.NodeID, Cluster: a.NodeCluster}
	if len(a.Metadata) > 0 {
		fields := make(map[string]*structpb.Value, len(a.Metadata))
		for k, v := range a.Metadata {
			fields[k] = structpb.NewStringValue(v)
		}
		node.Metadata = &structpb.Struct{Fields: fields}
	}
	if a.Locality != (Locality{}) {
		node.Locality = &corev3.Locality{Region: a.Locality.Region, Zone: a.Locality.Zone, SubZone: a.Locality.SubZone}
	}

	apiType := corev3.ApiConfigSource_GRPC
	if a.Delta {
		apiType = corev3.ApiConfigSource_DELTA_GRPC
	}
	dyn := &bootstrapv3.Bootstrap_DynamicResources{
		AdsConfig: &corev3.ApiConfigSource{
			ApiType:             apiType,
			TransportApiVersion: corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{
				TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: XDSCluster}},
			}},
			SetNodeOnFirstMessageOnly: a.SetNodeOnFirstMessageOnly,
		},
		CdsConfig: adsSource(a.InitialFetchTimeout),
	}
	if a.LDS {
		dyn.LdsConfig = adsSource(a.InitialFetchTimeout)
	}

	xds := StaticCluster(XDSCluster, host, uint32(port))
	if net.ParseIP(host) == nil {
		xds.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS}
	}
	xds.TypedExtensionProtocolOptions = map[string]*anypb.Any{
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
				ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
						Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
					},
				},
			},
		}),
	}
	if a.TLS != nil {
		xds.TransportSocket = a.TLS.transportSocket()
	}

	return &bootstrapv3.Bootstrap{
		Node:  node,
		Admin: LoopbackAdmin(),
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: append([]*listenerv3.Listener(nil), a.StaticListeners...),
			Clusters:  append([]*clusterv3.Cluster{xds}, a.StaticClusters...),
		},
		DynamicResources: dyn,
	}, nil
}

// JSON returns the bootstrap as JSON, for Options.Bootstrap.
func (a ADS) JSON() ([]byte, error) {
	b, err := a.Bootstrap()
	if err != nil {
		return nil, err
	}
	return Marshal(b)
}

func (t *TLSFiles) transportSocket() *corev3.TransportSocket {
	common := &tlsv3.CommonTlsContext{}
	if t.CertFile != "" || t.KeyFile != "" {
		common.TlsCertificates = []*tlsv3.TlsCertificate{{
			CertificateChain: fileSource(t.CertFile),
			PrivateKey:       fileSource(t.KeyFile),
		}}
	}
	if t.CAFile != "" {
		common.ValidationContextType = &tlsv3.CommonTlsContext_ValidationContext{
			ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: fileSource(t.CAFile)},
		}
	}
	return &corev3.TransportSocket{
		Name: "envoy.transport_sockets.tls",
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&tlsv3.UpstreamTlsContext{
			CommonTlsContext: common,
			Sni:              t.ServerName,
		})},
	}
}

func fileSource(name string) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: name}}
}

// adsSource is "from ADS", with an initial fetch timeout when given.
func adsSource(initialFetchTimeout *time.Duration) *corev3.ConfigSource {
	cs := &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}
	if initialFetchTimeout != nil {
		cs.InitialFetchTimeout = durationpb.New(*initialFetchTimeout)
	}
	return cs
}

// SocketAddress is a TCP address.
func SocketAddress(addr string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       addr,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// StaticCluster is a STATIC cluster of one host, addr (an IP) and port.
func StaticCluster(name, addr string, port uint32) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(time.Second),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{
				LbEndpoints: []*endpointv3.LbEndpoint{{
					HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: SocketAddress(addr, port)}},
				}},
			}},
		},
	}
}

// HTTPListener is a listener on addr:port with an HTTP connection manager
// (HTTP/1.1 or HTTP/2, whichever the client speaks) and the router filter.
// With ads its routes are the route configuration routeConfigName from RDS
// over ADS; without, an inline route configuration of that name with no
// virtual hosts (every request gets 404 until the listener is replaced).
func HTTPListener(name, addr string, port uint32, routeConfigName string, ads bool) *listenerv3.Listener {
	hcm := httpConnectionManager(name)
	if ads {
		hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    adsSource(nil),
			RouteConfigName: routeConfigName,
		}}
	} else {
		hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{Name: routeConfigName}}
	}
	return listener(name, addr, port, "envoy.filters.network.http_connection_manager", hcm)
}

// DirectResponseListener is an HTTP listener on addr:port that answers
// every request itself with status and body (a stand-in backend).
func DirectResponseListener(name, addr string, port uint32, status uint32, body string) *listenerv3.Listener {
	hcm := httpConnectionManager(name)
	hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    name,
			Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
					Status: status,
					Body:   &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: body}},
				}},
			}},
		}},
	}}
	return listener(name, addr, port, "envoy.filters.network.http_connection_manager", hcm)
}

// TCPListener is a listener on addr:port that proxies every connection to
// cluster (tcp_proxy).
func TCPListener(name, addr string, port uint32, cluster string) *listenerv3.Listener {
	return listener(name, addr, port, "envoy.filters.network.tcp_proxy", &tcpproxyv3.TcpProxy{
		StatPrefix:       name,
		ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: cluster},
	})
}

func httpConnectionManager(statPrefix string) *hcmv3.HttpConnectionManager {
	return &hcmv3.HttpConnectionManager{
		StatPrefix: statPrefix,
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		HttpFilters: []*hcmv3.HttpFilter{{
			Name:       "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
		}},
	}
}

func listener(name, addr string, port uint32, filterName string, filter proto.Message) *listenerv3.Listener {
	return &listenerv3.Listener{
		Name:    name,
		Address: SocketAddress(addr, port),
		FilterChains: []*listenerv3.FilterChain{{
			Filters: []*listenerv3.Filter{{
				Name:       filterName,
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(filter)},
			}},
		}},
	}
}

// mustAny wraps a message in an Any; it cannot fail for a generated type.
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}

// IstioMTLSALPN are the ALPN values an Istio east-west gateway's
// AUTO_PASSTHROUGH filter chains match besides the SNI (istiod's
// gateway.go: mTLS from a sidecar, with or without metadata exchange).
var IstioMTLSALPN = []string{"istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"}

// PassthroughGateway is a listener on addr:port shaped as istiod builds an
// east-west gateway's AUTO_PASSTHROUGH listener: a TLS inspector, then one
// filter chain per server name (routes: SNI → cluster) that also matches
// IstioMTLSALPN and extraALPN, proxying the connection to the cluster
// without terminating TLS. A connection whose SNI or ALPN matches no chain
// is closed. With extraALPN "h2" it is the gateway as
// deploy/eastwest-proxyless-alpn.yaml leaves it, which proxyless gRPC
// clients cross.
func PassthroughGateway(name, addr string, port uint32, routes map[string]string, extraALPN ...string) *listenerv3.Listener {
	l := &listenerv3.Listener{
		Name:    name,
		Address: SocketAddress(addr, port),
		ListenerFilters: []*listenerv3.ListenerFilter{{
			Name:       "envoy.filters.listener.tls_inspector",
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspectorv3.TlsInspector{})},
		}},
	}
	for _, sni := range slices.Sorted(maps.Keys(routes)) {
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
			Name:             sni,
			FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{sni}, ApplicationProtocols: slices.Concat(IstioMTLSALPN, extraALPN)},
			Filters: []*listenerv3.Filter{{
				Name: "envoy.filters.network.tcp_proxy",
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxyv3.TcpProxy{
					StatPrefix:       sni,
					ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: routes[sni]},
				})},
			}},
		})
	}
	return l
}
