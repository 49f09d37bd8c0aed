package hub

import (
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/trust"
)

// TestWorkloadCertsStayDue: every stream's certificate keeps a renewal
// due, including those a renewal tick found not due yet (served from the
// stream's cache), so none outlives its renewal; a certificate is never
// issued beyond the credential that proved the identity, nor to an
// identity that is not ours.
func TestWorkloadCertsStayDue(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	ca, err := trust.NewSelfSignedCA(td, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	wc := &workloadCerts{signer: &caSigner{ca}, ttl: time.Hour}
	idOf := func(sa string, notAfter time.Time) authn.Identity {
		return authn.Identity{SpiffeID: spiffeid.RequireFromPath(td, "/ns/a/sa/"+sa), Namespace: "a", Cluster: "west", NotAfter: notAfter}
	}
	var a, b streamWorkload
	if _, err := wc.secret(&a, idOf("a", time.Time{}), fakeRoots{}); err != nil {
		t.Fatal(err)
	}
	if _, err := wc.secret(&b, idOf("b", time.Now().Add(40*time.Minute)), fakeRoots{}); err != nil {
		t.Fatal(err)
	}
	if got := time.Until(b.cert.renewAt); got > 21*time.Minute {
		t.Errorf("b renews in %v; want half of its credential's 40 minutes", got)
	}
	if !wc.renewalDue(time.Now().Add(2 * time.Hour)) {
		t.Fatal("no renewal due two hours on")
	}
	// The tick's re-evaluation finds b's (and a's) not due yet at this
	// instant: they must stay due.
	if _, err := wc.secret(&b, idOf("b", time.Now().Add(40*time.Minute)), fakeRoots{}); err != nil {
		t.Fatal(err)
	}
	if wc.next.Load() == 0 {
		t.Fatal("a cached certificate left no renewal due: it would expire unrenewed")
	}
	if _, err := wc.secret(&a, authn.Identity{SpiffeID: spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString("other.org"), "/ns/a/sa/x"), Namespace: "a"}, fakeRoots{}); err == nil {
		t.Error("a certificate for another trust domain's identity")
	}
	if _, err := wc.secret(&a, idOf("c", time.Now().Add(time.Minute)), fakeRoots{}); err == nil {
		t.Error("a certificate for a credential that expires in a minute")
	}
}
