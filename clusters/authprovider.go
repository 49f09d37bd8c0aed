package clusters

// The oidc auth provider is the only one the hub registers with client-go.
// It is reached only with --kubeconfig-allow=auth-provider: without it the
// sanitiser rejects every auth-provider, and member rest.Configs are built
// field by field (KubeconfigPolicy.resolve), so no AuthProvider reaches client-go.
import _ "k8s.io/client-go/plugin/pkg/client/auth/oidc"
