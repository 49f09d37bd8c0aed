package authn

import (
	"encoding/pem"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hubmesh/hub/trust"
)

// staticRoots are the roots of example.org, as PEM.
type staticRoots struct{ pem []byte }

func (staticRoots) LocalTrustDomain() string { return "example.org" }
func (r staticRoots) RootsPEM(td string) ([]byte, bool) {
	return r.pem, td == "example.org"
}

// TestMemberBindingNeedsOurRoots checks the binding check itself with a
// certificate that a rogue CA (not in our bundle) issued for our trust
// domain, as a listener with a laxer verifier would let through.
func TestMemberBindingNeedsOurRoots(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	ours, _ := trust.NewSelfSignedCA(td, time.Hour)
	rogue, _ := trust.NewSelfSignedCA(td, time.Hour)
	peer, _ := trust.NewSelfSignedCA(spiffeid.RequireTrustDomainFromString("peer.org"), time.Hour)
	roots := staticRoots{pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ours.Cert.Raw})}
	id := spiffeid.RequireFromPath(td, "/ns/a/sa/gw")
	for name, c := range map[string]struct {
		ca   *trust.CA
		id   spiffeid.ID
		want string
	}{
		"ours":  {ours, id, "west"},
		"rogue": {rogue, id, ""},
		"peer":  {peer, spiffeid.RequireFromPath(peer.TrustDomain, "/ns/a/sa/gw"), ""},
	} {
		svid, err := c.ca.IssueWorkloadSVID(c.id, "west", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if got := MemberBinding(svid.Certificates, roots); got != c.want {
			t.Errorf("%s: binding %q; want %q", name, got, c.want)
		}
	}
	plain, _ := ours.IssueSVID(id, time.Hour)
	if got := MemberBinding(plain.Certificates, roots); got != "" {
		t.Errorf("a certificate without the extension is bound to %q", got)
	}
}
