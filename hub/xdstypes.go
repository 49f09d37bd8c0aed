package hub

import (
	"strings"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hubmesh/hub/mcp"
)

// xdsType is what the hub knows of one type URL. The table below is the
// one place that says which types the hub serves and how: a new type is a
// row.
type xdsType struct {
	// short is the type URL's last path element ("Cluster"); "MCP" for
	// every Istio config type.
	short string
	// label names the type in metrics and messages: short for a type the
	// hub serves, "syncz" for its debug type, "other" for any other, so
	// that a client cannot make series or log keys of its choosing.
	label string
	// rank is the type's place in the order a push answers a stream's
	// watches: the xDS protocol's ("eventual consistency
	// considerations": CDS before the EDS of its clusters, LDS before
	// RDS), then SDS, then the rest (Istio config), as istiod's PushOrder.
	rank int
	// shown is the type's place in the API's list of a proxy's types:
	// LDS, RDS, CDS, EDS, SDS, then the rest by type URL.
	shown int
	// changedOnly says SotW responses to a subscription by name carry only
	// what changed (EDS, RDS, SDS); the others carry the whole state.
	changedOnly bool
	// served says the hub answers it (a watch); debug says it answers it
	// in the stream's loop (TypeSyncz); config says it is Istio config.
	served, debug, config bool
}

// xdsTypes are the xDS types the hub serves, by type URL; Istio config
// (mcp.IsConfigType) and TypeSyncz are classified by xdsTypeOf.
var xdsTypes = map[string]xdsType{
	resourcev3.ClusterType:  {short: "Cluster", rank: 0, shown: 2, served: true},
	resourcev3.EndpointType: {short: "ClusterLoadAssignment", rank: 1, shown: 3, served: true, changedOnly: true},
	resourcev3.ListenerType: {short: "Listener", rank: 2, shown: 0, served: true},
	resourcev3.RouteType:    {short: "RouteConfiguration", rank: 3, shown: 1, served: true, changedOnly: true},
	resourcev3.SecretType:   {short: "Secret", rank: 4, shown: 4, served: true, changedOnly: true},
}

// xdsTypeOf classifies a type URL.
func xdsTypeOf(typeURL string) xdsType {
	if t, ok := xdsTypes[typeURL]; ok {
		t.label = t.short
		return t
	}
	t := xdsType{short: typeURL[strings.LastIndexByte(typeURL, '.')+1:], label: "other", rank: 5, shown: 5}
	switch {
	case mcp.IsConfigType(typeURL):
		t.short, t.label, t.served, t.config = configLabel, configLabel, true, true
	case typeURL == TypeSyncz:
		t.label, t.debug = "syncz", true
	}
	return t
}

// typeLabel names a type URL for metrics and messages (xdsType.label).
func typeLabel(typeURL string) string { return xdsTypeOf(typeURL).label }

// shortType is a type URL's last path element (xdsType.short).
func shortType(typeURL string) string { return xdsTypeOf(typeURL).short }

// latencyLabel names a type URL in the push latency's series: its short
// name for a type the hub serves ("MCP" for every Istio config type), ""
// (not measured) for any other.
func latencyLabel(typeURL string) string {
	if t := xdsTypeOf(typeURL); t.served {
		return t.short
	}
	return ""
}

// isDebugType reports whether the stream's loop answers typeURL itself.
func isDebugType(typeURL string) bool { return typeURL == TypeSyncz }

// served reports whether the hub answers a type URL: the xDS types it
// serves, Istio config and its debug type. Any other is ignored, as istiod
// ignores it (tracker.onUnserved): pilot-agent adds NDS, PCDS and health
// requests of its own to a proxy's stream.
func served(typeURL string) bool {
	t := xdsTypeOf(typeURL)
	return t.served || t.debug
}

// checkType refuses a type URL no watch serves.
func checkType(typeURL string) error {
	if !xdsTypeOf(typeURL).served {
		return status.Errorf(codes.InvalidArgument, "type %q is not served by the hub (CDS, EDS, LDS, RDS, SDS and Istio config <group>/<version>/<Kind> are)", typeURL)
	}
	return nil
}
