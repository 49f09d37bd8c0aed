package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
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
// workload into dir: cert-chain.pem, key.pem and root-cert.pem.
func (ca *demoCA) issue(ctx context.Context, c kubernetes.Interface, member, ns, sa, dir string) error {
	expiry := int64(time.Hour / time.Second)
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}, ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token of %s/%s in %s: %w", ns, sa, member, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return fmt.Errorf("creating a CSR: %w", err)
	}
	csr := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cctx = metadata.AppendToOutgoingContext(cctx, "authorization", "Bearer "+tr.Status.Token, "ClusterID", member)
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(ca.conn).CreateCertificate(cctx,
		&securityv1alpha1.IstioCertificateRequest{Csr: string(csr)})
	if err != nil {
		return fmt.Errorf("certificate for %s/%s in %s from the hub's CA: %w", ns, sa, member, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	var chain strings.Builder
	for _, p := range resp.GetCertChain() {
		chain.WriteString(strings.TrimRight(p, "\n") + "\n")
	}
	files := map[string][]byte{
		"cert-chain.pem": []byte(chain.String()),
		"key.pem":        pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"root-cert.pem":  ca.rootsPEM,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}

// writeDemoBootstrap writes the gRPC xDS bootstrap of a workload as
// istio-agent writes it for proxyless gRPC (a file_watcher certificate
// provider "default" on the files in dir, the inbound listener name
// template), connecting to the hub at xdsAddr in plaintext. Without mtls
// it names no certificate provider. It returns the file's path.
func writeDemoBootstrap(dir, xdsAddr, nodeID, member, namespace string, mtls bool) (string, error) {
	bootstrap := map[string]any{
		"xds_servers": []any{map[string]any{"server_uri": xdsAddr, "channel_creds": []any{map[string]any{"type": "insecure"}}, "server_features": []string{"xds_v3"}}},
		"node": map[string]any{
			"id":       nodeID,
			"metadata": map[string]any{"CLUSTER_ID": member, "NAMESPACE": namespace, "GENERATOR": "grpc"},
		},
		"server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s",
	}
	if mtls {
		bootstrap["certificate_providers"] = map[string]any{"default": map[string]any{"plugin_name": "file_watcher", "config": map[string]any{
			"certificate_file": filepath.Join(dir, "cert-chain.pem"), "private_key_file": filepath.Join(dir, "key.pem"),
			"ca_certificate_file": filepath.Join(dir, "root-cert.pem"), "refresh_interval": "900s",
		}}}
	}
	data, err := json.MarshalIndent(bootstrap, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "grpc-bootstrap.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", fmt.Errorf("writing the gRPC bootstrap: %w", err)
	}
	return path, nil
}
