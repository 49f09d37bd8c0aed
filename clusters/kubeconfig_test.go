package clusters

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// testPKI is a CA and a client certificate signed by it, base64-encoded PEM
// as kubeconfigs carry them.
type testPKI struct{ ca, cert, key string }

var (
	pkiOnce sync.Once
	pki     testPKI
)

func testCerts(tb testing.TB) testPKI {
	tb.Helper()
	pkiOnce.Do(func() {
		caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
		caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "client"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		der, _ := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
		keyDER, _ := x509.MarshalECPrivateKey(key)
		b64 := func(typ string, der []byte) string {
			return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
		}
		pki = testPKI{ca: b64("CERTIFICATE", caDER), cert: b64("CERTIFICATE", der), key: b64("EC PRIVATE KEY", keyDER)}
	})
	return pki
}

const goodKubeconfigTmpl = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://10.1.2.3:6443
    certificate-authority-data: CA
users:
- name: u
  user:
    token: s3cr3t-token-value
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
`

func goodKubeconfig(tb testing.TB) string {
	return strings.Replace(goodKubeconfigTmpl, "CA", testCerts(tb).ca, 1)
}

// withUser swaps the user stanza of goodKubeconfig.
func withUser(tb testing.TB, user string) string {
	return strings.Replace(goodKubeconfig(tb), "    token: s3cr3t-token-value\n", user, 1)
}

func TestParseKubeconfig(t *testing.T) {
	p := testCerts(t)
	good := goodKubeconfig(t)
	tests := []struct {
		name    string
		policy  KubeconfigPolicy
		data    string
		wantErr string // empty: valid
	}{
		{"valid token", KubeconfigPolicy{}, good, ""},
		{"valid client cert", KubeconfigPolicy{}, withUser(t, "    client-certificate-data: "+p.cert+"\n    client-key-data: "+p.key+"\n"), ""},
		{"valid basic auth", KubeconfigPolicy{}, withUser(t, "    username: admin\n    password: s3cr3t-pw\n"), ""},
		{"oidc allowed", KubeconfigPolicy{AuthProvider: true}, withUser(t, "    auth-provider: {name: oidc, config: {client-id: x}}\n"), ""},
		{"oidc", KubeconfigPolicy{}, withUser(t, "    auth-provider: {name: oidc, config: {client-id: x}}\n"), `kubeconfig user "u": auth-provider "oidc" is not allowed (--kubeconfig-allow=auth-provider)`},
		{"empty", KubeconfigPolicy{}, "", "kubeconfig is empty"},
		{"garbage", KubeconfigPolicy{}, "{{{not yaml", "kubeconfig does not parse"},
		{"no current context", KubeconfigPolicy{}, strings.Replace(good, "current-context: ctx", "", 1), "no current-context"},
		{"unknown current context", KubeconfigPolicy{}, strings.Replace(good, "current-context: ctx", "current-context: nope", 1), `current-context "nope" is not defined`},
		{"undefined cluster", KubeconfigPolicy{}, strings.Replace(good, "{cluster: c,", "{cluster: other,", 1), `undefined cluster "other"`},
		{"undefined user", KubeconfigPolicy{}, strings.Replace(good, "user: u}", "user: ghost}", 1), `undefined user "ghost"`},
		{"empty server", KubeconfigPolicy{}, strings.Replace(good, "server: https://10.1.2.3:6443", "server: \"\"", 1), "empty server"},
		{"ca file", KubeconfigPolicy{}, strings.Replace(good, "certificate-authority-data: "+p.ca, "certificate-authority: /etc/ca.crt", 1), "certificate-authority file references are not allowed"},
		{"bad ca", KubeconfigPolicy{}, strings.Replace(good, p.ca, "Y2E=", 1), "certificate-authority-data holds no PEM certificate"},
		{"exec", KubeconfigPolicy{}, withUser(t, "    exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}\n"), "exec credential plugins are not allowed"},
		{"gcp auth provider", KubeconfigPolicy{}, withUser(t, "    auth-provider: {name: gcp}\n"), `auth-provider "gcp" is not allowed`},
		{"token file", KubeconfigPolicy{}, withUser(t, "    tokenFile: /var/run/secrets/token\n"), "tokenFile references are not allowed"},
		{"client cert file", KubeconfigPolicy{}, withUser(t, "    client-certificate: /etc/c.crt\n    client-key-data: a2V5\n"), "client-certificate file references are not allowed"},
		{"client key file", KubeconfigPolicy{}, withUser(t, "    client-certificate-data: Y2VydA==\n    client-key: /etc/c.key\n"), "client-key file references are not allowed"},
		{"cert without key", KubeconfigPolicy{}, withUser(t, "    client-certificate-data: "+p.cert+"\n"), `kubeconfig user "u": a client certificate needs client-key-data`},
		{"mismatched pair", KubeconfigPolicy{}, withUser(t, "    client-certificate-data: "+p.ca+"\n    client-key-data: "+p.key+"\n"), `kubeconfig user "u": client-certificate-data and client-key-data are not a usable pair`},
		{"link-local", KubeconfigPolicy{}, strings.Replace(good, "10.1.2.3", "169.254.169.254", 1), `kubeconfig cluster "c": server address 169.254.169.254 is in the denied range 169.254.0.0/16 (--member-server-deny-cidrs)`},
		{"mapped link-local", KubeconfigPolicy{}, strings.Replace(good, "10.1.2.3", "[::ffff:169.254.169.254]", 1), `kubeconfig cluster "c": server address 169.254.169.254 is in the denied range 169.254.0.0/16 (--member-server-deny-cidrs)`},
		{"unspecified", KubeconfigPolicy{}, strings.Replace(good, "10.1.2.3", "[::]", 1), `kubeconfig cluster "c": server address :: is unspecified`},
		{"outside allow list", KubeconfigPolicy{ServerCIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}}, good, `kubeconfig cluster "c": server address 10.1.2.3 is not in an allowed range (--member-server-cidrs 192.168.0.0/16)`},
		{"deny list", KubeconfigPolicy{DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, good, `kubeconfig cluster "c": server address 10.1.2.3 is in the denied range 10.0.0.0/8 (--member-server-deny-cidrs)`},
		{"empty deny list allows link-local", KubeconfigPolicy{DenyCIDRs: []netip.Prefix{}}, strings.Replace(good, "10.1.2.3", "169.254.169.254", 1), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kc, err := tt.policy.ParseKubeconfig([]byte(tt.data))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if kc.Config.Host != kc.Server || !strings.HasPrefix(kc.Server, "https://") {
					t.Errorf("server = %q, host = %q", kc.Server, kc.Config.Host)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v; want it to contain %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error leaks the token: %v", err)
			}
		})
	}
}

func TestParseKubeconfigBuildsConfigFromResolvedFields(t *testing.T) {
	p := testCerts(t)
	// The context names no user: client-go resolves users[""].
	data := `apiVersion: v1
kind: Config
clusters:
- name: ""
  cluster: {server: "https://h.example:6443/prefix", certificate-authority-data: ` + p.ca + `, tls-server-name: api.example}
- name: unused
  cluster: {server: "http://ignored"}
users:
- name: ""
  user: {token: s3cr3t, as: alice, as-groups: [g]}
- name: other
  user: {username: bob, password: pw}
contexts:
- name: x
  context: {}
current-context: x
`
	kc, err := ParseKubeconfig([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	c := kc.Config
	if c.Host != "https://h.example:6443/prefix" || c.ServerName != "api.example" || c.BearerToken != "s3cr3t" ||
		c.Username != "" || c.Impersonate.UserName != "alice" || len(c.Impersonate.Groups) != 1 || len(c.CAData) == 0 {
		t.Errorf("config = %+v", c)
	}
	insecure := strings.Replace(data, "certificate-authority-data: "+p.ca, "insecure-skip-tls-verify: true", 1)
	kc, err = ParseKubeconfig([]byte(insecure))
	if err != nil {
		t.Fatal(err)
	}
	if !kc.Config.Insecure || len(kc.Warnings) != 1 || !strings.Contains(kc.Warnings[0], `cluster "" sets insecure-skip-tls-verify`) {
		t.Errorf("insecure: %v, warnings %q", kc.Config.Insecure, kc.Warnings)
	}
}

func TestParseKubeconfigHashIdentifiesBytes(t *testing.T) {
	good := goodKubeconfig(t)
	a, err := ParseKubeconfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ParseKubeconfig([]byte(good))
	c, _ := ParseKubeconfig([]byte(strings.Replace(good, "s3cr3t-token-value", "rotated", 1)))
	if a.SHA256 != b.SHA256 || a.SHA256 == c.SHA256 {
		t.Errorf("sha256 must be equal for equal bytes and differ for rotated credentials")
	}
}

func TestValidateClusterID(t *testing.T) {
	for _, id := range []string{"a", "west", "us-east-1", "c_1.prod", strings.Repeat("x", 63)} {
		if err := ValidateClusterID(id); err != nil {
			t.Errorf("%q: %v", id, err)
		}
	}
	for _, id := range []string{"", "-a", "a-", "a b", "a/b", strings.Repeat("x", 64), "é"} {
		if err := ValidateClusterID(id); err == nil {
			t.Errorf("%q accepted", id)
		}
	}
}
