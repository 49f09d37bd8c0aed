package mcp

import "testing"

func TestIsConfigType(t *testing.T) {
	istiod := IstiodTypes()
	for _, typeURL := range append(istiod[:],
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
