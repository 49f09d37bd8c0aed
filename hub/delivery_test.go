package hub

import (
	"context"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hubmesh/hub/clusters"
)

// A push's delivery ends when the real SotW and Delta servers have taken
// its responses to send, one per stream whose watch it answered.
func TestPushDeliveryFollowsRealStreams(t *testing.T) {
	h, err := New(Options{DomainSuffix: "cluster.local", Changes: NewChanges(10*time.Millisecond, time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// No Run: the test pushes itself and keeps the delivery.
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- h.ServeADS(ctx, lis, nil) }()
	t.Cleanup(func() { cancel(); <-served })
	addr := lis.Addr().String()

	const host = "echo.demo.svc.cluster.local"
	name := "outbound|7070||" + host
	h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	sotw, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ch := receiver(t, sotw)
	node := &corev3.Node{Id: "sidecar~10.0.0.9~sotw.demo~demo.svc.cluster.local"}
	if err := sotw.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	first := expectResponse(t, ch)
	if err := sotw.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}, ResponseNonce: first.Nonce, VersionInfo: first.VersionInfo}); err != nil {
		t.Fatal(err)
	}
	delta := openDelta(t, addr)
	delta.send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "sidecar~10.0.0.8~delta.demo~demo.svc.cluster.local"}, ResourceNamesSubscribe: []string{name}})
	delta.send(&discoveryv3.DeltaDiscoveryRequest{ResponseNonce: delta.next().Nonce})

	// Both ACKs parked a watch.
	deadline := time.Now().Add(10 * time.Second)
	for parked := 0; parked != 2; {
		if time.Now().After(deadline) {
			t.Fatalf("%d watches parked for %s; want 2", parked, host)
		}
		time.Sleep(5 * time.Millisecond)
		parked = 0
		h.watcher.mu.Lock()
		for s := range h.watcher.subscribersOf(host) {
			if s.parked != nil {
				parked++
			}
		}
		h.watcher.mu.Unlock()
	}

	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "echo"}, echoService("10.0.0.2"))
	d := h.push(&batch{hosts: map[string]struct{}{host: {}}})
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		n, _ := d.progress()
		t.Fatalf("push not delivered within 10s (%d taken)", n)
	}
	if n, _ := d.progress(); n != 2 {
		t.Fatalf("delivery counted %d; want 2", n)
	}
	if r := expectResponse(t, ch); len(r.Resources) != 1 {
		t.Fatalf("SotW push has %d resources; want 1", len(r.Resources))
	}
	if r := delta.next(); len(r.Resources) != 1 {
		t.Fatalf("Delta push has %d resources; want 1", len(r.Resources))
	}
}
