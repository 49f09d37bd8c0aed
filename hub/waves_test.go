package hub

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/pacing"
	"github.com/hubmesh/hub/internal/xdstest"
)

// A push of churn reaches its streams in waves through the real server:
// the streams of the first wave get the new clusters, the others nothing
// until the first wave's clients answered; a stream that asks again
// between waves is answered then and not twice; in the end every stream
// holds the new set, once.
func TestChurnPushReachesStreamsInWaves(t *testing.T) {
	h, addr, _ := serveHub(t, Options{Changes: feed.NewChanges(10*time.Millisecond, time.Minute)})
	services := []*clusters.Service{namedService("a", "10.0.0.1")}
	h.index.ReplaceCluster("west", services)
	const streams = 2*pacing.MinWave + 6 // waves of pacing.MinWave, pacing.MinWave and 6
	cs := make([]*xdstest.SotW, streams)
	for i := range cs {
		c := xdstest.DialSotW(t, addr)
		c.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node(fmt.Sprintf("wave-%d", i), "west"), TypeUrl: resourcev3.ClusterType})
		c.Send(t, ack(resourcev3.ClusterType, nil, c.ExpectType(t, resourcev3.ClusterType, "first request")))
		xdstest.Barrier(t, c, "parked")
		cs[i] = c
	}
	all := make([]int, streams)
	for i := range all {
		all[i] = i
	}

	// A leading edge reaches every stream at once; the test holds the
	// ACKs, so a second change is churn: it waits for them, then goes in
	// waves.
	services = append(services, namedService("b", "10.0.1.1"))
	h.index.ReplaceCluster("west", append([]*clusters.Service(nil), services...))
	last := make([]*discoveryv3.DiscoveryResponse, streams)
	for range streams {
		i, r := nextOfAny(t, cs, all)
		if last[i] != nil || len(r.Resources) != 2 {
			t.Fatalf("stream %d: a second response, or %d clusters; want one response with 2", i, len(r.Resources))
		}
		last[i] = r
	}
	services = append(services, namedService("c", "10.0.2.1"))
	h.index.ReplaceCluster("west", append([]*clusters.Service(nil), services...))
	for i, c := range cs {
		c.Send(t, ack(resourcev3.ClusterType, nil, last[i]))
	}

	got := map[int]bool{}
	for range pacing.MinWave {
		i, r := nextOfAny(t, cs, all)
		if got[i] || len(r.Resources) != 3 {
			t.Fatalf("stream %d: a second response, or %d clusters; want one response with 3", i, len(r.Resources))
		}
		got[i], last[i] = true, r
	}
	var rest []int
	for i := range cs {
		if !got[i] {
			rest = append(rest, i)
			xdstest.Barrier(t, cs[i], fmt.Sprintf("stream %d: nothing before the first wave is answered", i))
		}
	}
	// A stream that asks again between waves (here: its ACK repeated) is
	// answered at once, and its wave leaves it out.
	x := rest[0]
	cs[x].Send(t, ack(resourcev3.ClusterType, nil, last[x]))
	if r := cs[x].ExpectType(t, resourcev3.ClusterType, "asked again between waves"); len(r.Resources) != 3 {
		t.Fatalf("stream %d asked again: %d clusters; want 3", x, len(r.Resources))
	} else {
		got[x], last[x] = true, r
	}
	for i := range got {
		cs[i].Send(t, ack(resourcev3.ClusterType, nil, last[i]))
	}
	for range streams - len(got) {
		i, r := nextOfAny(t, cs, rest)
		if got[i] || len(r.Resources) != 3 {
			t.Fatalf("stream %d: a second response, or %d clusters; want one response with 3", i, len(r.Resources))
		}
		got[i] = true
		cs[i].Send(t, ack(resourcev3.ClusterType, nil, r))
	}
	for i, c := range cs {
		xdstest.Barrier(t, c, fmt.Sprintf("stream %d: one response for the churn", i))
	}
	if n := h.changes.Pushes(feed.QuietAfter) + h.changes.Pushes(feed.MaxWait); n != 1 {
		t.Fatalf("%d pushes after a wait; want 1 (the churn)", n)
	}
}

// nextOfAny returns the next response of any of the streams cs[i], i in
// from, and which one it came from.
func nextOfAny(t *testing.T, cs []*xdstest.SotW, from []int) (int, *discoveryv3.DiscoveryResponse) {
	t.Helper()
	cases := make([]reflect.SelectCase, 0, len(from)+1)
	for _, i := range from {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(cs[i].Responses())})
	}
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(time.After(20 * time.Second))})
	k, v, ok := reflect.Select(cases)
	if k == len(from) {
		t.Fatal("no response within 20s")
	}
	if !ok {
		t.Fatalf("stream %d ended: %v", from[k], cs[from[k]].End(t))
	}
	return from[k], v.Interface().(*discoveryv3.DiscoveryResponse)
}
