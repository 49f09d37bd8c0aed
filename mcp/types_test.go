package mcp

import "testing"

// istiodTypes are the type URLs istiod (1.24+) subscribes to on its
// config-source stream, in its order (DESIGN.md §3.7).
var istiodTypes = []string{
	"core/v1alpha1/MeshConfig",
	"networking.istio.io/v1/DestinationRule",
	"networking.istio.io/v1alpha3/EnvoyFilter",
	"networking.istio.io/v1/Gateway",
	"networking.istio.io/v1beta1/ProxyConfig",
	"networking.istio.io/v1/ServiceEntry",
	"networking.istio.io/v1/Sidecar",
	"networking.istio.io/v1/VirtualService",
	"networking.istio.io/v1/WorkloadEntry",
	"networking.istio.io/v1/WorkloadGroup",
	"security.istio.io/v1/AuthorizationPolicy",
	"security.istio.io/v1/PeerAuthentication",
	"security.istio.io/v1/RequestAuthentication",
	"telemetry.istio.io/v1/Telemetry",
	"extensions.istio.io/v1alpha1/WasmPlugin",
	"extensions.istio.io/v1alpha1/TrafficExtension",
}

func TestIsConfigType(t *testing.T) {
	for _, typeURL := range append(istiodTypes,
		"networking.istio.io/v1alpha3/ServiceEntry", // pre-1.24 istiods
		"networking.istio.io/v1beta1/ServiceEntry",
		"gateway.networking.k8s.io/v1/HTTPRoute",
		"networking.istio.io/v10beta22/FutureKind",
	) {
		if !IsConfigType(typeURL) {
			t.Errorf("IsConfigType(%q) = false, want true", typeURL)
		}
	}
	for _, typeURL := range []string{
		"", "type.googleapis.com/envoy.config.cluster.v3.Cluster",
		"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
		"networking.istio.io/v1/serviceEntry", // kinds start upper-case
		"networking.istio.io/1/ServiceEntry", "networking.istio.io/v/ServiceEntry",
		"networking.istio.io/v1gamma1/ServiceEntry", "networking.istio.io/v1alpha/ServiceEntry",
		"networking.istio.io/v1/Service/Entry", "Networking.istio.io/v1/ServiceEntry",
		"/v1/ServiceEntry", ".istio.io/v1/ServiceEntry", "networking.istio.io//ServiceEntry",
		"networking.istio.io/v1/Service-Entry",
	} {
		if IsConfigType(typeURL) {
			t.Errorf("IsConfigType(%q) = true, want false", typeURL)
		}
	}
}
