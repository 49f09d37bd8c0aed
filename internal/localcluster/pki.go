package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the certificate material shared by every API server of one Env:
// one CA that signs the serving certificate and the admin client certificate,
// and one key pair that signs and verifies service-account tokens.
type pki struct {
	caPEM, serverCertPEM, serverKeyPEM []byte
	adminCertPEM, adminKeyPEM          []byte
	saKeyPEM, saPubPEM                 []byte

	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64

	// Paths of the same material on disk, for kube-apiserver flags.
	caFile, serverCertFile, serverKeyFile, saKeyFile, saPubFile, tokenFile string
}

// adminToken is a static bearer token accepted by every local API server.
const adminToken = "hub-local-admin-token"

func newPKI(dir string) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	now := time.Now()
	p, err := selfSignCA(caKey, now)
	if err != nil {
		return nil, err
	}
	p.serverCertPEM, p.serverKeyPEM, err = p.issueLeaf(now, 2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("issuing serving certificate: %w", err)
	}
	p.adminCertPEM, p.adminKeyPEM, err = p.issueLeaf(now, 3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "hub-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("issuing admin certificate: %w", err)
	}
	if err := p.generateServiceAccountKey(); err != nil {
		return nil, err
	}
	if err := p.writeFiles(dir); err != nil {
		return nil, err
	}
	return p, nil
}

// selfSignCA makes the CA certificate of caKey, valid from an hour before
// now for ten years, and returns a pki holding the CA alone.
func selfSignCA(caKey *ecdsa.PrivateKey, now time.Time) (*pki, error) {
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "hub-local-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("self-signing CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parsing CA: %w", err)
	}
	return &pki{caPEM: pemBlock("CERTIFICATE", caDER), caCert: caCert, caKey: caKey, serial: 10}, nil
}

// issueLeaf signs tmpl with the CA for a new key, with the given serial
// number, valid from an hour before now for ten years, and returns the
// certificate and the key as PEM.
func (p *pki) issueLeaf(now time.Time, serial int64, tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = big.NewInt(serial)
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(10 * 365 * 24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), nil
}

// generateServiceAccountKey makes the RSA key pair that signs and verifies
// service-account tokens.
func (p *pki) generateServiceAccountKey() error {
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generating service-account key: %w", err)
	}
	p.saKeyPEM = pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey))
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return fmt.Errorf("marshalling service-account public key: %w", err)
	}
	p.saPubPEM = pemBlock("PUBLIC KEY", pubDER)
	return nil
}

// writeFiles writes the CA certificate, the serving certificate and key,
// the service-account key pair and the static token file into dir, and
// records their paths in p.
func (p *pki) writeFiles(dir string) error {
	files := []struct {
		path *string
		name string
		data []byte
	}{
		{&p.caFile, "ca.crt", p.caPEM},
		{&p.serverCertFile, "apiserver.crt", p.serverCertPEM},
		{&p.serverKeyFile, "apiserver.key", p.serverKeyPEM},
		{&p.saKeyFile, "sa.key", p.saKeyPEM},
		{&p.saPubFile, "sa.pub", p.saPubPEM},
		{&p.tokenFile, "tokens.csv", []byte(adminToken + ",hub-admin,hub-admin,system:masters\n")},
	}
	for _, f := range files {
		*f.path = filepath.Join(dir, f.name)
		if err := os.WriteFile(*f.path, f.data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", f.name, err)
		}
	}
	return nil
}

// clientCert issues a fresh client certificate for a user in groups.
func (p *pki) clientCert(user string, groups ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	p.serial++
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: user, Organization: groups},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing client certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
