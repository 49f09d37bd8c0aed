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
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

// TestBadInputs registers a working member, then applies Secrets full of
// malformed or unusable kubeconfigs. Each bad key gets its own precise state
// and message, no message carries credentials, and the working member keeps
// serving throughout.
func TestBadInputs(t *testing.T) {
	r, sink, ns := startRegistry(t, 4*time.Second)
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
	edit := func(old, repl string) []byte {
		if !strings.Contains(valid, old) {
			t.Fatalf("test kubeconfig lacks %q", old)
		}
		return []byte(strings.Replace(valid, old, repl, 1))
	}
	const secretToken = "tok-s3cr3t-value"
	user := func(stanza string) []byte {
		return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority-data: Y2E=}}]
users: [{name: u, user: %s}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, server, stanza))
	}
	wrongCA := edit("certificate-authority-data: ", "certificate-authority-data: "+encodeSelfSignedCA(t)+"\n    x-old: ")
	cases := []struct {
		id    string
		data  []byte
		state State
		msg   string // exact, or a prefix when it ends with "…"
		also  string // and, if set, this must appear too
	}{
		{"home", m1.Kubeconfig(), StateInvalid, `cluster ID "home" is the home cluster's own ID; key ignored`, ""},
		{"-lead", m1.Kubeconfig(), StateInvalid, `cluster ID "-lead" must match ^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`, ""},
		{"trail-", m1.Kubeconfig(), StateInvalid, `cluster ID "trail-" must match ^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`, ""},
		{strings.Repeat("x", 64), m1.Kubeconfig(), StateInvalid, fmt.Sprintf("cluster ID %q must be 1-63 characters", strings.Repeat("x", 64)), ""},
		{"empty", nil, StateInvalid, "kubeconfig is empty", ""},
		{"garbage", []byte("{{{not yaml"), StateInvalid, "kubeconfig does not parse: yaml: line 1: did not find expected ',' or '}'", ""},
		{"binary", []byte("\x00\xff\xfe\x01"), StateInvalid, "kubeconfig does not parse: yaml: control characters are not allowed", ""},
		{"pod", []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"), StateInvalid, `kubeconfig does not parse: no kind "Pod" is registered…`, ""},
		{"huge", append([]byte("# "), make([]byte, 300<<10)...), StateInvalid, "kubeconfig is 307202 bytes; at most 262144 are accepted", ""},
		{"no-context", edit("current-context: member1", ""), StateInvalid, "kubeconfig has no current-context", ""},
		{"dangling-context", edit("current-context: member1", "current-context: ghost"), StateInvalid, `kubeconfig current-context "ghost" is not defined in contexts`, ""},
		{"dangling-cluster", edit("cluster: member1", "cluster: nowhere"), StateInvalid, `kubeconfig context "member1" refers to undefined cluster "nowhere"`, ""},
		{"dangling-user", edit("user: admin", "user: nobody"), StateInvalid, `kubeconfig context "member1" refers to undefined user "nobody"`, ""},
		{"empty-server", edit("server: "+server, "server: \"\""), StateInvalid, `kubeconfig cluster "member1" has an empty server`, ""},
		{"http-server", edit("server: "+server, "server: "+strings.Replace(server, "https", "http", 1)), StateInvalid, `kubeconfig cluster "member1": server must be an https:// URL with a host and no user info`, ""},
		{"ca-file", edit("certificate-authority-data: ", "certificate-authority: /etc/ca.crt\n    x-old: "), StateInvalid, `kubeconfig cluster "member1": certificate-authority file references are not allowed (use certificate-authority-data)`, ""},
		{"exec", user("{exec: {command: /bin/sh, args: [-c, 'cat /etc/shadow'], apiVersion: client.authentication.k8s.io/v1}}"), StateInvalid, `kubeconfig user "u": exec credential plugins are not allowed`, ""},
		{"gcp", user("{auth-provider: {name: gcp}}"), StateInvalid, `kubeconfig user "u": auth-provider "gcp" is not allowed (only oidc)`, ""},
		{"token-file", user("{tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}"), StateInvalid, `kubeconfig user "u": tokenFile references are not allowed (use token)`, ""},
		{"cert-file", user("{client-certificate: /etc/hub/tls.crt, client-key-data: a2V5}"), StateInvalid, `kubeconfig user "u": client-certificate file references are not allowed (use client-certificate-data)`, ""},
		{"key-file", user("{client-certificate-data: Y2VydA==, client-key: /etc/hub/tls.key}"), StateInvalid, `kubeconfig user "u": client-key file references are not allowed (use client-key-data)`, ""},
		{"bad-token", m1.TokenKubeconfig(secretToken), StateTimedOut, "not synced within 4s; still trying (no longer blocks readiness): cannot list or watch: GET " + strings.TrimPrefix(server, "https://") + "/api/v1/…", "401 Unauthorized"},
		{"wrong-ca", wrongCA, StateTimedOut, "not synced within 4s; still trying (no longer blocks readiness): cannot list or watch: GET " + strings.TrimPrefix(server, "https://") + ": tls: failed to verify certificate: x509: certificate signed by unknown authority…", ""},
		{"refused", edit(server, "https://127.0.0.1:1"), StateTimedOut, "not synced within 4s; still trying (no longer blocks readiness): cannot list or watch: GET 127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused", ""},
		{"good", m1.Kubeconfig(), StateConflict, `cluster ID "good" is already registered by secret ` + ns + "/good", ""},
	}
	if len(cases) < 20 {
		t.Fatalf("only %d cases", len(cases))
	}
	// The contested ID below must be owned by the older Secret; creation
	// timestamps have one-second resolution (ties go to the lower name).
	time.Sleep(1100 * time.Millisecond)
	data := map[string][]byte{}
	for _, c := range cases {
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
				if strings.Contains(st.Message, secretToken) || strings.Contains(st.Message, "BEGIN") {
					return fmt.Errorf("message leaks credentials: %q", st.Message)
				}
				return nil
			})
		})
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
