// Package trust is the hub's SPIFFE layer: our trust domain's CA and
// bundle, the bundle endpoint, and federation with peers' bundle endpoints
// (fetched, validated and persisted).
package trust

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net/url"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// CA signs SVIDs for one trust domain.
type CA struct {
	TrustDomain spiffeid.TrustDomain
	Cert        *x509.Certificate // the signing certificate
	Key         crypto.Signer
	// Chain is the signing certificate's chain up to (not including) the
	// root, for intermediate CAs plugged in through cacerts.
	Chain []*x509.Certificate
}

// NewSelfSignedCA creates a root CA for td whose certificate carries the
// trust domain's SPIFFE ID as a URI SAN (as SPIRE's do), so that bundles can
// be checked against the trust domain they claim.
func NewSelfSignedCA(td spiffeid.TrustDomain, ttl time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tdURL, _ := url.Parse(td.IDString())
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"hub"}, CommonName: "hub root CA " + td.Name()},
		URIs:                  []*url.URL{tdURL},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(ttl),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-signing CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{TrustDomain: td, Cert: cert, Key: key}, nil
}

// IssueSVID signs an X.509-SVID for id with a fresh key.
func (ca *CA) IssueSVID(id spiffeid.ID, ttl time.Duration, dnsNames ...string) (*x509svid.SVID, error) {
	return ca.issue(id, ttl, dnsNames, nil)
}

// issue signs an X.509-SVID for id with a fresh key, the given DNS SANs and
// extra extensions, valid for ttl but never beyond the CA's own certificate.
func (ca *CA) issue(id spiffeid.ID, ttl time.Duration, dnsNames []string, extra []pkix.Extension) (*x509svid.SVID, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leaf, err := ca.sign(&key.PublicKey, id, ttl, dnsNames, extra)
	if err != nil {
		return nil, err
	}
	return &x509svid.SVID{ID: id, Certificates: append([]*x509.Certificate{leaf}, ca.chainWithSigner()...), PrivateKey: key}, nil
}

// sign makes a leaf certificate for id with the given public key, DNS SANs
// and extra extensions, valid for ttl but never beyond the CA's own
// certificate, with serverAuth and clientAuth usages. An expired CA signs
// nothing.
func (ca *CA) sign(pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration, dnsNames []string, extra []pkix.Extension) (*x509.Certificate, error) {
	if id.TrustDomain() != ca.TrustDomain {
		return nil, fmt.Errorf("SVID %s is outside trust domain %s", id, ca.TrustDomain)
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
	if !notAfter.After(now) {
		return nil, fmt.Errorf("signing SVID for %s: our CA certificate %q expired at %s", id, ca.Cert.Subject, ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	tmpl := &x509.Certificate{
		SerialNumber:    serial,
		Subject:         pkix.Name{Organization: []string{"hub"}},
		URIs:            []*url.URL{id.URL()},
		DNSNames:        dnsNames,
		NotBefore:       now.Add(-time.Minute),
		NotAfter:        notAfter,
		KeyUsage:        x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		ExtraExtensions: extra,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing SVID for %s: %w", id, err)
	}
	return x509.ParseCertificate(der)
}

// chainWithSigner is the signing certificate followed by its chain, unless
// the signer is itself a self-signed root (roots travel in bundles).
func (ca *CA) chainWithSigner() []*x509.Certificate {
	if ca.Cert.CheckSignatureFrom(ca.Cert) == nil && len(ca.Chain) == 0 {
		return nil
	}
	return append([]*x509.Certificate{ca.Cert}, ca.Chain...)
}
