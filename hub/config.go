package hub

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hubmesh/hub/mcp"
)

// Istio config (MCP-over-XDS, docs/architecture.md §3.7): a member's istiod opens one
// SotW stream and subscribes, as wildcards, to every Istio config type URL
// (<group>/<version>/<Kind>). The responder answers each with the full
// state of that type from the mcp generator (responder.all), under the type URL asked for, and
// answers again only when the type's set version changes: a push of
// changed hostnames re-evaluates these wildcard watches like Envoy's
// (watcher.push), and those whose set is unchanged are skipped
// (skipUnchangedWildcards).

// configLabel is the metrics label of every Istio config type (their
// names come from clients: one label keeps the series bounded).
const configLabel = "MCP"

// checkDeltaConfig refuses Istio config over Delta: istiod asks for it
// over SotW, and the watcher serves it as a whole set.
func checkDeltaConfig(typeURL string) error {
	if mcp.IsConfigType(typeURL) {
		return status.Errorf(codes.InvalidArgument, "Istio config (%s) is served over State-of-the-World ADS only", typeURL)
	}
	return nil
}
