package trust

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// MemberOID identifies the X.509 extension in which our CA binds a workload
// SVID to the member cluster the workload runs in: a non-critical extension
// whose value is the member's cluster ID as a DER UTF8String.
//
// It is a private OID made from the UUID 88d19992-a373-4893-acf6-8fb00c5e2e93
// under Microsoft's arc for GUID-derived OIDs (1.2.840.113556.1.8000.2554,
// the GUID split into 16/16/16/16/16/24/24-bit parts), which needs no
// registration. The UUID arc 2.25.<uuid> cannot be used: its single 128-bit
// component does not fit the int components of encoding/asn1, and Go's
// X.509 parser rejects every certificate with such an extension OID.
var MemberOID = asn1.ObjectIdentifier{1, 2, 840, 113556, 1, 8000, 2554, 35025, 39314, 41843, 18579, 44278, 9416716, 6172307}

// clusterIDPattern is a member cluster ID (docs/architecture.md §3.2).
var clusterIDPattern = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

func validMember(member string) bool {
	return len(member) <= 63 && clusterIDPattern.MatchString(member)
}

// MemberOf returns the member cluster a certificate is bound to by our
// member extension (MemberOID), and whether it carries a well-formed one.
// It does not check who signed the certificate: a binding means something
// only in a certificate that chains to our own trust domain's roots (any CA
// could write the extension), which the caller must verify.
func MemberOf(cert *x509.Certificate) (string, bool) {
	if cert == nil {
		return "", false
	}
	for _, ext := range cert.Extensions {
		if !ext.Id.Equal(MemberOID) {
			continue
		}
		var raw asn1.RawValue
		rest, err := asn1.Unmarshal(ext.Value, &raw)
		if err != nil || len(rest) != 0 || raw.Class != asn1.ClassUniversal || raw.Tag != asn1.TagUTF8String || raw.IsCompound {
			return "", false
		}
		if member := string(raw.Bytes); validMember(member) { // ASCII only: valid UTF-8
			return member, true
		}
		return "", false
	}
	return "", false
}

// IssueWorkloadSVID signs an X.509-SVID for a workload identity of our trust
// domain (spiffe://<td>/ns/<ns>/sa/<sa>) bound to member, the cluster ID of
// the member cluster it runs in (see MemberOID). The hub serves a member's
// Kubernetes Secrets over SDS to a certificate identity only when the
// certificate carries that member's binding.
func (ca *CA) IssueWorkloadSVID(id spiffeid.ID, member string, ttl time.Duration) (*x509svid.SVID, error) {
	ext, err := memberExtension(member)
	if err != nil {
		return nil, err
	}
	return ca.issue(id, ttl, nil, []pkix.Extension{ext})
}

// SignWorkloadKey signs a workload certificate for the caller's own public
// key (from a CSR whose signature the caller has checked): id as the only
// SAN, bound to member as IssueWorkloadSVID does, serverAuth and clientAuth,
// valid for ttl but never beyond the CA's own certificate. It returns the
// leaf only; WorkloadChain completes it.
func (ca *CA) SignWorkloadKey(pub crypto.PublicKey, id spiffeid.ID, member string, ttl time.Duration) (*x509.Certificate, error) {
	ext, err := memberExtension(member)
	if err != nil {
		return nil, err
	}
	return ca.sign(pub, id, ttl, nil, []pkix.Extension{ext})
}

// memberExtension is the member binding extension (MemberOID) for member.
func memberExtension(member string) (pkix.Extension, error) {
	if !validMember(member) {
		return pkix.Extension{}, fmt.Errorf("member %q is not a valid cluster ID", member)
	}
	value, err := asn1.MarshalWithParams(member, "utf8")
	if err != nil {
		return pkix.Extension{}, fmt.Errorf("encoding member binding: %w", err)
	}
	return pkix.Extension{Id: MemberOID, Value: value}, nil
}

// SignWorkload signs a workload certificate for pub with our CA (see
// CA.SignWorkloadKey) and returns it with its chain up to our root, root
// last (see CA.WorkloadChain).
func (f *Domains) SignWorkload(pub crypto.PublicKey, id spiffeid.ID, member string, ttl time.Duration) ([]*x509.Certificate, error) {
	f.mu.RLock()
	st := f.local
	f.mu.RUnlock()
	if st == nil {
		return nil, errors.New("our CA is not loaded yet")
	}
	leaf, err := st.ca.SignWorkloadKey(pub, id, member, ttl)
	if err != nil {
		return nil, err
	}
	return st.ca.WorkloadChain(leaf, st.roots)
}

// WorkloadChain is the chain Istio's CA API answers for leaf, one of ours:
// leaf, the CA's signing certificate, its chain, and the root among roots
// that anchors the last of them unless that already is a self-signed root.
// The root is last and never twice, so the chain has at least two
// certificates (istio-agent refuses a chain of one).
func (ca *CA) WorkloadChain(leaf *x509.Certificate, roots []*x509.Certificate) ([]*x509.Certificate, error) {
	chain := []*x509.Certificate{leaf, ca.Cert}
	for _, c := range ca.Chain {
		if !c.Equal(chain[len(chain)-1]) {
			chain = append(chain, c)
		}
	}
	last := chain[len(chain)-1]
	if selfSigned(last) {
		return chain, nil
	}
	for _, r := range roots {
		if last.CheckSignatureFrom(r) == nil {
			return append(chain, r), nil
		}
	}
	return nil, fmt.Errorf("no root of trust domain %s signed %q: the CA chain is incomplete", ca.TrustDomain, last.Subject)
}

func selfSigned(c *x509.Certificate) bool {
	return bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil
}
