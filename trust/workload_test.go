package trust

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// intermediateCA is a CA signing with an intermediate certificate under
// root, as an operator's plugged-in cacerts does.
func intermediateCA(t *testing.T, root *CA) *CA {
	t.Helper()
	return intermediateUntil(t, root, time.Now().Add(time.Hour))
}

func TestWorkloadChainEndsWithTheRoot(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	root, err := NewSelfSignedCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewSelfSignedCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	inter := intermediateCA(t, root)
	interWithRoot := *inter
	interWithRoot.Chain = []*x509.Certificate{root.Cert} // cert-chain.pem up to the root
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id := spiffeid.RequireFromPath(td, "/ns/a/sa/gw")
	for _, tc := range []struct {
		name  string
		ca    *CA
		roots []*x509.Certificate
		want  []*x509.Certificate // after the leaf
	}{
		{"self-signed root", root, []*x509.Certificate{other.Cert, root.Cert}, []*x509.Certificate{root.Cert}},
		{"intermediate", inter, []*x509.Certificate{other.Cert, root.Cert}, []*x509.Certificate{inter.Cert, root.Cert}},
		{"intermediate with the root in its chain", &interWithRoot, []*x509.Certificate{root.Cert}, []*x509.Certificate{inter.Cert, root.Cert}},
		{"intermediate whose root is unknown", inter, []*x509.Certificate{other.Cert}, nil},
	} {
		leaf, err := tc.ca.SignWorkloadKey(&key.PublicKey, id, "west", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		chain, err := tc.ca.WorkloadChain(leaf, tc.roots)
		if tc.want == nil {
			if err == nil {
				t.Errorf("%s: chain of %d; want an error", tc.name, len(chain))
			}
			continue
		}
		if err != nil || len(chain) != len(tc.want)+1 || chain[0] != leaf {
			t.Fatalf("%s: %d certificates, %v; want leaf and %d", tc.name, len(chain), err, len(tc.want))
		}
		for i, c := range tc.want {
			if !chain[i+1].Equal(c) {
				t.Errorf("%s: element %d is %q; want %q", tc.name, i+1, chain[i+1].Subject, c.Subject)
			}
		}
		if err := leaf.CheckSignatureFrom(chain[1]); err != nil {
			t.Errorf("%s: leaf not signed by the next element: %v", tc.name, err)
		}
	}
}
