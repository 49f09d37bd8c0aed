package hub

import (
	"context"
	"log/slog"
	"testing"
)

// TestProxyStatusSaysProxyless: the proxy list tells proxyless gRPC clients
// (GENERATOR=grpc or a gRPC user agent) from Envoys and istiods, as the
// dashboard's picture groups them.
func TestProxyStatusSaysProxyless(t *testing.T) {
	for name, kind := range clientKinds {
		t.Run(name, func(t *testing.T) {
			p := newProxyTracker(trackerInputs{log: slog.New(slog.DiscardHandler), limits: Limits{MaxStreams: 10}, held: newHoldings[heldResource]()})
			c := newConn(1)
			if err := p.onStreamOpen(context.Background(), c, ""); err != nil {
				t.Fatal(err)
			}
			p.request(c, kind.node, "", "", false)
			ps := p.proxies(nil)
			if len(ps) != 1 || ps[0].Proxyless != kind.proxyless {
				t.Errorf("proxies %+v; want one with Proxyless %v", ps, kind.proxyless)
			}
		})
	}
}
