package clusters

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"regexp"

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

// Kubeconfig is a parsed, sanitised kubeconfig for one member cluster.
type Kubeconfig struct {
	// Config is ready for client-go.
	Config *rest.Config
	// Server is the API server URL (no credentials).
	Server string
	// SHA256 identifies the raw bytes, so that an unchanged kubeconfig is a no-op.
	SHA256 [32]byte
}

// ParseKubeconfig parses untrusted kubeconfig bytes from a remote Secret and
// rejects anything that would run code or read local files on the hub: exec
// plugins, auth providers other than oidc, and file references. Error
// messages name the offending field but never include credential values.
func ParseKubeconfig(data []byte) (*Kubeconfig, error) {
	if len(data) == 0 {
		return nil, errors.New("kubeconfig is empty")
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
	if cluster.CertificateAuthority != "" {
		return nil, fmt.Errorf("kubeconfig cluster %q: certificate-authority file references are not allowed (use certificate-authority-data)", ctx.Cluster)
	}
	if ctx.AuthInfo != "" {
		user, ok := cfg.AuthInfos[ctx.AuthInfo]
		if !ok {
			return nil, fmt.Errorf("kubeconfig context %q refers to undefined user %q", cfg.CurrentContext, ctx.AuthInfo)
		}
		switch {
		case user.Exec != nil:
			return nil, fmt.Errorf("kubeconfig user %q: exec credential plugins are not allowed", ctx.AuthInfo)
		case user.AuthProvider != nil && user.AuthProvider.Name != "oidc":
			return nil, fmt.Errorf("kubeconfig user %q: auth-provider %q is not allowed (only oidc)", ctx.AuthInfo, user.AuthProvider.Name)
		case user.TokenFile != "":
			return nil, fmt.Errorf("kubeconfig user %q: tokenFile references are not allowed (use token)", ctx.AuthInfo)
		case user.ClientCertificate != "":
			return nil, fmt.Errorf("kubeconfig user %q: client-certificate file references are not allowed (use client-certificate-data)", ctx.AuthInfo)
		case user.ClientKey != "":
			return nil, fmt.Errorf("kubeconfig user %q: client-key file references are not allowed (use client-key-data)", ctx.AuthInfo)
		}
	}
	restCfg, err := clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig is not usable: %w", err)
	}
	return &Kubeconfig{Config: restCfg, Server: cluster.Server, SHA256: sha256.Sum256(data)}, nil
}
