package trust

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/hubmesh/hub/internal/dialguard"
	"github.com/hubmesh/hub/internal/expiry"
)

// PeerLabel marks a ConfigMap in the hub's namespace that declares a
// federation relationship (one per peer trust domain). `kubectl apply` of
// such a ConfigMap and PUT /api/v1/trustdomains/{td} are equivalent.
const PeerLabel = "hub.federation/peer"

// Keys of a peer ConfigMap. The accepted-* keys are written by the hub.
const (
	keyTrustDomain = "trustDomain"
	keyURL         = "bundleEndpointURL"
	keyProfile     = "profile"
	keyEndpointID  = "endpointSPIFFEID"
	keyBootstrap   = "bundle"
	keyCABundle    = "caBundle"
	keyAccepted    = "accepted-bundle"
)

// Refresh bounds: a peer's bundle is refreshed at the refresh hint it
// publishes (SPIFFE federation's refresh_hint), held within 10 s–1 h.
const (
	MinRefresh = 10 * time.Second
	MaxRefresh = time.Hour
	// OurRefreshHint is the hint our own bundle endpoint publishes.
	OurRefreshHint = MinRefresh
)

// PeerSpec is a federation relationship.
type PeerSpec struct {
	TrustDomain       string
	BundleEndpointURL string
	Profile           Profile
	EndpointSPIFFEID  string
	Bundle            string // https_spiffe bootstrap bundle (SPIFFE bundle JSON)
	CABundle          string // https_web roots (PEM), optional
}

// State of a trust domain.
type State string

// Trust domain states (docs/architecture.md §3.3).
const (
	StatePending State = "Pending"
	StateReady   State = "Ready"
	StateStale   State = "Stale"
	StateError   State = "Error"
)

// Status is what the hub reports about one trust domain.
type Status struct {
	Spec        PeerSpec
	Local       bool
	State       State
	Message     string
	LastFetch   time.Time
	LastSuccess time.Time
	NextRefresh time.Time
	Bundle      *spiffebundle.Bundle // nil until one is known
	// BundleExpiry is, for a peer, its bundle's first X.509 authority to
	// expire (zero while it has none), graded against Config.ExpiryWarning.
	BundleExpiry CertExpiry
	// CA is, for our own trust domain, when our CA's root and chain
	// expire (nil until the CA is loaded).
	CA *CAExpiry
}

// Config holds the Domains' dependencies.
type Config struct {
	Client      kubernetes.Interface // the home cluster
	Namespace   string
	TrustDomain spiffeid.TrustDomain
	Log         *slog.Logger
	// OnChange is called when any trust domain's roots change (may be nil).
	OnChange func()
	// IsLeader says whether this replica does the singleton writes
	// (persisting accepted peer bundles, our root's sequence); nil means
	// always.
	IsLeader func() bool
	// DNSNames are put on the hub's serving certificate next to its SPIFFE
	// ID (ParseDNSNames), for clients that verify a server by name
	// (istiod's SIMPLE TLS, istio-agent).
	DNSNames []string
	// EndpointGuard checks every address a peer's bundle endpoint is
	// fetched from (after name resolution) and IP literals in
	// bundleEndpointURL when a relationship is applied; nil means
	// DefaultEndpointGuard.
	EndpointGuard *dialguard.Guard
	// ExpiryWarning is how long before our CA or a peer's bundle expires
	// the hub warns (Events, the trust domain's status); 0 means seven
	// days.
	ExpiryWarning time.Duration
}

// Domains are the trust domains the hub trusts: ours (its CA, which signs
// every workload certificate the hub issues) and every peer trust domain
// we federate with (the bundles their endpoints served).
type Domains struct {
	cfg Config
	log *slog.Logger

	mu    sync.RWMutex
	local *caState
	peers map[string]*peer // by trust domain name

	// expiryKick wakes watchExpiry; expiryWarned is what it warned of.
	expiryKick   expiry.Kick
	expiryWarned expiry.Warned
}

type peer struct {
	spec   PeerSpec
	cmName string // the ConfigMap declaring it, where its accepted bundle is persisted
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{} // refresh now
	status Status
	// accepted is the last bundle the peer's endpoint served that passed
	// validation, or the persisted one until then (nil if neither).
	accepted *spiffebundle.Bundle
}

// New creates the Domains; Start loads our CA, Run starts federating.
func New(cfg Config) *Domains {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.EndpointGuard == nil {
		cfg.EndpointGuard = DefaultEndpointGuard
	}
	return &Domains{cfg: cfg, log: cfg.Log, peers: map[string]*peer{}, expiryKick: expiry.NewKick()}
}

// Start loads (or creates and persists) our CA. It must succeed before the
// bundle endpoint or the mTLS listener can serve. It runs again when the
// operator's CA Secret or the state Secret changes (the informer's
// reloadCA, e.g. a rotation another replica persisted) and when this
// replica becomes the leader (LeadershipGained: it then persists what only
// the leader writes). Stored CA material that
// cannot be read is a *CorruptStateError: nothing is written then, and
// retrying will not help.
func (f *Domains) Start(ctx context.Context) error {
	st, err := loadCA(ctx, f.cfg.Client.CoreV1().Secrets(f.cfg.Namespace), f.cfg.Namespace, f.cfg.TrustDomain, time.Now(), f.leader())
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.local = st
	f.mu.Unlock()
	return nil
}

// Run watches the CA Secrets and the peer ConfigMaps until ctx is done.
func (f *Domains) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(f.cfg.Client, 0, informers.WithNamespace(f.cfg.Namespace))
	cms := factory.Core().V1().ConfigMaps()
	secrets := factory.Core().V1().Secrets()
	reconcilePeers := func(any) { f.reconcilePeers(ctx, cms.Lister().ConfigMaps(f.cfg.Namespace).List) }
	if _, err := cms.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: reconcilePeers, UpdateFunc: func(_, o any) { reconcilePeers(o) }, DeleteFunc: reconcilePeers}); err != nil {
		return err
	}
	reloadCA := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		// cacerts is the operator's CA; the state Secret changes when the
		// leader (possibly another replica) persisted a rotation.
		if s, ok := obj.(*corev1.Secret); ok && (s.Name == PluggedCASecret || s.Name == StateSecret) {
			if err := f.Start(ctx); err != nil {
				f.log.Error("reloading our CA", "trustDomain", f.cfg.TrustDomain.Name(), "error", err)
				return
			}
			f.log.Info("CA reloaded", "trustDomain", f.cfg.TrustDomain.Name())
			f.changed()
		}
	}
	if _, err := secrets.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: reloadCA, UpdateFunc: func(_, o any) { reloadCA(o) }, DeleteFunc: reloadCA}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	expiryDone := make(chan struct{})
	go func() {
		defer close(expiryDone)
		f.watchExpiry(ctx)
	}()
	<-ctx.Done()
	<-expiryDone
	factory.Shutdown()
	f.mu.Lock()
	peers := f.peers
	f.peers = map[string]*peer{}
	f.mu.Unlock()
	for _, p := range peers {
		p.cancel()
		<-p.done
	}
	return nil
}

func (f *Domains) leader() bool { return f.cfg.IsLeader == nil || f.cfg.IsLeader() }

// LeadershipGained persists what only the leader writes and what this
// replica may have learnt while it was a follower: our roots and sequence
// if its view of them was ahead of the stored state, and every peer's last
// accepted bundle that differs from the one stored in the peer's ConfigMap.
func (f *Domains) LeadershipGained(ctx context.Context) {
	if err := f.Start(ctx); err != nil {
		f.log.Error("persisting our CA state as the new leader", "trustDomain", f.cfg.TrustDomain.Name(), "error", err)
	}
	type pending struct {
		td, cmName string
		bundle     *spiffebundle.Bundle
	}
	var todo []pending
	f.mu.RLock()
	for td, p := range f.peers {
		if p.accepted != nil {
			todo = append(todo, pending{td, p.cmName, p.accepted})
		}
	}
	f.mu.RUnlock()
	for _, p := range todo {
		if err := f.persist(ctx, p.cmName, p.bundle); err != nil && ctx.Err() == nil {
			f.log.Warn("persisting accepted peer bundle as the new leader", "trustDomain", p.td, "configMap", p.cmName, "error", err)
		}
	}
}

func (f *Domains) changed() {
	f.expiryKick.Now()
	if f.cfg.OnChange != nil {
		f.cfg.OnChange()
	}
}

func specFrom(cm *corev1.ConfigMap) PeerSpec {
	td := cm.Data[keyTrustDomain]
	if id, err := spiffeid.TrustDomainFromString(td); err == nil {
		td = id.Name()
	}
	return PeerSpec{
		TrustDomain: td, BundleEndpointURL: cm.Data[keyURL], Profile: Profile(cm.Data[keyProfile]),
		EndpointSPIFFEID: cm.Data[keyEndpointID], Bundle: cm.Data[keyBootstrap], CABundle: cm.Data[keyCABundle],
	}
}

// reconcilePeers starts, restarts or stops peer loops to match the ConfigMaps.
func (f *Domains) reconcilePeers(ctx context.Context, list func(labels.Selector) ([]*corev1.ConfigMap, error)) {
	cms, err := list(labels.SelectorFromSet(labels.Set{PeerLabel: "true"}))
	if err != nil {
		return
	}
	// One relationship per trust domain, keyed by its parsed name; invalid
	// ones and our own domain are skipped; of two ConfigMaps for one trust
	// domain the lower name wins, so the choice is stable.
	want := map[string]*corev1.ConfigMap{}
	for _, cm := range cms {
		td, err := spiffeid.TrustDomainFromString(cm.Data[keyTrustDomain])
		switch {
		case err != nil:
			f.log.Warn("ignoring federation config with an invalid trust domain", "configMap", cm.Name, "error", err)
			continue
		case td == f.cfg.TrustDomain:
			f.log.Warn("ignoring federation config for our own trust domain", "configMap", cm.Name)
			continue
		}
		if prev, ok := want[td.Name()]; ok && prev.Name < cm.Name {
			f.log.Warn("two federation configs for one trust domain; using the first by name", "trustDomain", td.Name(), "using", prev.Name, "ignoring", cm.Name)
			continue
		}
		want[td.Name()] = cm
	}
	f.mu.Lock()
	var stop []*peer
	carried := map[string]*spiffebundle.Bundle{} // a changed spec keeps serving the roots it had
	for td, p := range f.peers {
		if cm, ok := want[td]; !ok || specFrom(cm) != p.spec {
			stop = append(stop, p)
			delete(f.peers, td)
			if ok && p.status.Bundle != nil {
				carried[td] = p.status.Bundle
			}
		}
	}
	var start []*peer
	for td, cm := range want {
		if _, ok := f.peers[td]; ok {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		p := &peer{spec: specFrom(cm), cmName: cm.Name, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1),
			status: Status{Spec: specFrom(cm), State: StatePending, Bundle: carried[td]}}
		f.peers[td] = p
		start = append(start, p)
		go f.runPeer(pctx, p, cm.Data[keyAccepted])
	}
	f.mu.Unlock()
	for _, p := range stop {
		p.cancel()
		<-p.done
	}
	if len(stop) > 0 || len(start) > 0 {
		f.changed()
	}
}

// runPeer fetches one peer's bundle, honouring its refresh hint within
// [MinRefresh, MaxRefresh], with jittered exponential backoff on errors.
// The last accepted bundle is kept across peer outages and, by the leader,
// persisted in the peer's ConfigMap so that it survives restarts (a
// follower's is persisted when it gains leadership; a failed write is tried
// again after the next successful fetch).
func (f *Domains) runPeer(ctx context.Context, p *peer, persisted string) {
	defer close(p.done)
	log := f.log.With("trustDomain", p.spec.TrustDomain)
	ep, auth, err := peerEndpoint(p.spec, f.cfg.EndpointGuard)
	if auth != nil {
		f.setStatus(p, func(s *Status) { s.Bundle = auth })
	}
	if err != nil {
		f.setStatus(p, func(s *Status) { s.State, s.Message = StateError, err.Error() })
		return
	}
	var last *spiffebundle.Bundle
	if persisted != "" {
		if b, err := Validate(ep.TrustDomain, []byte(persisted), nil); err == nil {
			last, auth = b, b
			f.setStatus(p, func(s *Status) {
				s.Bundle, s.State, s.Message = b, StateStale, "using the last accepted bundle until the peer answers"
			})
			f.mu.Lock()
			p.accepted = b
			f.mu.Unlock()
			f.changed()
		}
	}
	backoff := time.Second
	stored := last != nil // last is what the ConfigMap holds
	for {
		b, err := Fetch(ctx, ep, auth, last)
		now := time.Now()
		var wait time.Duration
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			wait = backoff/2 + rand.N(backoff/2+1)
			backoff = min(backoff*2, 5*time.Minute)
			f.fetchFailed(p, log, err, last != nil, now, wait)
		} else {
			backoff = time.Second
			wait = MaxRefresh
			if hint, ok := b.RefreshHint(); ok {
				wait = min(max(hint, MinRefresh), MaxRefresh)
			}
			changed := last == nil || !last.Equal(b)
			last, auth = b, b // bootstrap roots are replaced by what the peer serves
			for _, w := range Warnings(b, now) {
				log.Warn("peer bundle accepted with a warning", "warning", w)
			}
			f.setStatus(p, func(s *Status) {
				s.Bundle, s.State, s.Message = b, StateReady, ""
				s.LastFetch, s.LastSuccess, s.NextRefresh = now, now, now.Add(wait)
			})
			f.mu.Lock()
			p.accepted = b
			f.mu.Unlock()
			if changed {
				stored = false
			}
			if !stored && f.leader() {
				if err := f.persist(ctx, p.cmName, b); err != nil {
					if ctx.Err() != nil {
						return
					}
					log.Warn("persisting accepted peer bundle; trying again after the next fetch", "configMap", p.cmName, "error", err)
				} else {
					stored = true
				}
			}
			if changed {
				f.changed()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-time.After(wait):
		}
	}
}

// peerEndpoint is where and how a peer's bundle is fetched, from its spec,
// and the bundle that authenticates its endpoint first (nil: none yet);
// an error says what in the spec is invalid (the bootstrap bundle, if it
// was read before, is returned with it).
func peerEndpoint(spec PeerSpec, guard *dialguard.Guard) (Endpoint, *spiffebundle.Bundle, error) {
	td, err := spiffeid.TrustDomainFromString(spec.TrustDomain)
	if err != nil {
		return Endpoint{}, nil, fmt.Errorf("invalid trust domain: %w", err)
	}
	ep := Endpoint{TrustDomain: td, URL: spec.BundleEndpointURL, Profile: spec.Profile, Guard: guard}
	var auth *spiffebundle.Bundle
	if spec.Profile == ProfileHTTPSSPIFFE {
		if ep.EndpointID, err = spiffeid.FromString(spec.EndpointSPIFFEID); err != nil {
			return Endpoint{}, nil, fmt.Errorf("invalid endpointSPIFFEID: %w", err)
		}
		if spec.Bundle != "" {
			if auth, err = spiffebundle.Parse(td, []byte(spec.Bundle)); err != nil {
				return Endpoint{}, nil, fmt.Errorf("invalid bootstrap bundle: %w", err)
			}
		}
	}
	if spec.CABundle != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(spec.CABundle)) {
			return Endpoint{}, auth, errors.New("caBundle holds no PEM certificates")
		}
		ep.Roots = pool
	}
	return ep, auth, nil
}

// fetchFailed records a failed fetch of p's bundle at now, tried again
// after wait: the peer is Stale while a bundle it served before is kept
// (stale), else in Error.
func (f *Domains) fetchFailed(p *peer, log *slog.Logger, err error, stale bool, now time.Time, wait time.Duration) {
	reason := "other"
	if fe := (*FetchError)(nil); errors.As(err, &fe) {
		reason = fe.Reason
	}
	log.Warn("peer bundle rejected", "reason", reason, "error", err, "retry", wait.Round(time.Second).String())
	f.setStatus(p, func(s *Status) {
		s.LastFetch, s.NextRefresh, s.Message = now, now.Add(wait), err.Error()
		if stale {
			s.State = StateStale // keep serving the last accepted bundle
		} else {
			s.State = StateError
		}
	})
}

func (f *Domains) setStatus(p *peer, change func(*Status)) {
	f.mu.Lock()
	change(&p.status)
	f.mu.Unlock()
}

// persist writes b as the accepted bundle of its trust domain into
// ConfigMap cmName, re-reading and retrying on conflicts. It writes nothing
// when the ConfigMap already holds b or a bundle with a higher sequence
// number (a newer one stored by an earlier leader), and nothing when the
// ConfigMap is gone or now declares another trust domain. Callers check
// leadership.
func (f *Domains) persist(ctx context.Context, cmName string, b *spiffebundle.Bundle) error {
	data, err := b.Marshal()
	if err != nil {
		return fmt.Errorf("encoding the bundle of %s: %w", b.TrustDomain().Name(), err)
	}
	cms := f.cfg.Client.CoreV1().ConfigMaps(f.cfg.Namespace)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, cmName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil // the relationship was removed
		}
		if err != nil {
			return err
		}
		if td, err := spiffeid.TrustDomainFromString(cm.Data[keyTrustDomain]); err != nil || td != b.TrustDomain() {
			return nil
		}
		if stored, err := Validate(b.TrustDomain(), []byte(cm.Data[keyAccepted]), nil); err == nil {
			storedSeq, ok1 := stored.SequenceNumber()
			seq, ok2 := b.SequenceNumber()
			if stored.Equal(b) || (ok1 && ok2 && storedSeq > seq) {
				return nil
			}
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[keyAccepted] = string(data)
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("persisting the accepted bundle of %s in ConfigMap %s/%s: %w", b.TrustDomain().Name(), f.cfg.Namespace, cmName, err)
	}
	return nil
}

// Refresh asks a peer's loop to fetch now.
func (f *Domains) Refresh(td string) bool {
	f.mu.RLock()
	p := f.peers[td]
	f.mu.RUnlock()
	if p == nil {
		return false
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return true
}

// LocalBundle is our trust domain's bundle: every trusted root, sequence
// and refresh hint.
func (f *Domains) LocalBundle() (*spiffebundle.Bundle, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.local == nil {
		return nil, errors.New("our CA is not loaded yet")
	}
	b := spiffebundle.FromX509Authorities(f.cfg.TrustDomain, f.local.roots)
	b.SetSequenceNumber(f.local.sequence)
	b.SetRefreshHint(OurRefreshHint)
	return b, nil
}

// GetBundleForTrustDomain implements spiffebundle.Source: ours, or a peer's
// last accepted (or bootstrap) bundle.
func (f *Domains) GetBundleForTrustDomain(td spiffeid.TrustDomain) (*spiffebundle.Bundle, error) {
	if td == f.cfg.TrustDomain {
		return f.LocalBundle()
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if p := f.peers[td.Name()]; p != nil && p.status.Bundle != nil {
		return p.status.Bundle, nil
	}
	return nil, fmt.Errorf("no bundle for trust domain %q", td)
}

// GetX509BundleForTrustDomain implements x509bundle.Source, for verifying
// client certificates of any federated trust domain.
func (f *Domains) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	b, err := f.GetBundleForTrustDomain(td)
	if err != nil {
		return nil, err
	}
	return b.X509Bundle(), nil
}

// LocalTrustDomain is our trust domain's name.
func (f *Domains) LocalTrustDomain() string { return f.cfg.TrustDomain.Name() }

// RootsPEM returns a trust domain's X.509 roots as PEM (for SDS ROOTCA and
// spiffe://<td> validation contexts).
func (f *Domains) RootsPEM(td string) ([]byte, bool) {
	id, err := spiffeid.TrustDomainFromString(td)
	if err != nil {
		return nil, false
	}
	b, err := f.GetBundleForTrustDomain(id)
	if err != nil || len(b.X509Authorities()) == 0 {
		return nil, false
	}
	return encodeCerts(b.X509Authorities()), true
}

// TrustDomains lists ours first, then every peer by name, with what
// expires when (Status.CA, Status.BundleExpiry).
func (f *Domains) TrustDomains() []Status {
	now := time.Now()
	local := Status{Spec: PeerSpec{TrustDomain: f.cfg.TrustDomain.Name()}, Local: true, State: StatePending}
	if b, err := f.LocalBundle(); err == nil {
		local.State, local.Bundle = StateReady, b
	}
	f.mu.RLock()
	out := []Status{local}
	for _, p := range f.peers {
		out = append(out, p.status)
	}
	f.mu.RUnlock()
	for i := range out {
		out[i] = f.withExpiry(out[i], now)
	}
	sort.Slice(out[1:], func(i, j int) bool { return out[i+1].Spec.TrustDomain < out[j+1].Spec.TrustDomain })
	return out
}

// IssueSVID signs an SVID with our CA, with DNS names if given.
func (f *Domains) IssueSVID(id spiffeid.ID, ttl time.Duration, dnsNames ...string) (*x509svid.SVID, error) {
	f.mu.RLock()
	st := f.local
	f.mu.RUnlock()
	if st == nil {
		return nil, errors.New("our CA is not loaded yet")
	}
	return st.ca.IssueSVID(id, ttl, dnsNames...)
}

// ServingCertificate returns a GetCertificate callback that serves an SVID
// for spiffe://<td>/hub with Config.DNSNames, reissued when half of its
// lifetime has passed.
func (f *Domains) ServingCertificate() func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	var mu sync.Mutex
	var cur *tls.Certificate
	var renewAt time.Time
	id := spiffeid.RequireFromPath(f.cfg.TrustDomain, "/hub")
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		if cur != nil && time.Now().Before(renewAt) {
			return cur, nil
		}
		svid, err := f.IssueSVID(id, 24*time.Hour, f.cfg.DNSNames...)
		if err != nil {
			return nil, err
		}
		cert := &tls.Certificate{PrivateKey: svid.PrivateKey, Leaf: svid.Certificates[0]}
		for _, c := range svid.Certificates {
			cert.Certificate = append(cert.Certificate, c.Raw)
		}
		lifetime := svid.Certificates[0].NotAfter.Sub(svid.Certificates[0].NotBefore)
		cur, renewAt = cert, svid.Certificates[0].NotBefore.Add(lifetime/2)
		return cur, nil
	}
}

// ServeBundleEndpoint serves our bundle on lis until ctx is done, with the
// https_spiffe profile (an SVID for spiffe://<td>/hub) or, if webCert is
// set, https_web.
func (f *Domains) ServeBundleEndpoint(ctx context.Context, lis net.Listener, webCert *tls.Certificate) error {
	h, err := federation.NewHandler(f.cfg.TrustDomain, f)
	if err != nil {
		return err
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: f.ServingCertificate()}
	if webCert != nil {
		tlsCfg.GetCertificate = nil
		tlsCfg.Certificates = []tls.Certificate{*webCert}
	}
	// The bundle is a small document served to anyone: every phase of a
	// connection is bounded so that slow or idle clients cannot hold it.
	srv := &http.Server{Handler: h, TLSConfig: tlsCfg,
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ServeTLS(lis, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the bundle endpoint on %s: %w", lis.Addr(), err)
	}
	return nil
}

// ServerTLSConfig is the TLS configuration of the mTLS xDS listener: it
// serves an SVID for spiffe://<td>/hub and, like istiod's PeerCertVerifier,
// accepts a client certificate only if it chains to the bundle of the trust
// domain in its own SPIFFE ID (ours or a federated peer's), unexpired.
// Clients without a certificate may connect; they get no verified identity.
func (f *Domains) ServerTLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: f.ServingCertificate(),
		ClientAuth:     tls.RequestClientCert,
		// VerifyConnection, unlike VerifyPeerCertificate, also runs on
		// resumed sessions, so a removed peer's clients cannot resume.
		VerifyConnection: func(cs tls.ConnectionState) error {
			certs := cs.PeerCertificates
			if len(certs) == 0 {
				return nil
			}
			id, _, err := x509svid.Verify(certs, f)
			if err != nil {
				f.log.Warn("xDS client certificate rejected", "subject", certs[0].Subject.String(), "error", err)
				return fmt.Errorf("client certificate rejected: %w", err)
			}
			f.log.Debug("xDS client certificate accepted", "spiffeID", id.String())
			return nil
		},
	}
}

// CertSHA256 is the lowercase hex SHA-256 of a certificate's DER bytes.
func CertSHA256(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}
