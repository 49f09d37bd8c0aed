package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/workload"
)

// demoCA obtains the demo workloads' certificates from the hub's CA
// (Istio's CreateCertificate on --xds-tls-addr) the way istio-agent does:
// with a real ServiceAccount token (audience istio-ca) of the member the
// workload runs in, and the member in the ClusterID header.
type demoCA struct {
	conn     *grpc.ClientConn
	rootsPEM []byte // our trust domain's roots, for the workloads' root-cert.pem
}

// newDemoCA reads our trust domain's bundle from the hub's REST API
// (adminURL, authenticated with token) and connects to the CA on tlsAddr,
// verifying that the hub presents spiffe://<td>/hub.
func newDemoCA(ctx context.Context, adminURL, token, trustDomain, tlsAddr string) (*demoCA, error) {
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		return nil, fmt.Errorf("trust domain %q: %w", trustDomain, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/api/v1/trustdomains/"+td.Name()+"/bundle", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading our trust bundle: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("reading our trust bundle: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading our trust bundle: %s: %s", resp.Status, strings.TrimSpace(string(body[:min(len(body), 200)])))
	}
	bundle, err := spiffebundle.Parse(td, body)
	if err != nil {
		return nil, fmt.Errorf("parsing our trust bundle: %w", err)
	}
	var roots []byte
	for _, c := range bundle.X509Authorities() {
		roots = append(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	creds := credentials.NewTLS(tlsconfig.TLSClientConfig(bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub"))))
	conn, err := grpc.NewClient(tlsAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("connecting to the hub's CA on %s: %w", tlsAddr, err)
	}
	return &demoCA{conn: conn, rootsPEM: roots}, nil
}

// Close closes the connection to the CA.
func (ca *demoCA) Close() error { return ca.conn.Close() }

// issue obtains a certificate for ServiceAccount ns/sa of member (whose
// API server c issues the token) and writes what istio-agent writes for a
// workload into dir: cert-chain.pem, key.pem and root-cert.pem, each
// replaced atomically. It returns the certificate's validity.
func (ca *demoCA) issue(ctx context.Context, c kubernetes.Interface, member, ns, sa, dir string) (validity, error) {
	expiry := int64(time.Hour / time.Second)
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}, ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return validity{}, fmt.Errorf("requesting a token of %s/%s in %s: %w", ns, sa, member, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return validity{}, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return validity{}, fmt.Errorf("creating a CSR: %w", err)
	}
	csr := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cctx = metadata.AppendToOutgoingContext(cctx, "authorization", "Bearer "+tr.Status.Token, "ClusterID", member)
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(ca.conn).CreateCertificate(cctx,
		&securityv1alpha1.IstioCertificateRequest{Csr: string(csr)})
	if err != nil {
		return validity{}, fmt.Errorf("certificate for %s/%s in %s from the hub's CA: %w", ns, sa, member, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return validity{}, err
	}
	var chain strings.Builder
	for _, p := range resp.GetCertChain() {
		chain.WriteString(strings.TrimRight(p, "\n") + "\n")
	}
	block, _ := pem.Decode([]byte(chain.String()))
	if block == nil {
		return validity{}, fmt.Errorf("the hub's CA answered %s/%s in %s without a certificate", ns, sa, member)
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return validity{}, fmt.Errorf("the certificate of %s/%s in %s: %w", ns, sa, member, err)
	}
	files := map[string][]byte{
		"cert-chain.pem": []byte(chain.String()),
		"key.pem":        pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"root-cert.pem":  ca.rootsPEM,
	}
	// The key first, then the chain (as istio-agent): a reader that sees
	// the new chain also sees its key.
	for _, name := range []string{"key.pem", "cert-chain.pem", "root-cert.pem"} {
		if err := writeAtomically(filepath.Join(dir, name), files[name]); err != nil {
			return validity{}, err
		}
	}
	return validity{issued: time.Now(), notAfter: leaf.NotAfter}, nil
}

// validity is when a certificate was received and when it expires (its
// NotBefore is backdated for clock skew, so the lifetime counts from
// receipt).
type validity struct{ issued, notAfter time.Time }

// renewAt is when a certificate is renewed: half-way through its lifetime,
// as istio-agent does by default.
func (v validity) renewAt() time.Time { return v.issued.Add(v.notAfter.Sub(v.issued) / 2) }

// refreshInterval is how often grpc-go re-reads the certificate files:
// istio-agent's 15 minutes, or a quarter of the lifetime when that is
// shorter, so that a renewed certificate is in use well before the old one
// expires.
func (v validity) refreshInterval() time.Duration {
	return min(15*time.Minute, max(time.Second, v.notAfter.Sub(v.issued)/4))
}

// writeAtomically replaces path with data (mode 0600) through a rename, so
// that a file watcher never reads half a file.
func writeAtomically(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	return nil
}

// writeDemoBootstrap writes the gRPC xDS bootstrap of a workload of member
// as istio-agent writes it for proxyless gRPC (workload.Bootstrap: the
// locality of its member's node, a file_watcher certificate provider on
// the files in dir, which grpc-go re-reads every refresh), connecting to
// the hub at xdsAddr in plaintext. Without mtls it names no certificate
// provider. It returns the file's path.
func writeDemoBootstrap(dir, xdsAddr, nodeID, member, namespace string, mtls bool, refresh time.Duration) (string, error) {
	b := workload.Bootstrap{XDSAddr: xdsAddr, NodeID: nodeID, ClusterID: member, Namespace: namespace, Refresh: refresh}
	for _, dc := range demoClusters {
		if dc.name == member {
			b.Region, b.Zone = dc.region, dc.zone
		}
	}
	if mtls {
		b.CertDir = dir
	}
	data, err := b.JSON()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "grpc-bootstrap.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", fmt.Errorf("writing the gRPC bootstrap: %w", err)
	}
	return path, nil
}
