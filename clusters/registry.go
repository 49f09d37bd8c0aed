// Package clusters manages mesh membership: it watches remote Secrets
// (labelled istio/multiCluster=true) in the home cluster, runs one Cluster per
// member with its own endpoint controller, and hands every member's services
// to a Sink. For the hub it also keeps, per member: its Secrets for SDS,
// its token and access reviews, which identities it may assert (identity
// scopes), its networks and gateways, what it exports and imports, its
// mesh pods' service accounts, and when its credentials expire. It knows
// nothing of xDS.
package clusters

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/hubmesh/hub/internal/expiry"
)

// MultiClusterLabel marks a Secret whose data keys are cluster IDs and whose
// values are kubeconfigs (Istio's remote-secret format).
const MultiClusterLabel = "istio/multiCluster"

// SecretEvents is told when members' Secrets change.
type SecretEvents interface {
	// SecretChanged: one Secret of a member changed or went away.
	SecretChanged(cluster string, key ServiceKey)
	// SecretsSynced: a member's Secret cache (re)synced, the member
	// switched to its new client (kubeconfig rotation), first synced, or
	// its remote Secret's identity annotations changed (IdentityScope), so
	// any of its Secrets may differ from what was served before.
	SecretsSynced(cluster string)
}

// stateNamespace is where the Registry keeps its own state.
func (c Config) stateNamespace() string {
	if c.StateNamespace != "" {
		return c.StateNamespace
	}
	return c.Namespace
}

// Config holds the Registry's dependencies.
type Config struct {
	// Home is the home cluster: it holds the remote Secrets and is a member itself.
	Home *rest.Config
	// HomeID is the home cluster's own cluster ID.
	HomeID string
	// HomeGatewayNamespaces names the home cluster's namespaces, besides
	// SystemNamespace, whose Services may be its gateways (what
	// AnnotationGatewayNamespaces says of a member), comma-separated.
	HomeGatewayNamespaces string
	// Namespace is where remote Secrets live (and their Events go).
	Namespace string
	// StateNamespace is the hub's own namespace, where member views are
	// persisted; empty means Namespace.
	StateNamespace string
	// SyncTimeout is how long a member may take to sync before it stops
	// blocking readiness.
	SyncTimeout time.Duration
	// Policy says what remote kubeconfigs may contain beyond inline credentials.
	Policy KubeconfigPolicy
	// ExportMode says which Services of every member, the home cluster
	// included, are exported ("": ExportAll).
	ExportMode ExportMode
	// ServiceExportPoll is how often a member that does not serve
	// ServiceExports is asked again (export mode serviceexport; 0: 30 s).
	ServiceExportPoll time.Duration
	// Sink receives every member's services.
	Sink Sink
	// SecretEvents, if set, is told when members' Secrets change (SDS
	// uses it to push TLS material again).
	SecretEvents SecretEvents
	// DemoteUnhealthy says the hub serves the endpoints of members that
	// are not healthy behind the others' (Status.Demoted says so).
	DemoteUnhealthy bool
	// States, if set, is told every state change of each member's
	// current client (not of a kubeconfig candidate still syncing).
	States StateObserver
	// Metrics, if set, gets the membership metrics.
	Metrics prometheus.Registerer
	// Log is the logger; nil means slog.Default().
	Log *slog.Logger
	// IsLeader says whether this replica records Events and persists
	// member views (one replica does, so that N replicas do not write N
	// copies); nil means always.
	IsLeader func() bool
	// ExpiryWarning is how long before a member's credential expires the
	// hub warns (an Event on its remote Secret, its status); 0 means
	// seven days.
	ExpiryWarning time.Duration
}

// Registry is the set of member clusters, driven by remote Secrets.
type Registry struct {
	// peersMu serialises refreshPeerGateways.
	peersMu sync.Mutex
	// settledOnce, settleMu and settleCheck are settled's memo.
	settledOnce atomic.Bool
	settleMu    sync.Mutex
	settleCheck time.Time
	cfg         Config
	log         *slog.Logger
	deps        clusterDeps
	homeClient  kubernetes.Interface
	home        *Cluster
	queue       workqueue.TypedRateLimitingInterface[string] // namespace/name of remote Secrets
	recorder    record.EventRecorder
	transitions *prometheus.CounterVec
	// expiryKick wakes watchExpiry; expiryWarned is what it warned of.
	expiryKick   expiry.Kick
	expiryWarned expiry.Warned

	secrets       corelisters.SecretLister
	secretsSynced cache.InformerSynced
	views         *viewPersister // wraps cfg.Sink; persists and restores member views
	exports       *exportStatus  // wraps views in export mode serviceexport (else nil)

	mu      sync.Mutex
	history map[string][]Transition      // by cluster ID, newest last, at most maxHistory
	members map[string]*member           // by cluster ID: the Secret key that owns the ID
	extra   map[string]map[string]Status // by Secret: keys that run no cluster (invalid, conflicting, ignored)
	// reconciled are the remote Secrets (namespace/name) reconciled at
	// least once, whatever the outcome: readiness waits for every listed
	// one, so that its members exist before anything is served.
	reconciled map[string]struct{}
}

// member is a cluster ID owned by one Secret key.
type member struct {
	secret string
	ref    *corev1.ObjectReference // the Secret, for Events
	active *Cluster                // serves the member's services
	// next is the client for a changed kubeconfig; it replaces active once
	// it has synced (make-before-break).
	next *Cluster
	// rejected is set when the Secret's current kubeconfig for this ID was
	// rejected while the previous, valid one keeps serving.
	rejected string
	// identity is the Secret's identity annotations (IdentityScope).
	identity identityAnnotations
}

// NewRegistry creates a Registry. Call Run to start it.
func NewRegistry(cfg Config) (*Registry, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if err := ValidateClusterID(cfg.HomeID); err != nil {
		return nil, fmt.Errorf("home cluster: %w", err)
	}
	homeClient, err := kubernetes.NewForConfig(cfg.Home)
	if err != nil {
		return nil, fmt.Errorf("building home cluster client: %w", err)
	}
	// The Sink chain, from the members towards cfg.Sink: the export
	// status (serviceexport mode), then the view persister.
	views, err := newViewPersister(cfg, homeClient)
	if err != nil {
		return nil, err
	}
	var sink Sink = views
	var exports *exportStatus
	if cfg.ExportMode == ExportServiceExport {
		exports = newExportStatus(views, cfg.Log)
		exports.isLeader = cfg.IsLeader
		sink = exports
	}
	r := &Registry{
		views:      views,
		exports:    exports,
		cfg:        cfg,
		log:        cfg.Log,
		deps:       clusterDeps{sink: sink, timeout: cfg.SyncTimeout, log: cfg.Log, secretEvents: cfg.SecretEvents, isLeader: cfg.IsLeader, exportMode: cfg.ExportMode, exportPoll: cfg.ServiceExportPoll},
		homeClient: homeClient,
		queue:      workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		members:    map[string]*member{},
		extra:      map[string]map[string]Status{},
		reconciled: map[string]struct{}{},
		history:    map[string][]Transition{},
		expiryKick: expiry.NewKick(),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_cluster_state_transitions_total",
			Help: "Member state changes, by member and new state.",
		}, []string{"cluster", "to"}),
	}
	r.deps.settled, r.deps.gatewaysChanged = r.settled, r.refreshPeerGateways
	home, err := newCluster(cfg.HomeID, "", &Kubeconfig{Config: cfg.Home, Server: cfg.Home.Host}, WatchScope{}, r.deps)
	if err != nil {
		return nil, err
	}
	home.setObserver(r.observer(nil, ""))
	home.net.setSecretNetworking(secretNetworking{gatewayNamespaces: cfg.HomeGatewayNamespaces})
	r.home = home
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(r.transitions); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
		if err := cfg.Metrics.Register(registryCollector{r}); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
		if err := cfg.Metrics.Register(expiryCollector{r}); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return r, nil
}

// Run watches remote Secrets and runs the members until ctx is done, then
// stops every member and returns.
func (r *Registry) Run(ctx context.Context) error {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	// Events go to their object's namespace: the remote Secrets' and, for
	// refused persisted views, the hub's own.
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.homeClient.CoreV1().Events(metav1.NamespaceAll)})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "hub"})
	r.mu.Lock()
	r.recorder = recorder
	r.mu.Unlock()
	// Before load; every replica reports the views it refuses.
	r.views.event = func(ref *corev1.ObjectReference, typ, reason, format string, args ...any) {
		recorder.Eventf(ref, typ, reason, format, args...)
	}

	factory := informers.NewSharedInformerFactoryWithOptions(r.homeClient, 0,
		informers.WithNamespace(r.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = MultiClusterLabel + "=true" }))
	inf := factory.Core().V1().Secrets()
	r.secrets = inf.Lister()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			r.queue.Add(key)
		}
	}
	reg, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	})
	if err != nil {
		return fmt.Errorf("watching remote secrets: %w", err)
	}
	r.mu.Lock()
	r.secretsSynced = reg.HasSynced
	r.mu.Unlock()

	r.home.start(ctx)
	factory.Start(ctx.Done())
	r.views.named = r.namedBySecret
	done, viewsDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(viewsDone)
		r.views.run(ctx)
	}()
	exportsDone := make(chan struct{})
	go func() {
		defer close(exportsDone)
		if r.exports != nil {
			r.exports.members = r.activeClusters
			r.exports.run(ctx)
		}
	}()
	go func() {
		defer close(done)
		r.views.load(ctx) // before any member starts, so each can be restored
		for r.processNext(ctx) {
		}
	}()
	expiryDone := make(chan struct{})
	go func() {
		defer close(expiryDone)
		r.watchExpiry(ctx)
	}()

	<-ctx.Done()
	r.queue.ShutDown()
	<-done
	<-viewsDone
	<-exportsDone
	<-expiryDone
	factory.Shutdown()
	r.home.stop()
	r.mu.Lock()
	members := r.members
	r.members = map[string]*member{}
	r.mu.Unlock()
	for _, m := range members {
		m.stop()
	}
	return nil
}

func (m *member) stop() {
	if m.next != nil {
		m.next.stop()
	}
	m.active.stop()
}

func (r *Registry) processNext(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(key)
	if ctx.Err() != nil {
		// Shutting down: the queue still hands out what it holds, which is
		// dropped, not reconciled with a cancelled context (that would
		// build member clients only to stop them, or remove members, on
		// the way out).
		return true
	}
	err := r.reconcile(ctx, key)
	r.mu.Lock()
	r.reconciled[key] = struct{}{}
	r.mu.Unlock()
	if err != nil {
		r.log.Error("reconciling remote secret", "secret", key, "error", err)
		r.queue.AddRateLimited(key)
		return true
	}
	r.queue.Forget(key)
	return true
}

// reconcile brings the members owned by one Secret in line with its data.
func (r *Registry) reconcile(ctx context.Context, key string) error {
	base, data, err := r.readRemoteSecret(key)
	if err != nil {
		return err
	}
	ref, ann, networking := base.ref, base.ann, base.networking
	freed, previous := r.removeUnlisted(key, data, ref)

	ids := make([]string, 0, len(data))
	for id := range data {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	extras := map[string]Status{}
	for _, id := range ids {
		k := base
		k.id, k.kubeconfig = id, data[id]
		st, ok := r.apply(ctx, k)
		if ok {
			continue
		}
		extras[id] = st
		if prev, seen := previous[id]; !seen || prev.State != st.State || prev.Message != st.Message {
			r.record(id, Transition{At: time.Now(), From: prev.State, To: st.State, Message: st.Message})
			r.event(ref, corev1.EventTypeWarning, "Cluster"+string(st.State), "cluster %s: %s", id, st.Message)
		}
	}
	r.mu.Lock()
	if len(extras) == 0 {
		delete(r.extra, key)
	} else {
		r.extra[key] = extras
	}
	// IDs this Secret no longer lists: forget their history unless another
	// Secret still lists them, so removed clusters leave nothing behind.
	gone := freed
	for id := range previous {
		if _, still := extras[id]; !still {
			gone = append(gone, id)
		}
	}
	r.pruneHistoryLocked(gone)
	rescoped := r.setIdentityLocked(key, ann)
	var clients []*Cluster
	for _, m := range r.members {
		if m.secret == key {
			clients = append(clients, m.active)
			if m.next != nil {
				clients = append(clients, m.next)
			}
		}
	}
	r.mu.Unlock()
	for _, c := range clients {
		c.net.setSecretNetworking(networking)
	}
	r.refreshPeerGateways() // members may have come or gone
	r.identityChanged(key, ann, rescoped)
	r.expiryKick.Now()
	// A freed ID may let a conflicting Secret take over.
	if len(freed) > 0 {
		r.requeueConflicts(key)
	}
	return nil
}

// readRemoteSecret reads remote Secret key: what every one of its data keys
// shares (an applyKey without id and kubeconfig) and its data; a Secret
// that is gone reads as one without data.
func (r *Registry) readRemoteSecret(key string) (applyKey, map[string][]byte, error) {
	base := applyKey{secret: key}
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return base, nil, err
	}
	secret, err := r.secrets.Secrets(ns).Get(name)
	switch {
	case apierrors.IsNotFound(err):
		return base, nil, nil
	case err != nil:
		return base, nil, fmt.Errorf("reading secret: %w", err)
	}
	base.ref = &corev1.ObjectReference{Kind: "Secret", APIVersion: "v1", Namespace: ns, Name: name, UID: secret.UID}
	base.ann = readIdentityAnnotations(secret)
	base.networking = secretNetworking{gateways: secret.Annotations[AnnotationGateways], network: secret.Annotations[AnnotationNetwork],
		gatewayNamespaces: secret.Annotations[AnnotationGatewayNamespaces], proxylessALPN: secret.Annotations[AnnotationProxylessALPN]}
	base.scope, base.scopeErr = readWatchScope(secret.Annotations)
	return base, secret.Data, nil
}

// removeUnlisted stops the members Secret key owns under IDs its data no
// longer lists and drops their services (the changes worked out under the
// lock, the clusters stopped outside it). It returns the freed IDs and the
// statuses the Secret's other keys had.
func (r *Registry) removeUnlisted(key string, data map[string][]byte, ref *corev1.ObjectReference) (freed []string, previous map[string]Status) {
	var removed []*member
	r.mu.Lock()
	for id, m := range r.members {
		if _, ok := data[id]; m.secret == key && !ok {
			delete(r.members, id)
			removed = append(removed, m)
			freed = append(freed, id)
		}
	}
	previous = r.extra[key]
	r.mu.Unlock()
	for i, m := range removed {
		m.stop()
		r.deps.sink.RemoveCluster(freed[i])
		r.transitions.DeletePartialMatch(prometheus.Labels{"cluster": freed[i]})
		r.log.Info("cluster removed", "cluster", freed[i], "secret", key)
		r.event(ref, corev1.EventTypeNormal, "ClusterRemoved", "cluster %s removed", freed[i])
	}
	return freed, previous
}

// apply starts, keeps or replaces the member for one data key. It returns
// ok=false with a status when the key runs no cluster of its own.
//
// A member's client is its kubeconfig and its WatchScope: a change of
// either starts a new client, make-before-break; a scope annotation that
// is not understood is refused like a kubeconfig that is not (scopeErr).
func (r *Registry) apply(ctx context.Context, key applyKey) (Status, bool) {
	return r.act(ctx, key, r.plan(key))
}

// applyKey is one data key of a remote Secret, as reconcile read it.
type applyKey struct {
	secret     string
	ref        *corev1.ObjectReference
	ann        identityAnnotations
	networking secretNetworking
	scope      WatchScope
	scopeErr   error
	id         string
	kubeconfig []byte
}

// applyKind is what applying a key comes to.
type applyKind int

const (
	applyRefused   applyKind = iota // the key runs no cluster: status says why
	applyRejected                   // its kubeconfig or scope is refused; the running client keeps serving
	applyUnchanged                  // the running client (or the candidate) already runs it
	applyAdded                      // a new member
	applyReplaced                   // a new client syncs beside the running one, then replaces it
)

// applyPlan is what applying a key will do, decided from the registry's
// state and the key alone (plan changes nothing but logs what it refuses);
// act does it.
type applyPlan struct {
	kind     applyKind
	status   Status
	existing *member // the member of the ID, nil when new
	// takeOver: the key's Secret is older than existing's, so it owns the
	// ID (make-before-break; the displaced Secret is reconciled again).
	takeOver bool
	kc       *Kubeconfig
	// With applyRejected: why, and the Event's reason and words.
	rejected     error
	reason, what string
	// What plan saw the member's clients run (kc): the running one, and
	// the candidate. A candidate that promoted itself since makes act
	// plan again.
	active, candidate bool
}

// plan decides what applying k does, reading the registry's state. Only
// the registry's worker applies keys, so what plan read still holds when
// act runs.
func (r *Registry) plan(k applyKey) applyPlan {
	p := applyPlan{status: Status{ID: k.id, Secret: k.secret}}
	refuse := func(state State, msg string, logMsg string, args ...any) applyPlan {
		p.kind, p.status.State, p.status.Message = applyRefused, state, msg
		r.log.Warn(logMsg, args...)
		return p
	}
	if k.id == r.cfg.HomeID {
		return refuse(StateInvalid, fmt.Sprintf("cluster ID %q is the home cluster's own ID; key ignored", k.id),
			"remote secret lists the home cluster; key ignored", "cluster", k.id, "secret", k.secret)
	}
	if err := ValidateClusterID(k.id); err != nil {
		return refuse(StateInvalid, err.Error(), "invalid cluster ID in remote secret", "secret", k.secret, "error", err)
	}
	r.mu.Lock()
	p.existing = r.members[k.id]
	r.mu.Unlock()
	if p.existing != nil && p.existing.secret != k.secret {
		// The older Secret owns the ID, whatever order the hub saw them in
		// (after a restart the newer one may have been reconciled first).
		if !r.olderSecret(k.secret, p.existing.secret) {
			return refuse(StateConflict, fmt.Sprintf("cluster ID %q is already registered by secret %s", k.id, p.existing.secret),
				"duplicate cluster ID", "cluster", k.id, "secret", k.secret, "owner", p.existing.secret)
		}
		p.takeOver = true
	}
	p.reason, p.what = "KubeconfigRejected", "new kubeconfig rejected"
	kc, err := r.cfg.Policy.ParseKubeconfig(k.kubeconfig)
	if err == nil && k.scopeErr != nil {
		err, p.reason, p.what = k.scopeErr, "WatchScopeRejected", "new watch scope rejected"
	}
	switch {
	case err != nil && p.existing == nil:
		return refuse(StateInvalid, err.Error(), "rejected kubeconfig", "cluster", k.id, "secret", k.secret, "error", err)
	case err != nil:
		p.kind, p.rejected = applyRejected, err
		return p
	}
	p.kc = kc
	if p.existing == nil {
		p.kind = applyAdded
		return p
	}
	r.mu.Lock()
	p.active, p.candidate = p.existing.runs(kc, k.scope)
	r.mu.Unlock()
	p.kind = applyReplaced
	if p.active || p.candidate {
		p.kind = applyUnchanged
	}
	return p
}

// runs reports whether the member's running client, and its candidate,
// run kc and scope; with Registry.mu held.
func (m *member) runs(kc *Kubeconfig, scope WatchScope) (active, candidate bool) {
	return m.active.runs(kc, scope), m.next != nil && m.next.runs(kc, scope)
}

// act does what p says for k and returns the key's status and whether it
// is a member.
func (r *Registry) act(ctx context.Context, k applyKey, p applyPlan) (Status, bool) {
	if p.kind == applyRefused {
		return p.status, false
	}
	m := p.existing
	var discard *Cluster
	var displaced string
	r.mu.Lock()
	if p.kc != nil && m != nil {
		if active, candidate := m.runs(p.kc, k.scope); active != p.active || candidate != p.candidate {
			r.mu.Unlock()
			return r.apply(ctx, k) // a candidate promoted itself since plan
		}
	}
	if p.takeOver {
		displaced = m.secret
		m.secret, m.ref = k.secret, k.ref
	}
	changed := false
	switch {
	case p.kind == applyRejected:
		changed = m.rejected != p.rejected.Error()
		m.rejected = p.rejected.Error()
		discard, m.next = m.next, nil // a pending candidate is no longer what the Secret says
	case m != nil:
		m.rejected, m.ref = "", k.ref
		if p.active {
			discard, m.next = m.next, nil // rotated back before the candidate synced
		}
	}
	r.mu.Unlock()
	if displaced != "" {
		r.log.Warn("duplicate cluster ID: the older secret takes over", "cluster", k.id, "secret", k.secret, "displaced", displaced)
		r.queue.Add(displaced)
	}
	if discard != nil {
		discard.stop()
	}
	switch p.kind {
	case applyRejected:
		r.log.Warn("rejected kubeconfig", "cluster", k.id, "secret", k.secret, "error", p.rejected)
		if changed {
			r.event(k.ref, corev1.EventTypeWarning, p.reason, "cluster %s: %s, still using the previous one: %s", k.id, p.what, p.rejected)
		}
		return p.status, true
	case applyUnchanged:
		return p.status, true
	}
	return r.startClient(ctx, k, p)
}

// startClient builds and starts the client of an added member, or the
// candidate that replaces a member's client once it has synced.
func (r *Registry) startClient(ctx context.Context, k applyKey, p applyPlan) (Status, bool) {
	c, err := newCluster(k.id, k.secret, p.kc, k.scope, r.deps)
	if err != nil {
		p.status.State, p.status.Message = StateInvalid, err.Error()
		return p.status, false
	}
	c.net.refused = func(reason string) {
		r.event(k.ref, corev1.EventTypeWarning, ReasonGatewayRefused, "cluster %s: gateway refused: %s", k.id, reason)
	}
	// What the Secret says of the member's network holds from the start,
	// for a restored view too (a persisted gateway counts only if the
	// Secret confirms its network).
	c.net.setSecretNetworking(k.networking)
	var discard *Cluster
	r.mu.Lock()
	if p.kind == applyAdded {
		c.setObserver(r.observer(k.ref, ""))
		// The Secret's identity annotations from the start: a member never
		// runs unscoped, not even before the whole Secret is applied.
		r.members[k.id] = &member{secret: k.secret, ref: k.ref, active: c, identity: k.ann}
		r.log.Info("cluster added", "cluster", k.id, "secret", k.secret, "server", p.kc.Server)
	} else {
		// Make-before-break: the old client keeps serving until the new one
		// has fully synced; then promote swaps them before the first publish.
		c.setObserver(r.observer(k.ref, "new kubeconfig: "))
		c.beforePublish = func() bool { return r.promote(k.id, c) }
		discard, p.existing.next = p.existing.next, c
		r.log.Info("cluster kubeconfig changed; syncing the new client before switching", "cluster", k.id, "secret", k.secret, "server", p.kc.Server)
	}
	r.mu.Unlock()
	if discard != nil {
		discard.stop()
	}
	if p.kind == applyAdded {
		r.views.restore(k.id, c)
	}
	c.start(ctx)
	return p.status, true
}

// setIdentityLocked records the identity annotations of Secret key on
// the members it owns and returns those whose annotations changed.
func (r *Registry) setIdentityLocked(key string, ann identityAnnotations) []string {
	var changed []string
	for id, m := range r.members {
		if m.secret == key && !m.identity.equal(ann) {
			m.identity = ann
			changed = append(changed, id)
		}
	}
	sort.Strings(changed)
	return changed
}

// identityChanged logs changed identity annotations and tells SecretEvents,
// so that SDS re-evaluates what the members' proxies may have.
func (r *Registry) identityChanged(key string, ann identityAnnotations, ids []string) {
	for _, id := range ids {
		r.log.Info("member identity scope changed", "cluster", id, "secret", key, "allowRootNamespace", ann.allowRoot,
			"namespaces", ann.namespaces, "invalid", ann.invalid)
		if ann.invalid != "" {
			r.log.Warn("remote secret has an invalid identity annotation; its members may assert no identity", "cluster", id, "secret", key, "error", ann.invalid)
		}
		if ev := r.cfg.SecretEvents; ev != nil {
			ev.SecretsSynced(id)
		}
	}
}

// olderSecret reports whether Secret a (namespace/name) was created before
// b, ties broken by name, so that ownership of a contested ID is stable.
func (r *Registry) olderSecret(a, b string) bool {
	get := func(key string) (time.Time, bool) {
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		s, err := r.secrets.Secrets(ns).Get(name)
		if err != nil {
			return time.Time{}, false
		}
		return s.CreationTimestamp.Time, true
	}
	ta, okA := get(a)
	tb, okB := get(b)
	switch {
	case !okA || !okB:
		return okA && !okB // a Secret that is gone owns nothing
	case !ta.Equal(tb):
		return ta.Before(tb)
	}
	return a < b
}

// promote makes a synced candidate the member's active client and stops the
// previous one, then tells SecretEvents that the member's Secrets may differ
// from what was served. It reports false if the candidate was superseded
// meanwhile.
func (r *Registry) promote(id string, candidate *Cluster) bool {
	r.mu.Lock()
	m := r.members[id]
	if m == nil || m.next != candidate {
		r.mu.Unlock()
		return false
	}
	old := m.active
	m.active, m.next = candidate, nil
	observe := r.observer(m.ref, "")
	candidate.setObserver(observe)
	r.mu.Unlock()
	r.views.setServer(id, candidate.api.server) // before it publishes
	from := old.status().State
	old.stop()
	if st := candidate.status(); from != st.State {
		// The member changes state by the swap itself (a Stale member
		// recovered by new credentials): that is the member's change.
		observe(st, from)
	}
	if ev := r.cfg.SecretEvents; ev != nil {
		// TLSSecret reads the candidate from now on; its Secret cache may
		// have synced (and said so) while the old client still answered.
		ev.SecretsSynced(id)
	}
	r.log.Info("cluster switched to its new kubeconfig", "cluster", id)
	r.event(m.ref, corev1.EventTypeNormal, "KubeconfigRotated", "cluster %s now uses its new kubeconfig", id)
	r.expiryKick.Now()
	return true
}

// settled reports whether membership has settled (Ready) once: from then
// on it stays true (members added later are written around, see
// gatewayWriter.reconcile). Ready is asked at most every
// gatewaySettleRetry, however many members' writers wait.
func (r *Registry) settled() bool {
	if r.settledOnce.Load() {
		return true
	}
	r.settleMu.Lock()
	defer r.settleMu.Unlock()
	if r.settledOnce.Load() || time.Since(r.settleCheck) < gatewaySettleRetry {
		return r.settledOnce.Load()
	}
	r.settleCheck = time.Now()
	if ok, _ := r.Ready(); ok {
		r.settledOnce.Store(true)
	}
	return r.settledOnce.Load()
}

// refreshPeerGateways hands every member the gateways of every network, as
// the home cluster and each member's current client have them (members in
// ID order), for the Services it writes for its istiod.
func (r *Registry) refreshPeerGateways() {
	r.peersMu.Lock() // one at a time: the last set handed out is the newest
	defer r.peersMu.Unlock()
	r.mu.Lock()
	ids := slices.Sorted(maps.Keys(r.members))
	sources := []*Cluster{r.home}
	var all []*Cluster
	for _, id := range ids {
		m := r.members[id]
		sources = append(sources, m.active)
		all = append(all, m.active)
		if m.next != nil {
			all = append(all, m.next)
		}
	}
	r.mu.Unlock()
	if sources[0] == nil {
		return // during NewRegistry
	}
	peers := peerGateways{networks: map[string][]Gateway{}, complete: true}
	for _, c := range sources {
		nw, gws, known := c.net.exportedGateways(c.health.progress())
		if !known {
			peers.complete = false // its network's Services are kept as they are
		}
		if nw != "" {
			peers.networks[nw] = append(peers.networks[nw], gws...)
		}
	}
	for _, c := range append(all, sources[0]) {
		c.net.gw.setPeers(peers)
	}
}

// observer returns the state-change hook of one member's client: a metric,
// a log line and an Event on the owning Secret. A candidate client (a new
// kubeconfig synced make-before-break, prefix non-empty) logs and records
// its changes under that prefix but does not count them in
// hub_cluster_state_transitions_total: the member itself has not changed
// state, and alerts on that metric must not see a rotation as flapping.
// The swap itself is the member's change when it changes the member's state
// (a Stale member recovered by new credentials, see promote).
func (r *Registry) observer(ref *corev1.ObjectReference, prefix string) func(Status, State) {
	return func(st Status, from State) {
		if prefix == "" {
			r.transitions.WithLabelValues(st.ID, string(st.State)).Inc()
		}
		r.record(st.ID, Transition{At: time.Now(), From: from, To: st.State, Message: prefix + st.Message})
		level, typ := slog.LevelInfo, corev1.EventTypeNormal
		switch st.State {
		case StateStale, StateUnreachable, StateTimedOut:
			level, typ = slog.LevelWarn, corev1.EventTypeWarning
		}
		r.log.Log(context.Background(), level, prefix+"cluster state changed", "cluster", st.ID, "from", from, "to", st.State, "message", st.Message)
		r.event(ref, typ, "Cluster"+string(st.State), "%scluster %s: %s → %s %s", prefix, st.ID, from, st.State, st.Message)
		if prefix == "" && r.cfg.States != nil {
			r.cfg.States.MemberState(st.ID, st.State)
		}
	}
}

// Transition is one state change of a member, for its history.
type Transition struct {
	At       time.Time
	From, To State
	Message  string
}

const maxHistory = 20

func (r *Registry) record(id string, t Transition) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := append(r.history[id], t)
	if len(h) > maxHistory {
		h = h[len(h)-maxHistory:]
	}
	r.history[id] = h
}

// pruneHistoryLocked drops the history of those IDs that are neither a
// member nor listed (invalid, conflicting) by any Secret.
func (r *Registry) pruneHistoryLocked(ids []string) {
next:
	for _, id := range ids {
		if _, ok := r.members[id]; ok || id == r.cfg.HomeID {
			continue
		}
		for _, extras := range r.extra {
			if _, ok := extras[id]; ok {
				continue next
			}
		}
		delete(r.history, id)
	}
}

// History returns a cluster ID's recent state changes, oldest first.
func (r *Registry) History(id string) []Transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Transition(nil), r.history[id]...)
}

// event records an Event on a remote Secret (nothing for the home cluster).
func (r *Registry) event(ref *corev1.ObjectReference, typ, reason, format string, args ...any) {
	r.mu.Lock()
	rec := r.recorder
	r.mu.Unlock()
	if ref != nil && rec != nil && (r.cfg.IsLeader == nil || r.cfg.IsLeader()) {
		rec.Eventf(ref, typ, reason, format, args...)
	}
}

func (r *Registry) requeueConflicts(except string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for secret, extras := range r.extra {
		for _, st := range extras {
			if st.State == StateConflict && secret != except {
				r.queue.Add(secret)
				break
			}
		}
	}
}

// Clusters returns the status of every member, the home cluster first, then
// by ID (and Secret, for IDs that appear more than once).
func (r *Registry) Clusters() []Status {
	type running struct {
		active, next *Cluster
		rejected     string
		secret       string
	}
	r.mu.Lock()
	out := make([]Status, 0, len(r.members)+1)
	members := make([]running, 0, len(r.members))
	for _, m := range r.members {
		members = append(members, running{m.active, m.next, m.rejected, m.secret})
	}
	for _, extras := range r.extra {
		for _, st := range extras {
			out = append(out, st)
		}
	}
	r.mu.Unlock()
	for _, m := range members {
		st := m.active.status()
		st.Secret = m.secret // the owner, also while a takeover's candidate syncs
		if m.next != nil {
			next := m.next.status()
			st.Message = strings.TrimSpace(st.Message + fmt.Sprintf(" (new kubeconfig %s: %s; the previous one keeps serving until it is Ready)", next.State, next.Message))
		}
		if m.rejected != "" {
			st.State = StateInvalid
			st.Message = "the remote Secret's new kubeconfig or watch scope was rejected, still using the previous one: " + m.rejected
		}
		out = append(out, r.withDemotion(st))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ID != out[j].ID {
			return out[i].ID < out[j].ID
		}
		return out[i].Secret < out[j].Secret
	})
	return append([]Status{r.withDemotion(r.home.status())}, out...)
}

// withDemotion sets Status.Demoted for a member whose endpoints the hub
// serves behind the healthy members' (the index demotes the same states),
// and grades its credentials' expiry now.
func (r *Registry) withDemotion(st Status) Status {
	st.Credentials = withLevels(st.Credentials, time.Now(), r.cfg.ExpiryWarning)
	switch st.State {
	case StateStale, StateUnreachable, StateTimedOut:
		if r.cfg.DemoteUnhealthy && st.Endpoints > 0 {
			st.Demoted = fmt.Sprintf("the member is %s: its endpoints are served one priority behind the healthy members' (as long as any other member serves the service)", st.State)
		}
	}
	st.ServiceExports = r.ServiceExportStatus(st.ID)
	return st
}

// Cluster returns the status of one cluster by ID: the running member if
// there is one, else the first Secret key that claims the ID.
func (r *Registry) Cluster(id string) (Status, bool) {
	if id == r.cfg.HomeID {
		return r.withDemotion(r.home.status()), true
	}
	r.mu.Lock()
	owner := ""
	if m := r.members[id]; m != nil {
		owner = m.secret
	}
	r.mu.Unlock()
	for _, st := range r.Clusters() {
		if st.ID == id && (owner == "" || st.Secret == owner) {
			return st, true
		}
	}
	return Status{}, false
}

// reconciledLocked reports whether the remote Secret key was reconciled
// at least once; r.mu is held.
func (r *Registry) reconciledLocked(key string) bool {
	_, ok := r.reconciled[key]
	return ok
}

// Ready reports whether the hub has a complete picture: remote Secrets are
// listed and read, the home cluster is synced and every member is synced, stale or
// timed out. The reason says what is still missing.
func (r *Registry) Ready() (bool, string) {
	r.mu.Lock()
	synced := r.secretsSynced
	r.mu.Unlock()
	if synced == nil || !synced() {
		return false, "remote secrets not listed yet"
	}
	// Listed is not reconciled: the informer's handlers only queue the
	// Secrets, whose members the queue's worker creates.
	listed, err := r.secrets.List(labels.Everything())
	if err != nil {
		return false, "listing remote secrets: " + err.Error()
	}
	var unread []string
	r.mu.Lock()
	for _, s := range listed {
		if key := s.Namespace + "/" + s.Name; !r.reconciledLocked(key) {
			unread = append(unread, key)
		}
	}
	r.mu.Unlock()
	if len(unread) > 0 {
		sort.Strings(unread)
		return false, "remote secrets not read yet: " + strings.Join(unread, ", ")
	}
	var waiting []string
	for _, st := range r.Clusters() {
		switch st.State {
		case StatePending, StateSyncing, StateUnreachable:
			waiting = append(waiting, st.ID)
		}
	}
	for _, c := range r.activeClusters() {
		if c.health.holdsReadiness() { // Stale from a persisted view, but syncing
			waiting = append(waiting, c.id)
		}
	}
	if len(waiting) > 0 {
		return false, "waiting for clusters to sync: " + strings.Join(waiting, ", ")
	}
	return true, ""
}

// TLSSecret returns the TLS material of a Secret in a member cluster, from
// the member's active client. It never falls back to another member.
func (r *Registry) TLSSecret(cluster string, key ServiceKey) (*TLSSecret, error) {
	c, err := r.activeCluster(cluster)
	if err != nil {
		return nil, err
	}
	return c.secrets.get(key)
}

// activeCluster is the home cluster or a member's active client, by ID.
func (r *Registry) activeCluster(id string) (*Cluster, error) {
	if id == r.cfg.HomeID {
		return r.home, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.members[id]; m != nil {
		return m.active, nil
	}
	return nil, fmt.Errorf("%w %q", ErrUnknownCluster, id)
}

// IsCluster reports whether id is the home cluster or a current member:
// not a removed one, nor a key that is invalid or in conflict.
func (r *Registry) IsCluster(id string) bool {
	_, err := r.activeCluster(id)
	return err == nil
}

// activeClusters returns the home cluster and every member's active client.
func (r *Registry) activeClusters() []*Cluster {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []*Cluster{r.home}
	for _, m := range r.members {
		out = append(out, m.active)
	}
	return out
}

// ServiceExportStatus is what the hub made of a member's ServiceExports
// (export mode serviceexport; nil otherwise): their conditions, and
// whether they were written back.
func (r *Registry) ServiceExportStatus(member string) map[ServiceKey]ExportStatus {
	if r.exports == nil {
		return nil
	}
	return r.exports.exportStatuses(member)
}
