package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	secretservice "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
)

// istio-agent's part for istiod's Envoys: istiod's clusters (auto mTLS:
// transport_socket_matches for tlsMode=istio) take their certificate
// ("default") and roots ("ROOTCA") over SDS from the static cluster
// sds-grpc, which a sidecar's istio-agent serves on a Unix socket, with
// initial_fetch_timeout 0: without it every such cluster warms forever.
// sdsServer serves both secrets (a self-signed certificate; no traffic is
// ever sent) to every Envoy of the run, as the agent would.

// sdsCluster is the static cluster Istio's clusters name for SDS.
const sdsCluster = "sds-grpc"

// Istio's SDS resource names.
const (
	sdsDefault = "default"
	sdsRoot    = "ROOTCA"
)

// sdsServer is a running SDS server.
type sdsServer struct {
	addr string
	grpc *grpc.Server
}

// startSDS serves Istio's two secrets on 127.0.0.1 until stop.
func startSDS(ctx context.Context) (*sdsServer, error) {
	certPEM, keyPEM, err := selfSigned()
	if err != nil {
		return nil, err
	}
	inline := func(b []byte) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
	}
	secrets := map[string]types.Resource{
		sdsDefault: &tlsv3.Secret{Name: sdsDefault, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(certPEM), PrivateKey: inline(keyPEM),
		}}},
		sdsRoot: &tlsv3.Secret{Name: sdsRoot, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: inline(certPEM),
		}}},
	}
	cache := cachev3.NewLinearCache(resourcev3.SecretType, cachev3.WithInitialResources(secrets))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer()
	secretservice.RegisterSecretDiscoveryServiceServer(g, serverv3.NewServer(ctx, cache, nil))
	go func() { _ = g.Serve(lis) }()
	return &sdsServer{addr: lis.Addr().String(), grpc: g}, nil
}

func (s *sdsServer) stop() {
	if s != nil {
		s.grpc.Stop()
	}
}

// selfSigned is a throwaway self-signed ECDSA certificate and key (PEM).
func selfSigned() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hubbench"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("self-signing: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
