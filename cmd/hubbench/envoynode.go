package main

import (
	"cmp"
	_ "embed"
	"fmt"
	"slices"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// The node of the envoy shape: what a real Envoy sends, with the metadata
// of an Istio sidecar.
//
// Envoy puts one Extension {name, category, type_urls} into
// Node.extensions for every factory compiled into it (Envoy's
// source/server/server.cc): the upstream Envoy 1.40 of make test lists
// 516, a 63 KB node. What the node carries besides what the
// bootstrap sets (its extensions, build version and client features) is
// recorded from that real Envoy in envoyNodeFile, which
// TestEnvoyShapeMatchesRealEnvoy keeps true. With SotW the node goes on
// the stream's first request only (set_node_on_first_message_only); so it
// does with Delta since Envoy 1.38 (envoyproxy/envoy#42650; the recording
// shows it), while Envoy before 1.38 merged it into every Delta request,
// ACKs included (envoyproxy/envoy#14976; --delta-node-every-request).
// ../shared/reference/push-floor.md §1 has the sources.

// envoyNodeFile is the recorded part of the real Envoy's node.
const envoyNodeFile = "envoy-1.40.0-node.json"

//go:embed envoy-1.40.0-node.json
var envoyNodeJSON []byte

// envoyNodeTemplate is the shared part of every envoy-shape stream's node:
// built once, never modified.
var envoyNodeTemplate = func() *corev3.Node {
	n := &corev3.Node{}
	if err := protojson.Unmarshal(envoyNodeJSON, n); err != nil {
		panic(fmt.Sprintf("%s: %v", envoyNodeFile, err))
	}
	return n
}()

// envoyNodeShared is the part of a node that envoyNodeFile records, its
// extensions sorted by category and name (Envoy lists them in the order of
// its factory registry, which a rebuild may change).
func envoyNodeShared(n *corev3.Node) *corev3.Node {
	exts := slices.Clone(n.GetExtensions())
	slices.SortStableFunc(exts, func(a, b *corev3.Extension) int {
		return cmp.Or(cmp.Compare(a.GetCategory(), b.GetCategory()), cmp.Compare(a.GetName(), b.GetName()))
	})
	return &corev3.Node{UserAgentName: n.GetUserAgentName(), UserAgentVersionType: n.GetUserAgentVersionType(),
		Extensions: exts, ClientFeatures: n.GetClientFeatures()}
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
