// Package clusters manages mesh membership: it watches remote Secrets
// (labelled istio/multiCluster=true) in the home cluster, runs one Cluster per
// member with its own endpoint controller, and hands every member's services
// to a Sink. It knows nothing of xDS.
package clusters

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// MultiClusterLabel marks a Secret whose data keys are cluster IDs and whose
// values are kubeconfigs (Istio's remote-secret format).
const MultiClusterLabel = "istio/multiCluster"

// Config holds the Registry's dependencies.
type Config struct {
	// Home is the home cluster: it holds the remote Secrets and is a member itself.
	Home *rest.Config
	// HomeID is the home cluster's own cluster ID.
	HomeID string
	// Namespace is where remote Secrets live.
	Namespace string
	// SyncTimeout is how long a member may take to sync before it stops
	// blocking readiness.
	SyncTimeout time.Duration
	// Sink receives every member's services.
	Sink Sink
	// Log is the logger; nil means slog.Default().
	Log *slog.Logger
}

// Registry is the set of member clusters, driven by remote Secrets.
type Registry struct {
	cfg   Config
	log   *slog.Logger
	home  *Cluster
	queue workqueue.TypedRateLimitingInterface[string] // namespace/name of remote Secrets

	secrets       corelisters.SecretLister
	secretsSynced cache.InformerSynced

	mu      sync.Mutex
	members map[string]*member           // by cluster ID: the Secret that owns the ID
	extra   map[string]map[string]Status // by Secret: keys that run no cluster (invalid, conflicting, ignored)
}

// member is a cluster ID owned by one Secret.
type member struct {
	secret  string
	cluster *Cluster
	// rejected is set when the Secret's current kubeconfig for this ID was
	// rejected while the previous, valid one keeps serving.
	rejected string
}

// NewRegistry creates a Registry. Call Run to start it.
func NewRegistry(cfg Config) (*Registry, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if err := ValidateClusterID(cfg.HomeID); err != nil {
		return nil, fmt.Errorf("home cluster: %w", err)
	}
	home, err := newCluster(cfg.HomeID, "", cfg.Home, cfg.Home.Host, [32]byte{}, cfg.Sink, cfg.SyncTimeout, cfg.Log)
	if err != nil {
		return nil, err
	}
	return &Registry{
		cfg:     cfg,
		log:     cfg.Log,
		home:    home,
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		members: map[string]*member{},
		extra:   map[string]map[string]Status{},
	}, nil
}

// Run watches remote Secrets and runs the members until ctx is done, then
// stops every member and returns.
func (r *Registry) Run(ctx context.Context) error {
	client, err := kubernetes.NewForConfig(r.cfg.Home)
	if err != nil {
		return fmt.Errorf("building home cluster client: %w", err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
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
	r.secretsSynced = reg.HasSynced

	r.home.start(ctx)
	factory.Start(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r.processNext(ctx) {
		}
	}()

	<-ctx.Done()
	r.queue.ShutDown()
	<-done
	factory.Shutdown()
	r.home.stop()
	r.mu.Lock()
	members := r.members
	r.members = map[string]*member{}
	r.mu.Unlock()
	for _, m := range members {
		if m.cluster != nil {
			m.cluster.stop()
		}
	}
	return nil
}

func (r *Registry) processNext(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(key)
	if err := r.reconcile(ctx, key); err != nil {
		r.log.Error("reconciling remote secret", "secret", key, "error", err)
		r.queue.AddRateLimited(key)
		return true
	}
	r.queue.Forget(key)
	return true
}

// reconcile brings the members owned by one Secret in line with its data.
func (r *Registry) reconcile(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return err
	}
	var data map[string][]byte
	secret, err := r.secrets.Secrets(ns).Get(name)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading secret: %w", err)
	default:
		data = secret.Data
	}

	// Keys that no longer exist: stop their clusters and drop their services.
	// Work out the changes under the lock, stop clusters outside it.
	var removed []*Cluster
	var freed []string
	r.mu.Lock()
	for id, m := range r.members {
		if _, ok := data[id]; m.secret == key && !ok {
			delete(r.members, id)
			removed = append(removed, m.cluster)
			freed = append(freed, id)
		}
	}
	r.mu.Unlock()
	for i, c := range removed {
		c.stop()
		r.cfg.Sink.RemoveCluster(freed[i])
		r.log.Info("cluster removed", "cluster", freed[i], "secret", key)
	}

	ids := make([]string, 0, len(data))
	for id := range data {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	extras := map[string]Status{}
	for _, id := range ids {
		if st, ok := r.apply(ctx, key, id, data[id]); !ok {
			extras[id] = st
		}
	}
	r.mu.Lock()
	if len(extras) == 0 {
		delete(r.extra, key)
	} else {
		r.extra[key] = extras
	}
	r.mu.Unlock()
	// A freed ID may let a conflicting Secret take over.
	if len(freed) > 0 {
		r.requeueConflicts(key)
	}
	return nil
}

// apply starts, keeps or replaces the member for one data key. It returns
// ok=false with a status when the key runs no cluster of its own.
func (r *Registry) apply(ctx context.Context, secret, id string, kubeconfig []byte) (Status, bool) {
	st := Status{ID: id, Secret: secret}
	if id == r.cfg.HomeID {
		st.State, st.Message = StateInvalid, fmt.Sprintf("cluster ID %q is the home cluster's own ID; key ignored", id)
		r.log.Warn("remote secret lists the home cluster; key ignored", "cluster", id, "secret", secret)
		return st, false
	}
	if err := ValidateClusterID(id); err != nil {
		st.State, st.Message = StateInvalid, err.Error()
		r.log.Warn("invalid cluster ID in remote secret", "secret", secret, "error", err)
		return st, false
	}
	r.mu.Lock()
	existing := r.members[id]
	r.mu.Unlock()
	if existing != nil && existing.secret != secret {
		st.State, st.Message = StateConflict, fmt.Sprintf("cluster ID %q is already registered by secret %s", id, existing.secret)
		r.log.Warn("duplicate cluster ID", "cluster", id, "secret", secret, "owner", existing.secret)
		return st, false
	}
	kc, err := ParseKubeconfig(kubeconfig)
	if err != nil {
		r.log.Warn("rejected kubeconfig", "cluster", id, "secret", secret, "error", err)
		if existing != nil {
			r.mu.Lock()
			existing.rejected = err.Error()
			r.mu.Unlock()
			return st, true
		}
		st.State, st.Message = StateInvalid, err.Error()
		return st, false
	}
	if existing != nil && existing.cluster.hash == kc.SHA256 {
		r.mu.Lock()
		existing.rejected = ""
		r.mu.Unlock()
		return st, true
	}
	c, err := newCluster(id, secret, kc.Config, kc.Server, kc.SHA256, r.cfg.Sink, r.cfg.SyncTimeout, r.log)
	if err != nil {
		st.State, st.Message = StateInvalid, err.Error()
		return st, false
	}
	if existing != nil {
		// The old client keeps its services in the Sink until the new one's
		// first full sync replaces them, so endpoints never go empty.
		existing.cluster.stop()
		r.log.Info("cluster kubeconfig changed; restarting its client", "cluster", id, "secret", secret)
	} else {
		r.log.Info("cluster added", "cluster", id, "secret", secret, "server", kc.Server)
	}
	r.mu.Lock()
	r.members[id] = &member{secret: secret, cluster: c}
	r.mu.Unlock()
	c.start(ctx)
	return st, true
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
		c        *Cluster
		rejected string
	}
	r.mu.Lock()
	out := make([]Status, 0, len(r.members)+1)
	members := make([]running, 0, len(r.members))
	for _, m := range r.members {
		members = append(members, running{m.cluster, m.rejected})
	}
	for _, extras := range r.extra {
		for _, st := range extras {
			out = append(out, st)
		}
	}
	r.mu.Unlock()
	for _, m := range members {
		st := m.c.status()
		if m.rejected != "" {
			st.State = StateInvalid
			st.Message = "new kubeconfig rejected, still using the previous one: " + m.rejected
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ID != out[j].ID {
			return out[i].ID < out[j].ID
		}
		return out[i].Secret < out[j].Secret
	})
	return append([]Status{r.home.status()}, out...)
}

// Cluster returns the status of one cluster by ID: the running member if
// there is one, else the first Secret key that claims the ID.
func (r *Registry) Cluster(id string) (Status, bool) {
	r.mu.Lock()
	m := r.members[id]
	r.mu.Unlock()
	if id == r.cfg.HomeID {
		return r.home.status(), true
	}
	for _, st := range r.Clusters() {
		if st.ID == id && (m == nil || st.Secret == m.secret) {
			return st, true
		}
	}
	return Status{}, false
}

// Ready reports whether the hub has a complete picture: remote Secrets are
// listed, the home cluster is synced and every member is synced or timed out.
// The reason says what is still missing.
func (r *Registry) Ready() (bool, string) {
	if r.secretsSynced == nil || !r.secretsSynced() {
		return false, "remote secrets not listed yet"
	}
	var waiting []string
	for _, st := range r.Clusters() {
		if st.State == StatePending || st.State == StateSyncing {
			waiting = append(waiting, st.ID)
		}
	}
	if len(waiting) > 0 {
		return false, "waiting for clusters to sync: " + strings.Join(waiting, ", ")
	}
	return true, ""
}
