package hub

import (
	"context"
	"strings"
	"testing"

	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/internal/xdstest"
	"github.com/hubmesh/hub/mcp"
)

// TestMTLSPortServesAnonymousStreamsIstioConfigOnly: istiod's config-source
// client speaks SIMPLE TLS at most (no certificate, no token). On the mTLS
// port such a stream gets every Istio config type and nothing else: a
// request for CDS, EDS, LDS, RDS or SDS ends it with Unauthenticated,
// whether it comes first or after config types; it is listed as a config
// subscriber without identity, as on the plaintext port, and counts against
// the stream limit.
func TestMTLSPortServesAnonymousStreamsIstioConfigOnly(t *testing.T) {
	s := startSecureHub(t, Options{Limits: Limits{MaxStreams: 2}})
	s.h.index.ReplaceCluster("west", []*clusters.Service{echoMember("10.0.0.1")})

	// istiod's stream: every config type answered, the ServiceEntry there.
	istiod := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()))
	for _, typ := range istiodConfigTypes {
		istiod.Send(t, &discoveryv3.DiscoveryRequest{Node: istiodNode(), TypeUrl: typ})
	}
	got := map[string]int{}
	for range istiodConfigTypes {
		r, err := istiod.Next(t)
		if err != nil {
			t.Fatalf("anonymous config stream on the mTLS port ended after %d types: %v", len(got), err)
		}
		got[r.TypeUrl] = len(r.Resources)
		istiod.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: r.TypeUrl, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce})
	}
	if len(got) != len(istiodConfigTypes) || got[serviceEntryType] != 1 {
		t.Fatalf("anonymous config stream got %v; want all %d types, one ServiceEntry", got, len(istiodConfigTypes))
	}
	var listed []xdsstatus.Proxy
	for _, p := range s.h.Proxies() {
		if p.ID == istiodNode().Id {
			listed = append(listed, p)
		}
	}
	if len(listed) != 1 || !listed[0].ConfigSubscriber || listed[0].Identity != "" || listed[0].IstioVersion == "" {
		t.Errorf("the anonymous istiod is listed as %+v; want one config subscriber with its version and no identity", listed)
	}

	// The stream limit (2) counts it: one more stream fits, a third does not.
	second := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()))
	second.Send(t, &discoveryv3.DiscoveryRequest{Node: istiodNode(), TypeUrl: serviceEntryType})
	if _, err := second.Next(t); err != nil {
		t.Fatalf("a second anonymous config stream: %v", err)
	}
	third := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()))
	third.Send(t, &discoveryv3.DiscoveryRequest{Node: istiodNode(), TypeUrl: serviceEntryType})
	third.Refused(t, "a third anonymous stream with a limit of two", codes.ResourceExhausted)

	// The same stream asking for CDS after its config: ended.
	istiod.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType})
	requireEnded(t, istiod, codes.Unauthenticated, "Cluster", "an anonymous config stream asking for CDS")
	second.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: []string{"ROOTCA"}})
	requireEnded(t, second, codes.Unauthenticated, "Secret", "an anonymous config stream asking for SDS without a node")

	// CDS first, then config: refused at the first request, for every type.
	for _, typ := range []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.ListenerType, resourcev3.RouteType, resourcev3.SecretType} {
		c := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()))
		c.Send(t, &discoveryv3.DiscoveryRequest{Node: istiodNode(), TypeUrl: typ})
		c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: serviceEntryType})
		c.Refused(t, "an anonymous "+shortType(typ)+" request before config types", codes.Unauthenticated)
	}

	// The per-type CDS service and Delta ADS: refused too.
	conn, err := grpc.NewClient(s.secure, grpc.WithTransportCredentials(s.anonymous()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cds, err := clusterservice.NewClusterDiscoveryServiceClient(conn).StreamClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = cds.Send(&discoveryv3.DiscoveryRequest{Node: istiodNode()})
	if _, err := cds.Recv(); status.Code(err) != codes.Unauthenticated {
		t.Errorf("an anonymous StreamClusters: %v; want Unauthenticated", err)
	}
	delta := xdstest.OpenDelta(t, ctx, conn)
	delta.Send(t, &discoveryv3.DeltaDiscoveryRequest{Node: istiodNode(), TypeUrl: resourcev3.EndpointType})
	if _, err := delta.Next(t); status.Code(err) != codes.Unauthenticated {
		t.Errorf("an anonymous Delta EDS stream: %v; want Unauthenticated", err)
	}
}

// requireEnded reads what a stream still had coming (config responses
// pushed before) until it ends, and asserts it ended with code and a message
// naming what was refused.
func requireEnded(t *testing.T, c *xdstest.SotW, code codes.Code, what, desc string) {
	t.Helper()
	for {
		r, err := c.Next(t)
		if r != nil {
			if !mcp.IsConfigType(r.TypeUrl) {
				t.Fatalf("%s: got a %s response; want the stream ended with %s", desc, r.TypeUrl, code)
			}
			continue
		}
		if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), what) {
			t.Fatalf("%s: stream ended with %v; want %s naming %s", desc, err, code, what)
		}
		return
	}
}
