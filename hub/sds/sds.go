// Package sds builds the SDS resources a hub-fed proxy may have, as istiod
// does: roots (ROOTCA, a trust domain's bundle as spiffe://<td>) and the
// Kubernetes Secrets of the member its credential proves, of its own
// namespace or of another whose Secrets its service account may list
// there. It decides and builds one name at a time; which names a stream
// holds, and when they change, is the watcher's.
package sds

import (
	"errors"
	"fmt"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/proto"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/internal/clip"
	"github.com/hubmesh/hub/hub/xdsgen"
)

// SecretSource gives SDS the TLS material of a member's Secrets
// (clusters.Registry implements it).
type SecretSource interface {
	TLSSecret(cluster string, key clusters.ServiceKey) (*clusters.TLSSecret, error)
}

// Reviewer decides, without waiting, whether a service account may list
// Secrets of another namespace of its member (a SubjectAccessReview there):
// ErrReviewPending until the review has completed.
type Reviewer interface {
	Decide(review feed.ReviewKey) (bool, error)
}

var (
	// ErrDenied means the proxy may not have the name: it is withheld
	// until its subscription or credentials change.
	ErrDenied = errors.New("not authorised")
	// ErrReviewPending means the access review a name needs has not
	// completed; the name is decided again when it has.
	ErrReviewPending = errors.New("access review pending")
)

// Transient reports whether a withheld secret may come back by itself (the
// member is syncing or being rebuilt, a review is pending), as opposed to
// gone or denied.
func Transient(err error) bool {
	return !errors.Is(err, ErrDenied) && !errors.Is(err, clusters.ErrSecretNotFound)
}

// Generator builds SDS resources from a hub's roots, its members' Secrets
// and their access reviews.
type Generator struct {
	roots   authn.RootSource
	secrets SecretSource
	scope   *authn.Scope
	reviews Reviewer // nil: only the proxy's own namespace
	// hubNamespace is the hub's own namespace, whose Secrets are never served.
	hubNamespace string
}

// New returns a Generator; with no roots or no secrets it serves nothing
// but says why, and with no reviews a proxy gets the Secrets of its own
// namespace only.
func New(roots authn.RootSource, secrets SecretSource, scope *authn.Scope, reviews Reviewer, hubNamespace string) *Generator {
	return &Generator{roots: roots, secrets: secrets, scope: scope, reviews: reviews, hubNamespace: hubNamespace}
}

// MaxOtherNamespaces bounds the namespaces other than its own whose Secrets
// one SDS subscription may ask for: each costs an access review.
const MaxOtherNamespaces = 64

// OtherNamespace returns the namespace of the Secret name asks for when it
// is a well-formed name of a namespace other than ns.
func OtherNamespace(name, ns string) (string, bool) {
	n := ParseName(name, ns)
	if n.Roots || !n.WellFormed || n.Key.Namespace == ns {
		return "", false
	}
	return n.Key.Namespace, true
}

// Name is what an SDS resource name asks for: roots (ROOTCA, or a trust
// domain's bundle as spiffe://<td>) or the stream's workload certificate
// (xdsgen.SDSWorkloadCert), or a Kubernetes Secret of the proxy's member,
// kubernetes://[<namespace>/]<name>[-cacert], the namespace defaulting to
// the proxy's own. With -cacert only a CA is served, as istiod does: of
// the Secret named <name>-cacert if there is one (Istio's separate CA
// Secret for gateway mTLS), else of <name>.
type Name struct {
	Roots      bool                // roots, or the workload certificate: no Secret
	Key        clusters.ServiceKey // the Secret; zero for roots
	CAOnly     bool
	CAKey      clusters.ServiceKey // with CAOnly: the Secret <name>-cacert, tried first
	WellFormed bool                // a real namespace and Secret name (or roots)
}

// Keys are the Secrets whose change can change what the name gets.
func (n Name) Keys() []clusters.ServiceKey {
	if n.CAOnly {
		return []clusters.ServiceKey{n.CAKey, n.Key}
	}
	return []clusters.ServiceKey{n.Key}
}

// ParseName reads an SDS resource name as the proxy of namespace ns means
// it, for the Secrets of its member (kubernetes://…, a bare name, Istio's
// -cacert suffix): what indexing which watches a Secret's change can
// affect, and serving such a name, read. Roots (ROOTCA, spiffe://…) and
// the workload certificate are no Secret: it reports them as such.
func ParseName(name, ns string) Name {
	if name == xdsgen.SDSRoots || name == xdsgen.SDSWorkloadCert || strings.HasPrefix(name, "spiffe://") {
		// The workload certificate ("default", as Istio names it) changes
		// with our CA, as roots do, and when due for renewal.
		return Name{Roots: true, WellFormed: true}
	}
	ref := strings.TrimPrefix(name, "kubernetes://")
	secret := ref
	if i := strings.IndexByte(ref, '/'); i >= 0 {
		ns, secret = ref[:i], ref[i+1:]
	}
	caOnly := strings.HasSuffix(secret, "-cacert")
	// Only a real namespace and Secret name: a lister asked for namespace ""
	// takes the name as a namespace/name key, which would bypass every
	// check (and a SubjectAccessReview for "" is for all namespaces).
	ok := len(k8svalidation.IsDNS1123Label(ns)) == 0 && len(k8svalidation.IsDNS1123Subdomain(secret)) == 0
	n := Name{Key: clusters.ServiceKey{Namespace: ns, Name: strings.TrimSuffix(secret, "-cacert")}, CAOnly: caOnly, WellFormed: ok}
	if caOnly {
		n.CAKey = clusters.ServiceKey{Namespace: ns, Name: secret}
	}
	return n
}

// caSecrets are Secrets that hold CA keys (Istio's plug-in CA and its
// self-signed CA): never served, in any namespace of any member.
var caSecrets = map[string]bool{"cacerts": true, "istio-ca-secret": true}

// servable refuses the Secrets that are never served over SDS: CA material
// anywhere and everything in the hub's own namespace.
func (g *Generator) servable(key clusters.ServiceKey) error {
	if caSecrets[key.Name] {
		return fmt.Errorf("%w: %s holds CA material and is never served", ErrDenied, key.Name)
	}
	if key.Namespace == g.hubNamespace && g.hubNamespace != "" {
		return fmt.Errorf("%w: Secrets of the hub's own namespace %s are never served", ErrDenied, key.Namespace)
	}
	return nil
}

// Secret builds the SDS resource name for id, or says why not (the
// workload certificate is not its to build). consulted is the access
// review it asked, if it asked one: a new decision for it decides the
// name again.
func (g *Generator) Secret(id authn.Identity, name string) (_ proto.Message, consulted *feed.ReviewKey, _ error) {
	if g == nil || g.roots == nil || g.secrets == nil {
		return nil, nil, errors.New("SDS is not configured on this hub")
	}
	local := g.roots.LocalTrustDomain()
	if !id.Verified(local) {
		return nil, nil, fmt.Errorf("%w: secrets are served only to a verified workload identity of %s over mTLS", ErrDenied, local)
	}
	validation := func(pem []byte) *tlsv3.Secret {
		return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: pem}},
		}}}
	}
	switch {
	case name == xdsgen.SDSRoots:
		pem, ok := g.roots.RootsPEM(local)
		if !ok {
			return nil, nil, errors.New("our roots are not loaded yet")
		}
		return validation(pem), nil, nil
	case strings.HasPrefix(name, "spiffe://"):
		td, err := spiffeid.TrustDomainFromString(name)
		if err != nil {
			return nil, nil, fmt.Errorf("bad trust domain resource: %w", err)
		}
		pem, ok := g.roots.RootsPEM(td.Name())
		if !ok {
			return nil, nil, fmt.Errorf("no bundle for trust domain %s", td.Name())
		}
		return validation(pem), nil, nil
	}
	n, err := g.readable(id, name)
	if err != nil {
		return nil, nil, err
	}
	if n.Roots { // the workload certificate: not a Secret, not built here
		return nil, nil, fmt.Errorf("%w: %q is no Secret of a member", ErrDenied, name)
	}
	if n.Key.Namespace != id.Namespace {
		review := feed.ReviewKey{Cluster: id.Cluster, SANamespace: id.Namespace, SA: authn.ServiceAccountOf(id.SpiffeID), Namespace: n.Key.Namespace}
		consulted = &review
		if err := g.mayList(id, review); err != nil {
			return nil, consulted, err
		}
	}
	if n.CAOnly {
		key := n.CAKey
		s, err := g.secrets.TLSSecret(id.Cluster, key)
		if errors.Is(err, clusters.ErrSecretNotFound) {
			key = n.Key
			s, err = g.secrets.TLSSecret(id.Cluster, key)
		}
		if err != nil {
			return nil, consulted, err
		}
		if len(s.CA) == 0 {
			return nil, consulted, fmt.Errorf("secret %s has no ca.crt or cacert", key)
		}
		return validation(s.CA), consulted, nil
	}
	s, err := g.secrets.TLSSecret(id.Cluster, n.Key)
	if err != nil {
		return nil, consulted, err
	}
	if len(s.Cert) == 0 || len(s.Key) == 0 {
		return nil, consulted, fmt.Errorf("secret %s has no certificate and key", n.Key)
	}
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: s.Cert}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: s.Key}},
	}}}, consulted, nil
}

// readable checks what a Kubernetes Secret name needs of id: a member its
// credential proves, in the scope, and a servable Secret.
func (g *Generator) readable(id authn.Identity, name string) (Name, error) {
	if id.Cluster == "" {
		return Name{}, fmt.Errorf("%w: %s proves no member cluster (a certificate needs our CA's member binding, or use a service-account token): Kubernetes Secrets are not served to it", ErrDenied, id.SpiffeID)
	}
	if id.Conflict != "" {
		return Name{}, fmt.Errorf("%w: %s claims member %s but its certificate is bound to %s", ErrDenied, id.SpiffeID, clip.String(id.Conflict, 64), id.Cluster)
	}
	if err := g.scope.Allow(id.Cluster, id.Namespace); err != nil {
		if err.(*authn.ScopeError).Reason == authn.ScopeMemberNotSynced {
			return Name{}, err // transient: served once the member syncs (SecretsSynced)
		}
		return Name{}, fmt.Errorf("%w: %w", ErrDenied, err)
	}
	n := ParseName(name, id.Namespace)
	if !n.WellFormed {
		return Name{}, fmt.Errorf("%w: %q does not name a Secret (kubernetes://[<namespace>/]<name>)", ErrDenied, clip.String(name, 256))
	}
	for _, k := range n.Keys() {
		if err := g.servable(k); err != nil {
			return Name{}, err
		}
	}
	return n, nil
}

// mayList decides, as istiod does, whether id may read Secrets of another
// namespace: if its service account may list Secrets there (a
// SubjectAccessReview in its own member). It never waits: a review not
// decided yet is ErrReviewPending, and the name is decided again when it
// is.
func (g *Generator) mayList(id authn.Identity, review feed.ReviewKey) error {
	if g.reviews == nil {
		return fmt.Errorf("%w: %s may only read secrets of namespace %s", ErrDenied, id.SpiffeID, id.Namespace)
	}
	ok, err := g.reviews.Decide(review)
	if err != nil {
		return err // transient: the stream keeps what it has
	}
	if !ok {
		return fmt.Errorf("%w: %s may not list secrets in namespace %s of cluster %s", ErrDenied, id.SpiffeID, review.Namespace, id.Cluster)
	}
	return nil
}
