package hub

import (
	"testing"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// TestLatencyLabel: push latency has one series per served type (one for
// all of Istio config) and none for a type a client names that the hub
// does not push, so that no client can add series.
func TestLatencyLabel(t *testing.T) {
	for typeURL, want := range map[string]string{
		resourcev3.ClusterType:                         "Cluster",
		resourcev3.EndpointType:                        "ClusterLoadAssignment",
		resourcev3.SecretType:                          "Secret",
		"networking.istio.io/v1alpha3/ServiceEntry":    configLabel,
		"security.istio.io/v1beta1/PeerAuthentication": configLabel,
		TypeSyncz: "",
		"type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig": "",
		"": "",
	} {
		if got := latencyLabel(typeURL); got != want {
			t.Errorf("latencyLabel(%q) = %q; want %q", typeURL, got, want)
		}
	}
}
