package hub

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/xdstest"
	"github.com/hubmesh/hub/mcp"
)

// istiodConfigTypes are the type URLs istiod subscribes to, in its order.
var istiodConfigTypes = mcp.IstiodTypes()

const serviceEntryType = "networking.istio.io/v1/ServiceEntry"

// istiodNode is the node istiod's config-source client (adsc) sends: an
// ID without a proxy type or IP, GENERATOR=api, ISTIO_VERSION, no
// CLUSTER_ID.
func istiodNode() *corev3.Node { return istiodNodeOf("") }

// istiodNodeOf is istiodNode with a CLUSTER_ID when cluster is set (a
// config-source client configured to name its member).
func istiodNodeOf(cluster string) *corev3.Node {
	fields := map[string]any{"GENERATOR": "api", "ISTIO_VERSION": "1.31.1"}
	if cluster != "" {
		fields["CLUSTER_ID"] = cluster
	}
	meta, _ := structpb.NewStruct(fields)
	return &corev3.Node{Id: "~~istiod-0.istio-system~istio-system.svc.cluster.local", Metadata: meta}
}

// istiodStream is a SotW ADS stream that behaves as istiod's config
// source client: every Istio config type as a wildcard on one stream,
// every response ACKed at once.
type istiodStream struct {
	t      *testing.T
	stream *xdstest.SotW
	node   *corev3.Node
}

func openIstiod(t *testing.T, addr string) *istiodStream { return openIstiodOf(t, addr, "") }

// openIstiodOf opens an istiod stream whose node names member cluster.
func openIstiodOf(t *testing.T, addr, cluster string) *istiodStream {
	t.Helper()
	s := &istiodStream{t: t, stream: xdstest.DialSotW(t, addr), node: istiodNodeOf(cluster)}
	for _, typeURL := range istiodConfigTypes {
		s.stream.Send(t, &discoveryv3.DiscoveryRequest{Node: s.node, TypeUrl: typeURL})
	}
	return s
}

// recv returns the next response, ACKed as adsc does (nonce, version, no
// names), or fails the test after a generous deadline.
func (s *istiodStream) recv() *discoveryv3.DiscoveryResponse {
	s.t.Helper()
	r, err := s.stream.NextWithin(s.t, 30*time.Second)
	if err != nil {
		s.t.Fatalf("receiving: %v", err)
	}
	s.stream.Send(s.t, &discoveryv3.DiscoveryRequest{Node: s.node, TypeUrl: r.TypeUrl, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce})
	return r
}

// serviceEntries decodes a ServiceEntry response by object name.
func serviceEntries(t *testing.T, resp *discoveryv3.DiscoveryResponse) (map[string]*mcpapi.Metadata, map[string]*networking.ServiceEntry) {
	t.Helper()
	metas, specs := map[string]*mcpapi.Metadata{}, map[string]*networking.ServiceEntry{}
	for _, a := range resp.Resources {
		var r mcpapi.Resource
		if err := a.UnmarshalTo(&r); err != nil {
			t.Fatalf("resource of type %s: %v", a.TypeUrl, err)
		}
		var se networking.ServiceEntry
		if err := r.Body.UnmarshalTo(&se); err != nil {
			t.Fatalf("body of %s (%s): %v", r.Metadata.GetName(), r.Body.GetTypeUrl(), err)
		}
		metas[r.Metadata.Name], specs[r.Metadata.Name] = r.Metadata, &se
	}
	return metas, specs
}

func addresses(se *networking.ServiceEntry) []string {
	var out []string
	for _, ep := range se.GetEndpoints() {
		out = append(out, ep.Labels[mcp.LabelCluster]+"="+ep.Address)
	}
	slices.Sort(out)
	return out
}

func echoMember(addrs ...string) *clusters.Service {
	s := &clusters.Service{Namespace: "demo", Name: "echo", Ports: []clusters.ServicePort{{Name: "http", Port: 8080, Protocol: "TCP"}}}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, clusters.Endpoint{Address: a, Port: 8080, ServicePort: 8080, Region: "r", Zone: "z"})
	}
	return s
}

func TestIstiodConfigSource(t *testing.T) {
	h, addr, _ := serveHub(t, Options{})
	echo := clusters.ServiceKey{Namespace: "demo", Name: "echo"}
	h.index.UpdateService("west", echo, echoMember("10.1.0.1"))
	h.index.UpdateService("east", echo, echoMember("10.2.0.1"))
	istiod := openIstiod(t, addr)

	// Every type is answered, under the type URL asked for; everything
	// but ServiceEntry is an empty list.
	first := map[string]*discoveryv3.DiscoveryResponse{}
	for len(first) < len(istiodConfigTypes) {
		resp := istiod.recv()
		if !slices.Contains(istiodConfigTypes[:], resp.TypeUrl) {
			t.Fatalf("response of type %q, which was not asked for", resp.TypeUrl)
		}
		if first[resp.TypeUrl] != nil {
			t.Fatalf("a second %s response before every type got its first", resp.TypeUrl)
		}
		first[resp.TypeUrl] = resp
		if resp.TypeUrl != serviceEntryType && len(resp.Resources) != 0 {
			t.Errorf("%s: %d resources, want none", resp.TypeUrl, len(resp.Resources))
		}
	}
	metas, specs := serviceEntries(t, first[serviceEntryType])
	se := specs["demo/hub-echo"]
	if len(specs) != 1 || se == nil {
		t.Fatalf("ServiceEntries %v, want demo/hub-echo", specs)
	}
	if se.Hosts[0] != "echo.demo.svc.clusterset.local" || se.Resolution != networking.ServiceEntry_STATIC || se.Location != networking.ServiceEntry_MESH_INTERNAL {
		t.Errorf("ServiceEntry %v", se)
	}
	if got, want := addresses(se), []string{"east=10.2.0.1", "west=10.1.0.1"}; !slices.Equal(got, want) {
		t.Errorf("endpoints %v, want %v", got, want)
	}
	version := metas["demo/hub-echo"].Version
	// It is listed as a config subscriber, with its Istio version.
	var listed bool
	for _, p := range h.Proxies() {
		if p.ConfigSubscriber && p.IstioVersion == "1.31.1" && len(p.Types) == len(istiodConfigTypes) {
			listed = true
		}
	}
	if !listed {
		t.Errorf("the istiod stream is not listed as a config subscriber with its version and %d types: %+v", len(istiodConfigTypes), h.Proxies())
	}

	// A draining endpoint changes what Envoy gets (EDS) but not the
	// ServiceEntry (ready endpoints only): no config response. An Envoy
	// stream's EDS response shows the push was made.
	eds := openEDS(t, addr, "outbound|8080||echo.demo.svc.cluster.local")
	draining := echoMember("10.2.0.1")
	draining.Endpoints = append(draining.Endpoints, clusters.Endpoint{Address: "10.2.0.9", Port: 8080, ServicePort: 8080, Health: clusters.Draining})
	h.index.UpdateService("east", echo, draining)
	eds.waitFor(t, "10.2.0.9")

	// An endpoint becomes ready in east: the next config response is this
	// change (a response for the draining one would have come first), for
	// ServiceEntry only.
	h.index.UpdateService("east", echo, echoMember("10.2.0.1", "10.2.0.2"))
	resp := istiod.recv()
	if resp.TypeUrl != serviceEntryType {
		t.Fatalf("response of type %s after an endpoint change; want only %s", resp.TypeUrl, serviceEntryType)
	}
	metas, specs = serviceEntries(t, resp)
	if got, want := addresses(specs["demo/hub-echo"]), []string{"east=10.2.0.1", "east=10.2.0.2", "west=10.1.0.1"}; !slices.Equal(got, want) {
		t.Errorf("after the change: endpoints %v, want %v", got, want)
	}
	if metas["demo/hub-echo"].Version == version || resp.VersionInfo == first[serviceEntryType].VersionInfo {
		t.Errorf("object version %s, set version %s: unchanged after an endpoint change", version, resp.VersionInfo)
	}

	// The Service goes from both members: the full state has no object.
	h.index.UpdateService("east", echo, nil)
	h.index.UpdateService("west", echo, nil)
	for {
		resp = istiod.recv()
		if resp.TypeUrl != serviceEntryType {
			t.Fatalf("response of type %s; want only %s", resp.TypeUrl, serviceEntryType)
		}
		if len(resp.Resources) == 0 {
			break
		}
	}
}

// edsStream is an Envoy-shaped stream subscribed to one cluster's endpoints.
type edsStream struct {
	stream *xdstest.SotW
	name   string
}

func openEDS(t *testing.T, addr, name string) *edsStream {
	t.Helper()
	e := &edsStream{stream: xdstest.DialSotW(t, addr), name: name}
	e.stream.Send(t, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy"}, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}})
	return e
}

// waitFor receives (and ACKs) EDS responses until one has address.
func (e *edsStream) waitFor(t *testing.T, address string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := e.stream.NextWithin(t, time.Until(deadline))
		if err != nil {
			t.Fatalf("waiting for %s in EDS: %v", address, err)
		}
		e.stream.Send(t, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy"}, TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce, ResourceNames: []string{e.name}})
		for _, a := range resp.Resources {
			var cla endpointv3.ClusterLoadAssignment
			if err := a.UnmarshalTo(&cla); err != nil {
				t.Fatal(err)
			}
			if containsAddress(&cla, address) {
				return
			}
		}
	}
}

func containsAddress(cla *endpointv3.ClusterLoadAssignment, address string) bool {
	for _, l := range cla.Endpoints {
		for _, ep := range l.LbEndpoints {
			if ep.GetEndpoint().GetAddress().GetSocketAddress().GetAddress() == address {
				return true
			}
		}
	}
	return false
}

func TestIstioConfigOverDeltaIsRefused(t *testing.T) {
	_, addr, _ := serveHub(t, Options{})
	stream := xdstest.DialDelta(t, addr)
	stream.Send(t, &discoveryv3.DeltaDiscoveryRequest{Node: istiodNode(), TypeUrl: serviceEntryType})
	if _, err := stream.Next(t); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Delta ServiceEntry subscription: %v; want InvalidArgument", err)
	}
}

// Istio config type URLs are the client's words: one stream may open at
// most maxTypesPerStream types, then it is refused with InvalidArgument.
func TestConfigTypesPerStreamAreBounded(t *testing.T) {
	_, addr, _ := serveHub(t, Options{})
	c := xdstest.DialSotW(t, addr)
	for i := range maxTypesPerStream + 1 {
		req := &discoveryv3.DiscoveryRequest{TypeUrl: fmt.Sprintf("example.com/v1/Kind%d", i)}
		if i == 0 {
			req.Node = istiodNode()
		}
		c.Send(t, req)
	}
	// The first types are answered (empty lists); then the stream ends.
	for range maxTypesPerStream + 1 {
		if _, err := c.Next(t); err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("the stream ended with %v; want InvalidArgument", err)
			}
			return
		}
	}
	t.Fatalf("a stream asking for %d types was not refused", maxTypesPerStream+1)
}

// TestIstiodExportTo: on the mTLS port a member's view annotated
// hub.federation/export-to reaches only the streams whose member a
// credential proves to be one the annotation names (a workload certificate
// bound to it); a node's CLUSTER_ID, which anyone can write, proves
// nothing there: an anonymous stream naming the member gets what every
// member gets. The plaintext port trusts the node's CLUSTER_ID (as
// istiod's 15010 does).
func TestIstiodExportTo(t *testing.T) {
	s := startSecureHub(t, Options{})
	echo := clusters.ServiceKey{Namespace: "demo", Name: "echo"}
	s.h.index.UpdateService("west", echo, echoMember("10.1.0.1"))
	limited := echoMember("10.2.0.1")
	limited.ExportTo = []string{"north"}
	s.h.index.UpdateService("east", echo, limited)
	firstSE := func(c *xdstest.SotW, cluster string) []string {
		c.Send(t, &discoveryv3.DiscoveryRequest{Node: istiodNodeOf(cluster), TypeUrl: serviceEntryType})
		resp, err := c.Next(t)
		if err != nil {
			t.Fatal(err)
		}
		_, specs := serviceEntries(t, resp)
		return addresses(specs["demo/hub-echo"])
	}
	shared := []string{"west=10.1.0.1"}
	if got, want := firstSE(xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "istio-system", "north"))), "north"), []string{"east=10.2.0.1", "west=10.1.0.1"}; !slices.Equal(got, want) {
		t.Errorf("north's proven istiod: %v, want %v", got, want)
	}
	if got, want := firstSE(xdstest.DialSotW(t, s.plain), "north"), []string{"east=10.2.0.1", "west=10.1.0.1"}; !slices.Equal(got, want) {
		t.Errorf("plaintext, CLUSTER_ID north: %v, want %v", got, want)
	}
	for name, c := range map[string]*xdstest.SotW{
		"mTLS port, anonymous, CLUSTER_ID north": xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous())),
		"a certificate bound to south":           xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "istio-system", "south"))),
	} {
		if got := firstSE(c, "north"); !slices.Equal(got, shared) {
			t.Errorf("%s: %v, want %v", name, got, shared)
		}
	}
}
