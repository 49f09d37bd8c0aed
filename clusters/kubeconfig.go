package clusters

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	// oidc is the one auth provider remote kubeconfigs may use.
	_ "k8s.io/client-go/plugin/pkg/client/auth/oidc"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

var clusterIDPattern = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// ValidateClusterID checks a cluster ID against DESIGN.md §3.2.
func ValidateClusterID(id string) error {
	if len(id) == 0 || len(id) > 63 {
		return fmt.Errorf("cluster ID %q must be 1-63 characters", id)
	}
	if !clusterIDPattern.MatchString(id) {
		return fmt.Errorf("cluster ID %q must match %s", id, clusterIDPattern)
	}
	return nil
}

// maxKubeconfigBytes bounds the parser's work on untrusted input.
const maxKubeconfigBytes = 256 << 10

// ParseKubeconfig parses with the default policy (inline credentials only).
func ParseKubeconfig(data []byte) (*Kubeconfig, error) {
	return KubeconfigPolicy{}.ParseKubeconfig(data)
}

// Kubeconfig is a parsed, sanitised kubeconfig for one member cluster.
type Kubeconfig struct {
	// Config is ready for client-go.
	Config *rest.Config
	// Server is the API server URL (no credentials).
	Server string
	// SHA256 identifies the raw bytes, so that an unchanged kubeconfig is a no-op.
	SHA256 [32]byte
}

// KubeconfigPolicy lists what an operator explicitly allows in remote
// kubeconfigs beyond inline credentials. The zero value allows nothing extra.
type KubeconfigPolicy struct {
	Exec         bool // exec credential plugins (run a command on the hub)
	AuthProvider bool // auth providers other than oidc
	Files        bool // file references: tokenFile, client-certificate/key, certificate-authority
}

// KubeconfigOptions are the names accepted by ParsePolicy.
const KubeconfigOptions = "exec, auth-provider, files"

// ParsePolicy parses a comma-separated list of KubeconfigOptions.
func ParsePolicy(list string) (KubeconfigPolicy, error) {
	var p KubeconfigPolicy
	for _, opt := range strings.Split(list, ",") {
		switch strings.TrimSpace(opt) {
		case "":
		case "exec":
			p.Exec = true
		case "auth-provider":
			p.AuthProvider = true
		case "files":
			p.Files = true
		default:
			return p, fmt.Errorf("unknown kubeconfig option %q (known: %s)", opt, KubeconfigOptions)
		}
	}
	return p, nil
}

// ParseKubeconfig parses untrusted kubeconfig bytes from a remote Secret and
// rejects anything that would run code or read local files on the hub: exec
// plugins, auth providers other than oidc, and file references, unless the
// policy allows them. Error messages name the offending field but never
// include credential values.
func (p KubeconfigPolicy) ParseKubeconfig(data []byte) (*Kubeconfig, error) {
	if len(data) == 0 {
		return nil, errors.New("kubeconfig is empty")
	}
	if len(data) > maxKubeconfigBytes {
		return nil, fmt.Errorf("kubeconfig is %d bytes; at most %d are accepted", len(data), maxKubeconfigBytes)
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig does not parse: %w", err)
	}
	if cfg.CurrentContext == "" {
		return nil, errors.New("kubeconfig has no current-context")
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return nil, fmt.Errorf("kubeconfig current-context %q is not defined in contexts", cfg.CurrentContext)
	}
	cluster, ok := cfg.Clusters[ctx.Cluster]
	if !ok {
		return nil, fmt.Errorf("kubeconfig context %q refers to undefined cluster %q", cfg.CurrentContext, ctx.Cluster)
	}
	if cluster.Server == "" {
		return nil, fmt.Errorf("kubeconfig cluster %q has an empty server", ctx.Cluster)
	}
	if u, err := url.Parse(cluster.Server); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		return nil, fmt.Errorf("kubeconfig cluster %q: server must be an https:// URL with a host and no user info", ctx.Cluster)
	}
	if cluster.CertificateAuthority != "" && !p.Files {
		return nil, fmt.Errorf("kubeconfig cluster %q: certificate-authority file references are not allowed (use certificate-authority-data)", ctx.Cluster)
	}
	if ctx.AuthInfo != "" {
		user, ok := cfg.AuthInfos[ctx.AuthInfo]
		if !ok {
			return nil, fmt.Errorf("kubeconfig context %q refers to undefined user %q", cfg.CurrentContext, ctx.AuthInfo)
		}
		switch {
		case user.Exec != nil && !p.Exec:
			return nil, fmt.Errorf("kubeconfig user %q: exec credential plugins are not allowed", ctx.AuthInfo)
		case user.AuthProvider != nil && user.AuthProvider.Name != "oidc" && !p.AuthProvider:
			return nil, fmt.Errorf("kubeconfig user %q: auth-provider %q is not allowed (only oidc)", ctx.AuthInfo, user.AuthProvider.Name)
		case user.TokenFile != "" && !p.Files:
			return nil, fmt.Errorf("kubeconfig user %q: tokenFile references are not allowed (use token)", ctx.AuthInfo)
		case user.ClientCertificate != "" && !p.Files:
			return nil, fmt.Errorf("kubeconfig user %q: client-certificate file references are not allowed (use client-certificate-data)", ctx.AuthInfo)
		case user.ClientKey != "" && !p.Files:
			return nil, fmt.Errorf("kubeconfig user %q: client-key file references are not allowed (use client-key-data)", ctx.AuthInfo)
		}
	}
	restCfg, err := clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig is not usable: %w", err)
	}
	return &Kubeconfig{Config: restCfg, Server: cluster.Server, SHA256: sha256.Sum256(data)}, nil
}
