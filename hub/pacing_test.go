package hub

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/pacing"
	"github.com/hubmesh/hub/internal/xdstest"
)

// The tracker counts what clients answer: an ACK or a NACK of a sent
// response, once, and what a closing stream leaves unanswered; a stale or
// unknown nonce is no answer.
func TestTrackerCountsAnswers(t *testing.T) {
	fleet := &pacing.Deliveries{}
	p := newProxyTracker(trackerInputs{log: slog.New(slog.DiscardHandler), limits: Limits{MaxStreams: 10}, held: newHoldings[heldResource]()})
	p.fleet = fleet
	conns := map[int64]*conn{}
	for id := int64(1); id <= 2; id++ {
		conns[id] = newConn(id)
		if err := p.onStreamOpen(context.Background(), conns[id], ""); err != nil {
			t.Fatal(err)
		}
	}
	send := func(id int64, typeURL, nonce string) {
		c := conns[id]
		p.onStreamResponse(c, &discoveryv3.DiscoveryResponse{TypeUrl: typeURL, VersionInfo: "v" + nonce, Nonce: nonce}, heldResources{}, false)
	}
	send(1, resourcev3.ClusterType, "1")
	send(1, resourcev3.EndpointType, "2")
	send(2, resourcev3.ClusterType, "1")
	send(2, resourcev3.EndpointType, "2")

	p.request(conns[1], nil, "1", "", false) // ACK
	p.request(conns[1], nil, "1", "", false) // the same again: no answer
	p.request(conns[1], nil, "9", "", false) // unknown nonce
	p.request(conns[1], nil, "2", "bad", true)
	if got := fleet.Answered(); got != 2 {
		t.Fatalf("answered %d after an ACK, a repeat, an unknown nonce and a NACK; want 2", got)
	}
	p.onStreamClosed(conns[2]) // two responses unanswered, lost with it
	if got := fleet.Answered(); got != 4 {
		t.Fatalf("answered %d after a stream with 2 unanswered responses closed; want 4", got)
	}
	p.onStreamClosed(conns[1]) // nothing left unanswered
	if got := fleet.Answered(); got != 4 {
		t.Fatalf("answered %d after a stream with nothing unanswered closed; want 4", got)
	}
}

// TestPushWaitsForTheFleetsACKs runs the pacing end to end on real gRPC
// streams: 40 SotW streams watch every cluster; a change is pushed to all
// of them; while 30 hold their ACK, a second change is not pushed (not
// even to the 10 that answered), and once they answer it is.
func TestPushWaitsForTheFleetsACKs(t *testing.T) {
	h, addr, _ := serveHub(t, Options{Changes: feed.NewChanges(10*time.Millisecond, time.Minute)})
	h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	const streams, holding = 40, 30
	ack := func(c *xdstest.SotW, r *discoveryv3.DiscoveryResponse) {
		t.Helper()
		c.Send(t, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resourcev3.ClusterType, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})
	}
	var fleet []*xdstest.SotW
	for range streams {
		c := xdstest.OpenSotW(t, ctx, xdstest.Dial(t, addr))
		ack(c, &discoveryv3.DiscoveryResponse{}) // the first request
		ack(c, c.Expect(t, "first response"))    // parks the stream's watch
		fleet = append(fleet, c)
	}

	// Change 1 (a new port: a new cluster) reaches every stream.
	svc := echoService("10.0.0.1")
	svc.Ports = append(svc.Ports, clusters.ServicePort{Name: "http", Port: 8080, Protocol: "TCP"})
	h.index.ReplaceCluster("west", []*clusters.Service{svc})
	first := make([]*discoveryv3.DiscoveryResponse, streams)
	for i := range fleet {
		first[i] = fleet[i].Expect(t, "change 1")
	}
	for i := holding; i < streams; i++ {
		ack(fleet[i], first[i]) // 10 answer, 30 hold
	}
	// Change 2 while 30 of 40 responses are unanswered (more than 16): held.
	svc2 := echoService("10.0.0.1")
	svc2.Name = "echo2"
	h.index.ReplaceCluster("west", []*clusters.Service{svc, svc2})
	// A second is a hundred debounce periods.
	fleet[streams-1].None(t, time.Second, "change 2 pushed while 30 of 40 streams had not answered change 1")
	for i := range holding {
		ack(fleet[i], first[i])
	}
	for i := range fleet {
		if r := fleet[i].Expect(t, "change 2"); len(r.GetResources()) != 3 {
			t.Fatalf("stream %d got %d clusters after change 2; want 3", i, len(r.GetResources()))
		}
	}
}
