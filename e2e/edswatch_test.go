package e2e

import (
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hubmesh/hub/internal/xdstest"
)

// edsRecorder is a second, raw ADS client that ACKs every EDS response for
// one cluster and remembers, per response, how many endpoints each member had.
type edsRecorder struct {
	mu        sync.Mutex
	responses []map[string]int // member → endpoints
}

func watchEDS(t *testing.T, xdsAddr, clusterName string) *edsRecorder {
	t.Helper()
	rec := &edsRecorder{}
	first := &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "eds-recorder"}, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{clusterName}}
	xdstest.Answer(t, xdstest.Dial(t, xdsAddr), first, func(resp *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
		counts := map[string]int{}
		for _, a := range resp.Resources {
			var cla endpointv3.ClusterLoadAssignment
			if err := a.UnmarshalTo(&cla); err != nil {
				continue
			}
			for _, l := range cla.Endpoints {
				for _, ep := range l.LbEndpoints {
					counts[ep.GetMetadata().GetFilterMetadata()["hub"].GetFields()["cluster"].GetStringValue()]++
				}
			}
		}
		rec.mu.Lock()
		rec.responses = append(rec.responses, counts)
		rec.mu.Unlock()
		return xdstest.ACK(resp, clusterName)
	})
	return rec
}

// snapshot returns every response recorded so far.
func (r *edsRecorder) snapshot() []map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]int(nil), r.responses...)
}
