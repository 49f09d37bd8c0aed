package trust

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
)

var (
	tdA = spiffeid.RequireTrustDomainFromString("a.example")
	tdB = spiffeid.RequireTrustDomainFromString("b.example")
)

func bundleJSON(t *testing.T, ca *CA, seq uint64) []byte {
	t.Helper()
	b := spiffebundle.FromX509Authorities(ca.TrustDomain, []*x509.Certificate{ca.Cert})
	b.SetSequenceNumber(seq)
	b.SetRefreshHint(30 * time.Second)
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// webPeer serves handler over real TLS (https_web) and returns its endpoint.
func webPeer(t *testing.T, td spiffeid.TrustDomain, h http.HandlerFunc) Endpoint {
	t.Helper()
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return Endpoint{TrustDomain: td, URL: srv.URL, Profile: ProfileHTTPSWeb, Roots: pool, Timeout: 2 * time.Second}
}

// spiffePeer serves handler over TLS with an SVID for serverID (https_spiffe).
func spiffePeer(t *testing.T, ca *CA, serverID spiffeid.ID, h http.HandlerFunc) string {
	t.Helper()
	svid, err := ca.IssueSVID(serverID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tlsconfig.GetCertificate(svid)(nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}} // httptest would add its own otherwise
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestFetchRejectsBadPeers(t *testing.T) {
	caA, err := NewSelfSignedCA(tdA, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caB, _ := NewSelfSignedCA(tdB, time.Hour)
	good := bundleJSON(t, caA, 5)
	last, err := Validate(tdA, good, nil)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(status int, body []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status); _, _ = w.Write(body) }
	}
	cases := []struct {
		name   string
		h      http.HandlerFunc
		reason string
		msg    string
	}{
		{"not found", serve(404, []byte("nope")), "http_status", "HTTP 404 Not Found"},
		{"server error", serve(500, good), "http_status", "HTTP 500 Internal Server Error"},
		{"oversize", serve(200, append(good, make([]byte, MaxBundleBytes)...)), "too_large", "exceeds 1048576 bytes"},
		{"slow body", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(200)
			_, _ = w.Write(good[:10])
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}, "timeout", "not complete within 2s"},
		{"empty keys", serve(200, []byte(`{"keys":[],"spiffe_sequence":6}`)), "empty", "no X.509 or JWT authorities"},
		{"wrong trust domain", serve(200, bundleJSON(t, caB, 6)), "trust_domain", "holds an authority of trust domain b.example"},
		{"sequence backwards", serve(200, bundleJSON(t, caA, 4)), "sequence", "sequence 4, lower than the accepted 5"},
		{"garbage", serve(200, []byte("<html>hello</html>")), "parse", "does not parse"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ep := webPeer(t, tdA, tc.h)
			b, err := Fetch(context.Background(), ep, nil, last)
			var fe *FetchError
			if b != nil || !errors.As(err, &fe) || fe.Reason != tc.reason || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Fetch = %v, %v; want reason %s with %q", b, err, tc.reason, tc.msg)
			}
		})
	}

	t.Run("accepted", func(t *testing.T) {
		ep := webPeer(t, tdA, serve(200, bundleJSON(t, caA, 5)))
		b, err := Fetch(context.Background(), ep, nil, last)
		if err != nil || !b.HasX509Authority(caA.Cert) {
			t.Fatalf("Fetch = %v, %v", b, err)
		}
	})

	t.Run("https_spiffe identity", func(t *testing.T) {
		want := spiffeid.RequireFromPath(tdA, "/hub")
		url := spiffePeer(t, caA, spiffeid.RequireFromPath(tdA, "/not-the-hub"), serve(200, good))
		_, err := Fetch(context.Background(), Endpoint{TrustDomain: tdA, URL: url, Profile: ProfileHTTPSSPIFFE, EndpointID: want}, last, nil)
		var fe *FetchError
		if !errors.As(err, &fe) || fe.Reason != "connect" || !strings.Contains(err.Error(), "unexpected ID") {
			t.Fatalf("wrong endpoint identity: %v", err)
		}
		url = spiffePeer(t, caA, want, serve(200, good))
		if b, err := Fetch(context.Background(), Endpoint{TrustDomain: tdA, URL: url, Profile: ProfileHTTPSSPIFFE, EndpointID: want}, last, nil); err != nil || b == nil {
			t.Fatalf("right identity: %v", err)
		}
		// A server whose SVID is signed by a CA the bootstrap bundle does not hold.
		url = spiffePeer(t, mustCA(t, tdA), want, serve(200, good))
		if _, err := Fetch(context.Background(), Endpoint{TrustDomain: tdA, URL: url, Profile: ProfileHTTPSSPIFFE, EndpointID: want}, last, nil); err == nil || !strings.Contains(err.Error(), "x509") {
			t.Fatalf("untrusted endpoint CA: %v", err)
		}
	})
}

func mustCA(t *testing.T, td spiffeid.TrustDomain) *CA {
	t.Helper()
	ca, err := NewSelfSignedCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// FuzzValidate checks that no document panics the validator and that
// anything accepted is non-empty and not from another trust domain.
func FuzzValidate(f *testing.F) {
	f.Add([]byte(`{"keys":[]}`))
	f.Add([]byte(`{"keys":[{"kty":"EC","use":"x509-svid","crv":"P-256","x":"a","y":"b","x5c":["AA=="]}],"spiffe_sequence":1}`))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Validate(tdA, data, nil)
		if err != nil {
			return
		}
		if len(b.X509Authorities()) == 0 && len(b.JWTAuthorities()) == 0 {
			t.Fatal("accepted an empty bundle")
		}
	})
}
