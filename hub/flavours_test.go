package hub

import (
	"context"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/internal/xdstest"
)

// clientKinds are a node of every kind of client the hub tells apart
// (xdsgen.Proxyless), and whether it is a proxyless gRPC one.
var clientKinds = map[string]struct {
	node      *corev3.Node
	proxyless bool
}{
	"envoy":           {&corev3.Node{Id: "sidecar~10.0.0.9~a.demo~demo.svc.cluster.local", UserAgentName: "envoy"}, false},
	"grpc-generator":  {&corev3.Node{Id: "sidecar~10.0.0.8~b.demo~demo.svc.cluster.local", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"GENERATOR": structpb.NewStringValue("grpc")}}}, true},
	"grpc-user-agent": {&corev3.Node{Id: "c", UserAgentName: "gRPC Go", UserAgentVersionType: &corev3.Node_UserAgentVersion{UserAgentVersion: "1.85.0"}}, true},
	"istiod":          {&corev3.Node{Id: "istiod", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"GENERATOR": structpb.NewStringValue("api")}}}, false},
}

// TestStreamsGetTheirClientKindsClusters runs one hub in STRICT: an
// Envoy-shaped stream and a proxyless gRPC one ask for the same cluster
// and each gets its own flavour.
func TestStreamsGetTheirClientKindsClusters(t *testing.T) {
	h, addr, _ := serveHub(t, Options{MTLSMode: xdsgen.MTLSStrict, Roots: fakeRoots{}})
	h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	const cds = "outbound|7070||echo.demo.svc.cluster.local"
	conn := xdstest.Dial(t, addr)
	for kind, c := range clientKinds {
		if kind == "istiod" {
			continue
		}
		t.Run(kind, func(t *testing.T) {
			for _, names := range [][]string{{cds}, nil} { // by name, and wildcard
				stream := xdstest.OpenSotW(t, context.Background(), conn)
				stream.Send(t, &discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: resourcev3.ClusterType, ResourceNames: names})
				resp := stream.Expect(t, "CDS response")
				if len(resp.GetResources()) != 1 {
					t.Fatalf("names %v: %d clusters; want 1", names, len(resp.GetResources()))
				}
				cl := &clusterv3.Cluster{}
				if err := resp.GetResources()[0].UnmarshalTo(cl); err != nil {
					t.Fatal(err)
				}
				// The shape of the context is xdsgen's to test.
				if got := cl.GetTransportSocket().GetTypedConfig().MessageIs(&tlsv3.UpstreamTlsContext{}); got != c.proxyless {
					t.Errorf("names %v: UpstreamTlsContext %v; want %v", names, got, c.proxyless)
				}
			}
		})
	}
}

func TestStrictNeedsTheLocalTrustDomain(t *testing.T) {
	if _, err := New(Options{MTLSMode: xdsgen.MTLSStrict}); err == nil {
		t.Error("STRICT without a trust domain was accepted")
	}
}
