package e2e

import (
	"context"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// edsRecorder is a second, raw ADS client that ACKs every EDS response for
// one cluster and remembers, per response, how many endpoints each member had.
type edsRecorder struct {
	mu        sync.Mutex
	responses []map[string]int // member → endpoints
}

func watchEDS(t *testing.T, xdsAddr, clusterName string) *edsRecorder {
	t.Helper()
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec := &edsRecorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		req := &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "eds-recorder"}, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{clusterName}}
		for {
			if err := stream.Send(req); err != nil {
				return
			}
			resp, err := stream.Recv()
			if err != nil {
				return
			}
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
			req = &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{clusterName}, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
		}
	}()
	t.Cleanup(func() {
		cancel()
		conn.Close()
		<-done
	})
	return rec
}

// snapshot returns every response recorded so far.
func (r *edsRecorder) snapshot() []map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]int(nil), r.responses...)
}
