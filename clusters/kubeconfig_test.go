package clusters

import (
	"strings"
	"testing"
)

const goodKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://10.1.2.3:6443
    certificate-authority-data: Y2E=
users:
- name: u
  user:
    token: s3cr3t-token-value
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
`

// withUser swaps the user stanza of goodKubeconfig.
func withUser(user string) string {
	return strings.Replace(goodKubeconfig, "    token: s3cr3t-token-value\n", user, 1)
}

func TestParseKubeconfig(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		wantErr string // empty: valid
	}{
		{"valid token", goodKubeconfig, ""},
		{"valid oidc", withUser("    auth-provider: {name: oidc, config: {client-id: x}}\n"), ""},
		{"empty", "", "kubeconfig is empty"},
		{"garbage", "{{{not yaml", "kubeconfig does not parse"},
		{"no current context", strings.Replace(goodKubeconfig, "current-context: ctx", "", 1), "no current-context"},
		{"unknown current context", strings.Replace(goodKubeconfig, "current-context: ctx", "current-context: nope", 1), `current-context "nope" is not defined`},
		{"undefined cluster", strings.Replace(goodKubeconfig, "{cluster: c,", "{cluster: other,", 1), `undefined cluster "other"`},
		{"undefined user", strings.Replace(goodKubeconfig, "user: u}", "user: ghost}", 1), `undefined user "ghost"`},
		{"empty server", strings.Replace(goodKubeconfig, "server: https://10.1.2.3:6443", "server: \"\"", 1), "empty server"},
		{"ca file", strings.Replace(goodKubeconfig, "certificate-authority-data: Y2E=", "certificate-authority: /etc/ca.crt", 1), "certificate-authority file references are not allowed"},
		{"exec", withUser("    exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}\n"), "exec credential plugins are not allowed"},
		{"gcp auth provider", withUser("    auth-provider: {name: gcp}\n"), `auth-provider "gcp" is not allowed`},
		{"token file", withUser("    tokenFile: /var/run/secrets/token\n"), "tokenFile references are not allowed"},
		{"client cert file", withUser("    client-certificate: /etc/c.crt\n    client-key-data: a2V5\n"), "client-certificate file references are not allowed"},
		{"client key file", withUser("    client-certificate-data: Y2VydA==\n    client-key: /etc/c.key\n"), "client-key file references are not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kc, err := ParseKubeconfig([]byte(tt.data))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if kc.Server != "https://10.1.2.3:6443" || kc.Config.Host != kc.Server {
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

func TestParseKubeconfigHashIdentifiesBytes(t *testing.T) {
	a, err := ParseKubeconfig([]byte(goodKubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ParseKubeconfig([]byte(goodKubeconfig))
	c, _ := ParseKubeconfig([]byte(strings.Replace(goodKubeconfig, "s3cr3t-token-value", "rotated", 1)))
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

// FuzzParseKubeconfig checks that no input panics the sanitiser and that
// anything accepted has a server and no exec plugin or file reference.
func FuzzParseKubeconfig(f *testing.F) {
	f.Add([]byte(goodKubeconfig))
	f.Add([]byte(withUser("    exec: {command: x}\n")))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		kc, err := ParseKubeconfig(data)
		if err != nil {
			return
		}
		if kc.Server == "" || kc.Config.ExecProvider != nil || kc.Config.BearerTokenFile != "" ||
			kc.Config.CertFile != "" || kc.Config.KeyFile != "" || kc.Config.CAFile != "" {
			t.Fatalf("accepted an unsafe kubeconfig: %+v", kc.Config)
		}
		if kc.Config.AuthProvider != nil && kc.Config.AuthProvider.Name != "oidc" {
			t.Fatalf("accepted auth provider %q", kc.Config.AuthProvider.Name)
		}
	})
}
