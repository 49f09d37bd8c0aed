package mcp

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/hubmesh/hub/distribute"
)

const (
	kindEnvoyFilter = "EnvoyFilter"

	// GatewayFilterName is the EnvoyFilter every member istiod gets in its
	// root namespace (Options.RootNamespace): see gatewayFilter.
	GatewayFilterName = NamePrefix + "eastwest-proxyless-alpn"

	// EastWestGatewayLabel and EastWestGatewayValue select Istio's
	// east-west gateways: the label gen-eastwest-gateway.sh gives their
	// pods and samples/multicluster/expose-services.yaml's Gateway selects.
	EastWestGatewayLabel = "istio"
	EastWestGatewayValue = "eastwestgateway"

	// eastWestPort is the port of Istio's cross-network Gateway
	// (AUTO_PASSTHROUGH): the port the hub's gateway endpoints name.
	eastWestPort = 15443
)

// gatewayFilter is the EnvoyFilter that lets proxyless gRPC clients cross
// networks through Istio's own east-west gateways. istiod builds a
// gateway's AUTO_PASSTHROUGH filter chains to match the SNI
// outbound_.<port>_.<subset>_.<host> *and* one of Istio's mTLS ALPNs
// (istio, istio-peer-exchange, istio-h2, ...), which only Envoy sidecars
// offer; grpc-go offers h2, which matches no chain, and a connection that
// matches none is closed (e2e TestSidecarsAcrossNetworksThroughRealGateway
// shows a client of an unlisted ALPN closed, and grpc-go passing with the
// filter).
// The filter adds h2 to every such chain's ALPNs (a MERGE appends to a
// repeated field): the gateway then passes grpc-go's TLS connection by SNI
// as it passes a sidecar's. It grants nothing: ALPN is not
// authentication, the connection still ends at the destination, which
// requires the mesh's mTLS, and the chain still admits one SNI only. It
// selects the east-west gateways only (EastWestGatewayLabel), and only
// their 15443 listener, so no other gateway's chains change.
func gatewayFilter(rootNamespace string) (*entry, error) {
	value, err := structpb.NewStruct(map[string]any{
		"filter_chain_match": map[string]any{"application_protocols": []any{"h2"}},
	})
	if err != nil {
		return nil, err
	}
	spec := &networking.EnvoyFilter{
		WorkloadSelector: &networking.WorkloadSelector{Labels: map[string]string{EastWestGatewayLabel: EastWestGatewayValue}},
		ConfigPatches: []*networking.EnvoyFilter_EnvoyConfigObjectPatch{{
			ApplyTo: networking.EnvoyFilter_FILTER_CHAIN,
			Match: &networking.EnvoyFilter_EnvoyConfigObjectMatch{
				Context:     networking.EnvoyFilter_GATEWAY,
				ObjectTypes: &networking.EnvoyFilter_EnvoyConfigObjectMatch_Listener{Listener: &networking.EnvoyFilter_ListenerMatch{PortNumber: eastWestPort}},
			},
			Patch: &networking.EnvoyFilter_Patch{Operation: networking.EnvoyFilter_Patch_MERGE, Value: value},
		}},
	}
	labels := map[string]string{LabelManagedBy: ManagedBy}
	// A fixed creation time: the object changes only with the hub's code,
	// and istiod orders the EnvoyFilters of a namespace by it.
	created := time.Unix(0, 0).UTC()
	version, err := objectVersion(spec, labels, created)
	if err != nil {
		return nil, fmt.Errorf("EnvoyFilter %s: %w", GatewayFilterName, err)
	}
	return marshalObject(rootNamespace+"/"+GatewayFilterName, distribute.Object{Kind: "networking.istio.io/v1alpha3/EnvoyFilter",
		Namespace: rootNamespace, Name: GatewayFilterName, Labels: labels, CreationTimestamp: created, Spec: spec, Version: version})
}
