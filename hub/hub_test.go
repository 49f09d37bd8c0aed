package hub

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/internal/wait"
	"github.com/hubmesh/hub/internal/xdstest"
)

// serveHub runs a Hub with opts on a loopback port until the test ends;
// stop ends ServeADS earlier and returns its error once it has returned.
func serveHub(t *testing.T, opts Options) (h *Hub, addr string, stop func() error) {
	t.Helper()
	opts.DomainSuffix = "cluster.local"
	if opts.Changes == nil {
		opts.Changes = feed.NewChanges(10*time.Millisecond, time.Second)
	}
	h, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	serveCtx, stopServe := context.WithCancel(context.Background())
	ran, served := make(chan struct{}), make(chan error, 1)
	go func() { h.Run(runCtx); close(ran) }()
	go func() { served <- h.ServeADS(serveCtx, lis, nil) }()
	var result error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			stopServe()
			result = <-served
			stopRun()
			<-ran
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return h, lis.Addr().String(), stop
}

// openCDS opens an ADS stream that asks for every cluster and returns it
// once the first response (or the stream's end) arrives.
func openCDS(t *testing.T, ctx context.Context, addr string) (*xdstest.SotW, error) {
	t.Helper()
	stream := xdstest.OpenSotW(t, ctx, xdstest.Dial(t, addr))
	stream.Send(t, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resourcev3.ClusterType})
	_, err := stream.Next(t)
	return stream, err
}

func TestNewStreamsAreRateLimited(t *testing.T) {
	// 0.01 streams per second: a burst of one, then one every 100 s.
	_, addr, _ := serveHub(t, Options{NewStreamsPerSecond: 0.01})
	if _, err := openCDS(t, context.Background(), addr); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := openCDS(t, ctx, addr)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream within the limit's wait: %v; want ResourceExhausted", err)
	}
}

func TestStreamsWaitUntilMembershipSettles(t *testing.T) {
	var settled atomic.Bool
	asked := atomic.Int32{}
	_, addr, _ := serveHub(t, Options{Settled: func() (bool, string) {
		asked.Add(1)
		return settled.Load(), "waiting for clusters to sync: west"
	}})
	_, err := openCDS(t, context.Background(), addr)
	if status.Code(err) != codes.Unavailable || strings.Contains(err.Error(), "west") {
		t.Fatalf("stream before membership settled: %v; want Unavailable naming no member", err)
	}
	settled.Store(true)
	if _, err := openCDS(t, context.Background(), addr); err != nil {
		t.Fatalf("stream after membership settled: %v", err)
	}
	// Settling is latched: a member syncing again later (a rotated
	// kubeconfig) does not close the door.
	settled.Store(false)
	n := asked.Load()
	if _, err := openCDS(t, context.Background(), addr); err != nil {
		t.Fatalf("stream after membership unsettled again: %v", err)
	}
	if asked.Load() != n {
		t.Fatal("Settled asked again after it first reported true")
	}
}

func TestShutdownDrainsStreamsWithUnavailable(t *testing.T) {
	_, addr, stop := serveHub(t, Options{DrainGrace: 4 * time.Second})
	var streams []*xdstest.SotW
	for range 5 {
		s, err := openCDS(t, context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	if err := stop(); err != nil {
		t.Fatalf("ServeADS: %v", err)
	}
	// ServeADS returned, so every stream has been closed by then.
	for _, s := range streams {
		if err := s.End(t); status.Code(err) != codes.Unavailable {
			t.Errorf("stream ended with %v; want Unavailable (clients retry it)", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := openCDS(t, ctx, addr); err == nil {
		t.Error("a drained listener accepted a new stream")
	}
}

func TestEndpointChangeSkipsWildcardClusterWatches(t *testing.T) {
	h, err := New(Options{DomainSuffix: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	cds := &watch{typeURL: resourcev3.ClusterType, wildcard: true}
	eds := &watch{typeURL: resourcev3.EndpointType, wildcard: true}
	for _, wt := range []*watch{cds, eds} {
		if _, err := h.watcher.responder.resources(wt, authn.Identity{}); err != nil || wt.setVersion == "" {
			t.Fatalf("evaluating %s: %v, set version %q", wt.typeURL, err, wt.setVersion)
		}
	}
	// New endpoints: the cluster list is the same, the endpoints are not.
	h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.2")})
	h.gen.Invalidate(map[string]struct{}{"echo.demo.svc.cluster.local": {}})
	cds.busy.Add(1) // as push does for the watches it takes
	eds.busy.Add(1)
	if got := h.watcher.skipUnchangedWildcards([]job{{wt: cds}, {wt: eds}}, map[xdsgen.WildcardSetKey]string{}); len(got) != 1 || got[0].wt != eds {
		t.Fatalf("after an endpoint change %d watches are re-evaluated; want only EDS", len(got))
	}
	// A new port changes the cluster list.
	svc := echoService("10.0.0.2")
	svc.Ports = append(svc.Ports, clusters.ServicePort{Name: "http", Port: 8080, Protocol: "TCP"})
	h.index.ReplaceCluster("west", []*clusters.Service{svc})
	h.gen.Invalidate(map[string]struct{}{"echo.demo.svc.cluster.local": {}})
	cds.busy.Add(1)
	if got := h.watcher.skipUnchangedWildcards([]job{{wt: cds}}, map[xdsgen.WildcardSetKey]string{}); len(got) != 1 {
		t.Fatal("a new port must re-evaluate wildcard CDS watches")
	}
}

// TestUnknownTypeIsIgnored: a request for a type the hub does not serve
// (pilot-agent adds NDS, PCDS and health requests upstream) is ignored as
// istiod ignores it: no answer, counted, and the stream stays and is
// answered for what it does serve. An oversized node behind an unserved
// type is refused as any request's.
func TestUnknownTypeIsIgnored(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, addr, _ := serveHub(t, Options{Metrics: reg})
	conn := xdstest.Dial(t, addr)
	stream := xdstest.OpenSotW(t, context.Background(), conn)
	for _, req := range []*discoveryv3.DiscoveryRequest{
		{Node: &corev3.Node{Id: "n"}, TypeUrl: "type.googleapis.com/istio.networking.nds.v1.NameTable"},
		{TypeUrl: "type.googleapis.com/made.up.Thing", ResponseNonce: "7"},
		{TypeUrl: resourcev3.ClusterType},
	} {
		stream.Send(t, req)
	}
	resp, err := stream.Next(t)
	if err != nil {
		t.Fatalf("after unserved types: %v; want the stream to stay", err)
	}
	if resp.GetTypeUrl() != resourcev3.ClusterType {
		t.Fatalf("answered %s; want only CDS answered", resp.GetTypeUrl())
	}
	if v := gaugeValue(t, reg, "hub_xds_unserved_requests_total"); v != 2 {
		t.Errorf("hub_xds_unserved_requests_total = %v; want 2", v)
	}

	big := xdstest.OpenSotW(t, context.Background(), conn)
	big.Send(t, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: strings.Repeat("x", 4096)}, TypeUrl: "type.googleapis.com/made.up.Thing"})
	if _, err := big.Next(t); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("oversized node behind an unserved type: %v; want InvalidArgument", err)
	}
}

func TestRefusedStreamsAreNotCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, addr, _ := serveHub(t, Options{NewStreamsPerSecond: 0.01, Metrics: reg})
	first, err := openCDS(t, context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := openCDS(t, ctx, addr); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream: %v", err)
	}
	first.CloseSend(t)
	_ = first.End(t) // the server ends the stream
	wait.Until(t, 10*time.Second, func() error {
		if v := gaugeValue(t, reg, "hub_xds_connected_streams"); v != 0 {
			return fmt.Errorf("hub_xds_connected_streams = %v; want 0", v)
		}
		return nil
	})
}

// gaugeValue is the value of an unlabelled gauge (or counter) in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			if c := f.GetMetric()[0].GetCounter(); c != nil {
				return c.GetValue()
			}
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge or counter %s", name)
	return 0
}
