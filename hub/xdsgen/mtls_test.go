package xdsgen

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/feed"
)

// validateDeep runs Envoy's ValidateAll on msg and on every message packed
// in an Any inside it (ValidateAll checks an Any's type URL only), as
// Envoy unpacks them: transport sockets' TLS contexts, HCMs, filters.
func validateDeep(t *testing.T, what string, msg proto.Message) {
	t.Helper()
	if v, ok := msg.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			t.Errorf("%s: %T fails Envoy validation: %v", what, msg, err)
		}
	}
	var walk func(m protoreflect.Message)
	walk = func(m protoreflect.Message) {
		if a, ok := m.Interface().(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			if err != nil {
				t.Errorf("%s: unpacking %s: %v", what, a.GetTypeUrl(), err)
				return
			}
			validateDeep(t, what+" > "+a.GetTypeUrl(), inner)
			return
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := range v.List().Len() {
					walk(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { walk(mv.Message()); return true })
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				walk(v.Message())
			}
			return true
		})
	}
	walk(msg.ProtoReflect())
}

var (
	envoyNode   = &corev3.Node{Id: "sidecar~10.0.0.9~a.demo~demo.svc.cluster.local", UserAgentName: "envoy"}
	grpcNode    = &corev3.Node{Id: "sidecar~10.0.0.8~b.demo~demo.svc.cluster.local", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"GENERATOR": structpb.NewStringValue("grpc")}}}
	grpcUANode  = &corev3.Node{Id: "c", UserAgentName: "gRPC Go", UserAgentVersionType: &corev3.Node_UserAgentVersion{UserAgentVersion: "1.85.0"}}
	apiNode     = &corev3.Node{Id: "istiod", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"GENERATOR": structpb.NewStringValue("api")}}}
	clientKinds = map[string]struct {
		node      *corev3.Node
		proxyless bool
	}{"envoy": {envoyNode, false}, "grpc-Generator": {grpcNode, true}, "grpc-user-agent": {grpcUANode, true}, "istiod": {apiNode, false}}
)

// fakeRoots is the hub's RootSource as far as the Generator reads it.
type fakeRoots struct{}

func (fakeRoots) LocalTrustDomain() string { return "example.org" }

func mtlsGenerator(t *testing.T, mode MTLSMode) *Generator {
	t.Helper()
	g := New(testIndex())
	if err := g.SetMTLS(mode, fakeRoots{}, "istio-system"); err != nil {
		t.Fatal(err)
	}
	return g
}

func unpack[M proto.Message](t *testing.T, r *Resource, m M) M {
	t.Helper()
	if err := r.Any.UnmarshalTo(m); err != nil {
		t.Fatalf("%s: %v", r.Name, err)
	}
	return m
}

// upstreamContext returns a Cluster's UpstreamTlsContext, nil without one.
func upstreamContext(t *testing.T, c *clusterv3.Cluster) *tlsv3.UpstreamTlsContext {
	t.Helper()
	ts := c.GetTransportSocket()
	if ts == nil {
		return nil
	}
	if ts.GetName() != "envoy.transport_sockets.tls" {
		t.Errorf("%s: transport socket %q; grpc-go accepts only envoy.transport_sockets.tls", c.GetName(), ts.GetName())
	}
	u := &tlsv3.UpstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(u); err != nil {
		t.Fatalf("%s: %v", c.GetName(), err)
	}
	return u
}

// checkProviders asserts Istio's grpcgen certificate provider shape.
func checkProviders(t *testing.T, what string, c *tlsv3.CommonTlsContext) *tlsv3.CertificateValidationContext {
	t.Helper()
	id := c.GetTlsCertificateProviderInstance()
	if id.GetInstanceName() != "default" || id.GetCertificateName() != "default" {
		t.Errorf("%s: identity provider %v; want instance default, certificate default", what, id)
	}
	v := c.GetValidationContext()
	ca := v.GetCaCertificateProviderInstance()
	if ca.GetInstanceName() != "default" || ca.GetCertificateName() != "ROOTCA" {
		t.Errorf("%s: ca_certificate_provider_instance %v; want instance default, certificate ROOTCA", what, ca)
	}
	return v
}

func TestMTLSModeAndClientKindDecideTLSContexts(t *testing.T) {
	const cluster = "outbound|7070||echo.demo.svc.cluster.local"
	inbound := InboundListenerPrefix + "198.18.0.1:8080"
	plainCDS := map[string]*Resource{}
	for _, mode := range []MTLSMode{MTLSStrict, MTLSPermissive, MTLSDisable} {
		for kind, c := range clientKinds {
			t.Run(string(mode)+"/"+kind, func(t *testing.T) {
				g := mtlsGenerator(t, mode)
				fl := FlavourOf(c.node)
				res, err := g.Resources(resourcev3.ClusterType, []string{cluster}, View{Flavour: fl})
				if err != nil || len(res) != 1 {
					t.Fatalf("CDS = %v, %v", res, err)
				}
				cl := unpack(t, res[0], &clusterv3.Cluster{})
				validateDeep(t, cluster, cl)
				if fl == FlavourEnvoy {
					checkEnvoyCluster(t, cl)
					// Envoy takes an api_listener only from its bootstrap:
					// none is sent to it, inbound ones neither.
					if lres, err := g.Resources(resourcev3.ListenerType, []string{inbound, ListenerName("echo.demo.svc.cluster.local", 7070)}, View{Flavour: fl}); err != nil || len(lres) != 0 {
						t.Errorf("LDS to Envoy = %v, %v; want none", lres, err)
					}
					return
				}
				u := upstreamContext(t, cl)
				wantTLS := mode == MTLSStrict && c.proxyless
				if (u != nil) != wantTLS {
					t.Fatalf("cluster has UpstreamTlsContext: %v; want %v", u != nil, wantTLS)
				}
				if u != nil {
					v := checkProviders(t, cluster, u.GetCommonTlsContext())
					sans := sansOf(v)
					if len(sans) != 1 || sans[0].GetPrefix() != "spiffe://example.org/" {
						t.Errorf("SAN matchers %v; want the trust domain prefix spiffe://example.org/", sans)
					}
				} else {
					// Whatever the mode, every client that is not a
					// proxyless gRPC one under STRICT gets the very bytes
					// Envoy always got.
					b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(buildCluster(cluster, clusters.ServicePort{Name: "grpc", Port: 7070, Protocol: "TCP"}))
					if !proto.Equal(res[0].Any, &anypb.Any{TypeUrl: resourcev3.ClusterType, Value: b}) {
						t.Error("plain Cluster differs from the one Envoy always got")
					}
					if prev := plainCDS[string(mode)]; prev != nil && prev.Version != res[0].Version {
						t.Error("plain Cluster differs between client kinds")
					}
					plainCDS[string(mode)] = res[0]
				}

				lres, err := g.Resources(resourcev3.ListenerType, []string{inbound}, View{Flavour: fl})
				if err != nil || len(lres) != 1 {
					t.Fatalf("inbound LDS = %v, %v", lres, err)
				}
				l := unpack(t, lres[0], &listenerv3.Listener{})
				validateDeep(t, inbound, l)
				checkInbound(t, l, mode)
			})
		}
	}
}

// checkInbound asserts the shape grpc-go's xDS server needs (gRFC A36) and
// Istio's grpcgen builds.
func checkInbound(t *testing.T, l *listenerv3.Listener, mode MTLSMode) {
	t.Helper()
	sa := l.GetAddress().GetSocketAddress()
	if sa.GetAddress() != "198.18.0.1" || sa.GetPortValue() != 8080 {
		t.Errorf("listener address %v; want 198.18.0.1:8080", sa)
	}
	if len(l.GetFilterChains()) != 1 || l.GetApiListener() != nil || len(l.GetListenerFilters()) != 0 {
		t.Fatalf("listener = %v; want one filter chain, no api_listener, no listener filters", l)
	}
	fc := l.GetFilterChains()[0]
	hcm := &hcmv3.HttpConnectionManager{}
	if err := fc.GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	vh := hcm.GetRouteConfig().GetVirtualHosts()
	if len(vh) != 1 || len(vh[0].GetDomains()) != 1 || vh[0].GetDomains()[0] != "*" ||
		vh[0].GetRoutes()[0].GetMatch().GetPrefix() != "/" || vh[0].GetRoutes()[0].GetNonForwardingAction() == nil {
		t.Errorf("inline route = %v; want vhost *, prefix /, non_forwarding_action", vh)
	}
	filters := hcm.GetHttpFilters()
	if len(filters) == 0 || filters[len(filters)-1].GetName() != "envoy.filters.http.router" {
		t.Errorf("HTTP filters %v; want the router last", filters)
	}
	ts := fc.GetTransportSocket()
	if mode != MTLSStrict {
		if ts != nil || fc.GetName() != "inbound-plaintext" {
			t.Errorf("%s: filter chain %q has transport socket %v; want plaintext (gRPC servers cannot be permissive)", mode, fc.GetName(), ts)
		}
		return
	}
	if ts.GetName() != "envoy.transport_sockets.tls" {
		t.Fatalf("STRICT: transport socket %v; want envoy.transport_sockets.tls", ts)
	}
	d := &tlsv3.DownstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(d); err != nil {
		t.Fatal(err)
	}
	if !d.GetRequireClientCertificate().GetValue() {
		t.Error("STRICT: DownstreamTlsContext does not require a client certificate")
	}
	v := checkProviders(t, "inbound", d.GetCommonTlsContext())
	if len(sansOf(v)) != 0 {
		t.Error("server-side SAN matchers: grpc-go NACKs them")
	}
}

// TestPeerSANsAreTheServiceIdentitiesWhereKnown: a client verifies a
// destination's SPIFFE identity exactly, from its mesh pods' service
// accounts and Istio's annotations, wherever every member's view names
// one; a gateway or any other workload of ours that terminates TLS with
// another identity fails the handshake.
func TestPeerSANsAreTheServiceIdentitiesWhereKnown(t *testing.T) {
	svc := func(ksa, csa []string) *clusters.Service {
		return &clusters.Service{Namespace: "demo", Name: "echo", KubernetesServiceAccounts: ksa, CanonicalServiceAccounts: csa,
			Endpoints: []clusters.Endpoint{{Address: "10.0.0.1", Port: 8080, ServicePort: 80}}}
	}
	prefix := []string{"prefix:spiffe://example.org/"}
	for _, tc := range []struct {
		name    string
		members map[string]*clusters.Service
		want    []string
	}{
		{"none declared", map[string]*clusters.Service{"west": svc(nil, nil)}, prefix},
		{"declared in every member", map[string]*clusters.Service{
			"west": svc([]string{"echo"}, nil),
			"east": svc([]string{"echo", "echo-v2"}, []string{"spiffe://other.org/ns/demo/sa/echo"}),
		}, []string{"exact:spiffe://example.org/ns/demo/sa/echo", "exact:spiffe://example.org/ns/demo/sa/echo-v2", "exact:spiffe://other.org/ns/demo/sa/echo"}},
		{"one member silent", map[string]*clusters.Service{"west": svc([]string{"echo"}, nil), "east": svc(nil, nil)}, prefix},
		{"the mesh pods' service accounts", map[string]*clusters.Service{
			"west": {Namespace: "demo", Name: "echo", PodServiceAccounts: []string{"echo"}},
			"east": {Namespace: "demo", Name: "echo", PodServiceAccounts: []string{"echo-canary"}, KubernetesServiceAccounts: []string{"echo"}},
		}, []string{"exact:spiffe://example.org/ns/demo/sa/echo", "exact:spiffe://example.org/ns/demo/sa/echo-canary"}},
		{"a member with no mesh pod known", map[string]*clusters.Service{
			"west": {Namespace: "demo", Name: "echo", PodServiceAccounts: []string{"echo"}},
			"east": svc(nil, nil),
		}, prefix},
		{"a member without endpoints (scaled to zero) is passed over", map[string]*clusters.Service{
			"west": {Namespace: "demo", Name: "echo", PodServiceAccounts: []string{"echo"}},
			"east": {Namespace: "demo", Name: "echo"},
		}, []string{"exact:spiffe://example.org/ns/demo/sa/echo"}},
		{"too many service accounts to name", map[string]*clusters.Service{
			"west": {Namespace: "demo", Name: "echo", TooManyPodServiceAccounts: true, KubernetesServiceAccounts: []string{"echo"}},
		}, prefix},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, m := range peerSANs("example.org", tc.members) {
				switch p := m.GetMatchPattern().(type) {
				case *matcherv3.StringMatcher_Exact:
					got = append(got, "exact:"+p.Exact)
				case *matcherv3.StringMatcher_Prefix:
					got = append(got, "prefix:"+p.Prefix)
				}
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("SAN matchers %v; want %v", got, tc.want)
			}
		})
	}

	// Through the Generator: the annotated Service's clusters carry them.
	x := feed.NewIndex("cluster.local", nil)
	x.ReplaceCluster("west", []*clusters.Service{{
		Namespace: "demo", Name: "echo",
		Ports:                     []clusters.ServicePort{{Name: "grpc", Port: 7070, Protocol: "TCP"}},
		Endpoints:                 []clusters.Endpoint{{Address: "10.0.0.1", Port: 8080, ServicePort: 7070}},
		KubernetesServiceAccounts: []string{"echo"},
	}})
	g := New(x)
	if err := g.SetMTLS(MTLSStrict, fakeRoots{}, "istio-system"); err != nil {
		t.Fatal(err)
	}
	res, err := g.Resources(resourcev3.ClusterType, []string{"outbound|7070||echo.demo.svc.cluster.local"}, View{Flavour: FlavourGRPC})
	if err != nil || len(res) != 1 {
		t.Fatalf("CDS = %v, %v", res, err)
	}
	cl := unpack(t, res[0], &clusterv3.Cluster{})
	validateDeep(t, "annotated cluster", cl)
	sans := sansOf(checkProviders(t, "annotated", upstreamContext(t, cl).GetCommonTlsContext()))
	if len(sans) != 1 || sans[0].GetExact() != "spiffe://example.org/ns/demo/sa/echo" {
		t.Errorf("annotated Service's SAN matchers %v; want exactly spiffe://example.org/ns/demo/sa/echo", sans)
	}
}

func TestInboundListenerNames(t *testing.T) {
	g := mtlsGenerator(t, MTLSStrict)
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"198.18.0.1:50051", true},
		{"0.0.0.0:8080", true}, // a server listening on every interface
		{"[::]:8080", true},
		{"[2001:db8::1]:443", true},
		{"[::ffff:198.18.0.1]:80", true},
		{"198.18.0.1:0", false},
		{"198.18.0.1:65536", false},
		{"198.18.0.1:080", false}, // not how grpc-go writes it
		{"198.18.0.1", false},
		{"echo.demo.svc.cluster.local:80", false},
		{"[fe80::1%eth0]:80", false},
		{"2001:db8::1:443", false},
		{"198.18.0.1:80/x", false},
		{"", false},
		{strings.Repeat("1", 300) + ":80", false},
	} {
		name := InboundListenerPrefix + tc.addr
		res, err := g.Resources(resourcev3.ListenerType, []string{name}, View{Flavour: FlavourGRPC})
		if err != nil {
			t.Fatalf("%q: %v", tc.addr, err)
		}
		if got := len(res) == 1; got != tc.ok {
			t.Errorf("inbound listener %q served: %v; want %v", tc.addr, got, tc.ok)
			continue
		}
		if tc.ok {
			l := unpack(t, res[0], &listenerv3.Listener{})
			validateDeep(t, name, l)
			if l.GetName() != name {
				t.Errorf("listener name %q; want %q", l.GetName(), name)
			}
		}
	}
	// Other names of the prefix's shape are not confused with services.
	if res, _ := g.Resources(resourcev3.ListenerType, []string{"xds.istio.io/grpc/lds/inbound:80"}, View{Flavour: FlavourPlain}); len(res) != 0 {
		t.Errorf("served %v for a garbage name", res[0].Name)
	}
	// The memo of inbound listeners (clients' words) stays bounded.
	for i := range maxInbound + 10 {
		_, _ = g.inboundListener(InboundListenerPrefix+"10.0."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250)+":80", nil)
	}
	if n := len(g.inbound); n > maxInbound {
		t.Errorf("inbound memo holds %d; want at most %d", n, maxInbound)
	}
}

func TestFlavoursAreMarshalledOnceAndSharedWhereEqual(t *testing.T) {
	g := mtlsGenerator(t, MTLSStrict)
	get := func(typeURL, name string, fl View) *Resource {
		res, err := g.Resources(typeURL, []string{name}, fl)
		if err != nil || len(res) != 1 {
			t.Fatalf("%s %s = %v, %v", typeURL, name, res, err)
		}
		return res[0]
	}
	const cds = "outbound|7070||echo.demo.svc.cluster.local"
	first, again := get(resourcev3.ClusterType, cds, View{Flavour: FlavourGRPC}), get(resourcev3.ClusterType, cds, View{Flavour: FlavourGRPC})
	if first != again {
		t.Error("a gRPC Cluster was marshalled twice")
	}
	if get(resourcev3.ClusterType, cds, View{Flavour: FlavourGRPC}).Version == get(resourcev3.ClusterType, cds, View{Flavour: FlavourPlain}).Version {
		t.Error("gRPC and plain Clusters are the same")
	}
	if get(resourcev3.EndpointType, cds, View{Flavour: FlavourGRPC}) != get(resourcev3.EndpointType, cds, View{Flavour: FlavourPlain}) {
		t.Error("EDS is not shared between flavours")
	}
	a, err := g.All(resourcev3.ClusterType, View{Flavour: FlavourGRPC})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := g.All(resourcev3.ClusterType, View{Flavour: FlavourPlain})
	if a.Version == b.Version {
		t.Error("wildcard CDS sets of both flavours are the same")
	}
	for _, r := range a.Resources {
		validateDeep(t, r.Name, unpack(t, r, &clusterv3.Cluster{}))
	}
}

func TestParseMTLSMode(t *testing.T) {
	for in, want := range map[string]MTLSMode{"": MTLSPermissive, "strict": MTLSStrict, "PERMISSIVE": MTLSPermissive, " Disable ": MTLSDisable} {
		if got, err := ParseMTLSMode(in); err != nil || got != want {
			t.Errorf("ParseMTLSMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"UNSET", "mutual", "STRICT,DISABLE"} {
		if _, err := ParseMTLSMode(in); err == nil {
			t.Errorf("ParseMTLSMode(%q) accepted", in)
		}
	}
}

// sansOf is a validation context's SAN matchers, the field grpc-go reads.
func sansOf(v *tlsv3.CertificateValidationContext) []*matcherv3.StringMatcher {
	//lint:ignore SA1019 grpc-go reads only match_subject_alt_names
	return v.GetMatchSubjectAltNames()
}

// checkEnvoyCluster: an Envoy's Cluster has Istio's auto mTLS whatever the
// mesh-wide mode (as istiod's sidecars): tlsMode istio endpoints get an
// UpstreamTlsContext with the workload certificate and roots by SDS over
// ADS, Istio's SNI, ALPN and our trust domain's identities; every other
// endpoint plaintext; and no transport socket of its own.
func checkEnvoyCluster(t *testing.T, cl *clusterv3.Cluster) {
	t.Helper()
	if cl.GetTransportSocket() != nil {
		t.Errorf("Envoy's cluster has a transport_socket: %v", cl.GetTransportSocket())
	}
	m := cl.GetTransportSocketMatches()
	if len(m) != 2 || m[0].GetName() != "tlsMode-istio" || m[1].GetName() != "tlsMode-disabled" {
		t.Fatalf("transport_socket_matches %v; want tlsMode-istio, tlsMode-disabled", m)
	}
	if got := m[0].GetMatch().GetFields()["tlsMode"].GetStringValue(); got != "istio" {
		t.Errorf("tlsMode-istio matches tlsMode=%q", got)
	}
	if m[1].GetMatch() != nil {
		t.Errorf("tlsMode-disabled matches %v; want every other endpoint", m[1].GetMatch())
	}
	u := &tlsv3.UpstreamTlsContext{}
	if err := m[0].GetTransportSocket().GetTypedConfig().UnmarshalTo(u); err != nil {
		t.Fatal(err)
	}
	if u.GetSni() != "outbound_.7070_._.echo.demo.svc.cluster.local" {
		t.Errorf("SNI %q", u.GetSni())
	}
	c := u.GetCommonTlsContext()
	if certs := c.GetTlsCertificateSdsSecretConfigs(); len(certs) != 1 || certs[0].GetName() != SDSWorkloadCert || certs[0].GetSdsConfig().GetAds() == nil {
		t.Errorf("certificate SDS %v; want %q over ADS", certs, SDSWorkloadCert)
	}
	v := c.GetCombinedValidationContext()
	if v.GetValidationContextSdsSecretConfig().GetName() != SDSRoots || v.GetValidationContextSdsSecretConfig().GetSdsConfig().GetAds() == nil {
		t.Errorf("roots SDS %v; want %q over ADS", v.GetValidationContextSdsSecretConfig(), SDSRoots)
	}
	sans := v.GetDefaultValidationContext().GetMatchTypedSubjectAltNames()
	if len(sans) != 1 || sans[0].GetSanType() != tlsv3.SubjectAltNameMatcher_URI || sans[0].GetMatcher().GetPrefix() != "spiffe://example.org/" {
		t.Errorf("SAN matchers %v; want URI prefix spiffe://example.org/", sans)
	}
	if !slices.Equal(c.GetAlpnProtocols(), []string{"istio", "h2"}) {
		t.Errorf("ALPN %v; want istio, h2 (a grpc port)", c.GetAlpnProtocols())
	}
}
