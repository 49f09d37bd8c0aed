package hub

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/hubmesh/hub/trust"
)

// caSigner signs with a real trust.CA as trust.Domains does, its root
// being the CA's own self-signed certificate.
type caSigner struct{ ca *trust.CA }

func (s *caSigner) SignWorkload(pub crypto.PublicKey, id spiffeid.ID, member string, ttl time.Duration) ([]*x509.Certificate, error) {
	leaf, err := s.ca.SignWorkloadKey(pub, id, member, ttl)
	if err != nil {
		return nil, err
	}
	return s.ca.WorkloadChain(leaf, []*x509.Certificate{s.ca.Cert})
}

// The member-cluster token reviews of these tests: the member API server
// is not the subject here (e2e/ca_test.go reviews real tokens).
var caTokens = TokenReviewerFunc(func(_ context.Context, cluster, token string) (string, string, error) {
	switch {
	case cluster == "west" && token == "west-token-a-gw":
		return "a", "gw", nil
	case cluster == "east" && token == "east-token-b-api":
		return "b", "api", nil
	}
	return "", "", fmt.Errorf("token not valid in %s", cluster)
})

// startCAHub is a secureHub serving the CA API with a maximum TTL of two
// hours (its CA lives one hour).
func startCAHub(t *testing.T) *secureHub {
	t.Helper()
	signer := &caSigner{}
	s := startSecureHub(t, Options{Tokens: caTokens, Signer: signer, MaxWorkloadCertTTL: 2 * time.Hour})
	signer.ca = s.ca
	return s
}

// caCall is one CreateCertificate call.
type caCall struct {
	creds   credentials.TransportCredentials
	token   string // authorization: Bearer, unless empty
	cluster string // ClusterID header, unless empty
	csr     string
	ttl     int64 // seconds
}

func (s *secureHub) createCertificate(t testing.TB, addr string, c caCall) (*securityv1alpha1.IstioCertificateResponse, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if c.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
	}
	if c.cluster != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "ClusterID", c.cluster) // as istio-agent spells it
	}
	return securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx,
		&securityv1alpha1.IstioCertificateRequest{Csr: c.csr, ValidityDuration: c.ttl})
}

// newCSR makes a PEM CSR signed by key that asks for identities the
// caller does not have: the CA must ignore them.
func newCSR(t testing.TB, key crypto.Signer) string {
	t.Helper()
	other, _ := url.Parse("spiffe://example.org/ns/kube-system/sa/admin")
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		URIs: []*url.URL{other}, DNSNames: []string{"istiod.istio-system.svc"},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// posingCSR is a PEM CSR for an RSA public key of bits bits and exponent
// e that nobody holds (a random odd modulus), with a signature of zeros:
// the CA must refuse such a key before it checks the signature.
func posingCSR(t testing.TB, bits, e int) string {
	t.Helper()
	buf := make([]byte, bits/8)
	if _, err := rand.Read(buf); err != nil {
		t.Fatal(err)
	}
	buf[0] |= 0x80
	buf[len(buf)-1] |= 1
	pkcs1 := x509.MarshalPKCS1PublicKey(&rsa.PublicKey{N: new(big.Int).SetBytes(buf), E: e})
	rsaEncryption := asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 1}
	sha256WithRSA := asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 11}
	type algorithm struct {
		OID    asn1.ObjectIdentifier
		Params asn1.RawValue
	}
	null := asn1.RawValue{Tag: asn1.TagNull}
	info, err := asn1.Marshal(struct {
		Version   int
		Subject   asn1.RawValue
		PublicKey struct {
			Algorithm algorithm
			Key       asn1.BitString
		}
		Attributes asn1.RawValue `asn1:"tag:0"`
	}{
		Subject: asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: []byte{}},
		PublicKey: struct {
			Algorithm algorithm
			Key       asn1.BitString
		}{algorithm{rsaEncryption, null}, asn1.BitString{Bytes: pkcs1, BitLength: 8 * len(pkcs1)}},
		Attributes: asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: []byte{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, bits/8)
	der, err := asn1.Marshal(struct {
		Info      asn1.RawValue
		Algorithm algorithm
		Signature asn1.BitString
	}{asn1.RawValue{FullBytes: info}, algorithm{sha256WithRSA, null}, asn1.BitString{Bytes: sig, BitLength: 8 * len(sig)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x509.ParseCertificateRequest(der); err != nil {
		t.Fatalf("the posing CSR does not parse: %v", err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

var rsaKey = sync.OnceValue(func() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
})

// parseChain decodes a response: one PEM certificate per element.
func parseChain(t testing.TB, resp *securityv1alpha1.IstioCertificateResponse) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for i, p := range resp.GetCertChain() {
		block, rest := pem.Decode([]byte(p))
		if block == nil || block.Type != "CERTIFICATE" || len(strings.TrimSpace(string(rest))) != 0 {
			t.Fatalf("cert_chain[%d] is not exactly one PEM certificate: %q", i, p)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// checkWorkloadCert asserts what every issued chain must be: exactly id,
// bound to member, serverAuth+clientAuth, leaf then root (ours, last),
// for pub.
func checkWorkloadCert(t *testing.T, s *secureHub, chain []*x509.Certificate, id, member string, pub crypto.PublicKey) {
	t.Helper()
	if len(chain) != 2 {
		t.Fatalf("chain has %d certificates; want leaf and root", len(chain))
	}
	leaf := chain[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id || len(leaf.DNSNames) != 0 || len(leaf.EmailAddresses) != 0 || len(leaf.IPAddresses) != 0 {
		t.Errorf("leaf SANs: URIs %v DNS %v; want exactly %s", leaf.URIs, leaf.DNSNames, id)
	}
	if m, ok := trust.MemberOf(leaf); !ok || m != member {
		t.Errorf("leaf member binding %q (%v); want %s", m, ok, member)
	}
	if len(leaf.ExtKeyUsage) != 2 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth || leaf.ExtKeyUsage[1] != x509.ExtKeyUsageClientAuth {
		t.Errorf("leaf EKUs %v; want serverAuth, clientAuth", leaf.ExtKeyUsage)
	}
	if leaf.IsCA {
		t.Error("leaf is a CA")
	}
	if !chain[1].Equal(s.ca.Cert) {
		t.Errorf("last element is %q; want our root", chain[1].Subject)
	}
	if err := leaf.CheckSignatureFrom(chain[1]); err != nil {
		t.Errorf("leaf is not signed by the next element: %v", err)
	}
	if k, ok := pub.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(leaf.PublicKey) {
		t.Error("leaf does not carry the CSR's public key")
	}
}

func TestCreateCertificateWithToken(t *testing.T) {
	s := startCAHub(t)
	anon := s.anonymous()
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range map[string]crypto.Signer{"RSA-2048": rsaKey(), "ECDSA P-256": ecKey} {
		start := time.Now()
		resp, err := s.createCertificate(t, s.secure, caCall{creds: anon, token: "west-token-a-gw", cluster: "west", csr: newCSR(t, key), ttl: 1800})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		chain := parseChain(t, resp)
		// The CSR asked for kube-system/admin and a DNS name: the token's
		// identity is what is issued.
		checkWorkloadCert(t, s, chain, "spiffe://example.org/ns/a/sa/gw", "west", key.Public())
		if got := chain[0].NotAfter.Sub(start); got < 29*time.Minute || got > 31*time.Minute {
			t.Errorf("%s: leaf lives %s; want the 30m asked for", name, got)
		}
	}

	// No validity_duration: the 24h default, but never beyond the CA's
	// own certificate (it lives an hour here).
	resp, err := s.createCertificate(t, s.secure, caCall{creds: anon, token: "east-token-b-api", cluster: "east", csr: newCSR(t, ecKey)})
	if err != nil {
		t.Fatal(err)
	}
	chain := parseChain(t, resp)
	checkWorkloadCert(t, s, chain, "spiffe://example.org/ns/b/sa/api", "east", ecKey.Public())
	if !chain[0].NotAfter.Equal(s.ca.Cert.NotAfter) {
		t.Errorf("leaf expires %s; want the CA's own expiry %s", chain[0].NotAfter, s.ca.Cert.NotAfter)
	}

	// Visible: metrics and the read model.
	if n := counterValue(t, s, "hub_ca_certificates_issued_total", map[string]string{"member": "west", "namespace": "a"}); n != 2 {
		t.Errorf("hub_ca_certificates_issued_total{member=west,namespace=a} = %v; want 2", n)
	}
	st, ok := s.h.Certificates()
	if !ok || len(st.Groups) != 2 || st.MaxTTL != 2*time.Hour || st.DefaultTTL != 2*time.Hour {
		t.Fatalf("Certificates() = %+v, %v; want two groups, max and default 2h", st, ok)
	}
	west := st.Groups[1] // sorted: east, west
	if west.Member != "west" || west.Namespace != "a" || west.Issued != 2 || west.Valid != 1 || west.NextExpiry.IsZero() {
		t.Errorf("west group %+v; want 2 issued to 1 identity with a next expiry", west)
	}
}

func TestCreateCertificateRefusals(t *testing.T) {
	s := startCAHub(t)
	anon := s.anonymous()
	csr := newCSR(t, rsaKey())
	block, _ := pem.Decode([]byte(csr))
	forged := append([]byte(nil), block.Bytes...)
	forged[len(forged)-5] ^= 0xff // inside the signature
	badSig := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: forged}))
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	good := caCall{creds: anon, token: "west-token-a-gw", cluster: "west", csr: csr}
	with := func(change func(*caCall)) caCall { c := good; change(&c); return c }
	for _, tc := range []struct {
		name   string
		call   caCall
		code   codes.Code
		reason string
		says   string
	}{
		{"no credentials", with(func(c *caCall) { c.token = "" }), codes.Unauthenticated, "no_credentials", "service-account token"},
		{"token without ClusterID", with(func(c *caCall) { c.cluster = "" }), codes.Unauthenticated, "no_credentials", "ClusterID header is required"},
		{"rejected token", with(func(c *caCall) { c.token = "forged-token" }), codes.Unauthenticated, "token_rejected", "not accepted by member west"},
		{"west token claiming east", with(func(c *caCall) { c.cluster = "east" }), codes.Unauthenticated, "token_rejected", "not accepted by member east"},
		{"garbage CSR", with(func(c *caCall) { c.csr = "not a CSR" }), codes.InvalidArgument, "invalid_csr", "not a PEM CERTIFICATE REQUEST"},
		{"empty CSR", with(func(c *caCall) { c.csr = "" }), codes.InvalidArgument, "invalid_csr", "no CSR"},
		{"oversize CSR", with(func(c *caCall) { c.csr = strings.Repeat("A", 64<<10+1) }), codes.InvalidArgument, "invalid_csr", "at most"}, // the CA takes 64 KiB
		{"CSR PEM of garbage", with(func(c *caCall) {
			c.csr = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte("garbage")}))
		}), codes.InvalidArgument, "invalid_csr", "cannot be parsed"},
		{"bad CSR signature", with(func(c *caCall) { c.csr = badSig }), codes.InvalidArgument, "invalid_csr", "signature does not verify"},
		{"RSA-1024", with(func(c *caCall) { c.csr = newCSR(t, weak) }), codes.InvalidArgument, "invalid_csr", "1024 bits"},
		// Refused before its signature is checked (which would cost ~4 ms).
		{"RSA-8192", with(func(c *caCall) { c.csr = posingCSR(t, 8192, 65537) }), codes.InvalidArgument, "invalid_csr", "8192 bits; 2048 to 4096"},
		{"RSA exponent 2^31-1", with(func(c *caCall) { c.csr = posingCSR(t, 2048, 1<<31-1) }), codes.InvalidArgument, "invalid_csr", "public exponent 2147483647; only 65537"},
		{"Ed25519", with(func(c *caCall) { c.csr = newCSR(t, edKey) }), codes.InvalidArgument, "invalid_csr", "Ed25519 key is not accepted"},
		{"TTL above the maximum", with(func(c *caCall) { c.ttl = 3 * 3600 }), codes.InvalidArgument, "invalid_ttl", "above the maximum"},
	} {
		resp, err := s.createCertificate(t, s.secure, tc.call)
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.says) {
			t.Errorf("%s: got %v, %v; want %s saying %q", tc.name, resp, err, tc.code, tc.says)
		}
	}
	st, _ := s.h.Certificates()
	got := map[string]uint64{}
	for _, f := range st.Failures {
		got[f.Reason] = f.LastHour
	}
	want := map[string]uint64{"no_credentials": 2, "token_rejected": 2, "invalid_csr": 9, "invalid_ttl": 1}
	for _, r := range []string{"no_credentials", "token_rejected", "review_unavailable", "certificate_rejected", "cluster_mismatch", "not_member",
		"rate_limited", "overloaded", "member_not_synced", "hub_namespace", "root_namespace", "namespace_not_allowed", "invalid_csr", "invalid_ttl", "signing_failed"} {
		want[r] += 0 // every reason is reported, most with none
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("failures in the last hour %v; want %v", got, want)
	}
	if n := counterValue(t, s, "hub_ca_requests_failed_total", map[string]string{"reason": "invalid_csr"}); n != 9 {
		t.Errorf("hub_ca_requests_failed_total{reason=invalid_csr} = %v; want 9", n)
	}
	if len(st.Groups) != 0 {
		t.Errorf("groups %+v after refusals only", st.Groups)
	}

	// The log says who and why, never the token or the CSR.
	logs := s.logs.String()
	for _, secret := range []string{"west-token-a-gw", "forged-token", strings.Split(csr, "\n")[1]} {
		if strings.Contains(logs, secret) {
			t.Errorf("the hub's log contains %q", secret)
		}
	}
	if n := s.logs.count("workload certificate refused", map[string]string{"cluster": "east", "reason": "token_rejected"}); n != 1 {
		t.Errorf("%d log lines for the west token claiming east; want 1", n)
	}
	if n := s.logs.count("workload certificate refused", map[string]string{"cluster": "west", "reason": "invalid_ttl"}); n != 1 {
		t.Errorf("%d log lines for the TTL above the maximum; want 1", n)
	}
}

func TestCreateCertificateRenewsWithOurCertificate(t *testing.T) {
	s := startCAHub(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.createCertificate(t, s.secure, caCall{creds: s.anonymous(), token: "west-token-a-gw", cluster: "west", csr: newCSR(t, key)})
	if err != nil {
		t.Fatal(err)
	}
	ours := s.withCertificate(t, key, parseChain(t, resp))

	// Renewal: the certificate alone (agents send their ClusterID too).
	newKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, cluster := range []string{"", "west"} {
		resp, err = s.createCertificate(t, s.secure, caCall{creds: ours, cluster: cluster, csr: newCSR(t, newKey), ttl: 600})
		if err != nil {
			t.Fatalf("renewal with ClusterID %q: %v", cluster, err)
		}
		checkWorkloadCert(t, s, parseChain(t, resp), "spiffe://example.org/ns/a/sa/gw", "west", newKey.Public())
	}

	for _, tc := range []struct {
		name    string
		creds   credentials.TransportCredentials
		cluster string
		reason  string
	}{
		{"our west certificate claiming east", ours, "east", "cluster_mismatch"},
		{"a federated peer's certificate", s.workload(t, s.peerCA, "a", "west"), "west", "certificate_rejected"},
		{"our certificate without a member binding", s.workload(t, s.ca, "a", ""), "west", "certificate_rejected"},
	} {
		// A token too: the certificate decides, never the token.
		_, err := s.createCertificate(t, s.secure, caCall{creds: tc.creds, token: "west-token-a-gw", cluster: tc.cluster, csr: newCSR(t, newKey)})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v; want Unauthenticated", tc.name, err)
		}
		if n := s.logs.count("workload certificate refused", map[string]string{"reason": tc.reason}); n == 0 {
			t.Errorf("%s: no refusal logged with reason %s", tc.name, tc.reason)
		}
	}
}

// withCertificate is client TLS presenting the chain issued for key.
func (s *secureHub) withCertificate(t testing.TB, key crypto.Signer, issued []*x509.Certificate) credentials.TransportCredentials {
	t.Helper()
	cert := tls.Certificate{PrivateKey: key, Leaf: issued[0]}
	for _, c := range issued {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	cfg := tlsconfig.TLSClientConfig(s.bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(s.ca.TrustDomain, "/hub")))
	cfg.Certificates = []tls.Certificate{cert}
	return credentials.NewTLS(cfg)
}

// withIssued is client TLS presenting the certificate of resp, issued
// for rsaKey's CSR.
func (s *secureHub) withIssued(t *testing.T, resp *securityv1alpha1.IstioCertificateResponse) credentials.TransportCredentials {
	t.Helper()
	return s.withCertificate(t, rsaKey(), parseChain(t, resp))
}

func TestCreateCertificateIsNotServedInPlaintext(t *testing.T) {
	s := startCAHub(t)
	_, err := s.createCertificate(t, s.plain, caCall{creds: insecure.NewCredentials(), token: "west-token-a-gw", cluster: "west", csr: newCSR(t, rsaKey())})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("CreateCertificate on the plaintext port: %v; want Unimplemented (not served there)", err)
	}
}

// counterValue reads one counter of the hub's metrics by its labels.
func counterValue(t *testing.T, s *secureHub, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := s.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A renewal by certificate rotates the key but never extends the
// lifetime: whatever it asks for and however often it renews, the new
// certificate ends no later than the one presented.
func TestRenewalNeverOutlivesThePresentedCertificate(t *testing.T) {
	s := startCAHub(t)
	var key crypto.Signer = rsaKey()
	resp, err := s.createCertificate(t, s.secure, caCall{creds: s.anonymous(), token: "west-token-a-gw", cluster: "west", csr: newCSR(t, key), ttl: 120})
	if err != nil {
		t.Fatal(err)
	}
	first := parseChain(t, resp)
	presented := first
	for i := range 3 {
		newKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.createCertificate(t, s.secure, caCall{creds: s.withCertificate(t, key, presented), cluster: "west", csr: newCSR(t, newKey), ttl: 3600})
		if err != nil {
			t.Fatalf("renewal %d: %v", i+1, err)
		}
		renewed := parseChain(t, resp)
		checkWorkloadCert(t, s, renewed, "spiffe://example.org/ns/a/sa/gw", "west", newKey.Public())
		if renewed[0].NotAfter.After(first[0].NotAfter) {
			t.Fatalf("renewal %d ends %s, after the first certificate (%s)", i+1, renewed[0].NotAfter, first[0].NotAfter)
		}
		key, presented = newKey, renewed
	}
	// A token proves the account exists now: it gets the lifetime asked for.
	resp, err = s.createCertificate(t, s.secure, caCall{creds: s.anonymous(), token: "west-token-a-gw", cluster: "west", csr: newCSR(t, rsaKey()), ttl: 1800})
	if err != nil {
		t.Fatal(err)
	}
	if got := parseChain(t, resp)[0].NotAfter; !got.After(first[0].NotAfter) {
		t.Errorf("a token's certificate asking for 30 min ends %s, not after the first 2-min one (%s)", got, first[0].NotAfter)
	}
}
