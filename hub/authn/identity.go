// Package authn tells who is calling: the workload identity and the member
// cluster a caller's credential proves. A credential is either a client
// certificate of our trust domain that chains to our own roots and is
// bound to a member (trust.MemberOID), or a Kubernetes service-account
// token that the member the caller names has reviewed (TokenAuth). A
// member asserts only the identities its scope allows (Scope): none before
// it has synced, none of the hub's own namespace, those of Istio's root
// namespace only when it is the home cluster or its remote Secret allows
// them, and only the namespaces its remote Secret lists when it lists any.
// What a caller may have once it is known is for this package's users to
// decide.
package authn

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/hubmesh/hub/trust"
)

// RootSource gives the roots of our trust domain and of federated ones
// (trust.Domains implements it): a member binding is honoured only on a
// certificate that chains to our own.
type RootSource interface {
	// LocalTrustDomain is our trust domain's name.
	LocalTrustDomain() string
	// RootsPEM returns a trust domain's X.509 roots as PEM.
	RootsPEM(trustDomain string) ([]byte, bool)
}

// Identity is what the hub has verified about a caller: its workload from
// the mTLS client certificate or a service-account token, and the member
// cluster that credential proves.
type Identity struct {
	// SpiffeID is the caller's workload; zero when not verified
	// (plaintext, no certificate).
	SpiffeID spiffeid.ID
	// Namespace is the workload's namespace (spiffe://<td>/ns/<ns>/...).
	Namespace string
	// Cluster is the member the credential proves: where a token was
	// reviewed, or the member binding (trust.MemberOID) of a certificate
	// from our own CA. Empty when it proves none: no Kubernetes Secrets.
	Cluster string
	// FromToken says the identity is proven by a service-account token
	// reviewed in Cluster.
	FromToken bool
	// NotAfter is when the client certificate that proves it expires
	// (zero for a token): a renewal by certificate never outlives it.
	NotAfter time.Time
	// Conflict is the other member a certificate-bound caller claims to
	// be in; it then gets no Kubernetes Secrets.
	Conflict string
}

// Verified reports whether the caller proved a workload identity of ours
// (local is our trust domain's name).
func (id Identity) Verified(local string) bool {
	return !id.SpiffeID.IsZero() && id.SpiffeID.TrustDomain().Name() == local && id.Namespace != ""
}

// MemberBinding returns the member cluster a verified client certificate
// is bound to (trust.MemberOID), or "": only a certificate of our own trust
// domain that chains to our own roots can bind one. A peer trust domain's
// CA could write the extension too; it cannot sign for our trust domain.
func MemberBinding(chain []*x509.Certificate, roots RootSource) string {
	if roots == nil || len(chain) == 0 {
		return ""
	}
	member, ok := trust.MemberOf(chain[0])
	if !ok {
		return ""
	}
	td, err := spiffeid.TrustDomainFromString(roots.LocalTrustDomain())
	if err != nil {
		return ""
	}
	pemRoots, ok := roots.RootsPEM(td.Name())
	if !ok {
		return ""
	}
	var authorities []*x509.Certificate
	for rest := pemRoots; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			authorities = append(authorities, c)
		}
	}
	if _, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(td, authorities)); err != nil {
		return ""
	}
	return member
}

// PeerIdentity reads the SPIFFE ID of a verified client certificate and
// the namespace it names. The mTLS listener's verifier has already checked
// the chain.
func PeerIdentity(p *peer.Peer) (spiffeid.ID, string) {
	if p == nil {
		return spiffeid.ID{}, ""
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 || !info.State.HandshakeComplete {
		return spiffeid.ID{}, ""
	}
	id, err := x509svid.IDFromCert(info.State.PeerCertificates[0])
	if err != nil {
		return spiffeid.ID{}, ""
	}
	return id, NamespaceOf(id)
}

// ServiceAccountOf extracts <sa> from spiffe://<td>/ns/<ns>/sa/<sa>.
func ServiceAccountOf(id spiffeid.ID) string {
	parts := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/")
	if len(parts) == 4 {
		return parts[3]
	}
	return ""
}

// NamespaceOf extracts <ns> from spiffe://<td>/ns/<ns>/sa/<sa>.
func NamespaceOf(id spiffeid.ID) string {
	parts := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/")
	if len(parts) == 4 && parts[0] == "ns" && parts[2] == "sa" {
		return parts[1]
	}
	return ""
}
