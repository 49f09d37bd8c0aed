package ewgateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"
)

// TestPassesTLSThroughBySNI: a TLS client reaches the backend its server
// name routes to through the gateway, with the handshake end to end (the
// client verifies the backend's certificate; the gateway holds no key); a
// name without a route and a connection that is not TLS are refused; a
// backend that refuses is skipped for the next.
func TestPassesTLSThroughBySNI(t *testing.T) {
	cert, pool := selfSigned(t, "backend.test")
	backend, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c) // echo
			}()
		}
	}()
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	dead.Close() // refuses connections

	var mu sync.Mutex
	routed, refused := map[string]string{}, map[string]error{}
	g := &Gateway{
		Routes:  map[string][]string{"outbound_.8080_._.echo.demo.svc.cluster.local": {deadAddr, backend.Addr().String()}},
		Routed:  func(sni, b string) { mu.Lock(); routed[sni] = b; mu.Unlock() },
		Refused: func(sni string, err error) { mu.Lock(); refused[sni] = err; mu.Unlock() },
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); g.Serve(ctx, lis) }()
	defer func() { cancel(); <-served }()

	for range 2 { // one of the two starts at the dead backend
		// The SNI is Istio's, not the certificate's name (as Istio's
		// clients, it verifies the peer's identity by hand).
		c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{ServerName: "outbound_.8080_._.echo.demo.svc.cluster.local",
			InsecureSkipVerify: true,
			VerifyConnection: func(cs tls.ConnectionState) error {
				_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, DNSName: "backend.test"})
				return err
			}})
		if err != nil {
			t.Fatalf("through the gateway: %v", err)
		}
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("echo %q, %v", buf, err)
		}
		c.Close()
	}
	mu.Lock()
	if routed["outbound_.8080_._.echo.demo.svc.cluster.local"] != backend.Addr().String() {
		t.Errorf("routed %v", routed)
	}
	mu.Unlock()

	if c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{ServerName: "unknown.example", InsecureSkipVerify: true}); err == nil {
		c.Close()
		t.Error("a server name without a route was passed through")
	}
	plain, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = plain.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	_ = plain.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, _ := plain.Read(make([]byte, 1)); n != 0 {
		t.Error("a plaintext connection got an answer")
	}
	plain.Close()
	mu.Lock()
	defer mu.Unlock()
	if refused["unknown.example"] == nil || refused[""] == nil {
		t.Errorf("refusals %v; want the unknown name and the plaintext connection", refused)
	}
}

func selfSigned(t *testing.T, name string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
