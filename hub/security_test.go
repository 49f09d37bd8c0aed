package hub

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/internal/wait"
	"github.com/hubmesh/hub/internal/xdstest"
	"github.com/hubmesh/hub/trust"
)

// secureHub is a Hub serving a plaintext and an mTLS listener on loopback,
// with real SPIFFE certificates: our trust domain example.org and a
// federated peer, peer.org, whose workloads the mTLS listener also accepts.
type secureHub struct {
	h             *Hub
	plain, secure string
	ca, peerCA    *trust.CA
	bundle        *x509bundle.Bundle // ours, for clients to verify the hub
	secrets       *fakeSecrets
	metrics       *prometheus.Registry
	logs          *syncBuffer
}

// syncBuffer collects the hub's JSON log lines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns how many log lines have message msg and every given field.
func (b *syncBuffer) count(msg string, fields map[string]string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, line := range strings.Split(b.buf.String(), "\n") {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil || entry["msg"] != msg {
			continue
		}
		match := true
		for k, v := range fields {
			if fmt.Sprint(entry[k]) != v {
				match = false
			}
		}
		if match {
			n++
		}
	}
	return n
}

func startSecureHub(t testing.TB, opts Options) *secureHub {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString("example.org")
	ca, err := trust.NewSelfSignedCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	peerCA, err := trust.NewSelfSignedCA(spiffeid.RequireTrustDomainFromString("peer.org"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s := &secureHub{ca: ca, peerCA: peerCA, bundle: x509bundle.FromX509Authorities(td, []*x509.Certificate{ca.Cert}),
		metrics: prometheus.NewRegistry(), logs: &syncBuffer{}}
	if opts.Secrets == nil {
		s.secrets = &fakeSecrets{data: map[string]map[clusters.ServiceKey]*clusters.TLSSecret{}}
		opts.Secrets = s.secrets
	}
	opts.Roots = fakeRoots{pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})}
	opts.Metrics, opts.Log = s.metrics, slog.New(slog.NewJSONHandler(s.logs, nil))
	opts.DomainSuffix, opts.Changes = "cluster.local", feed.NewChanges(10*time.Millisecond, time.Second)
	s.h, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	// As trust.Domains.ServerTLSConfig: a client certificate must chain
	// to the bundle of the trust domain in its own SPIFFE ID.
	bundles := x509bundle.NewSet(s.bundle, x509bundle.FromX509Authorities(peerCA.TrustDomain, []*x509.Certificate{peerCA.Cert}))
	serverSVID, err := ca.IssueSVID(spiffeid.RequireFromPath(td, "/hub"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serverCert, err := tlsconfig.GetCertificate(serverSVID)(nil)
	if err != nil {
		t.Fatal(err)
	}
	serverTLS := &tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*serverCert}, ClientAuth: tls.RequestClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return nil
			}
			_, _, err := x509svid.Verify(cs.PeerCertificates, bundles)
			return err
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	secure, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.plain, s.secure = plain.Addr().String(), secure.Addr().String()
	wg.Go(func() { s.h.Run(ctx) })
	wg.Go(func() { _ = s.h.ServeADS(ctx, plain, nil) })
	wg.Go(func() { _ = s.h.ServeADS(ctx, secure, serverTLS) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return s
}

// workload returns client credentials for spiffe://<ca's td>/ns/<ns>/sa/gw:
// bound to member unless it is empty.
func (s *secureHub) workload(t *testing.T, ca *trust.CA, ns, member string) credentials.TransportCredentials {
	t.Helper()
	id := spiffeid.RequireFromPath(ca.TrustDomain, "/ns/"+ns+"/sa/gw")
	var svid *x509svid.SVID
	var err error
	if member == "" {
		svid, err = ca.IssueSVID(id, time.Hour)
	} else {
		svid, err = ca.IssueWorkloadSVID(id, member, time.Hour)
	}
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(tlsconfig.MTLSClientConfig(svid, s.bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(s.ca.TrustDomain, "/hub"))))
}

// anonymous is server-authenticated TLS without a client certificate.
func (s *secureHub) anonymous() credentials.TransportCredentials {
	return credentials.NewTLS(tlsconfig.TLSClientConfig(s.bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(s.ca.TrustDomain, "/hub"))))
}

// secretsOf decodes an SDS response and ACKs it, keeping the subscription.
func secretsOf(t *testing.T, c *xdstest.SotW, names []string) map[string]*tlsv3.Secret {
	t.Helper()
	r, err := c.Next(t)
	if err != nil {
		t.Fatalf("SDS stream ended: %v", err)
	}
	out := map[string]*tlsv3.Secret{}
	for _, a := range r.Resources {
		var s tlsv3.Secret
		if err := a.UnmarshalTo(&s); err != nil {
			t.Fatal(err)
		}
		out[s.Name] = &s
	}
	c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: names, ResponseNonce: r.Nonce, VersionInfo: r.VersionInfo})
	return out
}

func sdsRequest(id, cluster string, names ...string) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{Node: xdstest.Node(id, cluster), TypeUrl: resourcev3.SecretType, ResourceNames: names}
}

// bearerCreds sends a service-account token as istio-agent does.
type bearerCreds string

func (b bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearerCreds) RequireTransportSecurity() bool { return true }

func TestMTLSPortRefusesUnauthenticatedStreams(t *testing.T) {
	tokens := TokenReviewerFunc(func(_ context.Context, cluster, token string) (string, string, error) {
		if cluster == "west" && token == "good-token" {
			return "a", "gw", nil
		}
		return "", "", fmt.Errorf("token not valid in %s", cluster)
	})
	s := startSecureHub(t, Options{Tokens: tokens})
	s.h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	cds := func(id string) *discoveryv3.DiscoveryRequest {
		return &discoveryv3.DiscoveryRequest{Node: xdstest.Node(id, "west"), TypeUrl: resourcev3.ClusterType}
	}

	// No certificate, no token: refused before anything is served, for
	// every type.
	for _, typ := range []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.ListenerType, resourcev3.RouteType, resourcev3.SecretType} {
		c := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()))
		c.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("anon", "west"), TypeUrl: typ})
		c.Refused(t, "an anonymous "+shortType(typ)+" stream on the mTLS port", codes.Unauthenticated)
	}
	// A token the member does not accept: refused too.
	bad := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()), grpc.WithPerRPCCredentials(bearerCreds("forged")))
	bad.Send(t, cds("forged"))
	bad.Refused(t, "a stream with a rejected token", codes.Unauthenticated)
	if n := len(s.h.Proxies()); n != 0 {
		t.Errorf("%d refused streams are listed as proxies", n)
	}

	// A valid token, a verified certificate (ours or a federated peer's),
	// and the plaintext port: served.
	for name, c := range map[string]*xdstest.SotW{
		"token":            xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()), grpc.WithPerRPCCredentials(bearerCreds("good-token"))),
		"certificate":      xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", ""))),
		"peer certificate": xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.peerCA, "a", ""))),
		"plaintext":        xdstest.DialSotW(t, s.plain),
	} {
		c.Send(t, cds(name))
		if r, err := c.Next(t); err != nil || len(r.Resources) != 1 {
			t.Errorf("%s: %v, %v; want the cluster", name, r, err)
		}
	}
}

func TestSDSBindsTheMemberTheCertificateProves(t *testing.T) {
	gw := clusters.ServiceKey{Namespace: "a", Name: "gw"}
	s := startSecureHub(t, Options{})
	s.secrets.data["west"] = map[clusters.ServiceKey]*clusters.TLSSecret{gw: {Cert: []byte("WEST-CERT"), Key: []byte("WEST-KEY")}}
	s.secrets.data["east"] = map[clusters.ServiceKey]*clusters.TLSSecret{gw: {Cert: []byte("EAST-CERT"), Key: []byte("EAST-KEY")}}
	names := []string{"kubernetes://gw", "ROOTCA"}
	fetch := func(creds credentials.TransportCredentials, id, claim string) map[string]*tlsv3.Secret {
		t.Helper()
		c := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(creds))
		c.Send(t, sdsRequest(id, claim, names...))
		return secretsOf(t, c, names)
	}
	cert := func(got map[string]*tlsv3.Secret) string {
		return string(got["kubernetes://gw"].GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	}

	// No member binding: roots, but no Kubernetes Secret of any member.
	for _, claim := range []string{"west", "east", ""} {
		if got := fetch(s.workload(t, s.ca, "a", ""), "unbound-"+claim, claim); got["ROOTCA"] == nil || got["kubernetes://gw"] != nil {
			t.Errorf("an unbound certificate claiming %q got %v; want only ROOTCA", claim, keys(got))
		}
	}
	// Bound to west: west's Secret, claimed or not.
	for _, claim := range []string{"west", ""} {
		if got := fetch(s.workload(t, s.ca, "a", "west"), "west-"+claim, claim); cert(got) != "WEST-CERT" {
			t.Errorf("a west-bound certificate claiming %q got %v (%q); want west's secret", claim, keys(got), cert(got))
		}
	}
	// Bound to west, claiming east: no Secret at all, said in status and
	// logged once.
	if got := fetch(s.workload(t, s.ca, "a", "west"), "liar", "east"); got["kubernetes://gw"] != nil || got["ROOTCA"] == nil {
		t.Errorf("a west-bound certificate claiming east got %v (%q); want only ROOTCA", keys(got), cert(got))
	}
	for _, p := range s.h.Proxies() {
		if p.ID == "liar" && (!strings.Contains(p.Warning, `"east"`) || !strings.Contains(p.Warning, `"west"`) || p.Cluster != "west") {
			t.Errorf("the liar's status: cluster %q, warning %q; want west and a warning naming both", p.Cluster, p.Warning)
		}
	}
	if n := s.logs.count("xDS proxy claims another member than its certificate proves; no Kubernetes Secrets are served to it", map[string]string{"proxy": "liar"}); n != 1 {
		t.Errorf("the conflict was logged %d times; want once", n)
	}
	// A peer trust domain's CA can write the binding extension too, but it
	// can only sign for its own trust domain: no Secrets for its workloads.
	if got := fetch(s.workload(t, s.peerCA, "a", "west"), "peer-bound", "west"); len(got) != 0 {
		t.Errorf("a peer workload bound to west got %v; want nothing", keys(got))
	}
}

func TestSDSNeverServesHubNamespaceOrCAMaterial(t *testing.T) {
	allowAll := AuthorizerFunc(func(context.Context, string, string, string, string) (bool, error) { return true, nil })
	s := startSecureHub(t, Options{Namespace: "hub-system", Authorizer: allowAll})
	tlsSecret := &clusters.TLSSecret{Cert: []byte("CERT"), Key: []byte("KEY"), CA: []byte("CA")}
	s.secrets.data["west"] = map[clusters.ServiceKey]*clusters.TLSSecret{
		{Namespace: "hub-system", Name: "gw"}: tlsSecret, {Namespace: "a", Name: "cacerts"}: tlsSecret,
		{Namespace: "a", Name: "istio-ca-secret"}: tlsSecret, {Namespace: "hub-system", Name: "cacerts"}: tlsSecret,
		{Namespace: "a", Name: "gw"}: tlsSecret,
	}
	forbidden := []string{"kubernetes://cacerts", "cacerts-cacert", "kubernetes://istio-ca-secret", "istio-ca-secret-cacert",
		"kubernetes://hub-system/gw", "kubernetes://hub-system/gw-cacert", "kubernetes://hub-system/cacerts"}
	// A workload of namespace a (allowed to list Secrets anywhere) and one
	// of the hub's own namespace.
	for _, ns := range []string{"a", "hub-system"} {
		names := append([]string{"kubernetes://gw", "ROOTCA"}, forbidden...)
		c := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, ns, "west")))
		c.Send(t, sdsRequest("in-"+ns, "west", names...))
		got := secretsOf(t, c, names)
		for _, name := range forbidden {
			if got[name] != nil {
				t.Errorf("a workload of namespace %s got %s", ns, name)
			}
		}
		if ns == "a" && got["kubernetes://gw"] == nil {
			t.Errorf("namespace a did not get its own gw: %v", keys(got))
		}
		if ns == "hub-system" && got["kubernetes://gw"] != nil {
			t.Errorf("a workload of the hub's namespace got its gw")
		}
	}
}

func TestOversizeXDSInputIsRefusedWithoutHarmingOthers(t *testing.T) {
	s := startSecureHub(t, Options{Limits: Limits{MaxRequestBytes: 2 << 20}})
	s.h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	const eds = "outbound|7070||echo.demo.svc.cluster.local"
	good := xdstest.DialSotW(t, s.plain)
	good.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("good", "west"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{eds}})
	first, err := good.Next(t)
	if err != nil {
		t.Fatal(err)
	}
	good.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{eds}, ResponseNonce: first.Nonce, VersionInfo: first.VersionInfo})

	bigMeta := func(n int) *corev3.Node {
		meta, _ := structpb.NewStruct(map[string]any{"CLUSTER_ID": "west", "PAD": strings.Repeat("x", n)})
		return &corev3.Node{Id: "big", Metadata: meta}
	}
	manyNames := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("n%d", i)
		}
		return out
	}
	for _, c := range []struct {
		what string
		req  *discoveryv3.DiscoveryRequest
		code codes.Code
	}{
		{"100 KiB of node metadata", &discoveryv3.DiscoveryRequest{Node: bigMeta(100 << 10), TypeUrl: resourcev3.ClusterType}, codes.InvalidArgument},
		{"a 2 KiB node ID", &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: strings.Repeat("i", 2<<10)}, TypeUrl: resourcev3.ClusterType}, codes.InvalidArgument},
		{"100,000 names", &discoveryv3.DiscoveryRequest{Node: xdstest.Node("many", "west"), TypeUrl: resourcev3.EndpointType, ResourceNames: manyNames(100000)}, codes.InvalidArgument},
		{"a 1 KiB name", &discoveryv3.DiscoveryRequest{Node: xdstest.Node("long", "west"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{strings.Repeat("n", 1<<10)}}, codes.InvalidArgument},
		{"a 3 MiB request", &discoveryv3.DiscoveryRequest{Node: xdstest.Node("huge", "west"), TypeUrl: resourcev3.ClusterType, ErrorDetail: &rpcstatus.Status{Message: strings.Repeat("e", 3<<20)}}, codes.ResourceExhausted},
	} {
		bad := xdstest.DialSotW(t, s.plain)
		bad.Send(t, c.req)
		bad.Refused(t, c.what, c.code)
	}
	// A Delta stream that grows its subscription request by request.
	delta := xdstest.DialDelta(t, s.plain)
	names := manyNames(DefaultMaxResourceNames + 1)
	half := len(names) / 2
	delta.Send(t, &discoveryv3.DeltaDiscoveryRequest{Node: xdstest.Node("delta", "west"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names[:half]})
	// (None of these names exist: the type's first answer is empty.)
	if r, err := delta.Next(t); err != nil || len(r.Resources) != 0 {
		t.Fatalf("first request of names that do not exist: %v, %v; want an empty answer", r, err)
	}
	delta.Send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names[half:]})
	if _, err := delta.Next(t); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a Delta stream subscribed to %d names: %v; want InvalidArgument", len(names), err)
	}

	// The good stream was not harmed: it gets the next change.
	s.h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.2")})
	r, err := good.Next(t)
	if err != nil || len(r.Resources) != 1 || !bytes.Contains(r.Resources[0].Value, []byte("10.0.0.2")) {
		t.Fatalf("the good stream after the refusals: %v, %v; want the new endpoint", r, err)
	}
}

func TestStreamLimitRefusesBeyondIt(t *testing.T) {
	s := startSecureHub(t, Options{Limits: Limits{MaxStreams: 2}})
	cds := &discoveryv3.DiscoveryRequest{Node: xdstest.Node("n", "west"), TypeUrl: resourcev3.ClusterType}
	var open []*xdstest.SotW
	for range 2 {
		c := xdstest.DialSotW(t, s.plain)
		c.Send(t, cds)
		if _, err := c.Next(t); err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	third := xdstest.DialSotW(t, s.plain)
	third.Send(t, cds)
	third.Refused(t, "a third stream with a limit of two", codes.ResourceExhausted)
	open[0].CloseSend(t)
	if _, err := open[0].Next(t); err == nil {
		t.Fatal("the closed stream got a response")
	}
	wait.Until(t, 30*time.Second, func() error {
		c := xdstest.DialSotW(t, s.plain)
		c.Send(t, cds)
		_, err := c.Next(t)
		return err
	})
}

func TestNackIsBoundedAndLabelsOnlyServedTypes(t *testing.T) {
	s := startSecureHub(t, Options{})
	s.h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	c := xdstest.DialSotW(t, s.plain)
	c.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("nacker", "west"), TypeUrl: resourcev3.ClusterType})
	r, err := c.Next(t)
	if err != nil {
		t.Fatal(err)
	}
	// A NACK of the real response, 64 KiB of error text and a version of
	// the client's invention.
	c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: r.Nonce, VersionInfo: strings.Repeat("v", 4096),
		ErrorDetail: &rpcstatus.Status{Message: strings.Repeat("é", 32<<10)}})
	wait.Until(t, 30*time.Second, func() error {
		for _, p := range s.h.Proxies() {
			for _, ts := range p.Types {
				if ts.Nacks == 1 {
					if len(ts.NackError) > maxNackDetailBytes || !strings.HasSuffix(ts.NackError, "(truncated)") || ts.NackedVersion != r.VersionInfo {
						t.Fatalf("NACK recorded with %d bytes of error (%q…), version %q; want at most %d bytes, truncated, version %q",
							len(ts.NackError), ts.NackError[:min(20, len(ts.NackError))], ts.NackedVersion[:min(20, len(ts.NackedVersion))], maxNackDetailBytes, r.VersionInfo)
					}
					return nil
				}
			}
		}
		return fmt.Errorf("the NACK is not recorded yet")
	})
	// A NACK of that nonce with an invented type URL: ignored (as istiod
	// ignores types it does not serve), no series; the stream stays.
	c2 := xdstest.DialSotW(t, s.plain)
	c2.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("inventor", "west"), TypeUrl: resourcev3.ClusterType})
	r2, err := c2.Next(t)
	if err != nil {
		t.Fatal(err)
	}
	c2.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/made.up.Thing", ResponseNonce: r2.Nonce, ErrorDetail: &rpcstatus.Status{Message: "no"}})
	c2.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType}) // a new request: answered
	if r, err := c2.Next(t); err != nil || r.TypeUrl != resourcev3.ClusterType {
		t.Fatalf("after a NACK with an invented type URL: %v, %v; want the stream to stay and CDS answered", r.GetTypeUrl(), err)
	}
	families, err := s.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "type" && l.GetValue() != "Cluster" {
					t.Errorf("%s has a series with type %q; want only Cluster", f.GetName(), l.GetValue())
				}
			}
		}
	}
	if got := typeLabel("type.googleapis.com/made.up.Thing"); got != "other" {
		t.Errorf("an unknown type's label is %q", got)
	}
}

func TestWithheldSecretIsLoggedOncePerStream(t *testing.T) {
	s := startSecureHub(t, Options{})
	gw := clusters.ServiceKey{Namespace: "a", Name: "gw"}
	rotate := func(i int) {
		s.secrets.mu.Lock()
		s.secrets.data["west"] = map[clusters.ServiceKey]*clusters.TLSSecret{gw: {Cert: []byte(fmt.Sprint("CERT-", i)), Key: []byte("KEY")}}
		s.secrets.mu.Unlock()
		s.h.changes.SecretChanged("west", gw)
	}
	rotate(0)
	names := []string{"kubernetes://missing", "kubernetes://other/gw", "kubernetes://gw"}
	c := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west")))
	c.Send(t, sdsRequest("quiet", "west", names...))
	secretsOf(t, c, names)
	// Every push re-evaluates the whole subscription: each rotation of gw
	// reaches the stream, so the withheld names were evaluated each time.
	for i := range 5 {
		rotate(i + 1)
		if got := secretsOf(t, c, names); string(got["kubernetes://gw"].GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != fmt.Sprint("CERT-", i+1) {
			t.Fatalf("push %d: got %v", i+1, keys(got))
		}
	}
	for _, name := range names[:2] {
		if n := s.logs.count("SDS resource withheld", map[string]string{"proxy": "quiet", "resource": name}); n != 1 {
			t.Errorf("%s withheld from one stream over 6 evaluations was logged %d times; want once", name, n)
		}
	}
}

func TestStreamsPerConnectionAreBounded(t *testing.T) {
	s := startSecureHub(t, Options{Limits: Limits{MaxStreamsPerConnection: 1}})
	conn, err := grpc.NewClient(s.plain, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	cds := &discoveryv3.DiscoveryRequest{Node: xdstest.Node("n", "west"), TypeUrl: resourcev3.ClusterType}
	firstCtx, closeFirst := context.WithCancel(context.Background())
	first, err := ads.StreamAggregatedResources(firstCtx)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Send(cds); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err != nil {
		t.Fatal(err)
	}
	// A second stream on the same connection waits for the first to end.
	answered := make(chan error, 1)
	go func() {
		second, err := ads.StreamAggregatedResources(context.Background())
		if err == nil {
			if err = second.Send(cds); err == nil {
				_, err = second.Recv()
			}
		}
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("a second stream on a connection limited to one was served (%v) while the first was open", err)
	case <-time.After(500 * time.Millisecond): // a slow machine only makes this wait longer
	}
	closeFirst()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("the second stream after the first ended: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second stream was not served within 30s of the first ending")
	}
}
