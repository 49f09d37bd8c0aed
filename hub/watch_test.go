package hub

import (
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/internal/xdstest"
)

// startHub serves a Hub's ADS on a loopback port and returns an ADS stream to it.
func startHub(t *testing.T) (*testHub, *xdstest.SotW) {
	t.Helper()
	h, addr, _ := serveHub(t, Options{})
	return &testHub{Hub: h, addrForTest: addr}, xdstest.DialSotW(t, addr) // its cleanup goes before serveHub's
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

// expectSilence asserts that no response arrives for a while. A negative
// can only be observed over a window; one second is long against the 10ms
// debounce and against go-control-plane caches, which resend a NACKed
// version thousands of times per second.
func expectSilence(t *testing.T, stream *xdstest.SotW, what string) {
	t.Helper()
	stream.None(t, time.Second, what)
}

func TestNACKedVersionIsNotResent(t *testing.T) {
	h, stream := startHub(t)
	key := clusters.ServiceKey{Namespace: "demo", Name: "echo"}
	h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	node := &corev3.Node{Id: "sidecar~10.0.0.9~client.demo~demo.svc.cluster.local"}
	name := "outbound|7070||echo.demo.svc.cluster.local"
	stream.Send(t, &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}})
	first := stream.Expect(t, "a response")
	if len(first.Resources) != 1 {
		t.Fatalf("first response has %d resources", len(first.Resources))
	}

	// The client rejects it.
	stream.Send(t, &discoveryv3.DiscoveryRequest{
		TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}, ResponseNonce: first.Nonce,
		ErrorDetail: &statuspb.Status{Code: 3, Message: "endpoint rejected by test"},
	})
	expectSilence(t, stream, "after a NACK")
	waitProxy(t, h, func(ts xdsstatus.Type) error {
		if ts.NackError != "endpoint rejected by test" || ts.NackedVersion != first.VersionInfo || ts.Sends != 1 || ts.Nacks != 1 {
			return fmt.Errorf("EDS status after NACK = %+v", ts)
		}
		return nil
	})

	// A change to another service pushes, but this stream's resources are
	// unchanged: still nothing.
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "other"}, &clusters.Service{Namespace: "demo", Name: "other"})
	expectSilence(t, stream, "after an unrelated change")

	// An input change produces a new version.
	h.index.UpdateService("west", key, echoService("10.0.0.2"))
	second := stream.Expect(t, "a response")
	if second.VersionInfo == first.VersionInfo {
		t.Fatalf("new response has the NACKed version %s", second.VersionInfo)
	}

	// ACK it: nothing more until the next change.
	stream.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}, ResponseNonce: second.Nonce, VersionInfo: second.VersionInfo})
	expectSilence(t, stream, "after an ACK")
	waitProxy(t, h, func(ts xdsstatus.Type) error {
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
func waitProxy(t *testing.T, h *testHub, check func(xdsstatus.Type) error) {
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
	stream.Send(t, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resourcev3.ClusterType})
	if r := stream.Expect(t, "a response"); len(r.Resources) != 0 {
		t.Fatalf("wildcard CDS on an empty mesh returned %d resources", len(r.Resources))
	}
}

func TestDeltaADS(t *testing.T) {
	h, _ := startHub(t)
	key := clusters.ServiceKey{Namespace: "demo", Name: "echo"}
	h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	stream := xdstest.DialDelta(t, h.addrForTest)
	name := "outbound|7070||echo.demo.svc.cluster.local"
	stream.Send(t, &discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "delta-client"}, TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{name}})
	first := stream.Expect(t, "a Delta response")
	if len(first.Resources) != 1 || first.Resources[0].Name != name || first.Resources[0].Version == "" {
		t.Fatalf("first delta response: %v", first)
	}
	stream.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: first.Nonce})
	stream.None(t, time.Second, "after an ACK")

	// An unrelated service changes: nothing; this one changes: only it is sent.
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "other"}, &clusters.Service{Namespace: "demo", Name: "other"})
	stream.None(t, time.Second, "after an unrelated change")
	h.index.UpdateService("west", key, echoService("10.0.0.2"))
	second := stream.Expect(t, "a Delta response")
	if len(second.Resources) != 1 || second.Resources[0].Version == first.Resources[0].Version {
		t.Fatalf("second delta response: %v", second)
	}
	// A NACK is not answered with the same version again.
	stream.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: second.Nonce, ErrorDetail: &statuspb.Status{Code: 3, Message: "no"}})
	stream.None(t, time.Second, "after a NACK")
	// The service goes away: the name is removed.
	h.index.UpdateService("west", key, nil)
	third := stream.Expect(t, "a Delta response")
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
