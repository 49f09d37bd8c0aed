package hub

import (
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/xdstest"
)

// TestSotWNoncesAsIstiodReadsThem: the xDS protocol's nonces, step by step
// on one SotW EDS stream, as istiod reads them (shouldRespond): an empty
// response_nonce is a new request and is answered with all it subscribes
// to, even what the stream holds; a nonce that is not the type's last
// response's is stale and ignored, names and all; the last one's is an
// ACK. A type's first request is answered whatever nonce it carries
// (Istio's adsc makes one up).
func TestSotWNoncesAsIstiodReadsThem(t *testing.T) {
	h, addr, _ := serveHub(t, Options{})
	twoServices(h)
	c := xdstest.DialSotW(t, addr)
	var last *discoveryv3.DiscoveryResponse
	steps := []struct {
		what   string
		names  []string
		nonce  func() string // nil: the last response's
		answer []string      // nil: no answer
	}{
		{"first request, no nonce", []string{edsA}, empty, []string{edsA}},
		{"ACK", []string{edsA}, nil, nil},
		{"stale nonce, new names", []string{edsA, edsB}, func() string { return "not-" + last.Nonce }, nil},
		{"no nonce, same names: a new request", []string{edsA}, empty, []string{edsA}},
		{"ACK of it", []string{edsA}, nil, nil},
		{"no nonce, new names", []string{edsA, edsB}, empty, []string{edsA, edsB}},
		{"ACK with new names", []string{edsA, edsB}, nil, nil},
	}
	for i, s := range steps {
		req := &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: s.names}
		if i == 0 {
			req.Node = xdstest.Node("nonces", "west")
		}
		if s.nonce != nil {
			req.ResponseNonce = s.nonce()
		} else {
			req.ResponseNonce, req.VersionInfo = last.Nonce, last.VersionInfo
		}
		c.Send(t, req)
		if s.answer == nil {
			xdstest.Barrier(t, c, s.what)
			continue
		}
		last = c.ExpectType(t, resourcev3.EndpointType, s.what)
		got := claNames(t, last)
		if len(got) != len(s.answer) {
			t.Fatalf("%s: answered %v; want %v", s.what, got, s.answer)
		}
		for _, name := range s.answer {
			if got[name] == "" {
				t.Fatalf("%s: answered %v; want %v", s.what, got, s.answer)
			}
		}
	}
	// A type's first request with a made-up nonce is answered.
	c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: "made-up"})
	c.ExpectType(t, resourcev3.ClusterType, "CDS's first request with a made-up nonce")
}

func empty() string { return "" }

// TestDeltaNoncesAsIstiodReadsThem: Delta has no stale requests (each says
// what changes): a request is answered for what it subscribes to that the
// stream does not hold, whatever its nonce; an ACK or a NACK (error_detail)
// subscribes nothing and gets nothing.
func TestDeltaNoncesAsIstiodReadsThem(t *testing.T) {
	h, addr, _ := serveHub(t, Options{})
	twoServices(h)
	c := xdstest.DialDelta(t, addr)
	c.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, Node: xdstest.Node("delta-nonces", "west"), ResourceNamesSubscribe: []string{edsA}})
	r := c.Expect(t, "a Delta response")
	if got := deltaCLAs(t, r); len(got) != 1 || got[edsA] == "" {
		t.Fatalf("first request: %v; want a", got)
	}
	c.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: r.Nonce})
	c.None(t, time.Second, "ACK")
	c.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: "not-" + r.Nonce, ResourceNamesSubscribe: []string{edsB}})
	r = c.Expect(t, "a Delta response")
	if got := deltaCLAs(t, r); len(got) != 1 || got[edsB] == "" {
		t.Fatalf("a subscription with an unknown nonce: %v; want b", got)
	}
	c.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: r.Nonce, ErrorDetail: &status.Status{Code: 3, Message: "rejected"}})
	c.None(t, time.Second, "NACK")
	c.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{edsA}})
	c.None(t, time.Second, "no nonce, a name already held")
}

// TestClusterChangeResendsItsEndpoints: a CDS response that changes a
// Cluster the stream holds is followed by that cluster's endpoint
// assignment, unchanged, without the client asking: Envoy re-warms a
// changed Cluster until its assignment arrives (15 s by default) and asks
// for nothing new, as it already watches the name (istiod's AlwaysRespond
// and forceEDSPush). Clusters new to the stream are left to the client's
// own request; a Delta stream that reconnects with
// initial_resource_versions gets, when it asks for endpoints, those of the
// clusters it was sent changed before.
func TestClusterChangeResendsItsEndpoints(t *testing.T) {
	renamed := func(h *Hub) {
		svc := namedService("a", "10.0.0.1")
		svc.Ports[0].Name = "tcp" // no longer HTTP/2: the Cluster changes, the assignment not
		h.index.UpdateService("west", clusters.ServiceKey{Namespace: "demo", Name: "a"}, svc)
	}
	t.Run("sotw", func(t *testing.T) {
		h, addr, _ := serveHub(t, Options{})
		twoServices(h)
		c := xdstest.DialSotW(t, addr)
		c.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("rewarm", "west"), TypeUrl: resourcev3.ClusterType})
		cds := c.ExpectType(t, resourcev3.ClusterType, "CDS")
		c.Send(t, ack(resourcev3.ClusterType, nil, cds))
		names := []string{edsA, edsB}
		c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names})
		eds := c.ExpectType(t, resourcev3.EndpointType, "EDS")
		c.Send(t, ack(resourcev3.EndpointType, names, eds))
		xdstest.Barrier(t, c, "ACKed")
		renamed(h)
		c.ExpectType(t, resourcev3.ClusterType, "the changed Cluster")
		if got := claNames(t, c.ExpectType(t, resourcev3.EndpointType, "its assignment, unchanged")); len(got) != 1 || got[edsA] == "" {
			t.Fatalf("after the Cluster change: %v; want a's assignment only", got)
		}
	})
	t.Run("delta", func(t *testing.T) {
		h, addr, _ := serveHub(t, Options{})
		twoServices(h)
		c := xdstest.DialDelta(t, addr)
		c.Send(t, &discoveryv3.DeltaDiscoveryRequest{Node: xdstest.Node("rewarm-delta", "west"), TypeUrl: resourcev3.ClusterType})
		cds := c.Expect(t, "a Delta response")
		c.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: cds.Nonce})
		c.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{edsA, edsB}})
		eds := c.Expect(t, "a Delta response")
		c.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: eds.Nonce})
		held := map[string]string{}
		for _, r := range cds.Resources {
			held[r.Name] = r.Version
		}
		eps := map[string]string{}
		for _, r := range eds.Resources {
			eps[r.Name] = r.Version
		}
		renamed(h)
		if r := c.Expect(t, "a Delta response"); r.TypeUrl != resourcev3.ClusterType || len(r.Resources) != 1 {
			t.Fatalf("after the change: %s with %d resources; want the changed Cluster", r.TypeUrl, len(r.Resources))
		}
		if got := deltaCLAs(t, c.Expect(t, "a Delta response")); len(got) != 1 || got[edsA] == "" {
			t.Fatalf("after the Cluster change: %v; want a's assignment only", got)
		}

		// A reconnect holding the old Cluster and every assignment.
		again := xdstest.DialDelta(t, addr)
		again.Send(t, &discoveryv3.DeltaDiscoveryRequest{Node: xdstest.Node("rewarm-delta", "west"), TypeUrl: resourcev3.ClusterType, InitialResourceVersions: held})
		if r := again.Expect(t, "a Delta response"); len(r.Resources) != 1 {
			t.Fatalf("reconnected CDS: %d resources; want the changed one", len(r.Resources))
		}
		again.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{edsA, edsB}, InitialResourceVersions: eps})
		if got := deltaCLAs(t, again.Expect(t, "a Delta response")); len(got) != 1 || got[edsA] == "" {
			t.Fatalf("reconnected EDS: %v; want a's assignment, though held", got)
		}
	})
}
