package clusters

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Stale-not-empty across restarts (docs/architecture.md §4): the leader persists each
// member's last good view (what its endpoint controller delivered to the
// Sink) in the home cluster, and a starting hub serves a member from that
// view, as Stale, until the member syncs.

// Persistence timing: a member's view is written at most once per
// viewWriteInterval, and only when its content changed since the last write.
const (
	viewWriteInterval = 30 * time.Second
	viewTick          = time.Second
	viewLoadAttempts  = 3
	viewLoadTimeout   = 20 * time.Second // per attempt
)

// viewPersister sits between the members and the Sink: it passes every call
// through and keeps each member's current view, which its loop writes (on
// the leader only) through a viewStore. It also holds the views read at
// start until their members are created.
type viewPersister struct {
	next     Sink
	store    *viewStore
	home     string
	isLeader func() bool
	log      *slog.Logger
	// named reports whether a remote Secret names the ID; known is false
	// until the Secrets are listed.
	named    func(id string) (named, known bool)
	interval time.Duration
	tick     time.Duration
	// rounds counts the loop's rounds, leader or not (tests wait on it).
	rounds atomic.Int64

	writes   *prometheus.CounterVec
	bytes    *prometheus.GaugeVec
	rejected *prometheus.CounterVec

	// secrets is the hub namespace's Secrets, holding ViewKeySecret.
	secrets   typedcorev1.SecretInterface
	namespace string
	// event records an Event (about a refused view, on its manifest; about
	// a malformed key, on its Secret); nil until the registry runs.
	event func(ref *corev1.ObjectReference, typ, reason, format string, args ...any)

	mu sync.Mutex
	// key authenticates views (nil until read); keyTried is the last
	// attempt to read it and keyErr what that attempt said.
	key       []byte
	keyTried  time.Time
	keyErr    string
	members   map[string]*trackedView
	loaded    map[string]*storedView // read at start, until the member is created
	deletions map[string]bool        // IDs whose persisted view must go
}

// trackedView is what the persister knows of one member.
type trackedView struct {
	services  map[ServiceKey]*Service
	dirty     bool      // changed since it was last looked at by the writer
	sum       string    // SHA-256 of the view last written or read
	server    string    // the API server the view is from (its member's kubeconfig)
	lastWrite time.Time // of the last write attempt
}

func newViewPersister(cfg Config, client kubernetes.Interface) (*viewPersister, error) {
	p := &viewPersister{
		next:      cfg.Sink,
		store:     &viewStore{cms: client.CoreV1().ConfigMaps(cfg.stateNamespace()), chunkSize: defaultChunkSize},
		secrets:   client.CoreV1().Secrets(cfg.stateNamespace()),
		namespace: cfg.stateNamespace(),
		home:      cfg.HomeID,
		isLeader:  cfg.IsLeader,
		log:       cfg.Log,
		interval:  viewWriteInterval,
		tick:      viewTick,
		members:   map[string]*trackedView{},
		loaded:    map[string]*storedView{},
		deletions: map[string]bool{},
		named:     func(string) (bool, bool) { return false, false },
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_member_view_writes_total",
			Help: "Writes of a member's persisted endpoint view to the home cluster, by member.",
		}, []string{"cluster"}),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hub_member_view_bytes",
			Help: "Size of a member's last persisted endpoint view, by encoding (json, gzip).",
		}, []string{"cluster", "encoding"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_member_view_rejected_total",
			Help: "Persisted member views refused at start, by reason: unauthenticated (no or a wrong MAC, or no view key), invalid (content that fails validation), unreadable (chunks missing or malformed).",
		}, []string{"reason"}),
	}
	for _, reason := range []string{rejectUnauthenticated, rejectInvalid, rejectUnreadable} {
		p.rejected.WithLabelValues(reason) // present at 0 from the start
	}
	if cfg.Metrics != nil {
		for _, c := range []prometheus.Collector{p.writes, p.bytes, p.rejected} {
			if err := cfg.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("registering metrics: %w", err)
			}
		}
	}
	return p, nil
}

// ReplaceCluster implements Sink.
func (p *viewPersister) ReplaceCluster(cluster string, services []*Service) {
	p.next.ReplaceCluster(cluster, services)
	if cluster == p.home {
		return
	}
	m := make(map[ServiceKey]*Service, len(services))
	for _, s := range services {
		m[ServiceKey{Namespace: s.Namespace, Name: s.Name}] = s
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.trackedLocked(cluster)
	t.services, t.dirty = m, true
}

// UpdateService implements Sink.
func (p *viewPersister) UpdateService(cluster string, key ServiceKey, svc *Service) {
	p.next.UpdateService(cluster, key, svc)
	if cluster == p.home {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.trackedLocked(cluster)
	if t.services == nil {
		return // not synced yet: nothing live to persist
	}
	if svc == nil {
		delete(t.services, key)
	} else {
		t.services[key] = svc
	}
	t.dirty = true
}

// RemoveCluster implements Sink: a member is removed only when its key left
// the remote Secrets, so its persisted view goes too.
func (p *viewPersister) RemoveCluster(cluster string) {
	p.next.RemoveCluster(cluster)
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.members, cluster)
	delete(p.loaded, cluster)
	p.deletions[cluster] = true
	p.writes.DeletePartialMatch(prometheus.Labels{"cluster": cluster})
	p.bytes.DeletePartialMatch(prometheus.Labels{"cluster": cluster})
}

func (p *viewPersister) trackedLocked(cluster string) *trackedView {
	t := p.members[cluster]
	if t == nil {
		t = &trackedView{}
		p.members[cluster] = t
	}
	delete(p.deletions, cluster) // a member that is back keeps its view
	return t
}

// load reads the view key and every persisted view once, before any member
// starts. A failure leaves members to start empty, as they would without
// persistence; so does a malformed key (restore then refuses every view)
// or one that cannot be read (views are then not even read).
func (p *viewPersister) load(ctx context.Context) {
	if !p.loadKey(ctx) {
		return
	}
	var views map[string]*storedView
	var bad []error
	var err error
	for attempt := 1; attempt <= viewLoadAttempts; attempt++ {
		actx, cancel := context.WithTimeout(ctx, viewLoadTimeout) // a home API server that hangs must not hold members back
		views, bad, err = p.store.readAll(actx)
		cancel()
		if err == nil {
			break
		}
		p.log.Warn("reading persisted member views", "attempt", attempt, "error", err)
		if !sleepCtx(ctx, time.Duration(attempt)*time.Second) {
			return
		}
	}
	if err != nil {
		p.log.Error("members whose API server is unreachable start without their persisted views", "error", err)
		return
	}
	for _, e := range bad {
		p.rejected.WithLabelValues(rejectUnreadable).Inc()
		p.log.Warn("ignoring a persisted member view", "error", e)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, v := range views {
		if _, ok := p.members[id]; !ok {
			p.loaded[id] = v
		}
	}
	p.log.Info("read persisted member views", "views", len(views))
}

// Reasons a persisted view is refused (hub_member_view_rejected_total).
const (
	rejectUnauthenticated = "unauthenticated"
	rejectInvalid         = "invalid"
	rejectUnreadable      = "unreadable"

	// ReasonViewRejected is the reason of the Warning Event on the manifest
	// of a persisted view that is refused.
	ReasonViewRejected = "PersistedViewRejected"
	// ReasonViewKeyInvalid is the reason of the Warning Event on the key
	// Secret when it exists but holds no usable key.
	ReasonViewKeyInvalid = "ViewKeyInvalid"
)

// loadKey reads (or creates) the view key, retrying failures other than a
// malformed Secret a few times. Without a key no view is restored; it
// reports whether views are worth reading (a key, or a malformed one, so
// that each refused view is reported).
func (p *viewPersister) loadKey(ctx context.Context) bool {
	for attempt := 1; attempt <= viewLoadAttempts; attempt++ {
		actx, cancel := context.WithTimeout(ctx, viewLoadTimeout)
		err := p.fetchKey(actx)
		cancel()
		switch {
		case err == nil:
			return true
		case errors.Is(err, errViewKeyMalformed):
			p.log.Error("persisted member views are neither restored nor written until the view key Secret is fixed or deleted", "error", err)
			if p.event != nil {
				p.event(&corev1.ObjectReference{Kind: "Secret", APIVersion: "v1", Namespace: p.namespace, Name: ViewKeySecret},
					corev1.EventTypeWarning, ReasonViewKeyInvalid, "%v; persisted member views are neither restored nor written", err)
			}
			return true
		}
		p.log.Warn("reading the view key", "attempt", attempt, "error", err)
		if !sleepCtx(ctx, time.Duration(attempt)*time.Second) {
			return false
		}
	}
	p.log.Error("members whose API server is unreachable start without their persisted views: the view key is unavailable")
	return false
}

// fetchKey reads (or creates) the view key and keeps it.
func (p *viewPersister) fetchKey(ctx context.Context) error {
	key, err := ensureViewKey(ctx, p.secrets, p.namespace)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keyTried = time.Now()
	if err != nil {
		p.keyErr = err.Error()
		return err
	}
	p.key, p.keyErr = key, ""
	return nil
}

// writeKey returns the view key for a write, reading it again (at most once
// per interval) while it is missing; nil means no view can be written.
func (p *viewPersister) writeKey(ctx context.Context) []byte {
	p.mu.Lock()
	key, tried, last := p.key, p.keyTried, p.keyErr
	p.mu.Unlock()
	if key != nil || time.Since(tried) < p.interval {
		return key
	}
	if err := p.fetchKey(ctx); err != nil {
		if err.Error() != last && ctx.Err() == nil {
			p.log.Warn("member views are not persisted: the view key is unavailable", "error", err)
		}
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.key
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// setServer records the API server a member's views now come from (its
// kubeconfig's), as persisted with them. A member that moved to another
// server drops what it tracked: that was the old server's view, not to be
// written as the new one's.
func (p *viewPersister) setServer(id, server string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.trackedLocked(id)
	if t.server != server {
		t.server, t.services, t.dirty, t.sum = server, nil, false, ""
	}
}

// restore hands a new member's persisted view, if there is one from the
// member's current API server that is authentic and valid, to the Sink and
// marks c as serving it. Call it before c starts. A view that fails its MAC
// or validation is refused (rejectView) and the member starts as if it had
// none.
func (p *viewPersister) restore(id string, c *Cluster) {
	p.setServer(id, c.api.server)
	p.mu.Lock()
	v := p.loaded[id]
	delete(p.loaded, id)
	key := p.key
	p.mu.Unlock()
	if v == nil {
		return
	}
	services, unauthenticated, err := v.open(key, time.Now(), c.objects.max)
	if err != nil {
		p.rejectView(v, unauthenticated, err)
		return
	}
	if v.Server != c.api.server {
		// Its kubeconfig now points elsewhere: the view is of another
		// cluster (or an older hub's, which did not record the server).
		p.log.Warn("not serving the persisted view of a member: it was read from another API server", "cluster", id,
			"persistedFrom", v.Server, "server", c.api.server, "persistedAt", v.WrittenAt.Format(time.RFC3339))
		return
	}
	p.mu.Lock()
	p.trackedLocked(id).sum = v.SHA256 // the live view is written only if it differs
	p.mu.Unlock()
	services = c.net.confirmedGateways(services)
	p.next.ReplaceCluster(id, services)
	c.servePersisted(v.WrittenAt, services)
	endpoints := 0
	for _, s := range services {
		endpoints += len(s.Endpoints)
	}
	p.log.Info("serving the persisted view until the member syncs", "cluster", id,
		"persistedAt", v.WrittenAt.Format(time.RFC3339), "services", len(services), "endpoints", endpoints)
}

// rejectView reports a refused view: a metric, a log line and a Warning
// Event on its manifest ConfigMap (the object at fault, which every view
// has, whichever Secret names its member). Every replica that refuses a
// view says so, leader or not: each one decided on its own. Neither names
// key material.
func (p *viewPersister) rejectView(v *storedView, unauthenticated bool, err error) {
	reason := rejectInvalid
	if unauthenticated {
		reason = rejectUnauthenticated
	}
	p.rejected.WithLabelValues(reason).Inc()
	p.log.Warn("refusing the persisted view of a member; it starts as if it had none", "cluster", v.ID,
		"configMap", v.Manifest.Namespace+"/"+v.Manifest.Name, "reason", reason, "error", err)
	if p.event != nil {
		p.event(v.Manifest, corev1.EventTypeWarning, ReasonViewRejected,
			"persisted view of cluster %s refused (%s): %v; the member starts without it", v.ID, reason, err)
	}
}

// run writes changed views (on the leader) and deletes those of removed
// members until ctx ends.
func (p *viewPersister) run(ctx context.Context) {
	t := time.NewTicker(p.tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.rounds.Add(1)
		if p.isLeader != nil && !p.isLeader() {
			continue // changes stay dirty: a replica that becomes leader writes them
		}
		p.deleteRemoved(ctx)
		p.writeDue(ctx)
	}
}

// writeDue writes every member view that changed and was not written within
// the interval, viewWriters at a time.
func (p *viewPersister) writeDue(ctx context.Context) {
	key := p.writeKey(ctx)
	if key == nil {
		return // changes stay dirty until there is a key
	}
	now := time.Now()
	var jobs []viewJob
	p.mu.Lock()
	for id, t := range p.members {
		if !t.dirty || t.services == nil || now.Sub(t.lastWrite) < p.interval {
			continue
		}
		t.dirty = false
		j := viewJob{id: id, sum: t.sum, server: t.server, services: make([]*Service, 0, len(t.services))}
		for _, s := range t.services {
			j.services = append(j.services, s)
		}
		jobs = append(jobs, j)
	}
	p.mu.Unlock()
	work := make(chan viewJob)
	var wg sync.WaitGroup
	for range min(viewWriters, len(jobs)) {
		wg.Go(func() {
			for j := range work {
				p.writeView(ctx, key, j, now)
			}
		})
	}
	for _, j := range jobs {
		if ctx.Err() != nil {
			break
		}
		work <- j
	}
	close(work)
	wg.Wait()
}

// viewWriters bounds the member views written at once (the home client's
// rate limit bounds them too).
const viewWriters = 8

// viewJob is one member view to write.
type viewJob struct {
	id       string
	services []*Service
	sum      string // what was last written
	server   string
}

// writeView writes one member view, unless it is what was last written.
func (p *viewPersister) writeView(ctx context.Context, key []byte, j viewJob, now time.Time) {
	content, sum, err := encodeView(j.services)
	if err != nil {
		p.log.Error("encoding a member view", "cluster", j.id, "error", err)
		return
	}
	if sum == j.sum {
		return // changed and changed back: nothing new to write
	}
	res, err := p.store.write(ctx, key, j.id, content, sum, j.server, now)
	p.mu.Lock()
	if t := p.members[j.id]; t != nil {
		t.lastWrite = now
		if err != nil {
			t.dirty = true // try again after the interval
		} else {
			t.sum = sum
		}
	}
	p.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil { // not just stopping
			p.log.Warn("persisting a member view", "cluster", j.id, "error", err)
		}
		return
	}
	if !res.Skipped {
		p.writes.WithLabelValues(j.id).Inc()
		p.bytes.WithLabelValues(j.id, "json").Set(float64(res.Bytes))
		p.bytes.WithLabelValues(j.id, "gzip").Set(float64(res.Compressed))
		p.log.Debug("persisted member view", "cluster", j.id, "bytes", res.Bytes, "compressed", res.Compressed, "objects", res.Objects)
	}
}

// deleteRemoved deletes the persisted views of removed members, and of
// views read at start whose ID no remote Secret names any more.
func (p *viewPersister) deleteRemoved(ctx context.Context) {
	p.mu.Lock()
	loaded := make([]string, 0, len(p.loaded))
	for id := range p.loaded {
		loaded = append(loaded, id)
	}
	p.mu.Unlock()
	for _, id := range loaded {
		if named, known := p.named(id); known && !named {
			p.mu.Lock()
			if _, ok := p.loaded[id]; ok {
				delete(p.loaded, id)
				p.deletions[id] = true
			}
			p.mu.Unlock()
		}
	}
	p.mu.Lock()
	ids := make([]string, 0, len(p.deletions))
	for id := range p.deletions {
		ids = append(ids, id)
	}
	p.mu.Unlock()
	for _, id := range ids {
		// Writes happen on this goroutine too, so a member added again
		// meanwhile cannot have written a view that this deletes.
		if err := p.store.delete(ctx, id); err != nil {
			if ctx.Err() == nil { // not just stopping
				p.log.Warn("deleting the persisted view of a removed member", "cluster", id, "error", err)
			}
			continue
		}
		p.mu.Lock()
		delete(p.deletions, id)
		p.mu.Unlock()
		p.log.Info("deleted the persisted view of a removed member", "cluster", id)
	}
}

// namedBySecret reports whether any remote Secret has a key id; known is
// false until the Secrets are listed.
func (r *Registry) namedBySecret(id string) (named, known bool) {
	r.mu.Lock()
	synced := r.secretsSynced
	r.mu.Unlock()
	if synced == nil || !synced() {
		return false, false
	}
	secrets, err := r.secrets.List(labels.Everything())
	if err != nil {
		return false, false
	}
	for _, s := range secrets {
		if _, ok := s.Data[id]; ok {
			return true, true
		}
	}
	return false, true
}
