package hub

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/internal/wait"
	"github.com/hubmesh/hub/internal/xdstest"
)

// The stream loop's protocol behaviour, in the xDS spec's own terms, on
// real gRPC streams. A stream's requests are taken in order and what its
// watches answered goes out before the next request is taken, so "no
// response" is proved without waiting: a barrier (the first request of a
// type nobody asked for, always answered) must be the next response.

const edsA, edsB = "outbound|7070||a.demo.svc.cluster.local", "outbound|7070||b.demo.svc.cluster.local"

func ack(typeURL string, names []string, r *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names, ResponseNonce: r.Nonce, VersionInfo: r.VersionInfo}
}

func twoServices(h *Hub) {
	h.index.ReplaceCluster("west", []*clusters.Service{namedService("a", "10.0.0.1"), namedService("b", "10.0.1.1")})
}

// TestStaleNonceIsIgnored: a SotW request whose nonce is not its type's
// last response's is ignored (its names too); the same request with the
// right nonce is taken.
func TestStaleNonceIsIgnored(t *testing.T) {
	h, addr, _ := serveHub(t, Options{})
	twoServices(h)
	c := xdstest.DialSotW(t, addr)
	c.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("stale", "west"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{edsA}})
	r1 := c.ExpectType(t, resourcev3.EndpointType, "first request")
	c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{edsA, edsB}, ResponseNonce: "not-" + r1.Nonce})
	xdstest.Barrier(t, c, "a request with a stale nonce")
	c.Send(t, ack(resourcev3.EndpointType, []string{edsA, edsB}, r1))
	if got := claNames(t, c.ExpectType(t, resourcev3.EndpointType, "the same request, nonce right")); len(got) != 1 || got[edsB] == "" {
		t.Fatalf("got %v; want b only (a is held)", got)
	}
}

// TestOneResponseInFlightPerType: while a response of a type is not
// acknowledged, changes to it wait and coalesce; the ACK gets one response
// with all of them. A second stream that acknowledges shows each push
// happened.
func TestOneResponseInFlightPerType(t *testing.T) {
	h, addr, _ := serveHub(t, Options{})
	twoServices(h)
	names := []string{edsA, edsB}
	slow := xdstest.DialSotW(t, addr)
	quick := xdstest.DialSotW(t, addr)
	slow.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("slow", "west"), TypeUrl: resourcev3.EndpointType, ResourceNames: names})
	inflight := slow.ExpectType(t, resourcev3.EndpointType, "slow: first request")
	quick.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("quick", "west"), TypeUrl: resourcev3.EndpointType, ResourceNames: names})
	quick.Send(t, ack(resourcev3.EndpointType, names, quick.ExpectType(t, resourcev3.EndpointType, "quick: first request")))
	for i, svc := range []*clusters.Service{namedService("a", "10.0.0.2"), namedService("b", "10.0.1.2")} {
		h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: svc.Name}, svc)
		r := quick.ExpectType(t, resourcev3.EndpointType, fmt.Sprintf("quick: push %d", i))
		quick.Send(t, ack(resourcev3.EndpointType, names, r))
	}
	xdstest.Barrier(t, slow, "slow: two pushes while its first response is unacknowledged")
	slow.Send(t, ack(resourcev3.EndpointType, names, inflight))
	got := claNames(t, slow.ExpectType(t, resourcev3.EndpointType, "slow: its ACK"))
	if want := map[string]string{edsA: "10.0.0.2", edsB: "10.0.1.2"}; !maps.Equal(got, want) {
		t.Fatalf("after the ACK: %v; want both changes in one response: %v", got, want)
	}
	xdstest.Barrier(t, slow, "slow: after the coalesced response")
}

// TestSotWWildcardSemantics: the xDS protocol's "how the client specifies
// what resources to return", step by step on one CDS stream (the whole
// state in every response).
func TestSotWWildcardSemantics(t *testing.T) {
	h, addr, _ := serveHub(t, Options{})
	twoServices(h)
	c := xdstest.DialSotW(t, addr)
	var last *discoveryv3.DiscoveryResponse
	for i, step := range []struct {
		what  string
		names []string
		want  []string // nil: no response
	}{
		{"empty first request: legacy wildcard", nil, []string{edsA, edsB}},
		{"again empty: still wildcard, nothing new", nil, nil},
		{"a name: no longer wildcard", []string{edsA}, []string{edsA}},
		{"empty after a name: nothing (what it held is forgotten, nothing to send)", []string{}, nil},
		{"explicit wildcard", []string{"*"}, []string{edsA, edsB}},
		{"wildcard and a name: still every cluster", []string{"*", edsA}, nil},
		{"a name alone", []string{edsB}, []string{edsB}},
		{"a name that does not exist beside it", []string{edsB, "outbound|1||nothing.demo.svc.cluster.local"}, nil},
		{"wildcard again", []string{"*"}, []string{edsA, edsB}},
	} {
		req := &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNames: step.names}
		if i == 0 {
			req.Node = xdstest.Node("wildcard", "west")
		} else {
			req.ResponseNonce, req.VersionInfo = last.Nonce, last.VersionInfo
		}
		c.Send(t, req)
		if step.want == nil {
			xdstest.Barrier(t, c, step.what)
			continue
		}
		last = c.ExpectType(t, resourcev3.ClusterType, step.what)
		if got := clusterNames(t, last); !slices.Equal(got, step.want) {
			t.Fatalf("%s: got clusters %q; want %q", step.what, got, step.want)
		}
	}
}

// clusterNames decodes a CDS response's cluster names, sorted.
func clusterNames(t *testing.T, r *discoveryv3.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, a := range r.Resources {
		var c clusterv3.Cluster
		if err := a.UnmarshalTo(&c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c.Name)
	}
	slices.Sort(out)
	return out
}

// TestSotWSubscriptionIsGoControlPlanes: the stream loop's SotW
// subscription follows go-control-plane's stream.Subscription through any
// sequence of requests and responses: the same wildcard state, subscribed
// names and returned resources, whether responses carry the whole state or
// only what changed (then held in a shared holding).
func TestSotWSubscriptionIsGoControlPlanes(t *testing.T) {
	pool := []string{"*", "a", "b", "c", "d"}
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 500 {
		var lists [][]string
		first := pickNames(rng, pool)
		ours := newSotwSubscription(first, newHoldings[heldResource]())
		theirs := streamv3.NewSotwSubscription(first, true)
		lists = append(lists, first)
		for step := range 12 {
			// What the stream was sent: some subscribed names (any,
			// when wildcard), recorded by both alike.
			sent := map[string]string{}
			for _, n := range pickNames(rng, pool[1:]) {
				if _, ok := theirs.SubscribedResources()[n]; ok || theirs.IsWildcard() {
					sent[n] = fmt.Sprint(step)
				}
			}
			if run%2 == 0 {
				// A whole-state response: what was sent is all it holds.
				r := &sotwResponse{PassthroughResponse: &cachev3.PassthroughResponse{}}
				for _, n := range slices.Sorted(maps.Keys(sent)) {
					r.whole = append(r.whole, &xdsgen.Resource{Name: n, Version: sent[n]})
				}
				ours.took(r)
				theirs.SetReturnedResources(maps.Clone(sent))
			} else {
				// One that carries what changed: held in a shared holding.
				r := &sotwResponse{PassthroughResponse: &cachev3.PassthroughResponse{}, incremental: true}
				for _, n := range slices.Sorted(maps.Keys(sent)) {
					r.changed = append(r.changed, &xdsgen.Resource{Name: n, Version: sent[n]})
				}
				ours.took(r)
				held := maps.Clone(theirs.ReturnedResources())
				maps.Copy(held, sent)
				theirs.SetReturnedResources(held)
			}
			names := pickNames(rng, pool)
			if rng.IntN(3) == 0 {
				names = lists[len(lists)-1] // an ACK: the same (interned) list again
			}
			lists = append(lists, names)
			ours.set(names)
			theirs.SetResourceSubscription(names)
			if ours.IsWildcard() != theirs.IsWildcard() ||
				!maps.Equal(ours.SubscribedResources(), theirs.SubscribedResources()) ||
				!maps.Equal(versionsHeld(ours.held()), theirs.ReturnedResources()) {
				t.Fatalf("run %d, requests %q: ours wildcard=%v subscribed=%v returned=%v; go-control-plane's %v %v %v", run, lists,
					ours.IsWildcard(), ours.SubscribedResources(), versionsHeld(ours.held()),
					theirs.IsWildcard(), theirs.SubscribedResources(), theirs.ReturnedResources())
			}
		}
	}
}

// versionsHeld is the version held of each name, as go-control-plane's
// subscriptions record what they returned.
func versionsHeld(h heldResources) map[string]string {
	out := map[string]string{}
	for name, r := range h.byName() {
		out[name] = r.version
	}
	for _, r := range h.whole {
		out[r.Name] = r.Version
	}
	return out
}

func pickNames(rng *rand.Rand, pool []string) []string {
	var out []string
	for _, n := range pool {
		if rng.IntN(2) == 0 {
			out = append(out, n)
		}
	}
	return out
}

// TestDeltaReconnectWithInitialVersions: a Delta client reconnecting says
// what it holds (initial_resource_versions); it gets only what changed
// since, and the removal of what it holds that is gone. Then "*" makes the
// subscription wildcard on top of the names, and unsubscribing "*" ends
// that.
func TestDeltaReconnectWithInitialVersions(t *testing.T) {
	h, addr, _ := serveHub(t, Options{})
	twoServices(h)
	first := xdstest.DialDelta(t, addr)
	first.Send(t, &discoveryv3.DeltaDiscoveryRequest{Node: xdstest.Node("delta-1", "west"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{edsA, edsB}})
	held := map[string]string{}
	r := first.Expect(t, "a Delta response")
	for _, res := range r.Resources {
		held[res.Name] = res.Version
	}
	if len(held) != 2 {
		t.Fatalf("first stream holds %v; want a and b", held)
	}
	first.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: r.Nonce})
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "b"}, namedService("b", "10.0.1.2"))
	first.Expect(t, "a Delta response") // the hub has the new version
	gone := "outbound|7070||gone.demo.svc.cluster.local"
	held[gone] = "some-version"

	second := xdstest.DialDelta(t, addr)
	second.Send(t, &discoveryv3.DeltaDiscoveryRequest{Node: xdstest.Node("delta-1", "west"), TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: []string{edsA, edsB, gone}, InitialResourceVersions: held})
	r = second.Expect(t, "a Delta response")
	if len(r.Resources) != 1 || r.Resources[0].Name != edsB || r.Resources[0].Version == held[edsB] {
		t.Fatalf("reconnected: got %v; want b only, at a new version", r.Resources)
	}
	if !slices.Equal(r.RemovedResources, []string{gone}) {
		t.Fatalf("reconnected: removed %q; want %q", r.RemovedResources, gone)
	}
	second.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: r.Nonce})

	// CDS: names first, then "*" on top: every cluster; then "*" off again.
	second.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{edsA}})
	r = second.Expect(t, "a Delta response")
	if len(r.Resources) != 1 || r.Resources[0].Name != edsA {
		t.Fatalf("CDS by name: %v", r.Resources)
	}
	second.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: r.Nonce, ResourceNamesSubscribe: []string{"*"}})
	r = second.Expect(t, "a Delta response")
	if len(r.Resources) != 1 || r.Resources[0].Name != edsB {
		t.Fatalf("CDS wildcard on top of a: got %v; want b (a is held)", r.Resources)
	}
	second.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: r.Nonce, ResourceNamesUnsubscribe: []string{"*"}})
	r = second.Expect(t, "a Delta response")
	if len(r.Resources) != 0 || !slices.Equal(r.RemovedResources, []string{edsB}) {
		t.Fatalf("CDS wildcard off: got %v, removed %q; want b removed, a kept", r.Resources, r.RemovedResources)
	}
}

// TestDeltaSubscriptionIsGoControlPlanes: the stream loop's Delta
// subscription, whose names and versions are shared holdings, follows
// go-control-plane's stream.Subscription through any sequence of
// subscribe and unsubscribe lists and responses.
func TestDeltaSubscriptionIsGoControlPlanes(t *testing.T) {
	pool := []string{"*", "a", "b", "c", "d"}
	rng := rand.New(rand.NewPCG(3, 4))
	names, versions := newHoldings[struct{}](), newHoldings[heldResource]()
	for run := range 500 {
		initial := map[string]string{}
		for _, n := range pickNames(rng, pool[1:]) {
			initial[n] = "i"
		}
		first := &discoveryv3.DeltaDiscoveryRequest{ResourceNamesSubscribe: pickNames(rng, pool), ResourceNamesUnsubscribe: pickNames(rng, pool), InitialResourceVersions: initial}
		ours := newDeltaSubscription(first, names, versions)
		theirs := streamv3.NewDeltaSubscription(first.ResourceNamesSubscribe, first.ResourceNamesUnsubscribe, maps.Clone(initial), true)
		steps := []string{fmt.Sprintf("first %q -%q initial %v", first.ResourceNamesSubscribe, first.ResourceNamesUnsubscribe, initial)}
		for step := range 12 {
			if rng.IntN(2) == 0 {
				// A response: some subscribed names (any when wildcard)
				// at a new version, some held names removed.
				r := &deltaResponse{}
				for _, n := range pickNames(rng, pool[1:]) {
					_, sub := theirs.SubscribedResources()[n]
					_, held := theirs.ReturnedResources()[n]
					switch {
					case sub || theirs.IsWildcard():
						r.changed = append(r.changed, &xdsgen.Resource{Name: n, Version: fmt.Sprint(step)})
					case held:
						r.removed = append(r.removed, n)
					}
				}
				ours.took(r)
				next := maps.Clone(theirs.ReturnedResources())
				for _, c := range r.changed {
					next[c.Name] = c.Version
				}
				for _, n := range r.removed {
					delete(next, n)
				}
				theirs.SetReturnedResources(next)
				steps = append(steps, fmt.Sprintf("sent %d, removed %q", len(r.changed), r.removed))
			} else {
				sub, unsub := pickNames(rng, pool), pickNames(rng, pool)
				ours.update(sub, unsub)
				theirs.UpdateResourceSubscriptions(sub, unsub)
				steps = append(steps, fmt.Sprintf("+%q -%q", sub, unsub))
			}
			if ours.IsWildcard() != theirs.IsWildcard() ||
				!maps.Equal(ours.SubscribedResources(), theirs.SubscribedResources()) ||
				!maps.Equal(versionsHeld(ours.held()), theirs.ReturnedResources()) {
				t.Fatalf("run %d, %q: ours wildcard=%v subscribed=%v returned=%v; go-control-plane's %v %v %v", run, steps,
					ours.IsWildcard(), ours.SubscribedResources(), versionsHeld(ours.held()),
					theirs.IsWildcard(), theirs.SubscribedResources(), theirs.ReturnedResources())
			}
		}
		ours.release()
	}
	if refs := versions.empty.refs + names.empty.refs; refs != 0 {
		t.Fatalf("released subscriptions still hold the empty holdings %d times", refs)
	}
}

// TestStalledClientHoldsUpNobody: a client that stops reading in the
// middle of a response larger than its flow-control window leaves its
// stream's loop blocked in that send; pushes (which only queue) and every
// other stream go on, and the stalled stream gets nothing more queued: its
// response is not acknowledged, so no watch of its is parked.
func TestStalledClientHoldsUpNobody(t *testing.T) {
	h, addr, _ := serveHub(t, Options{})
	var svcs []*clusters.Service
	for i := range 2000 {
		svcs = append(svcs, namedService(fmt.Sprintf("s%04d", i), fmt.Sprintf("10.1.%d.%d", i/250, i%250)))
	}
	h.index.ReplaceCluster("west", svcs)
	// A fixed 64 KiB window (no BDP estimation growing it): the response
	// cannot be sent whole until the client reads.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stalled, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Every cluster (~250 KB), never read.
	if err := stalled.Send(&discoveryv3.DiscoveryRequest{Node: xdstest.Node("stalled", "west"), TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	stalledSends := func() error {
		for _, p := range h.Proxies() {
			if p.ID == "stalled" && len(p.Types) == 1 && p.Types[0].Sends == 1 && p.Types[0].AckedVersion == "" {
				return nil
			}
		}
		return fmt.Errorf("the stalled stream has not been sent exactly one, unacknowledged, CDS response: %+v", h.Proxies())
	}
	wait.Until(t, 20*time.Second, stalledSends)
	name := "outbound|7070||s0000.demo.svc.cluster.local"
	healthy := xdstest.DialSotW(t, addr)
	healthy.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("healthy", "west"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}})
	healthy.Send(t, ack(resourcev3.EndpointType, []string{name}, healthy.ExpectType(t, resourcev3.EndpointType, "first request")))
	for i := range 5 {
		ip := fmt.Sprintf("10.9.0.%d", i)
		h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "s0000"}, namedService("s0000", ip))
		h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: fmt.Sprintf("new%d", i)}, namedService(fmt.Sprintf("new%d", i), ip)) // a new cluster: the CDS set changes too
		r := healthy.ExpectType(t, resourcev3.EndpointType, fmt.Sprintf("push %d", i))
		if got := claNames(t, r); got[name] != ip {
			t.Fatalf("push %d: %v; want %s", i, got, ip)
		}
		healthy.Send(t, ack(resourcev3.EndpointType, []string{name}, r))
	}
	if err := stalledSends(); err != nil {
		t.Fatal(err)
	}
	var sent dto.Metric
	if err := h.proxies.bytes.WithLabelValues("Cluster").Write(&sent); err != nil {
		t.Fatal(err)
	}
	if n := sent.GetCounter().GetValue(); n < 4*64<<10 {
		t.Fatalf("the stalled stream's response is %.0f bytes: not larger than its window", n)
	}
}

// deltaSends is a Delta stream that records what is sent on it.
type deltaSends struct {
	grpc.ServerStream // nil: not used
	sent              []*discoveryv3.DeltaDiscoveryResponse
}

func (s *deltaSends) Send(r *discoveryv3.DeltaDiscoveryResponse) error {
	s.sent = append(s.sent, r)
	return nil
}

func (s *deltaSends) Recv() (*discoveryv3.DeltaDiscoveryRequest, error) { return nil, io.EOF }

// openDeltaConn is a Delta stream's loop state over a hub with two
// services, driven by the test (handle, sendQueued) instead of a client;
// its responses are kept in st.
func openDeltaConn(t *testing.T) (*Hub, *deltaConn, *deltaSends) {
	t.Helper()
	h, err := New(Options{DomainSuffix: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	twoServices(h)
	st := &deltaSends{}
	c := &deltaConn{conn: newConn(1), a: &adsServer{tracker: h.proxies, watcher: h.watcher, held: h.held, names: h.names, fleet: h.fleet},
		st: st, types: map[string]*deltaType{}}
	if err := h.proxies.onStreamOpen(context.Background(), c.conn, resourcev3.AnyType); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return h, c, st
}

// TestDeltaAnswerQueuedBeforeARequestIsHeldFirst: a push answers a Delta
// stream's parked watch after its loop last took its outbox, and a request
// (the ACK of an earlier response) arrives before that answer went out.
// The answer is sent and recorded before the request's watch reads what the
// stream holds: that watch compares with what the stream will hold, and
// the loop never changes a holding a parked watch reads.
func TestDeltaAnswerQueuedBeforeARequestIsHeldFirst(t *testing.T) {
	h, c, st := openDeltaConn(t)
	handle := func(req *discoveryv3.DeltaDiscoveryRequest) {
		t.Helper()
		if err := c.handle(req, resourcev3.AnyType); err != nil {
			t.Fatal(err)
		}
	}
	handle(&discoveryv3.DeltaDiscoveryRequest{Node: xdstest.Node("delta", "west"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{edsA, edsB}})
	if err := c.sendQueued(); err != nil || len(st.sent) != 1 {
		t.Fatalf("first response: %v, %d sent", err, len(st.sent))
	}
	first := st.sent[0]
	handle(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: first.Nonce}) // parked
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "a"}, namedService("a", "10.0.0.2"))
	h.push(context.Background(), &feed.Batch{Hosts: map[string]struct{}{"a.demo.svc.cluster.local": {}}, Since: time.Now()}) // answers it: queued
	handle(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: first.Nonce})                 // before the loop took it
	if len(st.sent) != 2 || len(st.sent[1].Resources) != 1 || st.sent[1].Resources[0].Name != edsA {
		t.Fatalf("sent %d responses; want the pushed one (a) sent before the request's watch was made", len(st.sent))
	}
	parked := c.rec.subs[resourcev3.EndpointType].parked
	held := c.types[resourcev3.EndpointType].sub.holds.res
	if parked == nil || reflect.ValueOf(parked.held.byName()).UnsafePointer() != reflect.ValueOf(held).UnsafePointer() || held[edsA].version != st.sent[1].Resources[0].Version {
		t.Fatalf("the parked watch (%v) does not read what the stream holds (%v)", parked != nil, held)
	}
}

// TestADSOrderWithinAPush: when one change answers several of a stream's
// watches, the responses come in the xDS protocol's order (its "eventual
// consistency considerations"): CDS before EDS, LDS before RDS. Each
// round adds a service (new cluster, listener and route) and moves one's
// endpoints, on several streams at once, so a push's workers answer
// every stream's four watches in parallel.
func TestADSOrderWithinAPush(t *testing.T) {
	h, addr, _ := serveHub(t, Options{})
	services := []*clusters.Service{namedService("a", "10.0.0.1")}
	h.index.ReplaceCluster("west", services)
	const streams, rounds = 6, 8
	var routes []string
	for i := range rounds {
		routes = append(routes, xdsgen.ListenerName(fmt.Sprintf("c%d.demo.svc.cluster.local", i), 7070))
	}
	order := []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.ListenerType, resourcev3.RouteType}
	names := map[string][]string{resourcev3.EndpointType: {edsA}, resourcev3.RouteType: routes}
	var cs []*xdstest.SotW
	for i := range streams {
		c := xdstest.DialSotW(t, addr)
		for k, typeURL := range order {
			req := &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names[typeURL]}
			if k == 0 {
				req.Node = xdstest.Node(fmt.Sprintf("ordered-%d", i), "west")
			}
			c.Send(t, req)
			c.Send(t, ack(typeURL, names[typeURL], c.ExpectType(t, typeURL, "first request")))
		}
		xdstest.Barrier(t, c, "after the first responses")
		cs = append(cs, c)
	}
	for round := range rounds {
		services = append(services, namedService(fmt.Sprintf("c%d", round), fmt.Sprintf("10.1.%d.1", round)))
		services[0] = namedService("a", fmt.Sprintf("10.0.0.%d", round+2))
		h.index.ReplaceCluster("west", slices.Clone(services))
		for i, c := range cs {
			for _, typeURL := range order {
				r := c.ExpectType(t, typeURL, fmt.Sprintf("round %d, stream %d", round, i))
				c.Send(t, ack(typeURL, names[typeURL], r))
			}
			xdstest.Barrier(t, c, fmt.Sprintf("round %d, stream %d: one response per type", round, i))
		}
	}
}

// A stream keeps of its node only what the hub reads: an Istio sidecar's
// metadata and Envoy's extensions would otherwise stay for the stream's
// whole life.
func TestForgetUnread(t *testing.T) {
	meta, err := structpb.NewStruct(map[string]any{
		"CLUSTER_ID": "west", "NAMESPACE": "demo", "GENERATOR": "grpc", "ISTIO_VERSION": "1.28.0",
		"LABELS": map[string]any{"app": "a"}, "ANNOTATIONS": map[string]any{"x": "y"}, "POD_PORTS": "[]",
	})
	if err != nil {
		t.Fatal(err)
	}
	n := &corev3.Node{Id: "sidecar~10.0.0.1~a.demo~demo.svc.cluster.local", Cluster: "a.demo", UserAgentName: "gRPC Go", Metadata: meta,
		Extensions: []*corev3.Extension{{Name: "envoy.filters.http.router"}}, ClientFeatures: []string{"xds.config.resource-in-sotw"}}
	forgetUnread(n)
	if len(n.Extensions) != 0 || len(n.ClientFeatures) != 0 {
		t.Errorf("extensions %v, client features %v kept", n.Extensions, n.ClientFeatures)
	}
	want := map[string]string{"CLUSTER_ID": "west", "NAMESPACE": "demo", "GENERATOR": "grpc", "ISTIO_VERSION": "1.28.0", "LABELS": ""}
	got := map[string]string{}
	for k, v := range n.GetMetadata().GetFields() {
		got[k] = v.GetStringValue()
	}
	if !maps.Equal(got, want) {
		t.Errorf("metadata kept %v; want %v", got, want)
	}
	if !xdsgen.Proxyless(n) || n.GetId() == "" || n.GetCluster() != "a.demo" {
		t.Errorf("what the hub reads changed: %v", n)
	}
}

// TestOneRecordOfWhatAStreamHolds: the stream's record of what it holds
// keeps what the two records it replaced kept. Delta streams that say
// they hold the same versions share one holding; a SotW subscription
// that turns from a wildcard (whole-state responses) to names compares
// by name with what the whole state left, resending nothing; and a
// whole-state response of Istio config, which has no xdsgen.Resources,
// is what the API shows.
func TestOneRecordOfWhatAStreamHolds(t *testing.T) {
	held := newHoldings[heldResource]()
	names := newHoldings[struct{}]()
	req := &discoveryv3.DeltaDiscoveryRequest{InitialResourceVersions: map[string]string{"a": "1", "b": "2"}}
	one, two := newDeltaSubscription(req, names, held), newDeltaSubscription(req, names, held)
	if one.holds != two.holds {
		t.Error("two Delta streams holding the same initial versions hold two holdings")
	}
	one.release()
	two.release()

	sds := newSotwSubscription(nil, held)
	a := &xdsgen.Resource{Name: "a", Version: "1", Any: &anypb.Any{TypeUrl: "a"}}
	sds.took(&sotwResponse{PassthroughResponse: &cachev3.PassthroughResponse{}, whole: []*xdsgen.Resource{a}})
	sds.set([]string{"a"})
	if sds.held().changed(a) {
		t.Error("a name held from a wildcard's whole state counts as changed once subscribed by name")
	}
	if got := sds.held().anys(); len(got) != 1 || got[0] != a.Any {
		t.Errorf("the API shows %v; want a's resource", got)
	}
	sds.release()

	config := newSotwSubscription(nil, held)
	anys := []*anypb.Any{{TypeUrl: "networking.istio.io/v1/ServiceEntry"}}
	config.took(&sotwResponse{PassthroughResponse: &cachev3.PassthroughResponse{DiscoveryResponse: &discoveryv3.DiscoveryResponse{Resources: anys}}, set: "v1"})
	if got := config.held().anys(); len(got) != 1 || got[0] != anys[0] {
		t.Errorf("the API shows %v of an Istio config response; want its resources", got)
	}
}

// TestDeltaRewarmSurvivesAnACK: a CDS response that changes a cluster the
// stream holds is followed by that cluster's endpoints (resendEndpoints),
// also when the loop sends it while it takes an EDS request (an ACK that
// raced the push): the EDS watch resendEndpoints made is replaced by the
// request's, which must send the endpoints again.
func TestDeltaRewarmSurvivesAnACK(t *testing.T) {
	_, c, st := openDeltaConn(t)
	handle := func(req *discoveryv3.DeltaDiscoveryRequest) *discoveryv3.DeltaDiscoveryResponse {
		t.Helper()
		if err := c.handle(req, resourcev3.AnyType); err != nil {
			t.Fatal(err)
		}
		n := len(st.sent)
		if err := c.sendQueued(); err != nil {
			t.Fatal(err)
		}
		if len(st.sent) == n {
			return nil
		}
		return st.sent[len(st.sent)-1]
	}
	cds := handle(&discoveryv3.DeltaDiscoveryRequest{Node: xdstest.Node("delta", "west"), TypeUrl: resourcev3.ClusterType})
	eds := handle(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{edsA, edsB}})
	if cds == nil || eds == nil || len(eds.Resources) != 2 {
		t.Fatalf("first responses: CDS %v, EDS %v", cds != nil, eds)
	}
	handle(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: cds.Nonce})
	handle(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: eds.Nonce})
	// What a push of a change to cluster a's Cluster alone queues.
	var changed *discoveryv3.Resource
	for _, r := range cds.Resources {
		if r.Name == edsA {
			changed = &discoveryv3.Resource{Name: r.Name, Version: r.Version + "'", Resource: r.Resource}
		}
	}
	if changed == nil {
		t.Fatalf("no cluster %s in %v", edsA, cds.Resources)
	}
	c.out.put(reply{delta: &deltaResponse{
		DeltaPassthroughResponse: &cachev3.DeltaPassthroughResponse{
			DeltaRequest:           c.types[resourcev3.ClusterType].req,
			DeltaDiscoveryResponse: &discoveryv3.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Resources: []*discoveryv3.Resource{changed}},
		},
		changed: []*xdsgen.Resource{{Name: changed.Name, Version: changed.Version, Any: changed.Resource}},
	}})
	n := len(st.sent)
	handle(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: eds.Nonce}) // the ACK, again
	var resent bool
	for _, r := range st.sent[n:] {
		if r.TypeUrl == resourcev3.EndpointType && len(r.Resources) == 1 && r.Resources[0].Name == edsA {
			resent = true
		}
	}
	if !resent {
		t.Fatalf("after the changed cluster %s the stream got %d responses, none with its endpoints", edsA, len(st.sent)-n)
	}
}
