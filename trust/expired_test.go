package trust

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// A CA whose certificate has expired signs nothing: the leaf would be
// expired when issued (capped at the CA's expiry, before its own
// NotBefore), and istio-agent, which renews at a share of the lifetime it
// is given, would ask again at once, over and over.
func TestExpiredCASignsNothing(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	ca, err := NewSelfSignedCA(td, -time.Minute) // expired a minute ago
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id := spiffeid.RequireFromPath(td, "/ns/a/sa/gw")
	if leaf, err := ca.SignWorkloadKey(&key.PublicKey, id, "west", time.Hour); err == nil {
		t.Errorf("an expired CA signed a leaf valid from %s to %s", leaf.NotBefore, leaf.NotAfter)
	}
	if svid, err := ca.IssueSVID(id, time.Hour); err == nil {
		t.Errorf("an expired CA issued an SVID expiring %s", svid.Certificates[0].NotAfter)
	}
}
