package hub

import (
	"strings"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/hubmesh/hub/hub/xdsgen"
)

// inboundNames lists the inbound listener names of an LDS subscription
// (its names that name no hostname come after those that do).
func inboundNames(s *subscriber) []string {
	if s == nil || s.typeURL != resourcev3.ListenerType || s.idx == nil {
		return nil
	}
	var names []string
	for _, name := range s.idx.list[s.idx.hosted:] {
		if strings.HasPrefix(name, xdsgen.InboundListenerPrefix) {
			names = append(names, name)
		}
	}
	return names
}

// isServer reports whether an LDS subscription names an inbound listener.
func isServer(s *subscriber) bool { return len(inboundNames(s)) > 0 }
