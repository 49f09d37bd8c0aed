package clusters

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	rand2 "crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

// TestBadInputs registers a working member, then applies Secrets full of
// malformed, unusable or hostile kubeconfigs. Each bad key gets its own
// precise state and message, no message carries credentials, and the
// working member keeps serving throughout.
func TestBadInputs(t *testing.T) {
	policy := KubeconfigPolicy{
		ServerCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("169.254.0.0/16")},
		DenyCIDRs:   append(slices.Clone(DefaultDenyCIDRs), netip.MustParsePrefix("192.0.2.0/24")),
	}
	r, sink, ns := startRegistryWithPolicy(t, 4*time.Second, policy)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	secrets := kube(t, env.Cluster("home")).CoreV1().Secrets(ns)
	appNS := "app-" + rand.String(6)
	key := seedMember(t, m1, appNS, "198.18.5.1")
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "good", map[string][]byte{"good": m1.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, wantState(r, "good", ns+"/good", StateReady, ""))
	eventually(t, 10*time.Second, wantEndpoint(sink, "good", key, "198.18.5.1"))

	valid := string(m1.Kubeconfig())
	server := m1.Server()
	hostport := strings.TrimPrefix(server, "https://")
	rc := m1.RESTConfig()
	ca := base64.StdEncoding.EncodeToString(rc.CAData)
	certData := base64.StdEncoding.EncodeToString(rc.CertData)
	keyData := base64.StdEncoding.EncodeToString(rc.KeyData)
	edit := func(old, repl string) []byte {
		if !strings.Contains(valid, old) {
			t.Fatalf("test kubeconfig lacks %q", old)
		}
		return []byte(strings.Replace(valid, old, repl, 1))
	}
	const secretToken = "tok-s3cr3t-value"
	// doc assembles a kubeconfig from flow-style lists.
	doc := func(clusters, users, contexts, current string) []byte {
		return []byte("apiVersion: v1\nkind: Config\nclusters: " + clusters + "\nusers: " + users + "\ncontexts: " + contexts + "\ncurrent-context: " + current + "\n")
	}
	goodCluster := fmt.Sprintf("{name: c, cluster: {server: %q, certificate-authority-data: %s}}", server, ca)
	clusterAt := func(srv string) string {
		return fmt.Sprintf("[{name: c, cluster: {server: %q, certificate-authority-data: %s}}]", srv, ca)
	}
	goodUser := fmt.Sprintf("{name: u, user: {client-certificate-data: %s, client-key-data: %s}}", certData, keyData)
	ctxCU := "[{name: x, context: {cluster: c, user: u}}]"
	ctxNoUser := "[{name: x, context: {cluster: c}}]"
	user := func(stanza string) []byte {
		return doc("["+goodCluster+"]", "[{name: u, user: "+stanza+"}]", ctxCU, "x")
	}
	// emptyUser is the reproduced attack: the context names no user and
	// users[""] is what client-go resolves.
	emptyUser := func(stanza string) []byte {
		return doc("["+goodCluster+"]", "[{name: '', user: "+stanza+"}]", ctxNoUser, "x")
	}
	// spareUser adds an entry no context refers to.
	spareUser := func(stanza string) []byte {
		return doc("["+goodCluster+"]", "["+goodUser+", {name: spare, user: "+stanza+"}]", ctxCU, "x")
	}
	const execStanza = "{exec: {command: /bin/sh, args: [-c, 'touch /tmp/pwned'], apiVersion: client.authentication.k8s.io/v1}}"
	const oidcStanza = "{auth-provider: {name: oidc, config: {idp-issuer-url: 'http://127.0.0.1:1', client-id: x, id-token: " + secretToken + "}}}"
	const tokenFileStanza = "{tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}"
	wrongCA := edit("certificate-authority-data: ", "certificate-authority-data: "+encodeSelfSignedCA(t)+"\n    x-old: ")
	otherKey := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecKeyDER(t)}))
	redirect := redirectingServer(t)
	longName := strings.Repeat("n", 1000)
	const timedOut = "not synced within 4s; still trying (no longer blocks readiness): cannot list or watch: "
	cases := []struct {
		id    string
		data  []byte
		state State
		msg   string // exact, or a prefix when it ends with "…"
		also  string // and, if set, this must appear too
		warn  string // and, if set, the status carries this warning
	}{
		{"home", m1.Kubeconfig(), StateInvalid, `cluster ID "home" is the home cluster's own ID; key ignored`, "", ""},
		{"-lead", m1.Kubeconfig(), StateInvalid, `cluster ID "-lead" must match ^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`, "", ""},
		{"trail-", m1.Kubeconfig(), StateInvalid, `cluster ID "trail-" must match ^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`, "", ""},
		{strings.Repeat("x", 64), m1.Kubeconfig(), StateInvalid, fmt.Sprintf("cluster ID %q must be 1-63 characters", strings.Repeat("x", 64)), "", ""},
		// Reachability first: they are checked within seconds of the timeout,
		// before the health probe (every 10 s) reports its own view.
		{"anonymous", doc("["+goodCluster+"]", "[]", ctxNoUser, "x"), StateTimedOut, timedOut + "GET " + hostport + "/…", "403 Forbidden", ""},
		{"bad-token", m1.TokenKubeconfig(secretToken), StateTimedOut, timedOut + "GET " + hostport + "/api/v1/…", "401 Unauthorized", ""},
		{"wrong-ca", wrongCA, StateTimedOut, timedOut + "GET " + hostport + ": tls: failed to verify certificate: x509: certificate signed by unknown authority…", "", ""},
		{"refused", edit(server, "https://127.0.0.1:1"), StateTimedOut, timedOut + "GET 127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused", "", ""},
		{"redirect", doc(fmt.Sprintf("[{name: c, cluster: {server: %q, certificate-authority-data: %s}}]", redirect.from.URL, redirect.ca), "["+goodUser+"]", ctxCU, "x"), StateTimedOut,
			timedOut + "GET " + strings.TrimPrefix(redirect.from.URL, "https://") + ": member API server answered 307 Temporary Redirect, a redirect to " + strconv.Quote(strings.TrimPrefix(redirect.to.URL, "https://")) + "; redirects are not followed", "", ""},
		{"empty", nil, StateInvalid, "kubeconfig is empty", "", ""},
		{"garbage", []byte("{{{not yaml"), StateInvalid, "kubeconfig does not parse: yaml: line 1: did not find expected ',' or '}'", "", ""},
		{"binary", []byte("\x00\xff\xfe\x01"), StateInvalid, "kubeconfig does not parse: yaml: control characters are not allowed", "", ""},
		{"pod", []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"), StateInvalid, `kubeconfig does not parse: no kind "Pod" is registered…`, "", ""},
		{"huge", append([]byte("# "), make([]byte, 300<<10)...), StateInvalid, "kubeconfig is 307202 bytes; at most 262144 are accepted", "", ""},
		{"no-context", edit("current-context: member1", ""), StateInvalid, "kubeconfig has no current-context", "", ""},
		{"dangling-context", edit("current-context: member1", "current-context: ghost"), StateInvalid, `kubeconfig current-context "ghost" is not defined in contexts`, "", ""},
		{"dangling-cluster", edit("cluster: member1", "cluster: nowhere"), StateInvalid, `kubeconfig context "member1" refers to undefined cluster "nowhere"`, "", ""},
		{"dangling-user", edit("user: admin", "user: nobody"), StateInvalid, `kubeconfig context "member1" refers to undefined user "nobody"`, "", ""},
		{"empty-server", edit("server: "+server, "server: \"\""), StateInvalid, `kubeconfig cluster "member1" has an empty server`, "", ""},
		{"http-server", edit("server: "+server, "server: "+strings.Replace(server, "https", "http", 1)), StateInvalid, `kubeconfig cluster "member1": server must be an https:// URL with a host and no user info`, "", ""},
		{"userinfo-server", doc(clusterAt("https://admin:"+secretToken+"@"+hostport), "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": server must be an https:// URL with a host and no user info`, "", ""},
		{"query-server", doc(clusterAt(server+"/?token="+secretToken), "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": server must not have a query or fragment`, "", ""},
		{"port-server", doc(clusterAt("https://127.0.0.1:99999"), "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": server port must be 1-65535`, "", ""},
		{"ca-file", edit("certificate-authority-data: ", "certificate-authority: /etc/ca.crt\n    x-old: "), StateInvalid, `kubeconfig cluster "member1": certificate-authority file references are not allowed (use certificate-authority-data)`, "", ""},
		{"bad-ca", doc("[{name: c, cluster: {server: '"+server+"', certificate-authority-data: Y2E=}}]", "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": certificate-authority-data holds no PEM certificate`, "", ""},
		{"insecure-and-ca", doc("[{name: c, cluster: {server: '"+server+"', certificate-authority-data: "+ca+", insecure-skip-tls-verify: true}}]", "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": insecure-skip-tls-verify and a certificate authority are both set`, "", ""},
		{"exec", user(execStanza), StateInvalid, `kubeconfig user "u": exec credential plugins are not allowed`, "", ""},
		{"gcp", user("{auth-provider: {name: gcp}}"), StateInvalid, `kubeconfig user "u": auth-provider "gcp" is not allowed (--kubeconfig-allow=auth-provider)`, "", ""},
		{"oidc", user(oidcStanza), StateInvalid, `kubeconfig user "u": auth-provider "oidc" is not allowed (--kubeconfig-allow=auth-provider)`, "", ""},
		{"token-file", user(tokenFileStanza), StateInvalid, `kubeconfig user "u": tokenFile references are not allowed (use token)`, "", ""},
		{"token-and-file", user("{token: " + secretToken + ", tokenFile: /etc/hostname}"), StateInvalid, `kubeconfig user "u": tokenFile references are not allowed (use token)`, "", ""},
		{"cert-file", user("{client-certificate: /etc/hub/tls.crt, client-key-data: a2V5}"), StateInvalid, `kubeconfig user "u": client-certificate file references are not allowed (use client-certificate-data)`, "", ""},
		{"key-file", user("{client-certificate-data: Y2VydA==, client-key: /etc/hub/tls.key}"), StateInvalid, `kubeconfig user "u": client-key file references are not allowed (use client-key-data)`, "", ""},
		{"cert-no-key", user("{client-certificate-data: " + certData + "}"), StateInvalid, `kubeconfig user "u": a client certificate needs client-key-data`, "", ""},
		{"key-no-cert", user("{client-key-data: " + keyData + "}"), StateInvalid, `kubeconfig user "u": client-key-data needs client-certificate-data`, "", ""},
		{"bad-pair", user("{client-certificate-data: " + certData + ", client-key-data: " + otherKey + "}"), StateInvalid, `kubeconfig user "u": client-certificate-data and client-key-data are not a usable pair: tls: private key does not match public key`, "", ""},
		{"token-and-basic", user("{token: " + secretToken + ", username: admin, password: " + secretToken + "}"), StateInvalid, `kubeconfig user "u": token and username/password are both set; only one authentication method is allowed`, "", ""},
		{"impersonate-partial", user("{token: " + secretToken + ", as-groups: [system:masters]}"), StateInvalid, `kubeconfig user "u": as-uid, as-groups or as-user-extra without as (the user to impersonate)`, "", ""},
		// The reproduced attack and its variants: an empty user name that
		// the context does not name but client-go resolves.
		{"nouser-token-file", emptyUser(tokenFileStanza), StateInvalid, `kubeconfig user "": tokenFile references are not allowed (use token)`, "", ""},
		{"nouser-exec", emptyUser(execStanza), StateInvalid, `kubeconfig user "": exec credential plugins are not allowed`, "", ""},
		{"nouser-oidc", emptyUser(oidcStanza), StateInvalid, `kubeconfig user "": auth-provider "oidc" is not allowed (--kubeconfig-allow=auth-provider)`, "", ""},
		{"nouser-cert-file", emptyUser("{client-certificate: /etc/hub/tls.crt, client-key: /etc/hub/tls.key}"), StateInvalid, `kubeconfig user "": client-certificate file references are not allowed (use client-certificate-data)`, "", ""},
		{"emptycluster-ca-file", doc("[{name: '', cluster: {server: '"+server+"', certificate-authority: /etc/ca.crt}}]", "["+goodUser+"]", "[{name: x, context: {user: u}}]", "x"), StateInvalid, `kubeconfig cluster "": certificate-authority file references are not allowed (use certificate-authority-data)`, "", ""},
		{"emptycluster-proxy", doc("[{name: '', cluster: {server: '"+server+"', proxy-url: 'http://127.0.0.1:3128'}}, "+goodCluster+"]", "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "": proxy-url is not allowed (the hub connects to member API servers directly unless --kubeconfig-allow=proxy-url)`, "", ""},
		{"empty-context-name", doc("["+goodCluster+"]", "["+goodUser+"]", "[{name: '', context: {cluster: c, user: u}}]", "''"), StateInvalid, "kubeconfig has no current-context", "", ""},
		{"current-names-empty", doc("["+goodCluster+"]", "["+goodUser+"]", ctxCU, "''"), StateInvalid, "kubeconfig has no current-context", "", ""},
		{"context-without-cluster", doc("["+goodCluster+"]", "["+goodUser+"]", "[{name: x, context: {user: u}}]", "x"), StateInvalid, `kubeconfig context "x" refers to undefined cluster ""`, "", ""},
		{"spare-token-file", spareUser(tokenFileStanza), StateInvalid, `kubeconfig user "spare": tokenFile references are not allowed (use token)`, "", ""},
		{"spare-exec", spareUser(execStanza), StateInvalid, `kubeconfig user "spare": exec credential plugins are not allowed`, "", ""},
		{"spare-oidc", spareUser(oidcStanza), StateInvalid, `kubeconfig user "spare": auth-provider "oidc" is not allowed (--kubeconfig-allow=auth-provider)`, "", ""},
		{"spare-ca-file", doc("["+goodCluster+", {name: spare, cluster: {server: 'https://x', certificate-authority: /etc/ca.crt}}]", "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "spare": certificate-authority file references are not allowed (use certificate-authority-data)`, "", ""},
		{"proxy-url", doc("[{name: c, cluster: {server: '"+server+"', certificate-authority-data: "+ca+", proxy-url: 'http://u:"+secretToken+"@127.0.0.1:3128'}}]", "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": proxy-url is not allowed (the hub connects to member API servers directly unless --kubeconfig-allow=proxy-url)`, "", ""},
		{"link-local", doc(clusterAt("https://169.254.169.254"), "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": server address 169.254.169.254 is in the denied range 169.254.0.0/16 (--member-server-deny-cidrs)`, "", ""},
		{"link-local-v6", doc(clusterAt("https://[fe80::1%25eth0]:443"), "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": server address fe80::1 is in the denied range fe80::/10 (--member-server-deny-cidrs)`, "", ""},
		{"mapped-link-local", doc(clusterAt("https://[::ffff:169.254.169.254]"), "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": server address 169.254.169.254 is in the denied range 169.254.0.0/16 (--member-server-deny-cidrs)`, "", ""},
		{"unspecified", doc(clusterAt("https://0.0.0.0:6443"), "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": server address 0.0.0.0 is unspecified`, "", ""},
		{"unspecified-v6", doc(clusterAt("https://[::]:6443"), "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": server address :: is unspecified`, "", ""},
		{"deny-listed", doc(clusterAt("https://192.0.2.10"), "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": server address 192.0.2.10 is in the denied range 192.0.2.0/24 (--member-server-deny-cidrs)`, "", ""},
		{"not-allowed", doc(clusterAt("https://10.20.30.40"), "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig cluster "c": server address 10.20.30.40 is not in an allowed range (--member-server-cidrs 127.0.0.0/8,192.0.2.0/24,169.254.0.0/16)`, "", ""},
		{"dup-users", doc("["+goodCluster+"]", "["+goodUser+", {name: u, user: {token: "+secretToken+"}}]", ctxCU, "x"), StateInvalid, `kubeconfig users has more than one entry named "u"`, "", ""},
		{"dup-clusters", doc("["+goodCluster+", "+goodCluster+"]", "["+goodUser+"]", ctxCU, "x"), StateInvalid, `kubeconfig clusters has more than one entry named "c"`, "", ""},
		{"dup-contexts", doc("["+goodCluster+"]", "["+goodUser+"]", "[{name: x, context: {cluster: c, user: u}}, {name: x, context: {cluster: c}}]", "x"), StateInvalid, `kubeconfig contexts has more than one entry named "x"`, "", ""},
		{"long-name", doc("["+goodCluster+"]", "["+goodUser+"]", ctxCU, longName), StateInvalid, `kubeconfig current-context "` + longName[:64] + `"… is not defined in contexts`, "", ""},
		// Accepted shapes, resolved exactly as client-go resolves them.
		{"nouser-inline", emptyUser(fmt.Sprintf("{client-certificate-data: %s, client-key-data: %s}", certData, keyData)), StateReady, "", "", ""},
		{"emptycluster-inline", doc(fmt.Sprintf("[{name: '', cluster: {server: %q, certificate-authority-data: %s}}]", server, ca), "["+goodUser+"]", "[{name: x, context: {user: u}}]", "x"), StateReady, "", "", ""},
		{"insecure", doc(fmt.Sprintf("[{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]", server), "["+goodUser+"]", ctxCU, "x"), StateReady, "", "",
			`cluster "c" sets insecure-skip-tls-verify: the member's API server certificate is not verified`},
		{"good", m1.Kubeconfig(), StateConflict, `cluster ID "good" is already registered by secret ` + ns + "/good", "", ""},
	}
	if len(cases) < 60 {
		t.Fatalf("only %d cases", len(cases))
	}
	// The contested ID below must be owned by the older Secret; creation
	// timestamps have one-second resolution (ties go to the lower name).
	time.Sleep(1100 * time.Millisecond)
	data := map[string][]byte{}
	for _, c := range cases {
		if _, dup := data[c.id]; dup {
			t.Fatalf("case %s twice", c.id)
		}
		data[c.id] = c.data
	}
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "bad", data), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.id, func(t *testing.T) {
			eventually(t, 30*time.Second, func() error {
				st, ok := statusOf(r, c.id, ns+"/bad")
				if !ok {
					return fmt.Errorf("not listed")
				}
				if st.State != c.state {
					return fmt.Errorf("state %s (%s); want %s", st.State, st.Message, c.state)
				}
				if prefix, ok := strings.CutSuffix(c.msg, "…"); ok && !strings.HasPrefix(st.Message, prefix) || !ok && st.Message != c.msg {
					return fmt.Errorf("message\n  %q\nwant\n  %q", st.Message, c.msg)
				}
				if !strings.Contains(st.Message, c.also) {
					return fmt.Errorf("message %q lacks %q", st.Message, c.also)
				}
				if c.warn != "" && !slices.Contains(st.Warnings, c.warn) || c.warn == "" && len(st.Warnings) > 0 {
					return fmt.Errorf("warnings %q; want %q", st.Warnings, c.warn)
				}
				for _, s := range append([]string{st.Message}, st.Warnings...) {
					if strings.Contains(s, secretToken) || strings.Contains(s, "BEGIN") || strings.Contains(s, keyData[:40]) {
						return fmt.Errorf("status leaks credentials: %q", s)
					}
				}
				return nil
			})
		})
	}
	if n := redirect.followed.Load(); n != 0 {
		t.Errorf("the redirect target was contacted %d times", n)
	}
	if redirect.redirected.Load() == 0 {
		t.Error("the redirecting server was never asked")
	}

	// The good member never noticed.
	if err := wantState(r, "good", ns+"/good", StateReady, "")(); err != nil {
		t.Error(err)
	}
	if err := wantEndpoint(sink, "good", key, "198.18.5.1")(); err != nil {
		t.Error(err)
	}
	if sink.removedCount("good") != 0 || sink.emptied("good") {
		t.Error("bad input disturbed the good member")
	}
	if ok, reason := r.Ready(); !ok {
		t.Errorf("bad input made the hub unready: %s", reason)
	}
}

// startRegistryWithPolicy is startRegistry with a kubeconfig policy.
func startRegistryWithPolicy(t *testing.T, timeout time.Duration, policy KubeconfigPolicy) (*Registry, *recordingSink, string) {
	t.Helper()
	sink := newRecordingSink()
	r, ns := startRegistryWith(t, func(c *Config) { c.SyncTimeout, c.Sink, c.Policy = timeout, sink, policy })
	return r, sink, ns
}

// redirector is a TLS server that answers every request with a 307 to a
// second TLS server, which counts what reaches it.
type redirector struct {
	from, to             *httptest.Server
	ca                   string // base64 PEM of from's certificate
	redirected, followed atomic.Int64
}

func redirectingServer(t *testing.T) *redirector {
	t.Helper()
	r := &redirector{}
	r.to = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r.followed.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(r.to.Close)
	r.from = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.redirected.Add(1)
		http.Redirect(w, req, r.to.URL+req.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	t.Cleanup(r.from.Close)
	r.ca = base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.from.Certificate().Raw}))
	return r
}

// ecKeyDER is a fresh EC private key, DER-encoded.
func ecKeyDER(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand2.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// encodeSelfSignedCA returns a base64 PEM of a CA that signed nothing the
// local clusters use.
func encodeSelfSignedCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand2.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other-ca"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand2.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
