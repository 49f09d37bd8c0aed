package trust

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"net"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

func TestWorkloadSVIDCarriesItsMember(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	ca, err := NewSelfSignedCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id := spiffeid.RequireFromPath(td, "/ns/a/sa/gw")
	svid, err := ca.IssueWorkloadSVID(id, "west-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf := svid.Certificates[0]
	if m, ok := MemberOf(leaf); !ok || m != "west-1" {
		t.Fatalf("MemberOf = %q, %v; want west-1", m, ok)
	}
	for _, ext := range leaf.Extensions {
		if ext.Id.Equal(MemberOID) && ext.Critical {
			t.Error("the member extension is critical; clients that do not know it would reject the certificate")
		}
	}
	if _, _, err := x509svid.Verify(svid.Certificates, spiffebundle.FromX509Authorities(td, []*x509.Certificate{ca.Cert})); err != nil {
		t.Errorf("a member-bound SVID is not a valid X.509-SVID: %v", err)
	}
	plain, _ := ca.IssueSVID(id, time.Hour)
	if m, ok := MemberOf(plain.Certificates[0]); ok {
		t.Errorf("an SVID without the extension is bound to %q", m)
	}
	for _, bad := range []string{"", "-west", "west/east", string(make([]byte, 64))} {
		if _, err := ca.IssueWorkloadSVID(id, bad, time.Hour); err == nil {
			t.Errorf("member %q was accepted", bad)
		}
	}
	if _, err := ca.IssueWorkloadSVID(spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString("other.org"), "/ns/a/sa/gw"), "west", time.Hour); err == nil {
		t.Error("an SVID outside the CA's trust domain was issued")
	}
	// Malformed values (another ASN.1 type, trailing bytes, an invalid
	// cluster ID) bind nothing.
	printable, _ := asn1.MarshalWithParams("west", "printable")
	utf8, _ := asn1.MarshalWithParams("west", "utf8")
	invalid, _ := asn1.MarshalWithParams("we st", "utf8")
	for name, value := range map[string][]byte{"printable": printable, "trailing": append(utf8, 0), "invalid": invalid} {
		c := &x509.Certificate{Extensions: []pkix.Extension{{Id: MemberOID, Value: value}}}
		if m, ok := MemberOf(c); ok {
			t.Errorf("%s value binds %q", name, m)
		}
	}
}

// TestFederatedPeerCannotMintOurTrustDomain: the mTLS listener checks a
// client certificate against the bundle of the trust domain in its own
// SPIFFE ID, so a federated peer's CA can vouch only for its own trust
// domain, never for ours (and so never for a member binding of ours).
func TestFederatedPeerCannotMintOurTrustDomain(t *testing.T) {
	ctx := context.Background()
	cs, ns := homeNamespace(t)
	td := spiffeid.RequireTrustDomainFromString("ours.test")
	f := New(Config{Client: cs, Namespace: ns, TrustDomain: td})
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	peerTD := spiffeid.RequireTrustDomainFromString("peer.test")
	peerCA, err := NewSelfSignedCA(peerTD, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The peer's bundle as accepted from its bundle endpoint.
	f.mu.Lock()
	f.peers[peerTD.Name()] = &peer{status: Status{State: StateReady, Bundle: spiffebundle.FromX509Authorities(peerTD, []*x509.Certificate{peerCA.Cert})}}
	f.mu.Unlock()

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	serverTLS := f.ServerTLSConfig()
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				tc := tls.Server(conn, serverTLS)
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if tc.Handshake() == nil {
					_, _ = tc.Write([]byte{1}) // handshake accepted
				}
			}()
		}
	}()
	ours, err := f.LocalBundle()
	if err != nil {
		t.Fatal(err)
	}
	handshake := func(svid *x509svid.SVID) error {
		cfg := tlsconfig.MTLSClientConfig(svid, ours, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub")))
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", lis.Addr().String(), cfg)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(make([]byte, 1)) // TLS 1.3: the server's verdict arrives after the client's Finished
		return err
	}
	ourWorkload := spiffeid.RequireFromPath(td, "/ns/a/sa/gw")
	minted, err := peerCA.IssueSVID(spiffeid.RequireFromPath(peerTD, "/ns/a/sa/gw"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(minted); err != nil {
		t.Fatalf("the peer's own workload was refused: %v", err)
	}
	// The peer CA signs an SVID for OUR trust domain, with a member binding.
	forged := *peerCA
	forged.TrustDomain = td
	forgedSVID, err := forged.IssueWorkloadSVID(ourWorkload, "west", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(forgedSVID); err == nil {
		t.Fatal("a certificate for our trust domain signed by a federated peer's CA was accepted")
	}
	// Our own workload is accepted, as a baseline.
	own, err := f.IssueSVID(ourWorkload, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(own); err != nil {
		t.Fatalf("our own workload was refused: %v", err)
	}
}
