package hub

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/internal/wait"
	"github.com/hubmesh/hub/internal/xdstest"
)

func namedService(name, ip string) *clusters.Service {
	s := echoService(ip)
	s.Name = name
	return s
}

// claNames decodes a response's ClusterLoadAssignments: name → first endpoint address.
func claNames(t *testing.T, r *discoveryv3.DiscoveryResponse) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range r.Resources {
		var cla endpointv3.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			t.Fatal(err)
		}
		out[cla.ClusterName] = cla.GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetAddress()
	}
	return out
}

// A SotW EDS stream holding two clusters' endpoints gets, after one of them
// changes, a response with only that one; it keeps the other (the tracker's
// view of what it holds says so too), a new name is answered with just that
// name, a NACKed version is not resent, and an unsubscribed name is no
// longer sent.
func TestSotWEDSCarriesOnlyWhatChanged(t *testing.T) {
	h, stream := startHub(t)
	h.index.ReplaceCluster("west", []*clusters.Service{namedService("a", "10.0.0.1"), namedService("b", "10.0.1.1"), namedService("c", "10.0.2.1")})
	node := &corev3.Node{Id: "sidecar~10.0.0.9~client.demo~demo.svc.cluster.local"}
	a, b, c := "outbound|7070||a.demo.svc.cluster.local", "outbound|7070||b.demo.svc.cluster.local", "outbound|7070||c.demo.svc.cluster.local"
	send := func(req *discoveryv3.DiscoveryRequest) {
		t.Helper()
		req.TypeUrl = resourcev3.EndpointType
		stream.Send(t, req)
	}
	ack := func(r *discoveryv3.DiscoveryResponse, names ...string) {
		t.Helper()
		send(&discoveryv3.DiscoveryRequest{ResourceNames: names, ResponseNonce: r.Nonce, VersionInfo: r.VersionInfo})
	}
	send(&discoveryv3.DiscoveryRequest{Node: node, ResourceNames: []string{a, b}})
	first := stream.Expect(t, "a response")
	if got := claNames(t, first); len(got) != 2 || got[a] != "10.0.0.1" || got[b] != "10.0.1.1" {
		t.Fatalf("first response = %v; want a and b", got)
	}
	ack(first, a, b)
	expectSilence(t, stream, "after the ACK")

	// b changes: only b is sent.
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "b"}, namedService("b", "10.0.1.2"))
	second := stream.Expect(t, "a response")
	if got := claNames(t, second); len(got) != 1 || got[b] != "10.0.1.2" {
		t.Fatalf("response after b changed = %v; want only b", got)
	}
	ack(second, a, b)
	waitHolds(t, h, map[string]string{a: "10.0.0.1", b: "10.0.1.2"})

	// c is added to the subscription: only c is sent, and a and b are still held.
	ack(second, a, b, c)
	third := stream.Expect(t, "a response")
	if got := claNames(t, third); len(got) != 1 || got[c] != "10.0.2.1" {
		t.Fatalf("response to the new name = %v; want only c", got)
	}
	ack(third, a, b, c)
	waitHolds(t, h, map[string]string{a: "10.0.0.1", b: "10.0.1.2", c: "10.0.2.1"})

	// a changes and the client NACKs it: not resent until a changes again.
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "a"}, namedService("a", "10.0.0.2"))
	fourth := stream.Expect(t, "a response")
	if got := claNames(t, fourth); len(got) != 1 || got[a] != "10.0.0.2" {
		t.Fatalf("response after a changed = %v; want only a", got)
	}
	send(&discoveryv3.DiscoveryRequest{ResourceNames: []string{a, b, c}, ResponseNonce: fourth.Nonce, VersionInfo: third.VersionInfo,
		ErrorDetail: &statuspb.Status{Code: 3, Message: "rejected by test"}})
	expectSilence(t, stream, "after a NACK")
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "c"}, namedService("c", "10.0.2.2"))
	fifth := stream.Expect(t, "a response")
	if got := claNames(t, fifth); len(got) != 1 || got[c] != "10.0.2.2" {
		t.Fatalf("response after c changed (a NACKed) = %v; want only c", got)
	}

	// c is unsubscribed: a change to it sends nothing.
	ack(fifth, a, b)
	waitHolds(t, h, map[string]string{a: "10.0.0.2", b: "10.0.1.2"})
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "c"}, namedService("c", "10.0.2.3"))
	expectSilence(t, stream, "after a change to an unsubscribed name")
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "a"}, namedService("a", "10.0.0.3"))
	if got := claNames(t, stream.Expect(t, "a response")); len(got) != 1 || got[a] != "10.0.0.3" {
		t.Fatalf("response after a changed again = %v; want only a", got)
	}
}

// waitHolds waits until the hub's view of what the single proxy holds of
// EDS is exactly want (name → first endpoint address).
func waitHolds(t *testing.T, h *testHub, want map[string]string) {
	t.Helper()
	wait.Until(t, 10*time.Second, func() error {
		cfg, ok := h.ProxyConfig("sidecar~10.0.0.9~client.demo~demo.svc.cluster.local")
		if !ok {
			return fmt.Errorf("no proxy")
		}
		got := claNames(t, &discoveryv3.DiscoveryResponse{Resources: cfg.Resources[resourcev3.EndpointType]})
		if len(got) != len(want) {
			return fmt.Errorf("proxy holds %v; want %v", got, want)
		}
		for k, v := range want {
			if got[k] != v {
				return fmt.Errorf("proxy holds %v; want %v", got, want)
			}
		}
		return nil
	})
}

// A response that the server drops because a newer request of its type
// arrived first is sent again: the stream's record of what it holds is
// updated only when a response is sent.
func TestDroppedIncrementalResponseIsNotLost(t *testing.T) {
	h, err := New(Options{DomainSuffix: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	h.index.ReplaceCluster("west", []*clusters.Service{namedService("a", "10.0.0.1"), namedService("b", "10.0.1.1")})
	a, b := "outbound|7070||a.demo.svc.cluster.local", "outbound|7070||b.demo.svc.cluster.local"
	node := &corev3.Node{Id: "n"}
	c := newConn(1)
	sub := newSotwSubscription([]string{a, b}, newHoldings[heldResource]())
	out := c.out
	next := func() *sotwResponse {
		q := out.take()
		if len(q) != 1 {
			t.Fatalf("%d responses handed over; want 1", len(q))
		}
		return q[0].sotw
	}
	sendTo := func(r *sotwResponse) { sub.took(r) } // what the stream loop does
	req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{a, b}}
	if _, err := h.watcher.CreateWatch(req, &sub, c); err != nil {
		t.Fatal(err)
	}
	sendTo(next()) // the stream loop sends the first response
	ackReq := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{a, b}, ResponseNonce: "1"}
	cancel, err := h.watcher.CreateWatch(ackReq, &sub, c)
	if err != nil {
		t.Fatal(err)
	}
	h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "b"}, namedService("b", "10.0.1.2"))
	h.push(context.Background(), &feed.Batch{Hosts: map[string]struct{}{"b.demo.svc.cluster.local": {}}, Since: time.Now()})
	next() // handed over, then dropped: a newer request arrives first
	cancel()
	if _, err := h.watcher.CreateWatch(ackReq, &sub, c); err != nil {
		t.Fatal(err)
	}
	resp := next().DiscoveryResponse
	if got := claNames(t, resp); len(got) != 1 || got[b] != "10.0.1.2" {
		t.Fatalf("after a dropped response the stream got %v; want b again", got)
	}
	if names := slices.Sorted(maps.Keys(sub.held().byName())); !slices.Equal(names, []string{a, b}) {
		t.Fatalf("returned resources = %v", names)
	}
}

// A stream's first request of a type is answered even when there is nothing
// for it, also when it carries a response nonce of the client's own making
// (Istio's adsc sends one; istiod's config client is not ready until every
// type it asked for was answered); its ACK is not answered again.
func TestFirstRequestAnsweredWhateverItsNonce(t *testing.T) {
	_, addr, _ := serveHub(t, Options{})
	c := xdstest.DialSotW(t, addr)
	for _, req := range []*discoveryv3.DiscoveryRequest{
		{Node: xdstest.Node("made-up-nonce", "west"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"outbound|80||nothing.demo.svc.cluster.local"}, ResponseNonce: "2026-11-23 05:35:00 +0000 UTC"},
		{TypeUrl: resourcev3.ClusterType, ResourceNames: []string{"outbound|80||nothing.demo.svc.cluster.local"}, ResponseNonce: "also made up"},
		{TypeUrl: resourcev3.ListenerType, ResponseNonce: "made up too"},
	} {
		c.Send(t, req)
		r, err := c.Next(t)
		if err != nil {
			t.Fatalf("%s: %v", req.TypeUrl, err)
		}
		if r.TypeUrl != req.TypeUrl || len(r.Resources) != 0 {
			t.Fatalf("first %s request: got %s with %d resources; want an empty response of its type", req.TypeUrl, r.TypeUrl, len(r.Resources))
		}
		c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: req.TypeUrl, ResourceNames: req.ResourceNames, ResponseNonce: r.Nonce, VersionInfo: r.VersionInfo})
	}
	// The ACKs are parked. The server handles a stream's requests in
	// order and an ACK's watch answers at once or never (without a
	// change): a response to any of them would come before the answer to
	// a later first request.
	c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.RouteType, ResourceNames: []string{"nothing:80"}, ResponseNonce: "made up"})
	r, err := c.Next(t)
	if err != nil || r.TypeUrl != resourcev3.RouteType {
		t.Fatalf("after the ACKs: %v, %v; want only the RDS response", r.GetTypeUrl(), err)
	}
	c.NoneYet(t, "ACKs of empty responses")
}
