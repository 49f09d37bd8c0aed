package ca

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"slices"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/trust"
)

// A caller whose context ended gets no worker slot, however often it asks:
// callers that give up (a tiny grpc-timeout, a cancel) never leak the CA's
// slots.
func TestCASlotsSurviveCallersThatGiveUp(t *testing.T) {
	s := &Server{workers: make(chan struct{}, 1), renewals: make(chan struct{}, 1), maxWaiting: 4}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for range 100 {
		for _, renewal := range []bool{false, true} {
			if release, err := s.acquire(done, renewal); release != nil || err == nil {
				t.Fatalf("a cancelled caller got a slot (err %v)", err)
			}
		}
	}
	release, err := s.acquire(context.Background(), false)
	if err != nil || release == nil {
		t.Fatalf("a live caller got no free slot: %v", err)
	}
	release()
	if len(s.workers) != 0 || len(s.renewals) != 0 {
		t.Errorf("slots in use after every caller left: %d workers, %d renewals", len(s.workers), len(s.renewals))
	}
}

// rootsOf is a RootSource of one trust domain's roots.
type rootsOf struct {
	td    string
	roots []*x509.Certificate
}

func (r rootsOf) LocalTrustDomain() string { return r.td }
func (r rootsOf) RootsPEM(td string) ([]byte, bool) {
	var out []byte
	for _, c := range r.roots {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out, td == r.td && len(out) > 0
}

// The last element of a response is the root that anchors the chain, then
// every other root of ours, once each: what istio-agent serves whole as
// its workload's trust bundle.
func TestRootBundleIsTheAnchorThenOurOtherRoots(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	var roots []*x509.Certificate
	for range 3 {
		ca, err := trust.NewSelfSignedCA(td, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		roots = append(roots, ca.Cert)
	}
	certs := func(bundle string) []*x509.Certificate {
		var out []*x509.Certificate
		for rest := []byte(bundle); ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				return out
			}
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, c)
		}
	}
	for name, tc := range map[string]struct {
		roots authn.RootSource
		want  []*x509.Certificate
	}{
		"no root source":                {nil, roots[1:2]},
		"the anchor is our only root":   {rootsOf{"example.org", roots[1:2]}, roots[1:2]},
		"an earlier root still trusted": {rootsOf{"example.org", roots[:2]}, []*x509.Certificate{roots[1], roots[0]}},
		"three roots":                   {rootsOf{"example.org", roots}, []*x509.Certificate{roots[1], roots[0], roots[2]}},
	} {
		t.Run(name, func(t *testing.T) {
			s := &Server{roots: tc.roots}
			got := certs(s.rootBundle(roots[1]))
			if !slices.EqualFunc(got, tc.want, (*x509.Certificate).Equal) {
				t.Errorf("bundle of %d certificates; want %d, the anchor first", len(got), len(tc.want))
			}
		})
	}
}
