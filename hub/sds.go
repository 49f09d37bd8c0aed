package hub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
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

// SecretAuthorizer answers whether a service account may list Secrets of a
// namespace in a member cluster (clusters.Registry implements it).
type SecretAuthorizer interface {
	CanListSecrets(ctx context.Context, cluster, saNamespace, saName, namespace string) (bool, error)
}

// withheldLog remembers which SDS names a stream was told it may not have,
// so that each is logged once per stream rather than on every push. It
// belongs to the stream (streamRecord.withheld), not to its identity: a
// token's identity is cached and shared by every stream that presents it.
type withheldLog struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// maxWithheldLogged bounds what a stream's withheldLog remembers; past it
// nothing more is logged for that stream.
const maxWithheldLogged = 256

// first reports whether (name, reason) is new for the stream, and whether
// this is the entry that fills the log (logged with a note that more are
// not).
func (l *withheldLog) first(name, reason string) (first, last bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := name + "\x00" + reason
	if _, ok := l.seen[key]; ok || len(l.seen) >= maxWithheldLogged {
		return false, false
	}
	if l.seen == nil {
		l.seen = map[string]struct{}{}
	}
	l.seen[key] = struct{}{}
	return true, len(l.seen) == maxWithheldLogged
}

var errDenied = errors.New("not authorised")

// caSecrets are Secrets that hold CA keys (Istio's plug-in CA and its
// self-signed CA): never served, in any namespace of any member.
var caSecrets = map[string]bool{"cacerts": true, "istio-ca-secret": true}

// servable refuses the Secrets that are never served over SDS: CA material
// anywhere and everything in the hub's own namespace.
func (w *watcher) servable(namespace, name string) error {
	if caSecrets[name] {
		return fmt.Errorf("%w: %s holds CA material and is never served", errDenied, name)
	}
	if namespace == w.hubNamespace && w.hubNamespace != "" {
		return fmt.Errorf("%w: Secrets of the hub's own namespace %s are never served", errDenied, namespace)
	}
	return nil
}

// transient reports whether a withheld secret may come back by itself (the
// member is syncing or being rebuilt), as opposed to gone or denied.
func transient(err error) bool {
	return !errors.Is(err, errDenied) && !errors.Is(err, clusters.ErrSecretNotFound)
}

// secretResources builds the SDS resources a watch asked for, as istiod
// does: only to a verified identity of our trust domain, Secrets of the
// member its credential proves, of the proxy's own namespace or of another
// namespace whose Secrets its service account may list there (a
// SubjectAccessReview in that member, see secret); also roots (ROOTCA, a
// trust domain's bundle) and its own workload certificate ("default").
// Names it may not have are left out (and logged once per stream and
// reason), never an error for the stream.
func (w *watcher) secretResources(wt *watch) ([]*xdsgen.Resource, error) {
	var out []*xdsgen.Resource
	var reviews map[feed.ReviewKey]struct{}
	id := w.identityOf(wt)
	wt.awaiting = false
	defer func() {
		// Pushes read it, possibly while this runs on the stream's goroutine.
		w.mu.Lock()
		wt.sub.reviews = reviews
		w.mu.Unlock()
	}()
	var others map[string]struct{} // namespaces other than the proxy's its names ask for
	for _, name := range wt.names {
		var msg proto.Message
		var review *feed.ReviewKey
		var err error
		if ns, ok := otherNamespace(name, id.Namespace); ok && len(others) >= maxOtherNamespaces && !has(others, ns) {
			// Each other namespace costs an access review in the member:
			// a client cannot make the hub ask for thousands.
			err = fmt.Errorf("%w: the subscription names Secrets of more than %d namespaces other than %s", errDenied, maxOtherNamespaces, id.Namespace)
		} else {
			if ok {
				add(&others, ns)
			}
			if name == xdsgen.SDSWorkloadCert {
				msg, err = w.workload.secret(&wt.rec.workload, id, w.roots)
			} else {
				msg, review, err = w.secret(id, name)
			}
		}
		if review != nil {
			add(&reviews, *review)
		}
		if errors.Is(err, errReviewPending) {
			wt.awaiting = true
		} else if err != nil {
			if first, last := wt.rec.withheld.first(name, err.Error()); first {
				w.scope.Count("sds", err)
				w.log.Warn("SDS resource withheld", "proxy", wt.nodeID, "cluster", id.Cluster, "identity", id.SpiffeID.String(), "resource", name, "reason", err,
					"moreNotLogged", last)
			}
		}
		if err != nil {
			if v, ok := wt.held.version(name); ok && transient(err) {
				out = append(out, &xdsgen.Resource{Name: name, Version: v, Kept: true})
			}
			continue
		}
		r, err := xdsgen.Marshal(name, resourcev3.SecretType, msg)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// maxOtherNamespaces bounds the namespaces other than its own whose Secrets
// one SDS subscription may ask for: each costs an access review.
const maxOtherNamespaces = 64

// otherNamespace returns the namespace of the Secret name asks for when it
// is a well-formed name of a namespace other than ns.
func otherNamespace(name, ns string) (string, bool) {
	sn := parseSecretName(name, ns)
	if sn.roots || !sn.wellFormed || sn.key.Namespace == ns {
		return "", false
	}
	return sn.key.Namespace, true
}

func has[K comparable](m map[K]struct{}, k K) bool {
	_, ok := m[k]
	return ok
}

// identityOf is the identity of wt's stream as its loop last told it
// (conn.identified): a claim that puts a proxy in conflict mid-stream (see
// proxyTracker.claim) applies to the watches parked before it too.
func (w *watcher) identityOf(wt *watch) authn.Identity { return w.streamIdentity(wt.rec) }

// secretName is what an SDS resource name asks for: roots (ROOTCA, or a
// trust domain's bundle as spiffe://<td>) or the stream's workload
// certificate ("default", see workloadCerts), or a Kubernetes Secret of the
// proxy's member, kubernetes://[<namespace>/]<name>[-cacert], the
// namespace defaulting to the proxy's own. With -cacert only a CA is
// served, as istiod does: of the Secret named <name>-cacert if there is
// one (Istio's separate CA Secret for gateway mTLS), else of <name>.
type secretName struct {
	roots      bool
	key        clusters.ServiceKey // the Secret; zero for roots
	caOnly     bool
	caKey      clusters.ServiceKey // with caOnly: the Secret <name>-cacert, tried first
	wellFormed bool                // a real namespace and Secret name (or roots)
}

// keys are the Secrets whose change can change what the name gets.
func (sn secretName) keys() []clusters.ServiceKey {
	if sn.caOnly {
		return []clusters.ServiceKey{sn.caKey, sn.key}
	}
	return []clusters.ServiceKey{sn.key}
}

// parseSecretName reads an SDS resource name as the proxy of namespace ns
// means it, for the Secrets of its member (kubernetes://…, a bare name,
// Istio's -cacert suffix): what indexing which watches a Secret's change
// can affect, and serving such a name, read. Roots (ROOTCA, spiffe://…)
// and the workload certificate ("default") are no Secret: it reports them
// as such, and secret serves them itself.
func parseSecretName(name, ns string) secretName {
	if name == xdsgen.SDSRoots || name == xdsgen.SDSWorkloadCert || strings.HasPrefix(name, "spiffe://") {
		// The workload certificate ("default", as Istio names it) changes
		// with our CA, as roots do, and when due for renewal.
		return secretName{roots: true, wellFormed: true}
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
	sn := secretName{key: clusters.ServiceKey{Namespace: ns, Name: strings.TrimSuffix(secret, "-cacert")}, caOnly: caOnly, wellFormed: ok}
	if caOnly {
		sn.caKey = clusters.ServiceKey{Namespace: ns, Name: secret}
	}
	return sn
}

// secret builds one SDS resource for id, or says why not. consulted is the
// access review it asked, if it asked one: a new decision for it
// re-evaluates the watch.
func (w *watcher) secret(id authn.Identity, name string) (_ proto.Message, consulted *feed.ReviewKey, _ error) {
	if w.roots == nil || w.secrets == nil {
		return nil, nil, errors.New("SDS is not configured on this hub")
	}
	local := w.roots.LocalTrustDomain()
	if !id.Verified(local) {
		return nil, nil, fmt.Errorf("%w: secrets are served only to a verified workload identity of %s over mTLS", errDenied, local)
	}
	validation := func(pem []byte) *tlsv3.Secret {
		return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: pem}},
		}}}
	}
	switch {
	case name == "ROOTCA":
		pem, ok := w.roots.RootsPEM(local)
		if !ok {
			return nil, nil, errors.New("our roots are not loaded yet")
		}
		return validation(pem), nil, nil
	case strings.HasPrefix(name, "spiffe://"):
		td, err := spiffeid.TrustDomainFromString(name)
		if err != nil {
			return nil, nil, fmt.Errorf("bad trust domain resource: %w", err)
		}
		pem, ok := w.roots.RootsPEM(td.Name())
		if !ok {
			return nil, nil, fmt.Errorf("no bundle for trust domain %s", td.Name())
		}
		return validation(pem), nil, nil
	}
	if id.Cluster == "" {
		return nil, nil, fmt.Errorf("%w: %s proves no member cluster (a certificate needs our CA's member binding, or use a service-account token): Kubernetes Secrets are not served to it", errDenied, id.SpiffeID)
	}
	if id.Conflict != "" {
		return nil, nil, fmt.Errorf("%w: %s claims member %s but its certificate is bound to %s", errDenied, id.SpiffeID, clip.String(id.Conflict, 64), id.Cluster)
	}
	if err := w.scope.Allow(id.Cluster, id.Namespace); err != nil {
		if err.(*authn.ScopeError).Reason == authn.ScopeMemberNotSynced {
			return nil, nil, err // transient: served once the member syncs (SecretsSynced)
		}
		return nil, nil, fmt.Errorf("%w: %w", errDenied, err)
	}
	sn := parseSecretName(name, id.Namespace)
	if !sn.wellFormed {
		return nil, nil, fmt.Errorf("%w: %q does not name a Secret (kubernetes://[<namespace>/]<name>)", errDenied, clip.String(name, 256))
	}
	key := sn.key
	for _, k := range sn.keys() {
		if err := w.servable(k.Namespace, k.Name); err != nil {
			return nil, nil, err
		}
	}
	if key.Namespace != id.Namespace {
		// As istiod: another namespace only if the proxy's service account
		// may list Secrets there (SubjectAccessReview in its own member).
		if w.sar == nil {
			return nil, nil, fmt.Errorf("%w: %s may only read secrets of namespace %s", errDenied, id.SpiffeID, id.Namespace)
		}
		// Never waits: a review not decided yet is pending, and the watch
		// is re-evaluated when it is.
		review := feed.ReviewKey{Cluster: id.Cluster, SANamespace: id.Namespace, SA: authn.ServiceAccountOf(id.SpiffeID), Namespace: key.Namespace}
		consulted = &review
		ok, err := w.sar.decide(review)
		if err != nil {
			return nil, consulted, err // transient: the stream keeps what it has
		}
		if !ok {
			return nil, consulted, fmt.Errorf("%w: %s may not list secrets in namespace %s of cluster %s", errDenied, id.SpiffeID, key.Namespace, id.Cluster)
		}
	}
	if sn.caOnly {
		s, err := w.secrets.TLSSecret(id.Cluster, sn.caKey)
		if errors.Is(err, clusters.ErrSecretNotFound) {
			key = sn.key
			s, err = w.secrets.TLSSecret(id.Cluster, key)
		} else {
			key = sn.caKey
		}
		if err != nil {
			return nil, consulted, err
		}
		if len(s.CA) == 0 {
			return nil, consulted, fmt.Errorf("secret %s has no ca.crt or cacert", key)
		}
		return validation(s.CA), consulted, nil
	}
	s, err := w.secrets.TLSSecret(id.Cluster, key)
	if err != nil {
		return nil, consulted, err
	}
	if len(s.Cert) == 0 || len(s.Key) == 0 {
		return nil, consulted, fmt.Errorf("secret %s has no certificate and key", key)
	}
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: s.Cert}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: s.Key}},
	}}}, consulted, nil
}

// add puts k in the set *m, making it if needed.
func add[K comparable](m *map[K]struct{}, k K) {
	if *m == nil {
		*m = map[K]struct{}{}
	}
	(*m)[k] = struct{}{}
}
