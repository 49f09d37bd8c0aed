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
// Changes batch without delaying the first change after a calm period: a
// change arriving when nothing happened for `after` is pushed at once
// (leading edge); later changes wait for the push being delivered, then
// for a quiet period as long as its delivery took, but never longer than
// `max` (DESIGN.md §4); under sustained churn pushes back off to one per
// `max`, and each reaches the streams in waves that leave the fleet idle
// most of the time (see run and pace). Each batch carries the time its
// oldest change was reported, from which push latency is measured.
// Reporting never blocks, also when nothing consumes.
type Changes struct {
	after, max time.Duration

	quiet  atomic.Int64               // the current quiet period (time.Duration), see run
	pushes [pushTriggers]atomic.Int64 // pushes made, by what let them go

	mu       sync.Mutex
	incoming batch         // reported, not yet taken by the consumer
	signal   chan struct{} // one slot: "incoming is not empty"
}

// NewChanges creates a change feed whose batches wait at most max and close
// after a quiet period of after.
func NewChanges(after, max time.Duration) *Changes {
	return &Changes{after: after, max: max, signal: make(chan struct{}, 1)}
}

// pushTrigger is what let a push go.
type pushTrigger int

const (
	// leadingEdge: the first change after a calm period, pushed at once.
	leadingEdge pushTrigger = iota
	// quietAfter: no change for the quiet period.
	quietAfter
	// maxWait: the oldest change waited the longest a change may wait.
	maxWait
	pushTriggers
)

// String is the trigger's name in the hub_xds_pushes_total metric.
func (t pushTrigger) String() string {
	return [...]string{"leading_edge", "quiet", "max_wait"}[t]
}

// Pushes returns how many pushes the trigger let go.
func (c *Changes) Pushes(t pushTrigger) int64 { return c.pushes[t].Load() }

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
	reports int                    // how many reports these are
	// churn says these changes piled up (see Changes.run): their push
	// reaches its streams in waves (watcher.push).
	churn bool
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
	b.reports += o.reports
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
	c.incoming.reports++
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
// (deliveries); the time that took is the push's cost, the quiet period.
//
// The first change after a calm period goes at once (leading edge), so a
// quiet mesh and one-off writes are never held back. Calm means nothing
// pending, no change for `after`, and the fleet idle (the last push
// delivered) for `after` and for half the last push's cost: leading edges
// alone keep the fleet busy at most two thirds of the time, so the API
// servers and workloads it shares machines with keep a third. A change
// that is not calm only for that reason goes once the fleet was idle that
// long, as one-off writes on a busy fleet do.
//
// Changes that pile up are churn: a change made while a push is
// delivered, while another waits, or within `after` of another. A batch
// with churn waits, once the last push is delivered, for a quiet period
// (no change reported for the last push's cost) and for the spacing since
// the last push started; each push of such a batch doubles the spacing (from the
// last push's cost, up to `max`), and a push without churn resets it to
// `after`. So under sustained churn pushes back
// off to one per `max` whatever the churn's rhythm (a loaded fleet slows
// the API servers it shares machines with, their writes come with gaps,
// and gaps judged against a fixed quiet period would each look like a
// leading edge: congestion collapse), while a writer that waits for each
// write to arrive is never mistaken for churn.
//
// A push of churn reaches its streams in waves (pace): the fleet is busy
// about a third of the time while it is handed out, for at most `max`
// beyond what its delivery costs. Changes made meanwhile are taken when
// it is handed out.
//
// A batch never waits longer than `max` from its first change, delivered
// or not; a push not delivered within `max` stops being waited for, and
// pacing starts over.
func (c *Changes) run(ctx context.Context, push func(context.Context, *batch) time.Duration, fleet *deliveries) {
	var (
		pending    batch
		churn      bool      // pending holds changes that piled up (see above)
		first      time.Time // when run took the oldest pending change
		lastChange time.Time // when the newest change taken so far was reported
		quiet      = c.after // the last push's cost, within [after, max]
		spacing    = c.after // the least time between two pushes' starts
		delivering <-chan struct{}
		pushedAt   time.Time // when the last push started, plus the time it left the fleet idle (pace)
		idleSince  time.Time // when the last push was delivered (or given up on)
		timer      = time.NewTimer(time.Hour)
	)
	timer.Stop()
	c.quiet.Store(int64(quiet))
	setQuiet := func(d time.Duration) {
		quiet = min(max(d, c.after), c.max)
		c.quiet.Store(int64(quiet))
	}
	delivered := func(now time.Time) {
		delivering, idleSince = nil, now
		setQuiet(now.Sub(pushedAt))
	}
	// rested is how long the fleet must have been idle before a push that
	// is not forced by max: `after`, and half the last push's cost.
	rested := func() time.Duration { return max(c.after, quiet/2) }
	flush := func(t pushTrigger) {
		if pending.empty() {
			return
		}
		c.pushes[t].Add(1)
		if churn {
			spacing = min(max(2*spacing, quiet), c.max)
		} else {
			spacing = c.after
		}
		b := pending
		b.churn = churn
		pending, churn = batch{}, false
		timer.Stop()
		var m mark
		if fleet != nil {
			m = fleet.mark()
		}
		pushedAt = time.Now()
		// The time a paced push left the fleet idle is no cost of it.
		pushedAt = pushedAt.Add(push(ctx, &b))
		if fleet == nil {
			delivering, idleSince = nil, time.Now()
			return
		}
		if delivering = fleet.await(m); delivering == nil {
			delivered(time.Now()) // nothing handed out: the push cost its own time
		}
	}
	// giveUp stops waiting for a push not delivered within max.
	giveUp := func(now time.Time) {
		if delivering != nil && now.Sub(pushedAt) >= c.max {
			fleet.stopWaiting()
			delivering, idleSince = nil, now
			setQuiet(c.after)
		}
	}
	// due is when pending may go (see run): at the latest `max` from its
	// first change.
	due := func() time.Time {
		d := first.Add(c.max)
		if delivering != nil {
			if g := pushedAt.Add(c.max); g.Before(d) {
				return g // then given up on, and due again
			}
			return d
		}
		wait := c.after
		if churn {
			wait = quiet
		}
		q := lastChange.Add(wait)
		if r := idleSince.Add(rested()); r.After(q) {
			q = r
		}
		if s := pushedAt.Add(spacing); s.After(q) {
			q = s
		}
		if q.Before(d) {
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
			// Judged by when changes were reported, not when they were
			// taken, so that changes made during a long push are not
			// mistaken for the first after a calm period.
			if !pending.empty() || delivering != nil || in.reports > 1 || in.since.Sub(lastChange) < c.after {
				churn = true
			}
			calm := !churn && in.since.Sub(idleSince) >= rested() && now.Sub(pushedAt) >= spacing
			lastChange = in.latest
			if pending.empty() {
				first = now
			}
			pending.merge(&in)
			if calm {
				flush(leadingEdge)
				continue
			}
			schedule(now)
		case <-delivering:
			now := time.Now()
			delivered(now)
			schedule(now)
		case <-timer.C:
			now := time.Now()
			giveUp(now)
			if now.Before(due()) {
				schedule(now)
				continue
			}
			t := quietAfter
			if !now.Before(first.Add(c.max)) {
				t = maxWait
			}
			flush(t)
		}
	}
}

// Quiet returns the quiet period batches currently wait for: the time the
// last push took to be delivered, within the feed's bounds (see run).
func (c *Changes) Quiet() time.Duration { return time.Duration(c.quiet.Load()) }
