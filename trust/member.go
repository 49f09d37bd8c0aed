package trust

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"math/big"
	"net/url"
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

// clusterIDPattern is a member cluster ID (DESIGN.md §3.2).
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
	if id.TrustDomain() != ca.TrustDomain {
		return nil, fmt.Errorf("SVID %s is outside trust domain %s", id, ca.TrustDomain)
	}
	if !validMember(member) {
		return nil, fmt.Errorf("member %q is not a valid cluster ID", member)
	}
	value, err := asn1.MarshalWithParams(member, "utf8")
	if err != nil {
		return nil, fmt.Errorf("encoding member binding: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(ttl)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:    serial,
		Subject:         pkix.Name{Organization: []string{"hub"}},
		URIs:            []*url.URL{id.URL()},
		NotBefore:       now.Add(-time.Minute),
		NotAfter:        notAfter,
		KeyUsage:        x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		ExtraExtensions: []pkix.Extension{{Id: MemberOID, Value: value}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing SVID for %s: %w", id, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &x509svid.SVID{ID: id, Certificates: append([]*x509.Certificate{leaf}, ca.chainWithSigner()...), PrivateKey: key}, nil
}
