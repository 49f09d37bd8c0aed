package hub

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/wait"
	"github.com/hubmesh/hub/internal/xdstest"
)

// latencyFamily gathers hub_xds_push_latency_seconds from reg (nil while
// it has no series).
func latencyFamily(t *testing.T, g prometheus.Gatherer) *dto.MetricFamily {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "hub_xds_push_latency_seconds" {
			return f
		}
	}
	return nil
}

// latencyLabels lists the type labels of hub_xds_push_latency_seconds.
func latencyLabels(t *testing.T, g prometheus.Gatherer) []string {
	t.Helper()
	var labels []string
	for _, m := range latencyFamily(t, g).GetMetric() {
		for _, l := range m.GetLabel() {
			labels = append(labels, l.GetName()+"="+l.GetValue())
		}
	}
	slices.Sort(labels)
	return labels
}

// latencyOf returns the histogram's sample count and sum for one type label
// (zero without a series).
func latencyOf(t *testing.T, reg *prometheus.Registry, label string) (uint64, float64) {
	t.Helper()
	for _, m := range latencyFamily(t, reg).GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "type" && l.GetValue() == label {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0, 0
}

// openCDSFirst opens a wildcard CDS stream and returns it with its first
// response.
func openCDSFirst(t *testing.T, ctx context.Context, addr string) (*xdstest.SotW, *discoveryv3.DiscoveryResponse) {
	t.Helper()
	stream := xdstest.OpenSotW(t, ctx, xdstest.Dial(t, addr))
	stream.Send(t, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resourcev3.ClusterType})
	return stream, stream.Expect(t, "first CDS response")
}

// A change delivered to the index is measured once per stream it is pushed
// to, from the change to the hand-off; responses to a stream's own request
// (its first, and a new stream's) are not measured. The metric carries
// only the served types.
func TestPushLatencyIsMeasuredPerPushedStream(t *testing.T) {
	reg := prometheus.NewRegistry()
	h, addr, _ := serveHub(t, Options{Metrics: reg})
	h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const streams = 3
	var opened []*xdstest.SotW
	var firsts []*discoveryv3.DiscoveryResponse
	for range streams {
		s, first := openCDSFirst(t, ctx, addr)
		opened, firsts = append(opened, s), append(firsts, first)
	}
	if n, _ := latencyOf(t, reg, "Cluster"); n != 0 {
		t.Fatalf("%d push latencies after the streams' first responses; want none (they answer requests)", n)
	}
	// ACK, then wait until every stream's watch is parked: a change that
	// came before would be answered to the ACK, not pushed.
	for i, s := range opened {
		s.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: firsts[i].Nonce, VersionInfo: firsts[i].VersionInfo})
	}
	wait.Until(t, 30*time.Second, func() error {
		h.watcher.mu.Lock()
		defer h.watcher.mu.Unlock()
		parked := 0
		for s := range h.watcher.index.byType {
			if s.parked != nil {
				parked++
			}
		}
		if parked != streams {
			return fmt.Errorf("%d of %d CDS watches parked", parked, streams)
		}
		return nil
	})

	start := time.Now()
	svc := echoService("10.0.0.1")
	svc.Ports = append(svc.Ports, clusters.ServicePort{Name: "http", Port: 8080, Protocol: "TCP"})
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "echo"}, svc)
	for i, s := range opened {
		if _, err := s.Next(t); err != nil {
			t.Fatalf("stream %d: no push after the change: %v", i, err)
		}
	}
	wait.Until(t, 30*time.Second, func() error {
		if n, _ := latencyOf(t, reg, "Cluster"); n != streams {
			return fmt.Errorf("%d push latencies; want %d", n, streams)
		}
		return nil
	})
	elapsed := time.Since(start).Seconds()
	_, sum := latencyOf(t, reg, "Cluster")
	if sum < 0 || sum > streams*elapsed {
		t.Fatalf("push latency sum %.6fs for %d pushes; want between 0 and %d × %.6fs (the test's own elapsed time)", sum, streams, streams, elapsed)
	}
	sum5 := h.PushLatency()
	if sum5.Count != streams || sum5.P50 <= 0 || sum5.P99 < sum5.P50 || sum5.Window != 5*time.Minute {
		t.Fatalf("summary = %+v; want %d measurements with 0 < p50 ≤ p99 over 5m", sum5, streams)
	}

	// A new stream's first response answers its request: not measured.
	openCDSFirst(t, ctx, addr)
	if n, _ := latencyOf(t, reg, "Cluster"); n != streams {
		t.Fatalf("%d push latencies after a new stream's first response; want still %d", n, streams)
	}
	if got := latencyLabels(t, reg); !slices.Equal(got, []string{"type=Cluster"}) {
		t.Errorf("push latency series %v; want only type=Cluster (no stream subscribes to another type)", got)
	}
}
