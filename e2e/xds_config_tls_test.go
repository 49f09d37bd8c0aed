package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/xdstest"
	"github.com/hubmesh/hub/mcp"
)

// hubRootsPEM is our trust domain's roots as PEM, from the hub's bundle
// API: what an istiod's configSources tlsSettings.caCertificates holds.
func hubRootsPEM(t *testing.T, h *hubProcess, td spiffeid.TrustDomain) []byte {
	t.Helper()
	var out []byte
	for _, c := range h.bundle(t, td).X509Authorities() {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// simpleTLS is what istiod's config-source client presents with
// tlsSettings {mode: SIMPLE, caCertificates, sni}: no client certificate,
// the server verified by DNS name against those roots.
func simpleTLS(t *testing.T, rootsPEM []byte, serverName string) credentials.TransportCredentials {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rootsPEM) {
		t.Fatal("no certificate in the hub's roots PEM")
	}
	return credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: serverName})
}

// TestIstioConfigOverTLSWithPlaintextOff (issue 21): with --xds-addr=""
// the hub opens no plaintext port, yet becomes ready and serves; a client
// that speaks as istiod's config source over SIMPLE TLS (no certificate, no
// token, the server checked by a --tls-dns-names name) reads every Istio
// config type on the mTLS port, is listed as a config subscriber, and is
// cut with Unauthenticated the moment it asks for CDS; an anonymous stream
// asking for CDS (or SDS) first is refused before anything is served.
func TestIstioConfigOverTLSWithPlaintextOff(t *testing.T) {
	t.Parallel()
	e := localcluster.Require(t, env)
	home := e.Cluster("primary")
	ctx := testContext(t)
	ns := hubNamespace(t, home)
	app := "cfgtls-" + rand.String(5)
	if err := localcluster.EnsureNamespace(ctx, client(t, home), app); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, client(t, home), app, "echo", "http", 8080, []localcluster.Backend{{IP: "198.18.50.1", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("cfgtls.test")
	const dnsName = "hub.hub-system.svc"
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(),
		"--xds-addr", "", "--xds-tls-addr", "127.0.0.1:0", "--tls-dns-names", dnsName)
	if h.addrs["xds"] != "" || h.addrs["xds-tls"] == "" {
		t.Fatalf("listeners %v; want xds-tls and no plaintext xds", h.addrs)
	}
	logData, err := os.ReadFile(h.logPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logData), `"msg":"listener disabled","listener":"xds"`) {
		t.Errorf("the hub did not log the plaintext listener as disabled")
	}
	rootsPEM := hubRootsPEM(t, h, td)
	// docs/operating.md's way to get them for an istiod: the state Secret's roots.pem.
	state, err := client(t, home).CoreV1().Secrets(ns).Get(ctx, "hub-trust-state", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := state.Data["roots.pem"]; !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(rootsPEM)) {
		t.Errorf("hub-trust-state roots.pem:\n%s\nwant the bundle's roots:\n%s", got, rootsPEM)
	}
	creds := simpleTLS(t, rootsPEM, dnsName)
	istiodNode := nodeIn("~~istiod-cfgtls.istio-system~istio-system.svc.cluster.local", "", map[string]any{"GENERATOR": "api", "ISTIO_VERSION": "1.31.1"})
	delete(istiodNode.Metadata.Fields, "CLUSTER_ID") // istiod sends none

	// istiod's stream: every config type, the federated ServiceEntry among them.
	s := xdstest.DialSotW(t, h.addrs["xds-tls"], grpc.WithTransportCredentials(creds))
	for _, typ := range mcp.IstiodTypes() {
		s.Send(t, &discoveryv3.DiscoveryRequest{Node: istiodNode, TypeUrl: typ})
	}
	want := fmt.Sprintf("%s/hub-echo", app)
	got := map[string]bool{}
	for found := false; len(got) < len(mcp.IstiodTypes()) || !found; {
		r, err := s.NextWithin(t, time.Minute)
		if err != nil {
			t.Fatalf("the anonymous config stream on the mTLS port ended after %d types: %v", len(got), err)
		}
		got[r.TypeUrl] = true
		if r.TypeUrl == "networking.istio.io/v1/ServiceEntry" {
			found = slices.ContainsFunc(r.Resources, func(a *anypb.Any) bool { return bytes.Contains(a.Value, []byte(want)) })
		}
		s.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: r.TypeUrl, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce})
	}
	var list struct{ Items []api.Proxy }
	h.getJSON(t, "/api/v1/proxies", &list)
	if len(list.Items) != 1 || !list.Items[0].ConfigSubscriber || list.Items[0].Identity != "" {
		t.Errorf("GET /api/v1/proxies: %+v; want the anonymous istiod alone, a config subscriber without identity", list.Items)
	}

	// Then CDS on the same stream: it ends, Unauthenticated.
	s.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType})
	for {
		r, err := s.NextWithin(t, 30*time.Second)
		if r == nil {
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("an anonymous config stream asking for CDS ended with %v; want Unauthenticated", err)
			}
			break
		}
		if !mcp.IsConfigType(r.TypeUrl) {
			t.Fatalf("an anonymous config stream asking for CDS got a %s response", r.TypeUrl)
		}
	}
	// CDS or SDS first: refused before anything is served.
	for _, typ := range []string{resourcev3.ClusterType, resourcev3.SecretType} {
		c := xdstest.DialSotW(t, h.addrs["xds-tls"], grpc.WithTransportCredentials(creds))
		c.Send(t, &discoveryv3.DiscoveryRequest{Node: istiodNode, TypeUrl: typ, ResourceNames: []string{"ROOTCA"}})
		c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: "networking.istio.io/v1/ServiceEntry"})
		c.RefusedWithin(t, 30*time.Second, "an anonymous "+typ+" request on the mTLS port", codes.Unauthenticated)
	}
}
