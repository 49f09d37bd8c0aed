package hub

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hubmesh/hub/clusters"
)

// startHub serves a Hub's ADS on a loopback port and returns an ADS stream to it.
func startHub(t *testing.T) (*testHub, discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) {
	t.Helper()
	h, addr, _ := serveHub(t, Options{})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	streamCtx, streamCancel := context.WithCancel(context.Background())
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(streamCtx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before serveHub's: the client goes first
		streamCancel()
		conn.Close()
	})
	return &testHub{Hub: h, addrForTest: addr}, stream
}

// testHub is a Hub serving ADS on a loopback address.
type testHub struct {
	*Hub
	addrForTest string
}

func echoService(ip string) *clusters.Service {
	return &clusters.Service{
		Namespace: "demo", Name: "echo",
		Ports:     []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}},
		Endpoints: []clusters.Endpoint{{Address: ip, Port: 8080, ServicePort: 7070}},
	}
}

// receiver reads responses in the background so tests can assert that none arrive.
func receiver(t *testing.T, stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) <-chan *discoveryv3.DiscoveryResponse {
	ch := make(chan *discoveryv3.DiscoveryResponse, 100)
	go func() {
		defer close(ch)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			ch <- resp
		}
	}()
	return ch
}

func expectResponse(t *testing.T, ch <-chan *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryResponse {
	t.Helper()
	select {
	case r, ok := <-ch:
		if !ok {
			t.Fatal("stream closed")
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no response within 10s")
		return nil
	}
}

// expectSilence asserts that no response arrives for a while. A negative
// can only be observed over a window; one second is long against the 10ms
// debounce and against go-control-plane caches, which resend a NACKed
// version thousands of times per second.
func expectSilence(t *testing.T, ch <-chan *discoveryv3.DiscoveryResponse, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: got response version %s; want none", what, r.VersionInfo)
	case <-time.After(time.Second):
	}
}

func TestNACKedVersionIsNotResent(t *testing.T) {
	h, stream := startHub(t)
	key := clusters.ServiceKey{Namespace: "demo", Name: "echo"}
	h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	ch := receiver(t, stream)
	node := &corev3.Node{Id: "sidecar~10.0.0.9~client.demo~demo.svc.cluster.local"}
	name := "outbound|7070||echo.demo.svc.cluster.local"
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	first := expectResponse(t, ch)
	if len(first.Resources) != 1 {
		t.Fatalf("first response has %d resources", len(first.Resources))
	}

	// The client rejects it.
	if err := stream.Send(&discoveryv3.DiscoveryRequest{
		TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}, ResponseNonce: first.Nonce,
		ErrorDetail: &statuspb.Status{Code: 3, Message: "endpoint rejected by test"},
	}); err != nil {
		t.Fatal(err)
	}
	expectSilence(t, ch, "after a NACK")
	waitProxy(t, h, func(ts TypeStatus) error {
		if ts.NackError != "endpoint rejected by test" || ts.NackedVersion != first.VersionInfo || ts.Sends != 1 || ts.Nacks != 1 {
			return fmt.Errorf("EDS status after NACK = %+v", ts)
		}
		return nil
	})

	// A change to another service pushes, but this stream's resources are
	// unchanged: still nothing.
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "other"}, &clusters.Service{Namespace: "demo", Name: "other"})
	expectSilence(t, ch, "after an unrelated change")

	// An input change produces a new version.
	h.index.UpdateService("west", key, echoService("10.0.0.2"))
	second := expectResponse(t, ch)
	if second.VersionInfo == first.VersionInfo {
		t.Fatalf("new response has the NACKed version %s", second.VersionInfo)
	}

	// ACK it: nothing more until the next change.
	if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}, ResponseNonce: second.Nonce, VersionInfo: second.VersionInfo}); err != nil {
		t.Fatal(err)
	}
	expectSilence(t, ch, "after an ACK")
	waitProxy(t, h, func(ts TypeStatus) error {
		if ts.AckedVersion != second.VersionInfo || ts.SentVersion != second.VersionInfo || ts.Sends != 2 {
			return fmt.Errorf("EDS status after ACK = %+v", ts)
		}
		return nil
	})
	cfg, ok := h.ProxyConfig("sidecar~10.0.0.9~client.demo~demo.svc.cluster.local")
	if !ok || len(cfg.Resources[resourcev3.EndpointType]) != 1 {
		t.Errorf("proxy config = %+v, %v", cfg, ok)
	}
}

// waitProxy polls the hub's view of the single connected proxy's EDS state.
func waitProxy(t *testing.T, h *testHub, check func(TypeStatus) error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		ps := h.Proxies()
		switch {
		case len(ps) != 1:
			err = fmt.Errorf("%d proxies connected", len(ps))
		case len(ps[0].Types) != 1:
			err = fmt.Errorf("types = %+v", ps[0].Types)
		default:
			err = check(ps[0].Types[0])
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestFirstRequestIsAnsweredEvenWhenEmpty(t *testing.T) {
	_, stream := startHub(t)
	ch := receiver(t, stream)
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if r := expectResponse(t, ch); len(r.Resources) != 0 {
		t.Fatalf("wildcard CDS on an empty mesh returned %d resources", len(r.Resources))
	}
}

func TestDeltaADS(t *testing.T) {
	h, _ := startHub(t)
	key := clusters.ServiceKey{Namespace: "demo", Name: "echo"}
	h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	conn, err := grpc.NewClient(h.addrForTest, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *discoveryv3.DeltaDiscoveryResponse, 100)
	go func() {
		defer close(ch)
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			ch <- r
		}
	}()
	next := func() *discoveryv3.DeltaDiscoveryResponse {
		t.Helper()
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatal("stream closed")
			}
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no delta response within 10s")
			return nil
		}
	}
	silence := func(what string) {
		t.Helper()
		select {
		case r := <-ch:
			t.Fatalf("%s: got %v; want nothing", what, r)
		case <-time.After(time.Second):
		}
	}
	name := "outbound|7070||echo.demo.svc.cluster.local"
	if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "delta-client"}, TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{name}}); err != nil {
		t.Fatal(err)
	}
	first := next()
	if len(first.Resources) != 1 || first.Resources[0].Name != name || first.Resources[0].Version == "" {
		t.Fatalf("first delta response: %v", first)
	}
	_ = stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: first.Nonce})
	silence("after an ACK")

	// An unrelated service changes: nothing; this one changes: only it is sent.
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "other"}, &clusters.Service{Namespace: "demo", Name: "other"})
	silence("after an unrelated change")
	h.index.UpdateService("west", key, echoService("10.0.0.2"))
	second := next()
	if len(second.Resources) != 1 || second.Resources[0].Version == first.Resources[0].Version {
		t.Fatalf("second delta response: %v", second)
	}
	// A NACK is not answered with the same version again.
	_ = stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: second.Nonce, ErrorDetail: &statuspb.Status{Code: 3, Message: "no"}})
	silence("after a NACK")
	// The service goes away: the name is removed.
	h.index.UpdateService("west", key, nil)
	third := next()
	if len(third.Resources) != 0 || len(third.RemovedResources) != 1 || third.RemovedResources[0] != name {
		t.Fatalf("removal: %v", third)
	}
	// The helper's own SotW stream has the same stream number on its server:
	// both must be tracked separately.
	var found bool
	for _, p := range h.Proxies() {
		if p.ID == "delta-client" {
			found = len(p.Types) == 1 && p.Types[0].Nacks == 1
		}
	}
	if ps := h.Proxies(); !found || len(ps) != 2 {
		t.Errorf("proxy tracking of the delta stream: %+v", ps)
	}
}
