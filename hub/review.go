package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/sds"
)

// Access reviews (SubjectAccessReviews) are answered by member API servers,
// which can be slow or not answer at all. They never run in the push path:
// accessReviews answers from what it decided before, and on a miss starts
// the review in the background and says "pending"; when it completes, the
// SDS watches that consulted that review are re-evaluated (and only they),
// through the hub's change feed (Changes).

// Review timing and bounds, as istiod caches SubjectAccessReviews.
const (
	reviewTimeout   = 5 * time.Second // per review, per member
	reviewAllowTTL  = 5 * time.Minute
	reviewDenyTTL   = time.Minute
	reviewFailedTTL = 5 * time.Second // then the review is tried again
	// reviewRefresh is the share of an allow's or deny's lifetime after
	// which it is revalidated in the background while still served.
	reviewRefresh = 0.8
	// reviewsPerMember and reviewsOverall bound the reviews running at
	// once; more wait in a per-member queue.
	reviewsPerMember = 4
	reviewsOverall   = 32
	reviewCacheSize  = 10000
)

// errReviewsStopped means the hub is shutting down.
var errReviewsStopped = errors.New("access reviews stopped: the hub is shutting down")

// decision is a review's outcome and how long it stands.
type decision struct {
	allowed bool
	err     error     // the review failed (transient)
	expires time.Time // not served after this
	refresh time.Time // revalidated in the background from then on (allow and deny)
}

// accessReviews is the SubjectAccessReview decision source of SDS. decide
// never waits: see the comment at the top of this file. Decisions are
// cached as istiod does (an allow 5 minutes, a deny 1 minute), revalidated
// in the background during the last fifth of that while still served; a
// failed review stands for 5 seconds, after which the watches that asked
// are re-evaluated and so try again. Every review it starts is its own: it
// ends them when closed.
type accessReviews struct {
	authz  SecretAuthorizer
	notify func(feed.ReviewKey) // a decision changed; must not block
	log    *slog.Logger
	now    func() time.Time

	timeout                      time.Duration
	allowTTL, denyTTL, failedTTL time.Duration
	perMember, overall           int

	ctx    context.Context // ends every review when closed
	cancel context.CancelFunc
	wg     sync.WaitGroup // running reviews

	mu        sync.Mutex
	decisions *lru.Cache[feed.ReviewKey, decision]
	inflight  map[feed.ReviewKey]bool     // queued or running
	queued    map[string][]feed.ReviewKey // member → reviews waiting for a slot, oldest first
	running   map[string]int              // member → reviews running
	total     int                         // reviews running
	retries   map[feed.ReviewKey]*time.Timer
	closed    bool
}

func newAccessReviews(a SecretAuthorizer, notify func(feed.ReviewKey), log *slog.Logger) *accessReviews {
	if a == nil {
		return nil
	}
	decisions, _ := lru.New[feed.ReviewKey, decision](reviewCacheSize) // only a size ≤ 0 fails
	ctx, cancel := context.WithCancel(context.Background())
	return &accessReviews{
		authz: a, notify: notify, log: log, now: time.Now,
		timeout: reviewTimeout, allowTTL: reviewAllowTTL, denyTTL: reviewDenyTTL, failedTTL: reviewFailedTTL,
		perMember: reviewsPerMember, overall: reviewsOverall,
		ctx: ctx, cancel: cancel, decisions: decisions,
		inflight: map[feed.ReviewKey]bool{}, queued: map[string][]feed.ReviewKey{}, running: map[string]int{},
		retries: map[feed.ReviewKey]*time.Timer{},
	}
}

// decide answers from the cache and never waits. On a miss it starts the
// review and returns sds.ErrReviewPending; a failed review's error is returned
// (transient) until it is retried. A new decision for k is announced to
// notify.
func (r *accessReviews) Decide(k feed.ReviewKey) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false, errReviewsStopped
	}
	now := r.now()
	if d, ok := r.decisions.Get(k); ok && now.Before(d.expires) {
		if d.err != nil {
			return false, d.err
		}
		if !now.Before(d.refresh) {
			r.start(k) // serve the last decision while revalidating
		}
		return d.allowed, nil
	}
	r.start(k)
	return false, sds.ErrReviewPending
}

// start runs k's review, or queues it behind its member's running ones,
// unless it is already queued or running. r.mu is held.
func (r *accessReviews) start(k feed.ReviewKey) {
	if r.inflight[k] {
		return
	}
	r.inflight[k] = true
	if r.running[k.Cluster] < r.perMember && r.total < r.overall {
		r.launch(k)
		return
	}
	r.queued[k.Cluster] = append(r.queued[k.Cluster], k)
}

// launch runs k's review in the background. r.mu is held.
func (r *accessReviews) launch(k feed.ReviewKey) {
	r.running[k.Cluster]++
	r.total++
	r.wg.Go(func() { r.review(k) })
}

// launchQueued starts queued reviews while there are free slots. r.mu is
// held.
func (r *accessReviews) launchQueued() {
	for member, q := range r.queued {
		for len(q) > 0 && r.running[member] < r.perMember && r.total < r.overall {
			r.launch(q[0])
			q = q[1:]
		}
		if len(q) == 0 {
			delete(r.queued, member)
		} else {
			r.queued[member] = q
		}
	}
}

// review asks k's member, records the outcome and announces it if it
// changes what a watch gets.
func (r *accessReviews) review(k feed.ReviewKey) {
	ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
	allowed, err := r.authz.CanListSecrets(ctx, k.Cluster, k.SANamespace, k.SA, k.Namespace)
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
	cancel()
	if err != nil && timedOut {
		err = fmt.Errorf("member %s did not answer an access review within %s: %w", k.Cluster, r.timeout, err)
	}

	r.mu.Lock()
	r.running[k.Cluster]--
	if r.running[k.Cluster] == 0 {
		delete(r.running, k.Cluster)
	}
	r.total--
	delete(r.inflight, k)
	if r.closed {
		r.mu.Unlock()
		return
	}
	var changed []feed.ReviewKey
	if r.record(k, allowed, err) {
		changed = append(changed, k)
	}
	if err != nil && timedOut {
		// The member does not answer: its queued reviews fail with the same
		// error at once instead of each waiting out its own timeout.
		for _, q := range r.queued[k.Cluster] {
			delete(r.inflight, q)
			if r.record(q, false, err) {
				changed = append(changed, q)
			}
		}
		delete(r.queued, k.Cluster)
	}
	r.launchQueued()
	r.mu.Unlock()
	if err != nil {
		r.log.Warn("access review failed; SDS names that need it keep what they have and are retried", "cluster", k.Cluster,
			"serviceAccount", k.SANamespace+"/"+k.SA, "namespace", k.Namespace, "retryAfter", r.failedTTL.String(), "error", err)
	}
	for _, key := range changed {
		r.notify(key)
	}
}

// record stores the outcome of k's review and reports whether it changes
// what a watch gets. A failed revalidation keeps the decision it was to
// refresh until that expires. r.mu is held.
func (r *accessReviews) record(k feed.ReviewKey, allowed bool, err error) bool {
	now := r.now()
	prev, had := r.decisions.Peek(k)
	had = had && now.Before(prev.expires)
	if err != nil {
		if had && prev.err == nil {
			return false
		}
		r.decisions.Add(k, decision{err: err, expires: now.Add(r.failedTTL)})
		// When the failure expires, the watches that asked ask again.
		if t := r.retries[k]; t != nil {
			t.Stop()
		}
		r.retries[k] = time.AfterFunc(r.failedTTL, func() {
			r.mu.Lock()
			delete(r.retries, k)
			closed := r.closed
			r.mu.Unlock()
			if !closed {
				r.notify(k)
			}
		})
		return !had
	}
	ttl := r.denyTTL
	if allowed {
		ttl = r.allowTTL
	}
	r.decisions.Add(k, decision{allowed: allowed, expires: now.Add(ttl), refresh: now.Add(time.Duration(float64(ttl) * reviewRefresh))})
	return !had || prev.err != nil || prev.allowed != allowed
}

// close ends every running review and waits for them; later decisions are
// errReviewsStopped. It is safe on a nil accessReviews.
func (r *accessReviews) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.closed = true
	for k, t := range r.retries {
		t.Stop()
		delete(r.retries, k)
	}
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
}

// newSDS builds the SDS generator of opts: access reviews decide other
// namespaces when an authorizer is configured.
func newSDS(opts Options, scope *authn.Scope, reviews *accessReviews) *sds.Generator {
	var r sds.Reviewer // a nil *accessReviews would be a non-nil Reviewer
	if reviews != nil {
		r = reviews
	}
	return sds.New(opts.Roots, opts.Secrets, scope, r, opts.Namespace)
}
