package clusters

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hubmesh/hub/internal/dialguard"
)

var clusterIDPattern = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// ValidateClusterID checks a cluster ID against docs/architecture.md §3.2.
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

// ParseKubeconfig parses with the default policy (inline credentials only,
// link-local and unspecified servers refused).
func ParseKubeconfig(data []byte) (*Kubeconfig, error) {
	return KubeconfigPolicy{}.ParseKubeconfig(data)
}

// Kubeconfig is a parsed, sanitised kubeconfig for one member cluster.
type Kubeconfig struct {
	// Config is ready for client-go. It is built field by field from the
	// resolved context (see KubeconfigPolicy.resolve), never by clientcmd, so that
	// nothing the sanitiser did not look at reaches client-go.
	Config *rest.Config
	// Server is the API server URL (no credentials).
	Server string
	// SHA256 identifies the raw bytes, so that an unchanged kubeconfig is a no-op.
	SHA256 [32]byte
	// Warnings are accepted but risky settings, shown in the member's status.
	Warnings []string
	// Credentials are when its inline credentials expire (see
	// CredentialExpiry), shown in the member's status.
	Credentials []CredentialExpiry

	// guard checks every address the member's client dials (nil: none, for
	// the home cluster, which the operator configured).
	guard *dialGuard
	// maxObjects caps the objects the member's informers hold (0: no cap).
	maxObjects int
}

// KubeconfigPolicy lists what an operator explicitly allows in remote
// kubeconfigs beyond inline credentials, where member API servers may be,
// and how much a member may hold. The zero value allows nothing extra,
// refuses link-local servers and caps members at DefaultMaxObjects.
type KubeconfigPolicy struct {
	Exec bool // exec credential plugins (run a command on the hub)
	// AuthProvider allows auth providers (oidc is the only one the hub
	// registers); they are handed to client-go as configured, which lets a
	// kubeconfig make the hub contact its issuer.
	AuthProvider bool
	Files        bool // file references: tokenFile, client-certificate/key, certificate-authority
	ProxyURL     bool // proxy-url (the hub connects through that proxy)

	// ServerCIDRs, if not empty, are the only ranges a member's API server
	// (or its proxy) may be in.
	ServerCIDRs []netip.Prefix
	// DenyCIDRs are ranges a member's API server may never be in; nil means
	// DefaultDenyCIDRs, an empty non-nil slice denies nothing. Unspecified
	// addresses (0.0.0.0, ::) are always refused.
	DenyCIDRs []netip.Prefix
	// MaxObjects caps the Services, EndpointSlices, Nodes, Secrets and mesh
	// pods (labelled security.istio.io/tlsMode=istio; key, workload and
	// service account only) one member's informers may hold; 0 means
	// DefaultMaxObjects.
	MaxObjects int
}

// DefaultMaxObjects is the per-member object cap when the policy sets none.
const DefaultMaxObjects = 200000

// DefaultDenyCIDRs are the ranges member servers may not be in by default:
// link-local, where cloud metadata services live.
var DefaultDenyCIDRs = dialguard.DefaultDeny

// KubeconfigOptions are the names accepted by ParsePolicy.
const KubeconfigOptions = "exec, auth-provider, files, proxy-url"

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
		case "proxy-url":
			p.ProxyURL = true
		default:
			return p, fmt.Errorf("unknown kubeconfig option %q (known: %s)", opt, KubeconfigOptions)
		}
	}
	return p, nil
}

// ParseCIDRs parses a comma-separated list of CIDR prefixes (a bare address
// is its own /32 or /128). An empty list gives an empty, non-nil slice.
func ParseCIDRs(list string) ([]netip.Prefix, error) { return dialguard.ParseCIDRs(list) }

func (p KubeconfigPolicy) denyCIDRs() []netip.Prefix {
	if p.DenyCIDRs == nil {
		return DefaultDenyCIDRs
	}
	return p.DenyCIDRs
}

func (p KubeconfigPolicy) maxObjects() int {
	if p.MaxObjects <= 0 {
		return DefaultMaxObjects
	}
	return p.MaxObjects
}

// ParseKubeconfig parses untrusted kubeconfig bytes from a remote Secret or
// the API and rejects anything that would run code, read local files or
// reach places the policy forbids: every clusters, users and contexts entry
// is checked (empty names included), the current context is resolved as
// client-go resolves it, and the rest.Config is built from the resolved
// server, CA and inline credentials only. Error messages name the entry and
// field but never include credential values.
func (p KubeconfigPolicy) ParseKubeconfig(data []byte) (*Kubeconfig, error) {
	if len(data) == 0 {
		return nil, errors.New("kubeconfig is empty")
	}
	if len(data) > maxKubeconfigBytes {
		return nil, fmt.Errorf("kubeconfig is %d bytes; at most %d are accepted", len(data), maxKubeconfigBytes)
	}
	if err := checkDuplicateNames(data); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		if strings.Contains(err.Error(), "duplicate name") {
			// client-go's message prints the whole list, credentials included.
			return nil, errors.New("kubeconfig does not parse: duplicate names in a list")
		}
		return nil, fmt.Errorf("kubeconfig does not parse: %w", err)
	}
	guard, err := newDialGuard(p.ServerCIDRs, p.denyCIDRs())
	if err != nil {
		return nil, err
	}
	res, err := p.resolve(cfg, guard)
	if err != nil {
		return nil, err
	}
	return &Kubeconfig{
		Config: res.config, Server: res.server, SHA256: sha256.Sum256(data), Warnings: res.warnings,
		Credentials: credentialExpiries(res.config), guard: guard, maxObjects: p.maxObjects(),
	}, nil
}
