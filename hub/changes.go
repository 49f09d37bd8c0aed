package hub

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hubmesh/hub/clusters"
)

// Changes is the hub's change feed: the parts that see the mesh change
// report typed changes to it (the federated Index its hostnames, the member
// registry its Secrets, the trust federation its roots, the access reviews
// their decisions), and the Hub's push loop is its one consumer (Hub.Run).
// It is built before any of them, so that each can be given it.
//
// Changes batch without delaying the first change after a quiet period: a
// change arriving when nothing happened for `after` is pushed at once
// (leading edge); later changes are collected until `after` passes without
// another one, but never longer than `max` (DESIGN.md §4); changes made
// while a push is being delivered wait for it and for a quiet period as long
// as its delivery took (see run). Each batch
// carries the time its oldest change was reported, from which push latency
// is measured. Reporting never blocks, also when nothing consumes.
type Changes struct {
	after, max time.Duration

	quiet atomic.Int64 // the current quiet period (time.Duration), see run

	mu       sync.Mutex
	incoming batch         // reported, not yet taken by the consumer
	signal   chan struct{} // one slot: "incoming is not empty"
}

// NewChanges creates a change feed whose batches wait at most max and close
// after a quiet period of after.
func NewChanges(after, max time.Duration) *Changes {
	return &Changes{after: after, max: max, signal: make(chan struct{}, 1)}
}

// batch is what changed since the previous push.
type batch struct {
	hosts   map[string]struct{}    // services whose federated view changed
	secrets map[secretRef]struct{} // member Secrets that changed
	// members are the members whose every Secret may have changed: their
	// Secret cache (re)synced, or they switched to a new client.
	members map[string]struct{}
	roots   bool                   // a trust domain's roots changed
	kinds   map[string]struct{}    // Istio config kinds distributed from the home cluster that changed
	reviews map[reviewKey]struct{} // access reviews whose decision changed
	since   time.Time              // when the oldest of these was reported
	latest  time.Time              // when the newest of these was reported
}

// secretRef names one Secret of one member.
type secretRef struct {
	cluster string
	key     clusters.ServiceKey
}

func (b *batch) empty() bool {
	return len(b.hosts) == 0 && len(b.secrets) == 0 && len(b.members) == 0 && !b.roots && len(b.reviews) == 0 && len(b.kinds) == 0
}

// merge adds o's changes to b.
func (b *batch) merge(o *batch) {
	b.hosts = union(b.hosts, o.hosts)
	b.secrets = union(b.secrets, o.secrets)
	b.members = union(b.members, o.members)
	b.reviews = union(b.reviews, o.reviews)
	b.kinds = union(b.kinds, o.kinds)
	b.roots = b.roots || o.roots
	if b.since.IsZero() || !o.since.IsZero() && o.since.Before(b.since) {
		b.since = o.since
	}
	if o.latest.After(b.latest) {
		b.latest = o.latest
	}
}

func union[K comparable](into, from map[K]struct{}) map[K]struct{} {
	if into == nil {
		return from
	}
	for k := range from {
		into[k] = struct{}{}
	}
	return into
}

func add[K comparable](m *map[K]struct{}, k K) {
	if *m == nil {
		*m = map[K]struct{}{}
	}
	(*m)[k] = struct{}{}
}

// HostnamesChanged reports services whose federated view changed.
func (c *Changes) HostnamesChanged(hostnames []string) {
	c.report(func(b *batch) {
		for _, h := range hostnames {
			add(&b.hosts, h)
		}
	})
}

// SecretChanged reports that one Secret of a member changed (or went).
func (c *Changes) SecretChanged(cluster string, key clusters.ServiceKey) {
	c.report(func(b *batch) { add(&b.secrets, secretRef{cluster, key}) })
}

// SecretsSynced reports that a member's Secret cache (re)synced, or that
// the member switched to a new client (kubeconfig rotation): any of its
// Secrets may have changed.
func (c *Changes) SecretsSynced(cluster string) {
	c.report(func(b *batch) { add(&b.members, cluster) })
}

// ConfigChanged reports that the Istio objects of a kind distributed from
// the home cluster changed (distribute.Options.OnChange).
func (c *Changes) ConfigChanged(kind string) {
	c.report(func(b *batch) { add(&b.kinds, kind) })
}

// RootsChanged reports that a trust domain's roots changed.
func (c *Changes) RootsChanged() { c.report(func(b *batch) { b.roots = true }) }

// reviewDecided reports that an access review's decision changed.
func (c *Changes) reviewDecided(k reviewKey) {
	c.report(func(b *batch) { add(&b.reviews, k) })
}

// report records a change, stamped with the time of the call (for the
// Index: when a member's change reached it), and wakes the consumer.
func (c *Changes) report(change func(*batch)) {
	now := time.Now()
	c.mu.Lock()
	change(&c.incoming)
	if c.incoming.since.IsZero() {
		c.incoming.since = now
	}
	c.incoming.latest = now
	c.mu.Unlock()
	select {
	case c.signal <- struct{}{}:
	default:
	}
}

func (c *Changes) take() batch {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.incoming
	c.incoming = batch{}
	return b
}

// run hands batches to push until ctx is done; it is the feed's one
// consumer and owns the debounce state.
//
// Pushes are paced by what they cost (fleet, nil: not paced): after a push
// the feed waits until the fleet answered most of what it was handed
// (deliveries). A change made when that push is delivered and nothing
// changed for `after` is a leading edge and goes at once, so a quiet mesh
// and one-off writes are never held back. Changes made while a push is
// being delivered wait for it, then for a quiet period as long as its
// delivery took (never shorter than `after`): under sustained churn on a
// loaded fleet they coalesce into few, large pushes instead of each taking
// the leading edge (congestion collapse: every push slows the next and
// stretches the churn, so every gap looks quiet). A batch never waits
// longer than `max` from its first change, delivered or not; a push not
// delivered within `max` stops being waited for, and pacing starts over.
func (c *Changes) run(ctx context.Context, push func(*batch), fleet *deliveries) {
	var (
		pending    batch
		first      time.Time // when run took the oldest pending change
		lastChange time.Time // when the newest change taken so far was reported
		lastTaken  time.Time // when run took it
		quiet      = c.after // the quiet period a batch waits for
		delivering <-chan struct{}
		pushedAt   time.Time // when the push being delivered started
		timer      = time.NewTimer(time.Hour)
	)
	timer.Stop()
	c.quiet.Store(int64(quiet))
	setQuiet := func(d time.Duration) {
		quiet = min(max(d, c.after), c.max)
		c.quiet.Store(int64(quiet))
	}
	flush := func() {
		if pending.empty() {
			return
		}
		b := pending
		pending = batch{}
		timer.Stop()
		if fleet == nil {
			push(&b)
			return
		}
		m := fleet.mark()
		pushedAt = time.Now()
		push(&b)
		if delivering = fleet.await(m); delivering == nil {
			setQuiet(time.Since(pushedAt)) // nothing handed out: the push cost its own time
		}
	}
	// giveUp stops waiting for a push not delivered within max.
	giveUp := func(now time.Time) {
		if delivering != nil && now.Sub(pushedAt) >= c.max {
			delivering = nil
			fleet.stopWaiting()
			setQuiet(c.after)
		}
	}
	// due is when pending may go: the quiet period after its newest change
	// was taken once the last push is delivered (or given up on), and at
	// the latest `max` from its first change.
	due := func() time.Time {
		d := first.Add(c.max)
		if delivering != nil {
			if g := pushedAt.Add(c.max); g.Before(d) {
				return g // then given up on, and due again
			}
			return d
		}
		if q := lastTaken.Add(quiet); q.Before(d) {
			d = q
		}
		return d
	}
	schedule := func(now time.Time) {
		if !pending.empty() {
			timer.Reset(max(due().Sub(now), 0))
		}
	}
	defer func() {
		timer.Stop()
		if fleet != nil {
			fleet.stopWaiting()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.signal:
			in := c.take()
			if in.empty() {
				continue
			}
			now := time.Now()
			giveUp(now)
			// Quiet means the last push is delivered and no change was
			// made for `after` before this one: judged by when changes
			// were reported, not when they were taken, so that changes
			// made during a long push are not mistaken for the first after
			// a quiet period (under sustained churn every batch would take
			// the leading edge: back-to-back pushes, never coalesced).
			isQuiet := pending.empty() && delivering == nil && in.since.Sub(lastChange) >= c.after
			lastChange, lastTaken = in.latest, now
			if pending.empty() {
				first = now
			}
			pending.merge(&in)
			if isQuiet {
				flush()
				continue
			}
			schedule(now)
		case <-delivering:
			delivering = nil
			setQuiet(time.Since(pushedAt))
			schedule(time.Now())
		case <-timer.C:
			now := time.Now()
			giveUp(now)
			if now.Before(due()) {
				schedule(now)
				continue
			}
			flush()
		}
	}
}

// Quiet returns the quiet period batches currently wait for: the time the
// last push took to be delivered, within the feed's bounds (see run).
func (c *Changes) Quiet() time.Duration { return time.Duration(c.quiet.Load()) }
