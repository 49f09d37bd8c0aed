package e2e

import (
	"bytes"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/xdstest"
)

func nodeIn(id, cluster string, extra map[string]any) *corev3.Node {
	fields := map[string]any{"CLUSTER_ID": cluster}
	for k, v := range extra {
		fields[k] = v
	}
	meta, _ := structpb.NewStruct(fields)
	return &corev3.Node{Id: id, Metadata: meta}
}

// TestXDSAttacksAreRefused replays, against the real hub binary on real
// clusters, what an attacker on the network can try against the xDS ports
// (issue 12): read proxy config (CDS, EDS, LDS, RDS, SDS) anonymously from
// the mTLS port (Istio config is all an anonymous stream may read there,
// issue 21: TestIstioConfigOverTLSWithPlaintextOff), read another
// member's Secrets with a certificate of our CA, exhaust the hub with
// oversize input, and mint Prometheus series with invented type URLs
// (which are ignored, as istiod ignores them, and counted without a label).
func TestXDSAttacksAreRefused(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ctx := testContext(t)
	ns := hubNamespace(t, home)
	app := "sec-" + rand.String(5)
	for c, cert := range map[*localcluster.Cluster]string{west: "WEST", east: "EAST"} {
		cs := client(t, c)
		if err := localcluster.EnsureNamespace(ctx, cs, app); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Secrets(app).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gw-cert"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": []byte(cert + "-CERT"), "tls.key": []byte(cert + "-KEY")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := localcluster.ApplyService(ctx, client(t, west), app, "echo", "grpc", 7070, []localcluster.Backend{{IP: "198.18.30.1", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"west": west.Kubeconfig(), "east": east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("attack.test")
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0")
	tlsAddr := h.addrs["xds-tls"]
	eventually(t, 30*time.Second, func() error {
		if cl := h.clusters(t); cl["west"].State != "Ready" || cl["east"].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})
	bundle := h.bundle(t, td)
	ca := hubCA(t, home, ns, td)
	hubID := tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub"))
	workload := func(member string) credentials.TransportCredentials {
		id := spiffeid.RequireFromPath(td, "/ns/"+app+"/sa/gw")
		svid, err := ca.IssueSVID(id, time.Hour)
		if member != "" {
			svid, err = ca.IssueWorkloadSVID(id, member, time.Hour)
		}
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(tlsconfig.MTLSClientConfig(svid, bundle, hubID))
	}

	// A live proxy on the plaintext port, subscribed to west's echo
	// endpoints: it must keep getting pushes through everything below.
	const eds = "outbound|7070||echo.%s.svc.cluster.local"
	edsName := fmt.Sprintf(eds, app)
	live := xdstest.DialSotW(t, h.xdsAddr)
	live.Send(t, &discoveryv3.DiscoveryRequest{Node: nodeIn("live", "west", nil), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{edsName}})
	var last *discoveryv3.DiscoveryResponse
	var err error
	for last == nil || len(last.Resources) != 1 || !bytes.Contains(last.Resources[0].Value, []byte("198.18.30.1")) {
		if last, err = live.NextWithin(t, 30*time.Second); err != nil {
			t.Fatalf("the live stream: %v", err)
		}
		live.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{edsName}, ResponseNonce: last.Nonce, VersionInfo: last.VersionInfo})
	}

	t.Run("anonymous mTLS stream", func(t *testing.T) {
		anonymous := credentials.NewTLS(tlsconfig.TLSClientConfig(bundle, hubID))
		for _, typ := range []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.ListenerType, resourcev3.RouteType, resourcev3.SecretType} {
			s := xdstest.DialSotW(t, tlsAddr, grpc.WithTransportCredentials(anonymous))
			s.Send(t, &discoveryv3.DiscoveryRequest{Node: nodeIn("anonymous", "west", nil), TypeUrl: typ, ResourceNames: []string{edsName}})
			s.RefusedWithin(t, 30*time.Second, "an anonymous "+typ+" stream on the mTLS port", codes.Unauthenticated)
		}
	})

	t.Run("certificate claiming another member", func(t *testing.T) {
		names := []string{"kubernetes://gw-cert", "ROOTCA"}
		fetch := func(creds credentials.TransportCredentials, id, claim string) map[string]string {
			s := xdstest.DialSotW(t, tlsAddr, grpc.WithTransportCredentials(creds))
			s.Send(t, &discoveryv3.DiscoveryRequest{Node: nodeIn(id, claim, nil), TypeUrl: resourcev3.SecretType, ResourceNames: names})
			r, err := s.NextWithin(t, 30*time.Second)
			if err != nil {
				t.Fatalf("SDS for %s: %v", id, err)
			}
			got := map[string]string{} // name → certificate chain (ROOTCA: its roots)
			for _, a := range r.Resources {
				var sec tlsv3.Secret
				if err := a.UnmarshalTo(&sec); err != nil {
					t.Fatal(err)
				}
				got[sec.Name] = string(sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes()) + string(sec.GetValidationContext().GetTrustedCa().GetInlineBytes())
			}
			return got
		}
		// The positive control: east's workload gets east's Secret (once
		// the hub's Secret informers have synced).
		eventually(t, 30*time.Second, func() error {
			if got := fetch(workload("east"), "east-gw", "east"); !strings.Contains(got["kubernetes://gw-cert"], "EAST-CERT") {
				return fmt.Errorf("east's own workload got %v", slices.Sorted(maps.Keys(got)))
			}
			return nil
		})
		// West's workload claiming to be in east: roots, nothing of east.
		got := fetch(workload("west"), "west-gw-as-east", "east")
		if _, ok := got["kubernetes://gw-cert"]; ok || got["ROOTCA"] == "" {
			t.Errorf("a west-bound certificate claiming east got %v; want only ROOTCA", slices.Sorted(maps.Keys(got)))
		}
		// A certificate without a member binding gets no Secret anywhere.
		for _, claim := range []string{"east", "west"} {
			got := fetch(workload(""), "unbound-"+claim, claim)
			if _, ok := got["kubernetes://gw-cert"]; ok || got["ROOTCA"] == "" {
				t.Errorf("an unbound certificate claiming %s got %v; want only ROOTCA", claim, slices.Sorted(maps.Keys(got)))
			}
		}
		data, _ := readFile(h.logPath)
		if !strings.Contains(data, `"msg":"xDS proxy claims another member than its certificate proves; no Kubernetes Secrets are served to it"`) ||
			!strings.Contains(data, `"proxy":"west-gw-as-east"`) {
			t.Errorf("the hub did not log the conflicting claim")
		}
	})

	t.Run("oversize input", func(t *testing.T) {
		manyNames := make([]string, 100000)
		for i := range manyNames {
			manyNames[i] = fmt.Sprintf("n%d", i)
		}
		for _, c := range []struct {
			what  string
			req   *discoveryv3.DiscoveryRequest
			codes []codes.Code
		}{
			// 4 MiB is past the request size limit itself.
			{"4 MiB of node metadata", &discoveryv3.DiscoveryRequest{Node: nodeIn("fat", "west", map[string]any{"PAD": strings.Repeat("x", 4<<20)}), TypeUrl: resourcev3.ClusterType},
				[]codes.Code{codes.ResourceExhausted, codes.InvalidArgument}},
			// 1 MiB fits a request but not the node metadata limit.
			{"1 MiB of node metadata", &discoveryv3.DiscoveryRequest{Node: nodeIn("fat", "west", map[string]any{"PAD": strings.Repeat("x", 1<<20)}), TypeUrl: resourcev3.ClusterType},
				[]codes.Code{codes.InvalidArgument}},
			{"a 100,000-name subscription", &discoveryv3.DiscoveryRequest{Node: nodeIn("greedy", "west", nil), TypeUrl: resourcev3.EndpointType, ResourceNames: manyNames},
				[]codes.Code{codes.InvalidArgument}},
		} {
			s := xdstest.DialSotW(t, h.xdsAddr)
			s.Send(t, c.req)
			s.RefusedWithin(t, 30*time.Second, c.what, c.codes...)
		}
		// The live stream is unharmed: an EndpointSlice change reaches it.
		if err := localcluster.ApplyEndpoints(ctx, client(t, west), app, "echo", "grpc", []localcluster.Backend{{IP: "198.18.30.2", Port: 8080}}); err != nil {
			t.Fatal(err)
		}
		for {
			r, err := live.NextWithin(t, 30*time.Second)
			if err != nil {
				t.Fatalf("the live stream ended: %v", err)
			}
			live.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{edsName}, ResponseNonce: r.Nonce, VersionInfo: r.VersionInfo})
			if len(r.Resources) == 1 && bytes.Contains(r.Resources[0].Value, []byte("198.18.30.2")) {
				break
			}
		}
	})

	t.Run("NACK with an invented type URL", func(t *testing.T) {
		const invented = "type.googleapis.com/attacker.Invented"
		s := xdstest.DialSotW(t, h.xdsAddr)
		s.Send(t, &discoveryv3.DiscoveryRequest{Node: nodeIn("inventor", "west", nil), TypeUrl: resourcev3.ClusterType})
		r, err := s.NextWithin(t, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		// Ignored, as istiod ignores types it does not serve (pilot-agent
		// adds some of its own): the stream stays and is answered.
		s.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: invented, ResponseNonce: r.Nonce, ErrorDetail: &rpcstatus.Status{Message: "rejected"}})
		s.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType}) // no nonce: a new request
		if r, err := s.NextWithin(t, 30*time.Second); err != nil || r.GetTypeUrl() != resourcev3.ClusterType {
			t.Fatalf("after a NACK with an invented type URL: %v, %v; want the stream to stay and CDS answered", r.GetTypeUrl(), err)
		}
		body := []byte(h.scrapeMetrics(t))
		if bytes.Contains(body, []byte("Invented")) {
			t.Errorf("/metrics has a series for the invented type")
		}
		served := map[string]bool{"Cluster": true, "ClusterLoadAssignment": true, "Listener": true, "RouteConfiguration": true, "Secret": true, "other": true}
		for _, m := range regexp.MustCompile(`(?m)^hub_xds_\w+\{[^}]*type="([^"]*)"`).FindAllStringSubmatch(string(body), -1) {
			if !served[m[1]] {
				t.Errorf("/metrics has an xDS series with type %q", m[1])
			}
		}
	})
}
