package main

import (
	"fmt"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// The node of the envoy shape: what an Istio sidecar's Envoy sends.
//
// Envoy puts one Extension {name, category, type_urls} into
// Node.extensions for every factory compiled into it (Envoy's
// source/server/server.cc), so an Istio proxy's node is 11–23 KB
// (envoyproxy/envoy#15838, #12138). Istio's bootstrap sets
// set_node_on_first_message_only, which SotW honours: the node goes on the
// stream's first request only. Envoy's legacy Delta mux ignored that
// until Envoy 1.38 (envoyproxy/envoy#14976, fixed by #42650) and merged
// the node into every Delta request, ACKs included; istio-agent forwards
// Envoy's Delta requests upstream unchanged. ../shared/reference/
// push-floor.md §1 has the sources.

// envoyExtensions are extensions an Istio proxy (Envoy 1.3x) lists in its
// node: category → name → config type (the type_urls Envoy reports are
// full message names, without type.googleapis.com/): about 130 of the
// categories a control plane's configuration touches. A full Envoy build
// lists more categories (matchers, formatters, resource monitors, ...)
// and every deprecated alias of a name; those are left out.
var envoyExtensions = []struct{ category, names string }{
	{"envoy.filters.http", `
envoy.filters.http.router envoy.extensions.filters.http.router.v3.Router
envoy.filters.http.cors envoy.extensions.filters.http.cors.v3.Cors
envoy.filters.http.fault envoy.extensions.filters.http.fault.v3.HTTPFault
envoy.filters.http.grpc_stats envoy.extensions.filters.http.grpc_stats.v3.FilterConfig
envoy.filters.http.grpc_web envoy.extensions.filters.http.grpc_web.v3.GrpcWeb
envoy.filters.http.grpc_json_transcoder envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder
envoy.filters.http.ext_authz envoy.extensions.filters.http.ext_authz.v3.ExtAuthz
envoy.filters.http.ext_proc envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
envoy.filters.http.jwt_authn envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
envoy.filters.http.rbac envoy.extensions.filters.http.rbac.v3.RBAC
envoy.filters.http.local_ratelimit envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
envoy.filters.http.ratelimit envoy.extensions.filters.http.ratelimit.v3.RateLimit
envoy.filters.http.lua envoy.extensions.filters.http.lua.v3.Lua
envoy.filters.http.wasm envoy.extensions.filters.http.wasm.v3.Wasm
envoy.filters.http.compressor envoy.extensions.filters.http.compressor.v3.Compressor
envoy.filters.http.decompressor envoy.extensions.filters.http.decompressor.v3.Decompressor
envoy.filters.http.header_to_metadata envoy.extensions.filters.http.header_to_metadata.v3.Config
envoy.filters.http.health_check envoy.extensions.filters.http.health_check.v3.HealthCheck
envoy.filters.http.buffer envoy.extensions.filters.http.buffer.v3.Buffer
envoy.filters.http.csrf envoy.extensions.filters.http.csrf.v3.CsrfPolicy
envoy.filters.http.dynamic_forward_proxy envoy.extensions.filters.http.dynamic_forward_proxy.v3.FilterConfig
envoy.filters.http.original_src envoy.extensions.filters.http.original_src.v3.OriginalSrc
envoy.filters.http.tap envoy.extensions.filters.http.tap.v3.Tap
envoy.filters.http.oauth2 envoy.extensions.filters.http.oauth2.v3.OAuth2
envoy.filters.http.set_metadata envoy.extensions.filters.http.set_metadata.v3.Config
envoy.filters.http.stateful_session envoy.extensions.filters.http.stateful_session.v3.StatefulSession
envoy.filters.http.admission_control envoy.extensions.filters.http.admission_control.v3.AdmissionControl
envoy.filters.http.bandwidth_limit envoy.extensions.filters.http.bandwidth_limit.v3.BandwidthLimit
envoy.filters.http.composite envoy.extensions.filters.http.composite.v3.Composite
envoy.filters.http.header_mutation envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
envoy.filters.http.custom_response envoy.extensions.filters.http.custom_response.v3.CustomResponse
envoy.filters.http.grpc_field_extraction envoy.extensions.filters.http.grpc_field_extraction.v3.GrpcFieldExtractionConfig
envoy.filters.http.connect_grpc_bridge envoy.extensions.filters.http.connect_grpc_bridge.v3.FilterConfig
envoy.filters.http.alternate_protocols_cache envoy.extensions.filters.http.alternate_protocols_cache.v3.FilterConfig
envoy.filters.http.basic_auth envoy.extensions.filters.http.basic_auth.v3.BasicAuth
envoy.filters.http.credential_injector envoy.extensions.filters.http.credential_injector.v3.CredentialInjector
envoy.filters.http.gcp_authn envoy.extensions.filters.http.gcp_authn.v3.GcpAuthnFilterConfig
envoy.filters.http.on_demand envoy.extensions.filters.http.on_demand.v3.OnDemand
istio.alpn io.istio.http.alpn.v2alpha1.FilterConfig
istio.metadata_exchange io.istio.http.peer_metadata.Config
istio.stats stats.PluginConfig
envoy.filters.http.peer_metadata io.istio.http.peer_metadata.Config
`},
	{"envoy.filters.network", `
envoy.filters.network.http_connection_manager envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
envoy.filters.network.tcp_proxy envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
envoy.filters.network.rbac envoy.extensions.filters.network.rbac.v3.RBAC
envoy.filters.network.ext_authz envoy.extensions.filters.network.ext_authz.v3.ExtAuthz
envoy.filters.network.local_ratelimit envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit
envoy.filters.network.ratelimit envoy.extensions.filters.network.ratelimit.v3.RateLimit
envoy.filters.network.connection_limit envoy.extensions.filters.network.connection_limit.v3.ConnectionLimit
envoy.filters.network.mongo_proxy envoy.extensions.filters.network.mongo_proxy.v3.MongoProxy
envoy.filters.network.redis_proxy envoy.extensions.filters.network.redis_proxy.v3.RedisProxy
envoy.filters.network.dubbo_proxy envoy.extensions.filters.network.dubbo_proxy.v3.DubboProxy
envoy.filters.network.thrift_proxy envoy.extensions.filters.network.thrift_proxy.v3.ThriftProxy
envoy.filters.network.zookeeper_proxy envoy.extensions.filters.network.zookeeper_proxy.v3.ZooKeeperProxy
envoy.filters.network.sni_cluster envoy.extensions.filters.network.sni_cluster.v3.SniCluster
envoy.filters.network.sni_dynamic_forward_proxy envoy.extensions.filters.network.sni_dynamic_forward_proxy.v3.FilterConfig
envoy.filters.network.wasm envoy.extensions.filters.network.wasm.v3.Wasm
envoy.filters.network.echo envoy.extensions.filters.network.echo.v3.Echo
envoy.filters.network.direct_response envoy.extensions.filters.network.direct_response.v3.Config
envoy.filters.network.set_filter_state envoy.extensions.filters.network.set_filter_state.v3.Config
istio.metadata_exchange envoy.tcp.metadataexchange.config.MetadataExchange
envoy.filters.network.metadata_exchange envoy.tcp.metadataexchange.config.MetadataExchange
`},
	{"envoy.filters.listener", `
envoy.filters.listener.http_inspector envoy.extensions.filters.listener.http_inspector.v3.HttpInspector
envoy.filters.listener.original_dst envoy.extensions.filters.listener.original_dst.v3.OriginalDst
envoy.filters.listener.original_src envoy.extensions.filters.listener.original_src.v3.OriginalSrc
envoy.filters.listener.proxy_protocol envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol
envoy.filters.listener.tls_inspector envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector
envoy.filters.listener.local_ratelimit envoy.extensions.filters.listener.local_ratelimit.v3.LocalRateLimit
`},
	{"envoy.transport_sockets.upstream", `
envoy.transport_sockets.tls envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
envoy.transport_sockets.raw_buffer envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer
envoy.transport_sockets.tap envoy.extensions.transport_sockets.tap.v3.Tap
envoy.transport_sockets.http_11_proxy envoy.extensions.transport_sockets.http_11_proxy.v3.Http11ProxyUpstreamTransport
envoy.transport_sockets.upstream_proxy_protocol envoy.extensions.transport_sockets.proxy_protocol.v3.ProxyProtocolUpstreamTransport
envoy.transport_sockets.internal_upstream envoy.extensions.transport_sockets.internal_upstream.v3.InternalUpstreamTransport
envoy.transport_sockets.tcp_stats envoy.extensions.transport_sockets.tcp_stats.v3.Config
envoy.transport_sockets.quic envoy.extensions.transport_sockets.quic.v3.QuicUpstreamTransport
`},
	{"envoy.transport_sockets.downstream", `
envoy.transport_sockets.tls envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
envoy.transport_sockets.raw_buffer envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer
envoy.transport_sockets.tap envoy.extensions.transport_sockets.tap.v3.Tap
envoy.transport_sockets.tcp_stats envoy.extensions.transport_sockets.tcp_stats.v3.Config
envoy.transport_sockets.starttls envoy.extensions.transport_sockets.starttls.v3.StartTlsConfig
envoy.transport_sockets.quic envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport
`},
	{"envoy.access_loggers", `
envoy.access_loggers.file envoy.extensions.access_loggers.file.v3.FileAccessLog
envoy.access_loggers.stdout envoy.extensions.access_loggers.stream.v3.StdoutAccessLog
envoy.access_loggers.stderr envoy.extensions.access_loggers.stream.v3.StderrAccessLog
envoy.access_loggers.http_grpc envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig
envoy.access_loggers.tcp_grpc envoy.extensions.access_loggers.grpc.v3.TcpGrpcAccessLogConfig
envoy.access_loggers.open_telemetry envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig
envoy.access_loggers.wasm envoy.extensions.access_loggers.wasm.v3.WasmAccessLog
`},
	{"envoy.tracers", `
envoy.tracers.zipkin envoy.config.trace.v3.ZipkinConfig
envoy.tracers.datadog envoy.config.trace.v3.DatadogConfig
envoy.tracers.opentelemetry envoy.config.trace.v3.OpenTelemetryConfig
`},
	{"envoy.clusters", `
envoy.cluster.eds envoy.config.cluster.v3.Cluster
envoy.cluster.static envoy.config.cluster.v3.Cluster
envoy.cluster.strict_dns envoy.config.cluster.v3.Cluster
envoy.cluster.logical_dns envoy.config.cluster.v3.Cluster
envoy.cluster.original_dst envoy.config.cluster.v3.Cluster
envoy.clusters.aggregate envoy.extensions.clusters.aggregate.v3.ClusterConfig
envoy.clusters.dynamic_forward_proxy envoy.extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig
`},
	{"envoy.upstreams", `
envoy.upstreams.http.http_protocol_options envoy.extensions.upstreams.http.v3.HttpProtocolOptions
envoy.upstreams.http.generic envoy.extensions.upstreams.http.generic.v3.GenericConnectionPoolProto
envoy.upstreams.http.http envoy.extensions.upstreams.http.http.v3.HttpConnectionPoolProto
envoy.upstreams.http.tcp envoy.extensions.upstreams.http.tcp.v3.TcpConnectionPoolProto
envoy.upstreams.tcp.generic envoy.extensions.upstreams.tcp.generic.v3.GenericConnectionPoolProto
`},
	{"envoy.compression.compressor", `
envoy.compression.gzip.compressor envoy.extensions.compression.gzip.compressor.v3.Gzip
envoy.compression.brotli.compressor envoy.extensions.compression.brotli.compressor.v3.Brotli
envoy.compression.zstd.compressor envoy.extensions.compression.zstd.compressor.v3.Zstd
`},
	{"envoy.compression.decompressor", `
envoy.compression.gzip.decompressor envoy.extensions.compression.gzip.decompressor.v3.Gzip
envoy.compression.brotli.decompressor envoy.extensions.compression.brotli.decompressor.v3.Brotli
envoy.compression.zstd.decompressor envoy.extensions.compression.zstd.decompressor.v3.Zstd
`},
	{"envoy.stats_sinks", `
envoy.stat_sinks.statsd envoy.config.metrics.v3.StatsdSink
envoy.stat_sinks.dog_statsd envoy.config.metrics.v3.DogStatsdSink
envoy.stat_sinks.metrics_service envoy.config.metrics.v3.MetricsServiceConfig
envoy.stat_sinks.open_telemetry envoy.extensions.stat_sinks.open_telemetry.v3.SinkConfig
envoy.stat_sinks.wasm envoy.extensions.stat_sinks.wasm.v3.Wasm
`},
	{"envoy.health_checkers", `
envoy.health_checkers.redis envoy.extensions.health_checkers.redis.v3.Redis
envoy.health_checkers.thrift envoy.extensions.health_checkers.thrift.v3.Thrift
envoy.health_checkers.http envoy.config.core.v3.HealthCheck.HttpHealthCheck
envoy.health_checkers.tcp envoy.config.core.v3.HealthCheck.TcpHealthCheck
envoy.health_checkers.grpc envoy.config.core.v3.HealthCheck.GrpcHealthCheck
`},
	{"envoy.retry_host_predicates", `
envoy.retry_host_predicates.previous_hosts envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate
envoy.retry_host_predicates.omit_canary_hosts envoy.extensions.retry.host.omit_canary_hosts.v3.OmitCanaryHostsPredicate
envoy.retry_host_predicates.omit_host_metadata envoy.extensions.retry.host.omit_host_metadata.v3.OmitHostMetadataConfig
`},
	{"envoy.retry_priorities", `
envoy.retry_priorities.previous_priorities envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig
`},
	{"envoy.resolvers", `
envoy.ip envoy.config.core.v3.SocketAddress
`},
	{"envoy.bootstrap", `
envoy.bootstrap.wasm envoy.extensions.wasm.v3.WasmService
envoy.bootstrap.internal_listener envoy.extensions.bootstrap.internal_listener.v3.InternalListener
envoy.bootstrap.internal_listener_registry envoy.extensions.bootstrap.internal_listener.v3.InternalListener
`},
	{"envoy.tls.cert_validator", `
envoy.tls.cert_validator.default 
envoy.tls.cert_validator.spiffe envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig
`},
}

// istioProxyVersion is the Envoy build an Istio 1.26 proxy reports
// (user_agent_build_version); Envoy 1.34 repeats its node in Delta.
var istioProxyVersion = &typev3.SemanticVersion{MajorNumber: 1, MinorNumber: 34, Patch: 1}

// envoyNodeTemplate is the shared part of every envoy-shape stream's node:
// built once, never modified.
var envoyNodeTemplate = buildEnvoyNodeTemplate()

func buildEnvoyNodeTemplate() *corev3.Node {
	n := &corev3.Node{
		UserAgentName: "envoy",
		UserAgentVersionType: &corev3.Node_UserAgentBuildVersion{UserAgentBuildVersion: &corev3.BuildVersion{
			Version: istioProxyVersion,
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				"revision.sha":    structpb.NewStringValue("3d5f8a1c9b7e2f4d6a0c8e1b3f5d7a9c2e4b6d8f"),
				"revision.status": structpb.NewStringValue("Clean"),
				"build.type":      structpb.NewStringValue("RELEASE"),
				"ssl.version":     structpb.NewStringValue("BoringSSL"),
			}},
		}},
		ClientFeatures: []string{"envoy.lb.does_not_support_overprovisioning", "envoy.lrs.supports_send_all_clusters", "envoy.config.supports-resource-ttl"},
	}
	for _, c := range envoyExtensions {
		for _, line := range strings.Split(strings.TrimSpace(c.names), "\n") {
			name, typeURL, _ := strings.Cut(strings.TrimSpace(line), " ")
			e := &corev3.Extension{Name: name, Category: c.category}
			if typeURL != "" {
				e.TypeUrls = []string{typeURL}
			}
			n.Extensions = append(n.Extensions, e)
		}
	}
	return n
}

// envoyNode is the node of an Istio sidecar's Envoy, stream idx of the run,
// running in member cluster clusterID: the shared extensions and Istio's
// node metadata (the keys of Istio's pkg/model NodeMetadata that
// istio-agent fills in for a Kubernetes pod).
func envoyNode(idx int, clusterID, network string) *corev3.Node {
	pod := fmt.Sprintf("hubbench-%05d-7d8f9c6b5-x2x7z", idx)
	ip := address(maxAddresses - 1 - idx%maxAddresses) // pod IPs from the top of the benchmark range, never dialled
	str := structpb.NewStringValue
	strs := func(kv ...string) *structpb.Value {
		f := map[string]*structpb.Value{}
		for i := 0; i+1 < len(kv); i += 2 {
			f[kv[i]] = str(kv[i+1])
		}
		return structpb.NewStructValue(&structpb.Struct{Fields: f})
	}
	md := map[string]*structpb.Value{
		"CLUSTER_ID":                    str(clusterID),
		"NAMESPACE":                     str(benchNamespace),
		"NAME":                          str(pod),
		"WORKLOAD_NAME":                 str("hubbench"),
		"OWNER":                         str("kubernetes://apis/apps/v1/namespaces/" + benchNamespace + "/deployments/hubbench"),
		"SERVICE_ACCOUNT":               str("default"),
		"NODE_NAME":                     str("node-0"),
		"INSTANCE_IPS":                  str(ip + ",fd00:10:244:1::1a"),
		"ISTIO_VERSION":                 str("1.26.2"),
		"ISTIO_PROXY_SHA":               str("3d5f8a1c9b7e2f4d6a0c8e1b3f5d7a9c2e4b6d8f"),
		"MESH_ID":                       str("cluster.local"),
		"NETWORK":                       str(network),
		"INTERCEPTION_MODE":             str("REDIRECT"),
		"APP_CONTAINERS":                str("app"),
		"POD_PORTS":                     str(`[{"name":"http","containerPort":8080,"protocol":"TCP"}]`),
		"ENVOY_STATUS_PORT":             structpb.NewNumberValue(15021),
		"ENVOY_PROMETHEUS_PORT":         structpb.NewNumberValue(15090),
		"PILOT_SAN":                     structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{str("istiod.istio-system.svc")}}),
		"PROXY_XDS_VIA_AGENT":           str("true"),
		"ENVOY_SKIP_DEPRECATED_LOGS":    str("true"),
		"METADATA_DISCOVERY":            str("true"),
		"DNS_CAPTURE":                   str("true"),
		"DNS_AUTO_ALLOCATE":             str("true"),
		"WORKLOAD_IDENTITY_SOCKET_FILE": str("socket"),
		"LABELS": strs("app", "hubbench", "version", "v1", "pod-template-hash", "7d8f9c6b5",
			"security.istio.io/tlsMode", "istio", "service.istio.io/canonical-name", "hubbench",
			"service.istio.io/canonical-revision", "v1", "topology.istio.io/cluster", clusterID),
		"ANNOTATIONS": strs("kubectl.kubernetes.io/default-container", "app",
			"kubectl.kubernetes.io/default-logs-container", "app",
			"prometheus.io/path", "/stats/prometheus", "prometheus.io/port", "15020", "prometheus.io/scrape", "true",
			"istio.io/rev", "default",
			"sidecar.istio.io/status", `{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["workload-socket","credential-socket","workload-certs","istio-envoy","istio-data","istio-podinfo","istio-token","istiod-ca-cert"],"imagePullSecrets":null,"revision":"default"}`),
		"PROXY_CONFIG": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"binaryPath": str("/usr/local/bin/envoy"), "configPath": str("./etc/istio/proxy"),
			"controlPlaneAuthPolicy": str("MUTUAL_TLS"), "discoveryAddress": str("istiod.istio-system.svc:15012"),
			"drainDuration": str("45s"), "proxyAdminPort": structpb.NewNumberValue(15000),
			"serviceCluster": str("istio-proxy"), "statNameLength": structpb.NewNumberValue(189),
			"statusPort": structpb.NewNumberValue(15020), "terminationDrainDuration": str("5s"),
			"tracing": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"zipkin": strs("address", "zipkin.istio-system:9411"), // an object, as istiod's ProxyConfig reads it
			}}),
			"holdApplicationUntilProxyStarts": structpb.NewBoolValue(false),
			"meshId":                          str("cluster.local"),
			"image":                           strs("imageType", "default"),
		}}),
	}
	t := envoyNodeTemplate
	// The template's messages are shared, read only (marshalling them
	// from many streams at once is safe).
	return &corev3.Node{
		Id:                   fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.%s", ip, pod, benchNamespace, benchNamespace, domainSuffix),
		Cluster:              "hubbench." + benchNamespace,
		Metadata:             &structpb.Struct{Fields: md},
		Locality:             &corev3.Locality{Region: "region-" + clusterID, Zone: "zone-a"},
		UserAgentName:        t.UserAgentName,
		UserAgentVersionType: t.UserAgentVersionType,
		Extensions:           t.Extensions,
		ClientFeatures:       t.ClientFeatures,
	}
}
