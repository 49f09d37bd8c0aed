package clusters

import (
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// fuzzPolicies are the policies every input is tried with: the default,
// and one that allows auth providers and proxies (never exec or files,
// which would make client-go's own resolution run commands or read files).
var fuzzPolicies = []KubeconfigPolicy{{}, {AuthProvider: true, ProxyURL: true}}

// FuzzKubeconfig checks the sanitiser's resolution model: for any input it
// accepts, the rest.Config has no exec plugin, no auth provider or proxy
// unless allowed, and no file reference; and client-go's own resolution of
// the same bytes (clientcmd.NewDefaultClientConfig) reaches the same server,
// TLS settings and credentials, so the hub connects where client-go would
// have, with what client-go would have sent.
func FuzzKubeconfig(f *testing.F) {
	p := testCerts(f)
	good := goodKubeconfig(f)
	seeds := []string{
		good,
		withUser(f, "    client-certificate-data: "+p.cert+"\n    client-key-data: "+p.key+"\n"),
		withUser(f, "    username: admin\n    password: pw\n"),
		withUser(f, "    token: t\n    as: alice\n    as-groups: [a, b]\n    as-user-extra: {k: [v]}\n"),
		withUser(f, "    auth-provider: {name: oidc, config: {idp-issuer-url: 'http://127.0.0.1:1'}}\n"),
		withUser(f, "    exec: {command: /bin/sh, args: [-c, 'touch /tmp/x'], apiVersion: client.authentication.k8s.io/v1}\n"),
		strings.Replace(good, "    certificate-authority-data: "+p.ca, "    insecure-skip-tls-verify: true", 1),
		strings.Replace(good, "    server: https://10.1.2.3:6443", "    server: https://10.1.2.3:6443\n    proxy-url: http://10.9.9.9:3128", 1),
		strings.Replace(good, "10.1.2.3:6443", "169.254.169.254", 1),
		strings.Replace(good, "10.1.2.3:6443", "h.example/some/path", 1),
		// The reproduced attack: the context names no user, users[""] reads a file or runs a command.
		strings.Replace(strings.Replace(good, "{cluster: c, user: u}", "{cluster: c}", 1), "- name: u\n  user:\n    token: s3cr3t-token-value", "- name: \"\"\n  user:\n    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token", 1),
		strings.Replace(strings.Replace(good, "{cluster: c, user: u}", "{cluster: c}", 1), "- name: u\n  user:\n    token: s3cr3t-token-value", "- name: \"\"\n  user:\n    exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}", 1),
		strings.Replace(strings.Replace(good, "{cluster: c, user: u}", "{cluster: c}", 1), "- name: u\n  user:\n    token: s3cr3t-token-value", "- name: \"\"\n  user:\n    token: inline", 1),
		strings.Replace(strings.Replace(good, "{cluster: c, user: u}", "{user: u}", 1), "- name: c\n", "- name: \"\"\n", 1),
		strings.Replace(good, "- name: c\n  cluster:\n", "- name: \"\"\n  cluster: {certificate-authority: /etc/ca.crt, server: 'https://x'}\n- name: c\n  cluster:\n", 1),
		strings.Replace(strings.Replace(good, "- name: ctx\n", "- name: \"\"\n", 1), "current-context: ctx", "current-context: \"\"", 1),
		good + "users:\n- name: u\n  user: {token: dup}\n",
		"{}",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, policy := range fuzzPolicies {
			kc, err := policy.ParseKubeconfig(data)
			if err != nil {
				continue
			}
			checkSafe(t, policy, kc.Config)
			agreeWithClientGo(t, data, kc.Config)
		}
	})
}

func checkSafe(t *testing.T, policy KubeconfigPolicy, c *rest.Config) {
	t.Helper()
	switch {
	case c.ExecProvider != nil:
		t.Fatalf("accepted an exec plugin")
	case c.AuthProvider != nil && !policy.AuthProvider:
		t.Fatalf("accepted auth provider %q", c.AuthProvider.Name)
	case c.Proxy == nil:
		t.Fatalf("the proxy is left to client-go's default (the hub's environment)")
	case !policy.ProxyURL && proxyFor(c) != nil:
		t.Fatalf("accepted a proxy")
	case c.BearerTokenFile != "" || c.CertFile != "" || c.KeyFile != "" || c.CAFile != "":
		t.Fatalf("accepted a file reference: %q %q %q %q", c.BearerTokenFile, c.CertFile, c.KeyFile, c.CAFile)
	case !strings.HasPrefix(c.Host, "https://"):
		t.Fatalf("accepted host %q", c.Host)
	case c.Dial != nil || c.Transport != nil || c.WrapTransport != nil:
		t.Fatalf("the parsed config carries transport hooks")
	}
}

// agreeWithClientGo resolves data with client-go exactly as the hub did
// before it built rest.Configs itself, and compares.
func agreeWithClientGo(t *testing.T, data []byte, ours *rest.Config) {
	t.Helper()
	cfg, err := clientcmd.Load(data)
	if err != nil {
		t.Fatalf("accepted, but client-go cannot load it: %v", err)
	}
	theirs, err := clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		t.Fatalf("accepted, but client-go refuses it: %v", err)
	}
	type field struct {
		name string
		same bool
	}
	for _, f := range []field{
		{"host", ours.Host == theirs.Host},
		{"bearer token", ours.BearerToken == theirs.BearerToken},
		{"username", ours.Username == theirs.Username},
		{"password", ours.Password == theirs.Password},
		{"client certificate", slices.Equal(ours.CertData, theirs.CertData) && slices.Equal(ours.KeyData, theirs.KeyData)},
		{"CA", slices.Equal(ours.CAData, theirs.CAData)},
		{"insecure", ours.Insecure == theirs.Insecure},
		{"server name", ours.ServerName == theirs.ServerName},
		{"compression", ours.DisableCompression == theirs.DisableCompression},
		{"impersonation", ours.Impersonate.UserName == theirs.Impersonate.UserName && ours.Impersonate.UID == theirs.Impersonate.UID &&
			slices.Equal(ours.Impersonate.Groups, theirs.Impersonate.Groups) &&
			maps.EqualFunc(ours.Impersonate.Extra, theirs.Impersonate.Extra, slices.Equal)},
		{"auth provider", (ours.AuthProvider == nil) == (theirs.AuthProvider == nil) &&
			(ours.AuthProvider == nil || ours.AuthProvider.Name == theirs.AuthProvider.Name && maps.Equal(ours.AuthProvider.Config, theirs.AuthProvider.Config))},
		{"proxy", sameProxy(ours, theirs)},
		{"exec", theirs.ExecProvider == nil},
		{"token file", theirs.BearerTokenFile == ""},
		{"files", theirs.CertFile == "" && theirs.KeyFile == "" && theirs.CAFile == ""},
	} {
		if !f.same {
			t.Fatalf("our resolution differs from client-go's in the %s", f.name)
		}
	}
}

// sameProxy compares the proxies: where client-go would use the hub's
// environment (no proxy-url), ours connects directly.
func sameProxy(ours, theirs *rest.Config) bool {
	if theirs.Proxy == nil {
		return ours.Proxy != nil && proxyFor(ours) == nil
	}
	a, b := proxyFor(ours), proxyFor(theirs)
	return a != nil && b != nil && a.String() == b.String()
}

// proxyFor is the proxy c uses for a request to a member (nil: none, or
// client-go's default when c sets no proxy function).
func proxyFor(c *rest.Config) *url.URL {
	if c.Proxy == nil {
		return nil
	}
	req, _ := http.NewRequest(http.MethodGet, "https://member.example/", nil)
	u, err := c.Proxy(req)
	if err != nil {
		return nil
	}
	return u
}
