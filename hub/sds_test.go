package hub

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/internal/xdstest"
	"github.com/hubmesh/hub/trust"
)

// fakeSecrets is a SecretSource keyed by member cluster (the registry's own
// TLSSecret is tested on real API servers in clusters/).
type fakeSecrets struct {
	mu   sync.Mutex
	data map[string]map[clusters.ServiceKey]*clusters.TLSSecret
}

func (f *fakeSecrets) TLSSecret(cluster string, key clusters.ServiceKey) (*clusters.TLSSecret, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.data[cluster][key]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%w: %s", clusters.ErrSecretNotFound, key)
}

type fakeRoots struct{ pem []byte }

func (fakeRoots) LocalTrustDomain() string { return "example.org" }
func (f fakeRoots) RootsPEM(td string) ([]byte, bool) {
	return f.pem, td == "example.org"
}

func TestSDSAuthorisation(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	ca, err := trust.NewSelfSignedCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rootPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	gw := clusters.ServiceKey{Namespace: "a", Name: "gw"}
	secrets := &fakeSecrets{data: map[string]map[clusters.ServiceKey]*clusters.TLSSecret{
		"west": {gw: {Cert: []byte("WEST-CERT"), Key: []byte("WEST-KEY"), CA: []byte("WEST-CA")}, {Namespace: "b", Name: "gw"}: {Cert: []byte("B-CERT"), Key: []byte("B-KEY")}},
		"east": {gw: {Cert: []byte("EAST-CERT"), Key: []byte("EAST-KEY")}},
	}}
	h, err := New(Options{DomainSuffix: "cluster.local", Changes: feed.NewChanges(10*time.Millisecond, time.Second), Secrets: secrets, Roots: fakeRoots{rootPEM}})
	if err != nil {
		t.Fatal(err)
	}
	serverSVID, _ := ca.IssueSVID(spiffeid.RequireFromPath(td, "/hub"), time.Hour)
	bundle := x509bundle.FromX509Authorities(td, []*x509.Certificate{ca.Cert})
	serverCert, _ := tlsconfig.GetCertificate(serverSVID)(nil)
	serverTLS := &tls.Config{
		Certificates: []tls.Certificate{*serverCert},
		ClientAuth:   tls.RequestClientCert,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return nil
			}
			c, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			_, _, err = x509svid.Verify([]*x509.Certificate{c}, bundle)
			return err
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	plain, _ := net.Listen("tcp", "127.0.0.1:0")
	secure, _ := net.Listen("tcp", "127.0.0.1:0")
	wg.Go(func() { h.Run(ctx) })
	wg.Go(func() { _ = h.ServeADS(ctx, plain, nil) })
	wg.Go(func() { _ = h.ServeADS(ctx, secure, serverTLS) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	// open opens an ADS stream and asks for names; recv returns the
	// secrets of its next response, ACKed.
	open := func(addr string, creds credentials.TransportCredentials, cluster string, names ...string) *xdstest.SotW {
		t.Helper()
		st := xdstest.DialSotW(t, addr, grpc.WithTransportCredentials(creds))
		st.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("proxy-"+cluster, cluster), TypeUrl: resourcev3.SecretType, ResourceNames: names})
		return st
	}
	recv := func(st *xdstest.SotW) map[string]*tlsv3.Secret {
		t.Helper()
		r := st.Expect(t, "an SDS response")
		out := map[string]*tlsv3.Secret{}
		for _, a := range r.Resources {
			var s tlsv3.Secret
			if err := a.UnmarshalTo(&s); err != nil {
				t.Fatal(err)
			}
			if err := s.ValidateAll(); err != nil {
				t.Errorf("secret %s fails Envoy validation: %v", s.Name, err)
			}
			out[s.Name] = &s
		}
		st.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: names(out, r), ResponseNonce: r.Nonce, VersionInfo: r.VersionInfo})
		return out
	}
	mtls := func(ns, member string) credentials.TransportCredentials {
		svid, err := ca.IssueWorkloadSVID(spiffeid.RequireFromPath(td, "/ns/"+ns+"/sa/gateway"), member, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(tlsconfig.MTLSClientConfig(svid, bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub"))))
	}
	all := []string{"kubernetes://gw", "kubernetes://b/gw", "gw-cacert", "ROOTCA", "spiffe://other.org"}

	// Plaintext: no verified identity, no secrets.
	plainStream := open(plain.Addr().String(), insecure.NewCredentials(), "west", all...)
	if got := recv(plainStream); len(got) != 0 {
		t.Errorf("plaintext client got secrets: %v", keys(got))
	}
	// mTLS, namespace a, member west: its own namespace only.
	west := open(secure.Addr().String(), mtls("a", "west"), "west", all...)
	got := recv(west)
	if want := []string{"ROOTCA", "gw-cacert", "kubernetes://gw"}; fmt.Sprint(keys(got)) != fmt.Sprint(want) {
		t.Fatalf("namespace a in west got %v; want %v", keys(got), want)
	}
	if c := string(got["kubernetes://gw"].GetTlsCertificate().GetCertificateChain().GetInlineBytes()); c != "WEST-CERT" {
		t.Errorf("west got certificate %q", c)
	}
	if ca := got["ROOTCA"].GetValidationContext().GetTrustedCa().GetInlineBytes(); string(ca) != string(rootPEM) {
		t.Errorf("ROOTCA is not our root")
	}
	// The plaintext stream has the same stream number on its server as the
	// mTLS one: a new request with a new node must still get nothing.
	plainStream.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("sneaky", "west"), TypeUrl: resourcev3.SecretType, ResourceNames: []string{"kubernetes://gw"}})
	select {
	case r, ok := <-plainStream.Responses():
		if ok && len(r.Resources) != 0 {
			t.Fatalf("a plaintext stream got %d secrets after an mTLS stream with the same number opened", len(r.Resources))
		}
	case <-time.After(2 * time.Second): // nothing sent is fine too
	}

	// The same namespace in member east gets east's secret, never west's.
	if got := recv(open(secure.Addr().String(), mtls("a", "east"), "east", "kubernetes://gw")); string(got["kubernetes://gw"].GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != "EAST-CERT" {
		t.Errorf("east proxy got %v", got)
	}
	// A rotated secret is pushed.
	secrets.mu.Lock()
	secrets.data["west"][gw] = &clusters.TLSSecret{Cert: []byte("WEST-CERT-2"), Key: []byte("WEST-KEY-2"), CA: []byte("WEST-CA")}
	secrets.mu.Unlock()
	h.changes.SecretChanged("west", gw)
	if got := recv(west); string(got["kubernetes://gw"].GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != "WEST-CERT-2" {
		t.Errorf("after rotation west got %v", got)
	}
}

func keys(m map[string]*tlsv3.Secret) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// names keeps the subscription as it was (SotW requests repeat it).
func names(_ map[string]*tlsv3.Secret, r *discoveryv3.DiscoveryResponse) []string {
	return []string{"kubernetes://gw", "kubernetes://b/gw", "gw-cacert", "ROOTCA", "spiffe://other.org"}
}
