package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/sds"

	"github.com/hubmesh/hub/internal/wait"
)

// scriptedMember answers access reviews as the test says: per namespace,
// allow, deny, fail, or hang until the caller gives up.
type scriptedMember struct {
	mu      sync.Mutex
	answers map[string]string // namespace → "allow", "deny", "fail", "hang"
	calls   map[string]int    // namespace → reviews asked
	running int               // reviews in progress
	// unblock ends the hanging reviews as their deadline would (nil: only
	// their deadline does).
	unblock chan struct{}
}

func (m *scriptedMember) CanListSecrets(ctx context.Context, _, _, _, ns string) (bool, error) {
	m.mu.Lock()
	m.calls[ns]++
	m.running++
	answer := m.answers[ns]
	m.mu.Unlock()
	defer func() { m.mu.Lock(); m.running--; m.mu.Unlock() }()
	switch answer {
	case "allow":
		return true, nil
	case "deny":
		return false, nil
	case "hang":
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-m.unblock:
			return false, fmt.Errorf("post: %w", context.DeadlineExceeded)
		}
	}
	return false, errors.New("member says no")
}

func (m *scriptedMember) set(ns, answer string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.answers[ns] = answer
}

func (m *scriptedMember) count(ns string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[ns]
}

// events collects the decisions an accessReviews announces.
type events struct {
	mu   sync.Mutex
	keys map[feed.ReviewKey]int
}

func (e *events) add(k feed.ReviewKey) { e.mu.Lock(); e.keys[k]++; e.mu.Unlock() }
func (e *events) count(k feed.ReviewKey) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.keys[k]
}

// clock is a time the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) get() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// testReviews is an accessReviews on a clock the test moves.
func testReviews(t *testing.T, m *scriptedMember) (*accessReviews, *events, *clock) {
	t.Helper()
	ev := &events{keys: map[feed.ReviewKey]int{}}
	r := newAccessReviews(m, ev.add, slog.New(slog.NewTextHandler(io.Discard, nil)))
	c := &clock{now: time.Now()}
	r.now = c.get
	t.Cleanup(r.close)
	return r, ev, c
}

func TestAccessReviewsAnswerWithoutWaiting(t *testing.T) {
	m := &scriptedMember{answers: map[string]string{"b": "allow", "c": "deny"}, calls: map[string]int{}}
	r, ev, _ := testReviews(t, m)
	key := reviewOf("west", "a", "gw", "b")

	// A miss is pending and starts one review, however often it is asked.
	for range 5 {
		if _, err := r.Decide(key); !errors.Is(err, sds.ErrReviewPending) && err != nil {
			t.Fatalf("first decision: %v", err)
		}
	}
	wait.Until(t, 10*time.Second, func() error {
		if ev.count(key) == 0 {
			return errors.New("the decision was not announced")
		}
		return nil
	})
	if ok, err := r.Decide(reviewOf("west", "a", "gw", "b")); !ok || err != nil {
		t.Fatalf("after the review: %v, %v; want allowed", ok, err)
	}
	if n := m.count("b"); n != 1 {
		t.Errorf("%d reviews for one question; want 1", n)
	}

	// A deny is cached too.
	_, _ = r.Decide(reviewOf("west", "a", "gw", "c"))
	denyKey := reviewOf("west", "a", "gw", "c")
	wait.Until(t, 10*time.Second, func() error {
		if ev.count(denyKey) == 0 {
			return errors.New("the deny was not announced")
		}
		return nil
	})
	if ok, err := r.Decide(reviewOf("west", "a", "gw", "c")); ok || err != nil {
		t.Fatalf("denied: %v, %v", ok, err)
	}
}

func TestAccessReviewsRevalidateNearExpiry(t *testing.T) {
	m := &scriptedMember{answers: map[string]string{"b": "allow"}, calls: map[string]int{}}
	r, ev, now := testReviews(t, m)
	key := reviewOf("west", "a", "gw", "b")
	_, _ = r.Decide(reviewOf("west", "a", "gw", "b"))
	wait.Until(t, 10*time.Second, func() error {
		if ev.count(key) != 1 {
			return errors.New("the allow was not announced")
		}
		return nil
	})
	// Before the last fifth of its life an allow is served as it is.
	now.advance(r.allowTTL / 2)
	if ok, err := r.Decide(reviewOf("west", "a", "gw", "b")); !ok || err != nil || m.count("b") != 1 {
		t.Fatalf("mid-life: %v, %v, %d reviews", ok, err, m.count("b"))
	}
	// Near expiry: still served, and revalidated in the background; the
	// member now denies, which is announced and then served.
	m.set("b", "deny")
	now.advance(r.allowTTL * 4 / 10)
	if ok, err := r.Decide(reviewOf("west", "a", "gw", "b")); !ok || err != nil {
		t.Fatalf("near expiry: %v, %v; want the last decision (allowed) served", ok, err)
	}
	wait.Until(t, 10*time.Second, func() error {
		if ev.count(key) != 2 {
			return fmt.Errorf("the changed decision was announced %d times in all; want 2", ev.count(key))
		}
		return nil
	})
	if ok, err := r.Decide(reviewOf("west", "a", "gw", "b")); ok || err != nil {
		t.Fatalf("after revalidation: %v, %v; want denied", ok, err)
	}
	// A failed revalidation keeps the decision it was to refresh.
	m.set("b", "fail")
	now.advance(r.denyTTL * 9 / 10)
	if ok, err := r.Decide(reviewOf("west", "a", "gw", "b")); ok || err != nil {
		t.Fatalf("near the deny's expiry: %v, %v", ok, err)
	}
	wait.Until(t, 10*time.Second, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.inflight) != 0 || m.count("b") != 3 {
			return fmt.Errorf("%d reviews asked, %d in flight", m.count("b"), len(r.inflight))
		}
		return nil
	})
	if ok, err := r.Decide(reviewOf("west", "a", "gw", "b")); ok || err != nil {
		t.Fatalf("after a failed revalidation: %v, %v; want the deny still served", ok, err)
	}
}

func TestAccessReviewsRetryFailures(t *testing.T) {
	m := &scriptedMember{answers: map[string]string{"b": "fail"}, calls: map[string]int{}}
	r, ev, now := testReviews(t, m)
	r.failedTTL = 50 * time.Millisecond
	key := reviewOf("west", "a", "gw", "b")
	_, _ = r.Decide(reviewOf("west", "a", "gw", "b"))
	// The failure is announced, then announced again when it has expired,
	// so that the watches that asked ask again.
	wait.Until(t, 10*time.Second, func() error {
		if ev.count(key) < 2 {
			return fmt.Errorf("announced %d times; want the failure and its expiry", ev.count(key))
		}
		return nil
	})
	m.set("b", "allow")
	now.advance(time.Second)
	if _, err := r.Decide(reviewOf("west", "a", "gw", "b")); !errors.Is(err, sds.ErrReviewPending) {
		t.Fatalf("after the failure expired: %v; want a new review pending", err)
	}
	wait.Until(t, 10*time.Second, func() error {
		if ok, err := r.Decide(reviewOf("west", "a", "gw", "b")); !ok || err != nil {
			return fmt.Errorf("%v, %v", ok, err)
		}
		return nil
	})
}

// TestAccessReviewsOfASilentMemberHoldNoOtherMember: reviews in a member
// that does not answer take at most its share of the slots; another
// member's run at once. When one of the silent member's reviews times out,
// those queued behind it fail with it instead of each waiting its own
// timeout.
func TestAccessReviewsOfASilentMemberHoldNoOtherMember(t *testing.T) {
	black := &scriptedMember{answers: map[string]string{}, calls: map[string]int{}, unblock: make(chan struct{})}
	for i := range 5 {
		black.answers[fmt.Sprint("ns", i)] = "hang"
	}
	black.answers["ok"] = "allow"
	r, ev, _ := testReviews(t, black)
	r.perMember, r.overall = 2, 3
	for i := range 5 {
		_, _ = r.Decide(reviewOf("black", "a", "gw", fmt.Sprint("ns", i)))
	}
	wait.Until(t, 10*time.Second, func() error {
		black.mu.Lock()
		defer black.mu.Unlock()
		if black.running != 2 {
			return fmt.Errorf("%d reviews running; want the member's 2", black.running)
		}
		return nil
	})
	// Another member gets the free slot while the silent one's hang.
	_, _ = r.Decide(reviewOf("west", "a", "gw", "ok"))
	wait.Until(t, 10*time.Second, func() error {
		if ok, err := r.Decide(reviewOf("west", "a", "gw", "ok")); !ok || err != nil {
			return fmt.Errorf("west: %v, %v", ok, err)
		}
		return nil
	})
	black.mu.Lock()
	if black.running != 2 {
		t.Errorf("%d of the silent member's reviews running when west's was decided; want 2", black.running)
	}
	black.mu.Unlock()
	// The silent member's timeouts fail everything queued behind them.
	close(black.unblock)
	wait.Until(t, 10*time.Second, func() error {
		for i := range 5 {
			k := reviewOf("black", "a", "gw", fmt.Sprint("ns", i))
			if ev.count(k) == 0 {
				return fmt.Errorf("%s not decided yet", k.Namespace)
			}
		}
		return nil
	})
	asked := 0
	for i := range 5 {
		asked += black.count(fmt.Sprint("ns", i))
		if _, err := r.Decide(reviewOf("black", "a", "gw", fmt.Sprint("ns", i))); err == nil || errors.Is(err, sds.ErrReviewPending) {
			t.Errorf("ns%d: %v; want the member's failure", i, err)
		}
	}
	if asked != 2 {
		t.Errorf("the silent member was asked %d reviews; want the 2 that ran before the first timeout", asked)
	}
}

// A push reaches only the subscribers that what changed can affect:
// hostnames their named subscriptions, any hostname the wildcard ones, a
// Secret the SDS subscribers whose identity's member and names ask for it,
// roots those asking for roots, a decision those that consulted it.
func TestChangesReachOnlyTheirSubscribers(t *testing.T) {
	k1, k2 := reviewOf("west", "a", "gw", "b"), reviewOf("west", "a", "gw", "c")
	const host = "echo.demo.svc.cluster.local"
	names := func(n ...string) map[string]struct{} {
		m := map[string]struct{}{}
		for _, k := range n {
			m[k] = struct{}{}
		}
		return m
	}
	westA := authn.Identity{Cluster: "west", Namespace: "a"}
	sds := func(id authn.Identity, n ...string) *subscriber {
		s := newSubscriber(resourcev3.SecretType, names(n...), false, true)
		s.aim(id)
		return s
	}
	consulted := func(s *subscriber, k feed.ReviewKey) *subscriber {
		s.reviews = map[feed.ReviewKey]struct{}{k: {}}
		return s
	}
	secret := func(cluster, ns, name string) *feed.Batch {
		return &feed.Batch{Secrets: map[feed.SecretRef]struct{}{{Cluster: cluster, Key: clusters.ServiceKey{Namespace: ns, Name: name}}: {}}}
	}
	for _, c := range []struct {
		name    string
		sub     *subscriber
		changed *feed.Batch
		want    bool
	}{
		{"its review", consulted(sds(westA, "kubernetes://b/gw"), k1), &feed.Batch{Reviews: map[feed.ReviewKey]struct{}{k1: {}}}, true},
		{"another review", consulted(sds(westA, "kubernetes://b/gw"), k1), &feed.Batch{Reviews: map[feed.ReviewKey]struct{}{k2: {}}}, false},
		{"a review it did not consult", sds(westA, "kubernetes://gw"), &feed.Batch{Reviews: map[feed.ReviewKey]struct{}{k1: {}}}, false},
		{"its secret", sds(westA, "kubernetes://gw"), secret("west", "a", "gw"), true},
		{"its secret by namespace, CA only", sds(westA, "kubernetes://b/gw-cacert"), secret("west", "b", "gw"), true},
		{"its separate CA secret", sds(westA, "kubernetes://b/gw-cacert"), secret("west", "b", "gw-cacert"), true},
		{"the same secret in another member", sds(westA, "kubernetes://gw"), secret("east", "a", "gw"), false},
		{"another namespace's secret of that name", sds(westA, "kubernetes://gw"), secret("west", "b", "gw"), false},
		{"another secret", sds(westA, "kubernetes://gw", "ROOTCA"), secret("west", "a", "other"), false},
		{"no member proven", sds(authn.Identity{Namespace: "a"}, "kubernetes://gw"), secret("", "a", "gw"), false},
		{"its member resynced", sds(westA, "kubernetes://gw"), &feed.Batch{Members: map[string]struct{}{"west": {}}}, true},
		{"another member resynced", sds(westA, "kubernetes://gw"), &feed.Batch{Members: map[string]struct{}{"east": {}}}, false},
		{"roots, asking ROOTCA", sds(westA, "ROOTCA"), &feed.Batch{Roots: true}, true},
		{"roots, asking a peer's bundle", sds(westA, "spiffe://peer.example"), &feed.Batch{Roots: true}, true},
		{"roots, asking no roots", sds(westA, "kubernetes://gw"), &feed.Batch{Roots: true}, false},
		{"a service, SDS", sds(westA, "ROOTCA"), &feed.Batch{Hosts: names(host)}, false},
		{"wildcard, a review and a secret", &subscriber{typeURL: resourcev3.ClusterType, wildcard: true}, &feed.Batch{Reviews: map[feed.ReviewKey]struct{}{k1: {}}, Secrets: secret("west", "a", "gw").Secrets, Roots: true}, false},
		{"wildcard, a service", &subscriber{typeURL: resourcev3.ClusterType, wildcard: true}, &feed.Batch{Hosts: names(host)}, true},
		{"named, a review", newSubscriber(resourcev3.EndpointType, names("outbound|80||"+host), false, true), &feed.Batch{Reviews: map[feed.ReviewKey]struct{}{k1: {}}, Roots: true}, false},
		{"named, its service", newSubscriber(resourcev3.EndpointType, names("outbound|80||"+host), false, true), &feed.Batch{Hosts: names(host)}, true},
		{"named, another service", newSubscriber(resourcev3.EndpointType, names("outbound|80||"+host), false, true), &feed.Batch{Hosts: names("x.demo.svc.cluster.local")}, false},
	} {
		// No watch is parked: a push only notes what changed for each
		// subscriber it reaches.
		w := newWatcher(watcherInputs{workers: 1, log: slog.New(slog.DiscardHandler)})
		w.index.add(c.sub)
		c.sub.dirty, c.sub.full = nil, false
		w.push(context.Background(), c.changed, w.fleet.Mark(), nil)
		if got := len(c.sub.dirty) > 0 || c.sub.full; got != c.want {
			t.Errorf("%s: reached %v (%v); want %v", c.name, got, c.sub.dirty, c.want)
		}
	}
}

// reviewOf is the access review of ServiceAccount saNamespace/sa of member
// cluster for the Secrets of namespace.
func reviewOf(cluster, saNamespace, sa, namespace string) feed.ReviewKey {
	return feed.ReviewKey{Cluster: cluster, SANamespace: saNamespace, SA: sa, Namespace: namespace}
}
