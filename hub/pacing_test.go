package hub

import (
	"context"
	"log/slog"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// The tracker counts what clients answer: an ACK or a NACK of a sent
// response, once, and what a closing stream leaves unanswered; a stale or
// unknown nonce is no answer.
func TestTrackerCountsAnswers(t *testing.T) {
	fleet := &deliveries{}
	p := newProxyTracker(slog.New(slog.DiscardHandler), Limits{MaxStreams: 10})
	p.fleet = fleet
	for id := int64(1); id <= 2; id++ {
		if err := p.onStreamOpen(context.Background(), id, ""); err != nil {
			t.Fatal(err)
		}
	}
	send := func(id int64, typeURL, nonce string) {
		p.onStreamResponse(context.Background(), id, nil, &discoveryv3.DiscoveryResponse{TypeUrl: typeURL, VersionInfo: "v" + nonce, Nonce: nonce})
	}
	send(1, resourcev3.ClusterType, "1")
	send(1, resourcev3.EndpointType, "2")
	send(2, resourcev3.ClusterType, "1")
	send(2, resourcev3.EndpointType, "2")

	p.request(1, nil, "1", "", false) // ACK
	p.request(1, nil, "1", "", false) // the same again: no answer
	p.request(1, nil, "9", "", false) // unknown nonce
	p.request(1, nil, "2", "bad", true)
	if got := fleet.answered.Load(); got != 2 {
		t.Fatalf("answered %d after an ACK, a repeat, an unknown nonce and a NACK; want 2", got)
	}
	p.onStreamClosed(2, nil) // two responses unanswered, lost with it
	if got := fleet.answered.Load(); got != 4 {
		t.Fatalf("answered %d after a stream with 2 unanswered responses closed; want 4", got)
	}
	p.onStreamClosed(1, nil) // nothing left unanswered
	if got := fleet.answered.Load(); got != 4 {
		t.Fatalf("answered %d after a stream with nothing unanswered closed; want 4", got)
	}
}
