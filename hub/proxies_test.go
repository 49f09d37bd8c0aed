package hub

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hubmesh/hub/hub/pacing"
)

// TestStatusIsPublishedToReaders: the API reads a stream's status and
// what it holds while the stream's loop records responses, ACKs and
// changes its holding in place, with no lock between them (go test -race
// is the proof), and sees every change once the loop made it.
func TestStatusIsPublishedToReaders(t *testing.T) {
	held := newHoldings[heldResource]()
	p := newProxyTracker(trackerInputs{log: slog.New(slog.DiscardHandler), limits: Limits{MaxStreams: 10}, fleet: &pacing.Deliveries{}, held: held})
	c := newConn(1)
	if err := p.onStreamOpen(context.Background(), c, ""); err != nil {
		t.Fatal(err)
	}
	p.request(c, &corev3.Node{Id: "sidecar~10.0.0.1~a.demo~demo.svc.cluster.local"}, "", "", false)
	id := c.state.status.ID

	const responses = 300
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, ps := range p.proxies(nil) {
					for _, ts := range ps.Types {
						if ts.AckedNonce != "" && ts.AckedVersion != "v"+ts.AckedNonce {
							t.Errorf("status %+v: ACKed version and nonce of two moments", ts)
						}
					}
				}
				if pc, ok := p.config(id, nil); ok {
					if n := len(pc.Resources[resourcev3.EndpointType]); n > responses {
						t.Errorf("config holds %d endpoints; at most %d were sent", n, responses)
					}
				}
			}
		})
	}

	// The loop: each response adds one resource to what the stream holds,
	// in place while no reader froze the holding (other streams' changes
	// push it out of the remembered ones first, as at scale).
	var holding *holding[heldResource]
	for i := 1; i <= responses; i++ {
		for j := range maxTransitions {
			held.release(held.apply(nil, change[heldResource]{names: []string{strconv.Itoa(j)}, vals: []heldResource{{version: strconv.Itoa(i)}}}))
		}
		name := fmt.Sprintf("outbound|80||s%d.demo.svc.cluster.local", i)
		holding = held.apply(holding, change[heldResource]{names: []string{name}, vals: []heldResource{{version: "1", any: &anypb.Any{Value: []byte(name)}}}})
		nonce := strconv.Itoa(i)
		p.onDeltaResponse(c, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: resourcev3.EndpointType, SystemVersionInfo: "v" + nonce, Nonce: nonce}, heldResources{holding: holding})
		p.request(c, nil, nonce, "", false)
		runtime.Gosched() // let the readers in between
	}
	close(stop)
	readers.Wait()

	ps := p.proxies(nil)
	if len(ps) != 1 || len(ps[0].Types) != 1 {
		t.Fatalf("proxies %+v; want one stream with one type", ps)
	}
	if ts := ps[0].Types[0]; ts.Sends != responses || ts.AckedNonce != strconv.Itoa(responses) {
		t.Errorf("status %+v; want %d sends, the last ACKed", ts, responses)
	}
	pc, ok := p.config(id, nil)
	if !ok || len(pc.Resources[resourcev3.EndpointType]) != responses {
		t.Errorf("config holds %d endpoints; want %d", len(pc.Resources[resourcev3.EndpointType]), responses)
	}
}
