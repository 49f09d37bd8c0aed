package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/chromium"
	"github.com/hubmesh/hub/internal/hubproc"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/xdstest"
	"github.com/hubmesh/hub/trust"
)

func (h *hubProcess) do(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	c := &apiClient{base: h.adminURL}
	code, b, _ := c.call(t, method, path, h.token, body)
	return code, b
}

func (h *hubProcess) trustDomain(t *testing.T, td string) api.TrustDomain {
	t.Helper()
	var out api.TrustDomain
	h.getJSON(t, "/api/v1/trustdomains/"+td, &out)
	return out
}

// findTrustDomain is trustDomain for condition waits: a relationship PUT a
// moment ago is listed once the hub's informer has seen its ConfigMap, and
// is 404 until then.
func (h *hubProcess) findTrustDomain(t *testing.T, td string) (api.TrustDomain, error) {
	t.Helper()
	var out api.TrustDomain
	code, body := h.do(t, "GET", "/api/v1/trustdomains/"+td, "")
	if code != 200 {
		return out, fmt.Errorf("GET trust domain %s: %d %s", td, code, body)
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		return out, fmt.Errorf("GET trust domain %s: %w", td, err)
	}
	return out, nil
}

// webServingCert issues a certificate for 127.0.0.1 from a throwaway CA and
// writes it to files, for an https_web bundle endpoint.
func webServingCert(t *testing.T) (certFile, keyFile string, caPEM []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "web-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "bundle"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	_ = os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	_ = os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return certFile, keyFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// hubCA reads a hub's self-signed CA from its home cluster, to issue test SVIDs.
func hubCA(t *testing.T, c *localcluster.Cluster, ns string, td spiffeid.TrustDomain) *trust.CA {
	t.Helper()
	s, err := client(t, c).CoreV1().Secrets(ns).Get(testContext(t), trust.StateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	certBlock, _ := pem.Decode(s.Data["ca-cert.pem"])
	keyBlock, _ := pem.Decode(s.Data["ca-key.pem"])
	cert, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return &trust.CA{TrustDomain: td, Cert: cert, Key: key.(*ecdsa.PrivateKey)}
}

// adsOverMTLS opens an ADS stream to the hub's mTLS port with a client SVID
// and asks for CDS; it returns the first response or the error.
func adsOverMTLS(t *testing.T, addr string, client *x509svid.SVID, hubBundle *spiffebundle.Bundle, hubTD spiffeid.TrustDomain) error {
	t.Helper()
	cfg := tlsconfig.MTLSClientConfig(client, hubBundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(hubTD, "/hub")))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = xdstest.Fetch(ctx, conn, &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "mtls-client"}, TypeUrl: resourcev3.ClusterType})
	return err
}

// expiredSVID signs an SVID whose validity ended an hour ago.
func expiredSVID(t *testing.T, ca *trust.CA, id spiffeid.ID) *x509svid.SVID {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	u, _ := url.Parse(id.String())
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(99), URIs: []*url.URL{u}, NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return &x509svid.SVID{ID: id, Certificates: []*x509.Certificate{leaf}, PrivateKey: key}
}

// TestTrustFederation runs two hubs, each with its own home cluster and
// trust domain, federating through their real bundle endpoints: A serves
// https_spiffe, B serves https_web. Then A's root is rotated and B follows;
// B's workloads' certificates are accepted on A's mTLS xDS port while
// unknown trust domains and expired chains are refused.
func TestTrustFederation(t *testing.T) {
	e := localcluster.Require(t, env)
	homeA, homeB := e.Cluster("primary"), e.Cluster("west")
	nsA, nsB := hubNamespace(t, homeA), hubNamespace(t, homeB)
	tdA, tdB := spiffeid.RequireTrustDomainFromString("a.test"), spiffeid.RequireTrustDomainFromString("b.test")
	certFile, keyFile, webCA := webServingCert(t)
	a := startHub(t, homeA, "--namespace", nsA, "--trust-domain", tdA.Name(), "--bundle-addr", "127.0.0.1:0", "--xds-tls-addr", "127.0.0.1:0")
	b := startHub(t, homeB, "--namespace", nsB, "--trust-domain", tdB.Name(), "--bundle-addr", "127.0.0.1:0", "--bundle-profile", "https_web",
		"--bundle-cert", certFile, "--bundle-key", keyFile, "--xds-tls-addr", "")
	bundleA, bundleB, tlsA := a.addrs["bundle"], b.addrs["bundle"], a.addrs["xds-tls"]

	// Bootstrap: B needs A's bundle to authenticate A's https_spiffe endpoint.
	code, aBundle := a.do(t, "GET", "/api/v1/trustdomains/a.test/bundle", "")
	if code != 200 || !strings.Contains(aBundle, `"keys"`) {
		t.Fatalf("A's bundle: %d %s", code, aBundle)
	}
	put := func(h *hubProcess, td string, req api.PeerRequest) {
		t.Helper()
		body, _ := json.Marshal(req)
		if code, resp := h.do(t, "PUT", "/api/v1/trustdomains/"+td, string(body)); code != 201 {
			t.Fatalf("PUT %s: %d %s", td, code, resp)
		}
	}
	put(b, "a.test", api.PeerRequest{BundleEndpointURL: "https://" + bundleA, Profile: "https_spiffe", EndpointSPIFFEID: "spiffe://a.test/hub", Bundle: aBundle})
	put(a, "b.test", api.PeerRequest{BundleEndpointURL: "https://" + bundleB, Profile: "https_web", CABundle: string(webCA)})
	// Bad requests are refused before anything is written.
	if code, resp := a.do(t, "PUT", "/api/v1/trustdomains/c.test", `{"bundleEndpointURL":"https://x","profile":"https_spiffe","endpointSPIFFEID":"spiffe://c.test/hub"}`); code != 422 || !strings.Contains(resp, "bootstrap bundle") {
		t.Errorf("https_spiffe without bootstrap: %d %s", code, resp)
	}
	if code, resp := a.do(t, "PUT", "/api/v1/trustdomains/a.test", `{"bundleEndpointURL":"https://x","profile":"https_web"}`); code != 422 || !strings.Contains(resp, "our own trust domain") {
		t.Errorf("peering with ourselves: %d %s", code, resp)
	}

	ready := func(h *hubProcess, td string) api.TrustDomain {
		var st api.TrustDomain
		eventually(t, 60*time.Second, func() error {
			var err error
			if st, err = h.findTrustDomain(t, td); err != nil {
				return err
			}
			if st.State != "Ready" || st.Sequence == nil || len(st.X509Authorities) == 0 || st.LastRefresh == nil {
				return fmt.Errorf("%s: %+v", td, st)
			}
			return nil
		})
		return st
	}
	aAtB := ready(b, "a.test")
	bAtA := ready(a, "b.test")
	ours := a.trustDomain(t, "a.test")
	if !ours.Local || ours.X509Authorities[0].SHA256 != aAtB.X509Authorities[0].SHA256 {
		t.Fatalf("B's view of a.test %+v differs from A's own %+v", aAtB, ours)
	}
	if *aAtB.RefreshHint != 10 || bAtA.Profile != "https_web" {
		t.Errorf("refresh hint %d, profile %q", *aAtB.RefreshHint, bAtA.Profile)
	}

	// mTLS xDS on A: a b.test workload is accepted; unknown domains and expired chains are not.
	caB := hubCA(t, homeB, nsB, tdB)
	aBundleParsed, err := spiffebundle.Parse(tdA, []byte(aBundle))
	if err != nil {
		t.Fatal(err)
	}
	workload := spiffeid.RequireFromPath(tdB, "/ns/demo/sa/client")
	svid, err := caB.IssueSVID(workload, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := adsOverMTLS(t, tlsA, svid, aBundleParsed, tdA); err != nil {
		t.Fatalf("a federated client certificate was refused: %v", err)
	}
	stranger, _ := trust.NewSelfSignedCA(spiffeid.RequireTrustDomainFromString("c.test"), time.Hour)
	strangerSVID, _ := stranger.IssueSVID(spiffeid.RequireFromPath(stranger.TrustDomain, "/ns/x/sa/y"), time.Hour)
	if err := adsOverMTLS(t, tlsA, strangerSVID, aBundleParsed, tdA); err == nil {
		t.Error("a client certificate from an unknown trust domain was accepted")
	}
	if err := adsOverMTLS(t, tlsA, expiredSVID(t, caB, workload), aBundleParsed, tdA); err == nil {
		t.Error("an expired client certificate was accepted")
	}
	eventually(t, 10*time.Second, func() error {
		logs, _ := os.ReadFile(a.logPath)
		if !strings.Contains(string(logs), `"xDS client certificate rejected"`) || !strings.Contains(string(logs), "c.test") || !strings.Contains(string(logs), "expired") {
			return fmt.Errorf("A's log does not record both rejections with their reasons")
		}
		return nil
	})

	// Rotate A's root by plugging in a new CA: B sees the new root within a
	// refresh interval, and A keeps the old root in its bundle.
	newRoot, _ := trust.NewSelfSignedCA(tdA, 24*time.Hour)
	keyDER, _ := x509.MarshalPKCS8PrivateKey(newRoot.Key)
	rootPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: newRoot.Cert.Raw})
	plugged := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: trust.PluggedCASecret}, Data: map[string][]byte{
		"ca-cert.pem": rootPEM, "ca-key.pem": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"root-cert.pem": rootPEM, "cert-chain.pem": rootPEM,
	}}
	rotated := time.Now()
	if _, err := client(t, homeA).CoreV1().Secrets(nsA).Create(testContext(t), plugged, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	newSum := trust.CertSHA256(newRoot.Cert)
	eventually(t, 45*time.Second, func() error {
		st := b.trustDomain(t, "a.test")
		has := map[string]bool{}
		for _, a := range st.X509Authorities {
			has[a.SHA256] = true
		}
		if !has[newSum] || !has[aAtB.X509Authorities[0].SHA256] || *st.Sequence <= *aAtB.Sequence {
			return fmt.Errorf("B's view of a.test after rotation: %+v", st)
		}
		return nil
	})
	t.Logf("root rotation at A reached B after %s (A's refresh hint %ds)", time.Since(rotated).Round(time.Second), *aAtB.RefreshHint)

	// The dashboard shows both trust domains with their authorities.
	if ctx := browserIfAvailable(t); ctx != nil {
		dir := chromium.Artifacts(t)
		chromium.Do(t, ctx, "sign in", chromedp.Navigate(b.adminURL+"/trust"), chromedp.WaitVisible(chromedp.ID("token")),
			chromedp.SetValue(chromedp.ID("token"), homeB.AdminToken()), chromedp.Submit(chromedp.ID("token")),
			chromedp.WaitVisible(chromedp.CSS("section.trust")))
		chromium.WaitText(t, ctx, "main", "a.test", 10*time.Second)
		chromium.WaitText(t, ctx, "main", newSum[:12], 10*time.Second)
		chromium.Screenshot(t, ctx, dir, "trust")
	}

	// B's bundle endpoint goes away: A keeps B's last bundle, marked Stale, also across A's restart.
	b.stop(t)
	eventually(t, 90*time.Second, func() error {
		if st := a.trustDomain(t, "b.test"); st.State != "Stale" || len(st.X509Authorities) == 0 {
			return fmt.Errorf("b.test at A while B is down: %+v", st)
		}
		return nil
	})
	a.stop(t)
	a2 := startHub(t, homeA, "--namespace", nsA, "--trust-domain", tdA.Name(), "--bundle-addr", "", "--xds-tls-addr", "")
	eventually(t, 30*time.Second, func() error {
		st, err := a2.findTrustDomain(t, "b.test")
		if err != nil {
			return err
		}
		if st.State != "Stale" || len(st.X509Authorities) == 0 || st.X509Authorities[0].SHA256 != bAtA.X509Authorities[0].SHA256 {
			return fmt.Errorf("b.test after A's restart with B down: %+v", st)
		}
		return nil
	})

	// Refresh on demand, then end the relationship (idempotently).
	if code, resp := a2.do(t, "POST", "/api/v1/trustdomains/b.test/refresh", ""); code != 200 || !strings.Contains(resp, `"trustDomain":"b.test"`) {
		t.Errorf("refresh: %d %s", code, resp)
	}
	for range 2 {
		if code, resp := a2.do(t, "DELETE", "/api/v1/trustdomains/b.test", ""); code != 204 {
			t.Errorf("delete: %d %s", code, resp)
		}
	}
	eventually(t, 10*time.Second, func() error {
		if code, _ := a2.do(t, "GET", "/api/v1/trustdomains/b.test", ""); code != 404 {
			return fmt.Errorf("b.test still federated: %d", code)
		}
		return nil
	})
	if code, resp := a2.do(t, "DELETE", "/api/v1/trustdomains/a.test", ""); code != 422 {
		t.Errorf("deleting our own trust domain: %d %s", code, resp)
	}
}

// TestHubRefusesCorruptCA: with an unreadable CA key stored in
// hub-trust-state the real hub binary exits at once with an error that
// names the Secret and says how to start over; it does not retry (the
// error is not transient) and writes no new CA.
func TestHubRefusesCorruptCA(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("primary")
	ns := hubNamespace(t, home)
	secrets := client(t, home).CoreV1().Secrets(ns)
	state, err := secrets.Create(testContext(t), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: trust.StateSecret}, Data: map[string][]byte{
		"ca-cert.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("truncated")}),
		"ca-key.pem":  []byte("-----BEGIN PRIVATE KEY-----\ntruncated"),
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "home.kubeconfig")
	if err := os.WriteFile(kubeconfig, home.Kubeconfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	hub, err := hubproc.Start(hubproc.Options{Bin: hubBin, LogPath: filepath.Join(dir, "hub.log"), Args: []string{"serve",
		"--kubeconfig", kubeconfig, "--cluster-id", home.Name, "--namespace", ns,
		"--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--xds-tls-addr", "", "--bundle-addr", ""}})
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	select {
	case <-hub.Done():
		err = hub.Err()
	case <-time.After(2 * time.Minute): // startTrust would give up on a transient error after one minute
		hub.Kill()
		t.Fatalf("the hub still runs with a corrupt CA key:\n%s", hub.Tail(20))
	}
	t.Logf("hub exited %s after start: %v", time.Since(started).Round(100*time.Millisecond), err)
	out, _ := os.ReadFile(hub.LogPath())
	log := string(out)
	if err == nil {
		t.Errorf("the hub exited 0 with a corrupt CA key:\n%s", tail(log, 20))
	}
	want := "in Secret " + ns + "/" + trust.StateSecret + " is unreadable: "
	if !strings.Contains(log, want) || !strings.Contains(log, "refusing to mint a new CA (delete the Secret to start over)") {
		t.Errorf("the hub's output does not explain the refusal (want %q):\n%s", want, tail(log, 20))
	}
	if strings.Contains(log, "loading our CA; retrying") {
		t.Errorf("the hub retried a corrupt CA:\n%s", tail(log, 20))
	}
	if strings.Contains(log, "truncated") {
		t.Errorf("the hub's output quotes the stored key:\n%s", tail(log, 20))
	}
	if now, err := secrets.Get(testContext(t), trust.StateSecret, metav1.GetOptions{}); err != nil || now.ResourceVersion != state.ResourceVersion {
		t.Errorf("hub-trust-state was rewritten (%v)", err)
	}
}
