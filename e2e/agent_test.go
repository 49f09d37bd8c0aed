package e2e

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/trust"
)

// agentHubName is the DNS name on the hub's serving certificate that the
// agents verify (ISTIOD_SAN), like istiod.istio-system.svc in a cluster.
const agentHubName = "hub.hub-system.svc"

// agentHub is a hub with members west and east and its mTLS xDS port on a
// certificate that names agentHubName, for pilot-agent tests.
type agentHub struct {
	*hubProcess
	ns      string // the hub's namespace in the home cluster
	td      spiffeid.TrustDomain
	rootPEM []byte
	roots   *x509.CertPool
}

// startAgentHub starts a hub for trust domain td with members west and
// east and waits until both are Ready.
func startAgentHub(t *testing.T, e *localcluster.Env, td spiffeid.TrustDomain, extraArgs ...string) *agentHub {
	t.Helper()
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ns := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(testContext(t), localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"west": west.Kubeconfig(), "east": east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0",
		"--tls-dns-names", agentHubName}, extraArgs...)
	h := &agentHub{hubProcess: startHub(t, home, args...), ns: ns, td: td, roots: x509.NewCertPool()}
	eventually(t, 30*time.Second, func() error {
		if cl := h.clusters(t); cl["west"].State != "Ready" || cl["east"].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})
	for _, c := range h.bundle(t, td).X509Authorities() {
		h.roots.AddCert(c)
		h.rootPEM = append(h.rootPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return h
}

// agent starts a pilot-agent for ns/sa in member against this hub.
func (h *agentHub) agent(t *testing.T, member *localcluster.Cluster, ns, sa string, env ...string) *agentProcess {
	t.Helper()
	return startAgent(t, agentOptions{Member: member, Namespace: ns, ServiceAccount: sa, HubAddr: h.addrs["xds-tls"],
		HubName: agentHubName, RootPEM: h.rootPEM, TrustDomain: h.td.Name(), Env: env})
}

// checkWorkloadCert verifies the agent's cert-chain.pem: the leaf names
// exactly spiffe://<td>/ns/<ns>/sa/<sa> and member, has the serverAuth and
// clientAuth EKUs, is valid now and chains through the file's
// intermediates to the hub's root, which is the file's last certificate
// and root-cert.pem. It returns the leaf.
func (h *agentHub) checkWorkloadCert(t *testing.T, a *agentProcess, ns, sa, member string) *x509.Certificate {
	t.Helper()
	ders := a.certChain(t)
	if len(ders) < 2 {
		t.Fatalf("cert-chain.pem holds %d certificate(s); want the leaf and the chain to the root", len(ders))
	}
	var chain []*x509.Certificate
	for _, der := range ders {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		chain = append(chain, c)
	}
	leaf := chain[0]
	want := spiffeid.RequireFromPath(h.td, "/ns/"+ns+"/sa/"+sa).String()
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		t.Errorf("leaf URI SANs %v; want exactly %s", leaf.URIs, want)
	}
	if len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
		t.Errorf("leaf has other SANs: %v %v %v", leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses)
	}
	if got, ok := trust.MemberOf(leaf); !ok || got != member {
		t.Errorf("leaf is bound to member %q (%v); want %q", got, ok, member)
	}
	intermediates := x509.NewCertPool()
	for _, c := range chain[1 : len(chain)-1] {
		intermediates.AddCert(c)
	}
	for _, eku := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: h.roots, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{eku}}); err != nil {
			t.Errorf("leaf does not verify for EKU %v against the hub's root: %v", eku, err)
		}
	}
	if root := chain[len(chain)-1]; !root.IsCA || !bytes.Equal(root.RawSubject, root.RawIssuer) {
		t.Errorf("the chain's last certificate (%s) is not a root", root.Subject)
	}
	rootFile, err := os.ReadFile(filepath.Join(a.CertDir, "root-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := pem.Decode(rootFile); b == nil || !bytes.Equal(b.Bytes, chain[len(chain)-1].Raw) {
		t.Errorf("root-cert.pem is not the chain's root")
	}
	return leaf
}

// grpcBootstrap is the part of the agent's gRPC bootstrap the tests check.
type grpcBootstrap struct {
	XDSServers []struct {
		ServerURI    string `json:"server_uri"`
		ChannelCreds []struct {
			Type string `json:"type"`
		} `json:"channel_creds"`
		ServerFeatures []string `json:"server_features"`
	} `json:"xds_servers"`
	Node struct {
		ID       string         `json:"id"`
		Metadata map[string]any `json:"metadata"`
	} `json:"node"`
	CertificateProviders map[string]struct {
		PluginName string            `json:"plugin_name"`
		Config     map[string]string `json:"config"`
	} `json:"certificate_providers"`
	ServerListenerResourceNameTemplate string `json:"server_listener_resource_name_template"`
}

// checkBootstrap verifies the agent's gRPC bootstrap: xDS through the
// agent's own Unix socket, the sidecar node ID and metadata, the
// file_watcher provider "default" on the cert files, and the inbound
// listener name template.
func checkBootstrap(t *testing.T, a *agentProcess, ns, member string) {
	t.Helper()
	data, err := os.ReadFile(a.BootstrapPath)
	if err != nil {
		t.Fatal(err)
	}
	var b grpcBootstrap
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatalf("the agent's bootstrap: %v\n%s", err, data)
	}
	sock := "unix:///" + filepath.Join(a.Dir, "etc/istio/proxy/XDS")
	if len(b.XDSServers) != 1 || b.XDSServers[0].ServerURI != sock || len(b.XDSServers[0].ChannelCreds) != 1 || b.XDSServers[0].ChannelCreds[0].Type != "insecure" {
		t.Errorf("xds_servers: %+v; want only %s, insecure", b.XDSServers, sock)
	}
	if fi, err := os.Stat(strings.TrimPrefix(sock, "unix:///")); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("the agent's xDS socket: %v, %v", fi, err)
	}
	if want := fmt.Sprintf("sidecar~%s~%s~%s.svc.cluster.local", a.PodIP, a.Name, ns); b.Node.ID != want {
		t.Errorf("node id %q; want %q", b.Node.ID, want)
	}
	for k, want := range map[string]string{"CLUSTER_ID": member, "NAMESPACE": ns, "GENERATOR": "grpc"} {
		if got := b.Node.Metadata[k]; got != want {
			t.Errorf("node metadata %s = %v; want %q", k, got, want)
		}
	}
	p, ok := b.CertificateProviders["default"]
	if !ok || p.PluginName != "file_watcher" {
		t.Errorf("certificate_providers: %+v; want default = file_watcher", b.CertificateProviders)
	}
	for k, f := range map[string]string{"certificate_file": "cert-chain.pem", "private_key_file": "key.pem", "ca_certificate_file": "root-cert.pem"} {
		if want := filepath.Join(a.CertDir, f); p.Config[k] != want {
			t.Errorf("file_watcher %s = %q; want %q", k, p.Config[k], want)
		}
	}
	if b.ServerListenerResourceNameTemplate != "xds.istio.io/grpc/lds/inbound/%s" {
		t.Errorf("server_listener_resource_name_template %q", b.ServerListenerResourceNameTemplate)
	}
}

// TestPilotAgentWorkloadCertificate: a real, unmodified pilot-agent for a
// proxyless gRPC workload in member west, run as Istio's grpc-agent
// template runs it, authenticates to the hub with a real projected token
// of a real ServiceAccount, gets its certificate from the hub's CA (the
// identity of the token, bound to west, chained to the hub's root), writes
// the cert files and the gRPC bootstrap, and proxies a grpc-go xds:///
// client's xDS stream to the hub: the client calls a backend in west, and
// the hub lists the stream under the token's identity. A second agent for
// east runs beside it and gets east's binding.
func TestPilotAgentWorkloadCertificate(t *testing.T) {
	e := localcluster.Require(t, env)
	west := e.Cluster("west")
	ctx := testContext(t)
	ip := dataPlaneIP(t)
	pilotAgentBin(t)
	app := "agent-" + rand.String(5)
	if err := localcluster.EnsureNamespace(ctx, client(t, west), app); err != nil {
		t.Fatal(err)
	}
	b := startBackend(t, ip, "west-agent")
	const port = 7070
	if err := localcluster.ApplyService(ctx, client(t, west), app, "echo", "grpc", port,
		[]localcluster.Backend{{IP: b.addr.IP.String(), Port: int32(b.addr.Port)}}); err != nil {
		t.Fatal(err)
	}
	h := startAgentHub(t, e, spiffeid.RequireTrustDomainFromString("agent.test"))

	start := time.Now()
	a := h.agent(t, west, app, "client")
	t.Logf("pilot-agent wrote its certificate and bootstrap %s after start", time.Since(start).Round(time.Millisecond))
	leaf := h.checkWorkloadCert(t, a, app, "client", "west")
	if ttl := leaf.NotAfter.Sub(leaf.NotBefore); ttl < 23*time.Hour || ttl > 25*time.Hour {
		t.Errorf("certificate lifetime %s; want the agent's default SECRET_TTL, 24h", ttl)
	}
	checkBootstrap(t, a, app, "west")
	// A second agent side by side, for the same namespace and account name
	// in east: its token is reviewed in east, so its certificate names the
	// same identity bound to east.
	ea := h.agent(t, e.Cluster("east"), app, "client")
	h.checkWorkloadCert(t, ea, app, "client", "east")
	checkBootstrap(t, ea, app, "east")

	// The workload: a grpc-go xds:/// client with the agent's bootstrap
	// (grpc-go reads GRPC_XDS_BOOTSTRAP before GRPC_XDS_BOOTSTRAP_CONFIG,
	// so the helper's own bootstrap is not used).
	target := fmt.Sprintf("xds:///echo.%s.svc.cluster.local:%d", app, port)
	xc := startXDSClientWith(t, "unused:0", `[{"type":"insecure"}]`, []string{"GRPC_XDS_BOOTSTRAP=" + a.BootstrapPath}, target, "west", app)
	xc.waitFor(t, 60*time.Second, "an answer from west-agent through the agent's xDS proxy", func(l clientLine) bool { return l.text == "ok west-agent" })

	id := spiffeid.RequireFromPath(h.td, "/ns/"+app+"/sa/client").String()
	eventually(t, 10*time.Second, func() error {
		var proxies api.List[api.Proxy]
		h.getJSON(t, "/api/v1/proxies", &proxies)
		for _, p := range proxies.Items {
			if strings.Contains(p.ID, "~"+a.Name+"~") {
				if p.Identity != id || p.Cluster != "west" || p.Namespace != app {
					return fmt.Errorf("proxy %s: identity %q cluster %q namespace %q; want %s in west", p.ID, p.Identity, p.Cluster, p.Namespace, id)
				}
				return nil
			}
		}
		return fmt.Errorf("the agent's stream is not listed: %+v", proxies.Items)
	})
	// istio#53532: the agent's xDS proxy serves one downstream stream at a
	// time; a second one closes the first.
	if a.logContains("registered overlapping stream") {
		t.Errorf("the agent saw overlapping xDS streams from one grpc-go client (istio#53532)")
	}
}

// TestPilotAgentTrustsEveryRootOfOurs: once the operator plugs in a new CA
// (cacerts), the hub keeps trusting its earlier root until it expires, and
// a real pilot-agent that gets its certificate then serves both roots as
// its workload's trust bundle (root-cert.pem, what a proxyless workload
// reads; Envoy's ROOTCA is the same element of the CA's answer): the
// workload still accepts peers whose certificates chain to the earlier
// root. Its own certificate chains to the new one.
func TestPilotAgentTrustsEveryRootOfOurs(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west := e.Cluster("primary"), e.Cluster("west")
	dataPlaneIP(t)
	pilotAgentBin(t)
	app := "roots-" + rand.String(5)
	h := startAgentHub(t, e, spiffeid.RequireTrustDomainFromString("roots.test"))
	earlier := h.bundle(t, h.td).X509Authorities()
	if len(earlier) != 1 {
		t.Fatalf("a new hub trusts %d roots; want its own one", len(earlier))
	}

	plugged, err := trust.NewSelfSignedCA(h.td, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(plugged.Key)
	if err != nil {
		t.Fatal(err)
	}
	rootPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: plugged.Cert.Raw})
	if _, err := client(t, home).CoreV1().Secrets(h.ns).Create(testContext(t), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: trust.PluggedCASecret},
		Data: map[string][]byte{"ca-cert.pem": rootPEM, "ca-key.pem": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
			"root-cert.pem": rootPEM, "cert-chain.pem": rootPEM},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{trust.CertSHA256(earlier[0]): true, trust.CertSHA256(plugged.Cert): true}
	eventually(t, 45*time.Second, func() error {
		got := map[string]bool{}
		for _, c := range h.bundle(t, h.td).X509Authorities() {
			got[trust.CertSHA256(c)] = true
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("the hub's roots %v; want the plugged root and the earlier one", got)
		}
		return nil
	})
	// The agent verifies the hub's serving certificate with both roots:
	// which one it chains to is not this test's subject.
	h.rootPEM = append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: earlier[0].Raw}), rootPEM...)

	a := h.agent(t, west, app, "client")
	rootFile, err := os.ReadFile(filepath.Join(a.CertDir, "root-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for rest := rootFile; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		got[trust.CertSHA256(c)] = true
	}
	if !maps.Equal(got, want) {
		t.Errorf("the agent's root-cert.pem holds %v; want the plugged root and the earlier one %v", got, want)
	}
	leaf, err := x509.ParseCertificate(a.certChain(t)[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(plugged.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the agent's certificate does not chain to the plugged root: %v", err)
	}
}

// TestPilotAgentRotatesCertificate: with a short certificate lifetime
// (the agent's SECRET_TTL, under the hub's --max-workload-cert-ttl) the
// real agent renews its certificate from the hub before it expires and
// rewrites its cert files: each new certificate is another one (new
// serial and key), for the same identity and member, valid now and chained
// to the hub's root; the hub counts every issuance. An agent asking for
// more than the maximum gets no certificate (InvalidArgument), and says so.
func TestPilotAgentRotatesCertificate(t *testing.T) {
	t.Parallel() // it mostly waits for the agent's timer
	e := localcluster.Require(t, env)
	west := e.Cluster("west")
	dataPlaneIP(t)
	pilotAgentBin(t)
	app := "rotate-" + rand.String(5)
	h := startAgentHub(t, e, spiffeid.RequireTrustDomainFromString("rotate.test"), "--max-workload-cert-ttl", "10m")

	// 1 minute certificates, renewed when three quarters of the lifetime
	// are left (the agent's grace period ratio, ±1% jitter): every ~15 s,
	// each 45 s before the old one expires.
	const ttl = time.Minute
	a := h.agent(t, west, app, "rotating", "SECRET_TTL="+ttl.String(), "SECRET_GRACE_PERIOD_RATIO=0.75")
	leaf := h.checkWorkloadCert(t, a, app, "rotating", "west")
	// The hub backdates NotBefore (clock skew); NotAfter is issuance + TTL.
	if left := time.Until(leaf.NotAfter); left > ttl+5*time.Second || left < ttl/2 {
		t.Errorf("the new certificate expires in %s; want about SECRET_TTL %s", left, ttl)
	}
	keyPEM, err := os.ReadFile(filepath.Join(a.CertDir, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	const rotations = 2
	for i := 1; i <= rotations; i++ {
		eventually(t, 3*ttl, func() error {
			if !a.alive() {
				t.Fatal(a.Exited())
			}
			if c, err := x509.ParseCertificate(a.certChain(t)[0]); err != nil || c.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
				return fmt.Errorf("rotation %d: cert-chain.pem still holds serial %x (%v)", i, leaf.SerialNumber, err)
			}
			return nil
		})
		// The agent replaces key.pem, then cert-chain.pem, each atomically
		// (and root-cert.pem only when the root changes).
		next := h.checkWorkloadCert(t, a, app, "rotating", "west")
		if err := matchesKey(next, filepath.Join(a.CertDir, "key.pem")); err != nil {
			t.Errorf("rotation %d: %v", i, err)
		}
		if now := time.Now(); now.Before(next.NotBefore) || now.After(next.NotAfter) {
			t.Errorf("rotation %d: the new certificate is valid %s to %s, not now", i, next.NotBefore, next.NotAfter)
		}
		if leaf.NotAfter.Before(time.Now()) {
			t.Errorf("rotation %d came after the old certificate expired (%s)", i, leaf.NotAfter)
		}
		t.Logf("rotation %d: serial %x → %x, %s before the old one expired", i, leaf.SerialNumber, next.SerialNumber, time.Until(leaf.NotAfter).Round(time.Second))
		leaf = next
	}
	if newKey, err := os.ReadFile(filepath.Join(a.CertDir, "key.pem")); err != nil || bytes.Equal(newKey, keyPEM) {
		t.Errorf("key.pem was not replaced (%v): a renewal must use a new key", err)
	}
	var st api.Certificates
	h.getJSON(t, "/api/v1/certificates", &st)
	for _, g := range st.Issued {
		if g.Member == "west" && g.Namespace == app {
			if g.Issued < 1+rotations || g.Valid != 1 {
				t.Errorf("/api/v1/certificates: %+v; want ≥ %d issued, 1 valid", g, 1+rotations)
			}
		}
	}

	// Above the hub's maximum: refused, so no files, and the agent keeps
	// retrying with backoff, logging why.
	greedy := launchAgent(t, agentOptions{Member: west, Namespace: app, ServiceAccount: "greedy", HubAddr: h.addrs["xds-tls"],
		HubName: agentHubName, RootPEM: h.rootPEM, TrustDomain: h.td.Name(), Env: []string{"SECRET_TTL=24h"}})
	eventually(t, time.Minute, func() error {
		if !greedy.logContains("InvalidArgument") {
			return fmt.Errorf("the agent asking for 24h has not logged InvalidArgument")
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(greedy.CertDir, "cert-chain.pem")); err == nil {
		t.Error("an agent asking for more than --max-workload-cert-ttl got a certificate")
	}
}

// matchesKey checks that the private key in keyFile belongs to cert.
func matchesKey(cert *x509.Certificate, keyFile string) error {
	data, err := os.ReadFile(keyFile)
	if err != nil {
		return err
	}
	b, _ := pem.Decode(data)
	if b == nil {
		return fmt.Errorf("%s holds no PEM block", keyFile)
	}
	var key any
	if key, err = x509.ParsePKCS8PrivateKey(b.Bytes); err != nil {
		if key, err = x509.ParsePKCS1PrivateKey(b.Bytes); err != nil {
			if key, err = x509.ParseECPrivateKey(b.Bytes); err != nil {
				return fmt.Errorf("%s: %w", keyFile, err)
			}
		}
	}
	pub, ok := key.(interface{ Public() crypto.PublicKey })
	if !ok {
		return fmt.Errorf("%s: a %T has no public key", keyFile, key)
	}
	if eq, ok := pub.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !eq.Equal(cert.PublicKey) {
		return fmt.Errorf("%s does not hold the key of the certificate with serial %x yet", keyFile, cert.SerialNumber)
	}
	return nil
}
