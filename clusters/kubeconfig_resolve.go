package clusters

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"

	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// How client-go resolves a kubeconfig (clientcmd.DirectClientConfig with no
// overrides, client-go v0.37): the context is contexts[current-context]
// (an empty context if there is none), then the cluster is
// clusters[context.cluster] and the user users[context.user] — empty names
// included: a context that names no user gets users[""] when that entry
// exists, and a missing entry resolves to an empty one without an error.
// Credentials go into the rest.Config only for TLS servers, token before
// tokenFile (whose path is kept and re-read), and the cluster extension
// "client.authentication.k8s.io/exec" feeds an exec plugin.
//
// The sanitiser checks every entry for forbidden fields, so that no
// resolution path can reach one, then resolves like client-go but more
// strictly (a current context must be named and exist, a named user must
// exist), and builds the rest.Config itself from the resolved fields.

// execClusterExtension is the cluster extension client-go hands to exec plugins.
const execClusterExtension = "client.authentication.k8s.io/exec"

// resolved is what a kubeconfig's current context resolves to.
type resolved struct {
	config   *rest.Config
	server   string
	warnings []string
}

// resolve validates every entry of cfg and builds the member's rest.Config
// from its current context.
func (p KubeconfigPolicy) resolve(cfg *clientcmdapi.Config, guard *dialGuard) (*resolved, error) {
	for _, name := range slices.Sorted(maps.Keys(cfg.Clusters)) {
		if err := p.checkCluster(name, cfg.Clusters[name], guard); err != nil {
			return nil, err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.AuthInfos)) {
		if err := p.checkUser(name, cfg.AuthInfos[name]); err != nil {
			return nil, err
		}
	}
	// Contexts hold names, a namespace and extensions: nothing of theirs
	// reaches client-go but the entries they resolve to, checked above.

	if cfg.CurrentContext == "" {
		return nil, errors.New("kubeconfig has no current-context")
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok || ctx == nil {
		return nil, fmt.Errorf("kubeconfig current-context %s is not defined in contexts", qn(cfg.CurrentContext))
	}
	cluster, ok := cfg.Clusters[ctx.Cluster]
	if !ok || cluster == nil {
		return nil, fmt.Errorf("kubeconfig context %s refers to undefined cluster %s", qn(cfg.CurrentContext), qn(ctx.Cluster))
	}
	user, ok := cfg.AuthInfos[ctx.AuthInfo]
	switch {
	case ok && user != nil:
	case ctx.AuthInfo != "":
		return nil, fmt.Errorf("kubeconfig context %s refers to undefined user %s", qn(cfg.CurrentContext), qn(ctx.AuthInfo))
	default:
		user = clientcmdapi.NewAuthInfo() // no user and no users[""]: anonymous, as in client-go
	}

	res := &resolved{server: cluster.Server}
	host, err := p.checkServer(ctx.Cluster, cluster, guard)
	if err != nil {
		return nil, err
	}
	rc := &rest.Config{
		Host:               host,
		DisableCompression: cluster.DisableCompression,
		TLSClientConfig: rest.TLSClientConfig{
			Insecure:   cluster.InsecureSkipTLSVerify,
			ServerName: cluster.TLSServerName,
			CAData:     slices.Clone(cluster.CertificateAuthorityData),
		},
	}
	if p.Files {
		rc.CAFile = cluster.CertificateAuthority
	}
	if cluster.InsecureSkipTLSVerify {
		res.warnings = append(res.warnings, fmt.Sprintf("cluster %s sets insecure-skip-tls-verify: the member's API server certificate is not verified", qn(ctx.Cluster)))
	}
	if cluster.ProxyURL != "" { // only here when allowed (checkCluster)
		u, _ := url.Parse(cluster.ProxyURL)
		rc.Proxy = http.ProxyURL(u)
	} else {
		// Not client-go's default (HTTPS_PROXY and friends of the hub's
		// environment): through a proxy the dial guard would see only the
		// proxy's address, and the proxy would resolve and connect the
		// member's server wherever it points.
		rc.Proxy = noProxy
	}
	if err := p.setCredentials(rc, ctx.AuthInfo, user, cluster); err != nil {
		return nil, err
	}
	res.config = rc
	return res, nil
}

// noProxy is a member client's proxy function unless its kubeconfig sets
// an allowed proxy-url: every connection is dialled directly.
func noProxy(*http.Request) (*url.URL, error) { return nil, nil }

// checkCluster rejects forbidden fields of one clusters entry.
func (p KubeconfigPolicy) checkCluster(name string, c *clientcmdapi.Cluster, guard *dialGuard) error {
	if c == nil {
		return nil
	}
	if c.CertificateAuthority != "" && !p.Files {
		return fmt.Errorf("kubeconfig cluster %s: certificate-authority file references are not allowed (use certificate-authority-data)", qn(name))
	}
	if c.ProxyURL != "" {
		if !p.ProxyURL {
			return fmt.Errorf("kubeconfig cluster %s: proxy-url is not allowed (the hub connects to member API servers directly unless --kubeconfig-allow=proxy-url)", qn(name))
		}
		u, err := url.Parse(c.ProxyURL)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "socks5") {
			return fmt.Errorf("kubeconfig cluster %s: proxy-url must be an http, https or socks5 URL with a host", qn(name))
		}
		if a, err := netip.ParseAddr(u.Hostname()); err == nil {
			if err := guard.check(a); err != nil {
				return fmt.Errorf("kubeconfig cluster %s: proxy-url %w", qn(name), err)
			}
		}
	}
	return nil
}

// checkUser rejects forbidden fields of one users entry, and combinations
// client-go refuses.
func (p KubeconfigPolicy) checkUser(name string, u *clientcmdapi.AuthInfo) error {
	if u == nil {
		return nil
	}
	switch {
	case u.Exec != nil && !p.Exec:
		return fmt.Errorf("kubeconfig user %s: exec credential plugins are not allowed", qn(name))
	case u.AuthProvider != nil && !p.AuthProvider:
		return fmt.Errorf("kubeconfig user %s: auth-provider %s is not allowed (--kubeconfig-allow=auth-provider)", qn(name), qn(u.AuthProvider.Name))
	case u.Exec != nil && u.AuthProvider != nil:
		return fmt.Errorf("kubeconfig user %s: exec and auth-provider are both set", qn(name))
	case u.TokenFile != "" && !p.Files:
		return fmt.Errorf("kubeconfig user %s: tokenFile references are not allowed (use token)", qn(name))
	case u.ClientCertificate != "" && !p.Files:
		return fmt.Errorf("kubeconfig user %s: client-certificate file references are not allowed (use client-certificate-data)", qn(name))
	case u.ClientKey != "" && !p.Files:
		return fmt.Errorf("kubeconfig user %s: client-key file references are not allowed (use client-key-data)", qn(name))
	case u.Token != "" && (u.Username != "" || u.Password != ""):
		return fmt.Errorf("kubeconfig user %s: token and username/password are both set; only one authentication method is allowed", qn(name))
	case u.ClientCertificate != "" && len(u.ClientCertificateData) > 0:
		return fmt.Errorf("kubeconfig user %s: client-certificate and client-certificate-data are both set", qn(name))
	case u.ClientKey != "" && len(u.ClientKeyData) > 0:
		return fmt.Errorf("kubeconfig user %s: client-key and client-key-data are both set", qn(name))
	case (u.ClientCertificate != "" || len(u.ClientCertificateData) > 0) && u.ClientKey == "" && len(u.ClientKeyData) == 0:
		return fmt.Errorf("kubeconfig user %s: a client certificate needs client-key-data", qn(name))
	case (u.ClientKey != "" || len(u.ClientKeyData) > 0) && u.ClientCertificate == "" && len(u.ClientCertificateData) == 0:
		return fmt.Errorf("kubeconfig user %s: client-key-data needs client-certificate-data", qn(name))
	case u.Impersonate == "" && (u.ImpersonateUID != "" || len(u.ImpersonateGroups) > 0 || len(u.ImpersonateUserExtra) > 0):
		return fmt.Errorf("kubeconfig user %s: as-uid, as-groups or as-user-extra without as (the user to impersonate)", qn(name))
	}
	return nil
}

// checkServer validates the resolved cluster's server and TLS settings and
// returns the Host client-go would use.
func (p KubeconfigPolicy) checkServer(name string, c *clientcmdapi.Cluster, guard *dialGuard) (string, error) {
	if c.Server == "" {
		return "", fmt.Errorf("kubeconfig cluster %s has an empty server", qn(name))
	}
	u, err := url.Parse(c.Server)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.Opaque != "" {
		return "", fmt.Errorf("kubeconfig cluster %s: server must be an https:// URL with a host and no user info", qn(name))
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return "", fmt.Errorf("kubeconfig cluster %s: server must not have a query or fragment", qn(name))
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("kubeconfig cluster %s: server port must be 1-65535", qn(name))
		}
	}
	if a, err := netip.ParseAddr(u.Hostname()); err == nil {
		if err := guard.check(a); err != nil {
			return "", fmt.Errorf("kubeconfig cluster %s: server %w", qn(name), err)
		}
	}
	if c.InsecureSkipTLSVerify && (len(c.CertificateAuthorityData) > 0 || c.CertificateAuthority != "") {
		return "", fmt.Errorf("kubeconfig cluster %s: insecure-skip-tls-verify and a certificate authority are both set", qn(name))
	}
	if c.CertificateAuthority != "" && len(c.CertificateAuthorityData) > 0 {
		return "", fmt.Errorf("kubeconfig cluster %s: certificate-authority and certificate-authority-data are both set", qn(name))
	}
	if len(c.CertificateAuthorityData) > 0 && !x509.NewCertPool().AppendCertsFromPEM(c.CertificateAuthorityData) {
		return "", fmt.Errorf("kubeconfig cluster %s: certificate-authority-data holds no PEM certificate", qn(name))
	}
	// client-go drops a query and fragment from a server with a path; there
	// are none here, but the URL is normalised the same way.
	host := c.Server
	if ru, err := url.ParseRequestURI(host); err == nil && ru.Opaque == "" && len(ru.Path) > 1 {
		ru.RawQuery, ru.Fragment = "", ""
		host = ru.String()
	}
	return host, nil
}

// setCredentials copies the resolved user's credentials into rc.
func (p KubeconfigPolicy) setCredentials(rc *rest.Config, name string, u *clientcmdapi.AuthInfo, c *clientcmdapi.Cluster) error {
	rc.BearerToken = u.Token
	if p.Files {
		rc.BearerTokenFile = u.TokenFile
		rc.CertFile, rc.KeyFile = u.ClientCertificate, u.ClientKey
	}
	if len(u.ClientCertificateData) > 0 {
		if _, err := tls.X509KeyPair(u.ClientCertificateData, u.ClientKeyData); err != nil {
			return fmt.Errorf("kubeconfig user %s: client-certificate-data and client-key-data are not a usable pair: %w", qn(name), err)
		}
		rc.CertData, rc.KeyData = slices.Clone(u.ClientCertificateData), slices.Clone(u.ClientKeyData)
	}
	rc.Username, rc.Password = u.Username, u.Password
	if u.Impersonate != "" {
		rc.Impersonate = rest.ImpersonationConfig{
			UserName: u.Impersonate, UID: u.ImpersonateUID,
			Groups: slices.Clone(u.ImpersonateGroups), Extra: maps.Clone(u.ImpersonateUserExtra),
		}
	}
	if u.AuthProvider != nil && p.AuthProvider {
		rc.AuthProvider = &clientcmdapi.AuthProviderConfig{Name: u.AuthProvider.Name, Config: maps.Clone(u.AuthProvider.Config)}
	}
	if u.Exec != nil && p.Exec {
		e := *u.Exec
		e.Args, e.Env, e.InstallHint = slices.Clone(e.Args), slices.Clone(e.Env), ""
		e.Config = c.Extensions[execClusterExtension]
		rc.ExecProvider = &e
	}
	return nil
}

// checkDuplicateNames reports a name used twice in clusters, users or
// contexts. client-go refuses those too, but its message prints the whole
// list, credentials included.
func checkDuplicateNames(data []byte) error {
	type named struct {
		Name string `json:"name"`
	}
	var lists struct {
		Clusters []named `json:"clusters"`
		Users    []named `json:"users"`
		Contexts []named `json:"contexts"`
	}
	if err := yaml.Unmarshal(data, &lists); err != nil {
		return nil // clientcmd.Load reports what does not parse
	}
	for _, l := range []struct {
		kind    string
		entries []named
	}{{"clusters", lists.Clusters}, {"users", lists.Users}, {"contexts", lists.Contexts}} {
		seen := map[string]bool{}
		for _, e := range l.entries {
			if seen[e.Name] {
				return fmt.Errorf("kubeconfig %s has more than one entry named %s", l.kind, qn(e.Name))
			}
			seen[e.Name] = true
		}
	}
	return nil
}

// qn quotes a name from a kubeconfig for a message, cut to 64 bytes.
func qn(s string) string {
	const limit = 64
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "…"
	}
	return strconv.Quote(s)
}
