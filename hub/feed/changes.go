// Package feed is where the hub's data path starts: the federated Index
// of every member's services, and the change feed (Changes) that the
// Index, the member registry, the trust federation, the distributed Istio
// config and the access reviews report typed changes to, batched for the
// hub's push and paced by when each push says it was delivered. It knows
// nothing of xDS or of streams.
package feed

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
// their decisions, the distributed Istio config its kinds), and the Hub's
// push loop is its one consumer (Hub.Run).
// It is built before any of them, so that each can be given it.
//
// Changes batch without delaying the first change after a calm period: a
// change arriving when nothing happened for `after` is pushed at once
// (leading edge); later changes wait for the push being delivered, then
// for a quiet period as long as its delivery took, but never longer than
// `max` (docs/architecture.md §4); under sustained churn pushes back off to one per
// `max`, and each reaches the streams in waves that leave the fleet idle
// most of the time (see Run, and pacing.Pace). Each batch carries the time its
// oldest change was reported, from which push latency is measured.
// Reporting never blocks, also when nothing consumes.
type Changes struct {
	after, max time.Duration

	quiet  atomic.Int64               // the current quiet period (time.Duration), see run
	pushes [PushTriggers]atomic.Int64 // pushes made, by what let them go

	mu       sync.Mutex
	incoming Batch         // reported, not yet taken by the consumer
	signal   chan struct{} // one slot: "incoming is not empty"
}

// NewChanges creates a change feed whose batches wait at most max and close
// after a quiet period of after.
func NewChanges(after, max time.Duration) *Changes {
	return &Changes{after: after, max: max, signal: make(chan struct{}, 1)}
}

// PushTrigger is what let a push go.
type PushTrigger int

const (
	// LeadingEdge: the first change after a calm period, pushed at once.
	LeadingEdge PushTrigger = iota
	// QuietAfter: no change for the quiet period.
	QuietAfter
	// MaxWait: the oldest change waited the longest a change may wait.
	MaxWait
	PushTriggers
)

// String is the trigger's name in the hub_xds_pushes_total metric.
func (t PushTrigger) String() string {
	return [...]string{"leading_edge", "quiet", "max_wait"}[t]
}

// Pushes returns how many pushes the trigger let go.
func (c *Changes) Pushes(t PushTrigger) int64 { return c.pushes[t].Load() }

// Batch is what changed since the previous push.
type Batch struct {
	Hosts   map[string]struct{}    // services whose federated view changed
	Secrets map[SecretRef]struct{} // member Secrets that changed
	// Members are the members whose every Secret may have changed: their
	// Secret cache (re)synced, or they switched to a new client.
	Members map[string]struct{}
	Roots   bool                   // a trust domain's roots changed
	Kinds   map[string]struct{}    // Istio config kinds distributed from the home cluster that changed
	Reviews map[ReviewKey]struct{} // access reviews whose decision changed
	Since   time.Time              // when the oldest of these was reported
	latest  time.Time              // when the newest of these was reported
	reports int                    // how many reports these are
	// Churn says these changes piled up (see Changes.Run): their push
	// reaches its streams in waves (pacing.Pace).
	Churn bool
}

// SecretRef names one Secret of one member.
type SecretRef struct {
	Cluster string
	Key     clusters.ServiceKey
}

// ReviewKey is one access review: may the ServiceAccount SA of
// SANamespace in member Cluster read the Secrets of Namespace.
type ReviewKey struct{ Cluster, SANamespace, SA, Namespace string }

// Empty reports whether nothing changed.
func (b *Batch) Empty() bool {
	return len(b.Hosts) == 0 && len(b.Secrets) == 0 && len(b.Members) == 0 && !b.Roots && len(b.Reviews) == 0 && len(b.Kinds) == 0
}

// AddHost adds a hostname whose resources changed: one a change of the
// generators' inputs (a DestinationRule, the mesh-wide mTLS mode) reached.
func (b *Batch) AddHost(host string) {
	if b.Hosts == nil {
		b.Hosts = map[string]struct{}{}
	}
	b.Hosts[host] = struct{}{}
}

// merge adds o's changes to b.
func (b *Batch) merge(o *Batch) {
	b.Hosts = union(b.Hosts, o.Hosts)
	b.Secrets = union(b.Secrets, o.Secrets)
	b.Members = union(b.Members, o.Members)
	b.Reviews = union(b.Reviews, o.Reviews)
	b.Kinds = union(b.Kinds, o.Kinds)
	b.Roots = b.Roots || o.Roots
	b.reports += o.reports
	if b.Since.IsZero() || !o.Since.IsZero() && o.Since.Before(b.Since) {
		b.Since = o.Since
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
	c.report(func(b *Batch) {
		for _, h := range hostnames {
			add(&b.Hosts, h)
		}
	})
}

// SecretChanged reports that one Secret of a member changed (or went).
func (c *Changes) SecretChanged(cluster string, key clusters.ServiceKey) {
	c.report(func(b *Batch) { add(&b.Secrets, SecretRef{cluster, key}) })
}

// SecretsSynced reports that a member's Secret cache (re)synced, or that
// the member switched to a new client (kubeconfig rotation): any of its
// Secrets may have changed.
func (c *Changes) SecretsSynced(cluster string) {
	c.report(func(b *Batch) { add(&b.Members, cluster) })
}

// ConfigChanged reports that the Istio objects of a kind distributed from
// the home cluster changed (distribute.Options.OnChange).
func (c *Changes) ConfigChanged(kind string) {
	c.report(func(b *Batch) { add(&b.Kinds, kind) })
}

// RootsChanged reports that a trust domain's roots changed.
func (c *Changes) RootsChanged() { c.report(func(b *Batch) { b.Roots = true }) }

// ReviewDecided reports that an access review's decision changed.
func (c *Changes) ReviewDecided(k ReviewKey) {
	c.report(func(b *Batch) { add(&b.Reviews, k) })
}

// report records a change, stamped with the time of the call (for the
// Index: when a member's change reached it), and wakes the consumer.
func (c *Changes) report(change func(*Batch)) {
	now := time.Now()
	c.mu.Lock()
	change(&c.incoming)
	if c.incoming.Since.IsZero() {
		c.incoming.Since = now
	}
	c.incoming.latest = now
	c.incoming.reports++
	c.mu.Unlock()
	select {
	case c.signal <- struct{}{}:
	default:
	}
}

func (c *Changes) take() Batch {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.incoming
	c.incoming = Batch{}
	return b
}

// Run hands batches to push until ctx is done; it is the feed's one
// consumer. The rules below are the debouncer's (debounce.go), which holds
// the debounce state; Run feeds it the clock, the timer and when each push
// is delivered.
//
// Pushes are paced by what they cost: push returns a channel closed once
// the streams took in most of what it handed them (nil: nothing to wait
// for), and the feed waits for it; the time from the push's start until
// then is its cost, the quiet period. push also returns how long it left
// the fleet idle while handing out its waves (that is no cost of it).
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
// A push of churn may reach its streams in waves (pacing.Pace): the
// fleet is busy about a third of the time while it is handed out, for at
// most `max` beyond what its delivery costs. Changes made meanwhile are
// taken when it is handed out.
//
// A batch never waits longer than `max` from its first change, delivered
// or not; a push not delivered within `max` stops being waited for, and
// pacing starts over.
func (c *Changes) Run(ctx context.Context, push func(context.Context, *Batch) (delivered <-chan struct{}, idled time.Duration)) {
	d := newDebouncer(c.after, c.max)
	c.quiet.Store(int64(d.quiet))
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	timer.Stop()
	var delivering <-chan struct{}
	flush := func(t PushTrigger) {
		c.pushes[t].Add(1)
		timer.Stop()
		b := d.take()
		start := time.Now()
		var idled time.Duration
		delivering, idled = push(ctx, &b)
		d.pushed(start, idled, delivering != nil)
		if delivering == nil {
			d.delivered(time.Now()) // nothing to wait for: the push cost its own time
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.signal:
			in := c.take()
			if in.Empty() {
				continue
			}
			now := time.Now()
			if d.giveUp(now) {
				delivering = nil // not delivered within max
			}
			if d.changed(&in, now) {
				flush(LeadingEdge)
			}
		case <-delivering:
			delivering = nil
			d.delivered(time.Now())
		case <-timer.C:
			now := time.Now()
			if d.giveUp(now) {
				delivering = nil
			}
			if t, ok := d.fired(now); ok {
				flush(t)
			}
		}
		c.quiet.Store(int64(d.quiet))
		if due, ok := d.due(); ok {
			timer.Reset(max(time.Until(due), 0))
		}
	}
}

// Limit is the longest a change waits for its push (--debounce-max); a
// push of churn hands out its waves within it too (pacing.Pace).
func (c *Changes) Limit() time.Duration { return c.max }

// Quiet returns the quiet period batches currently wait for: the time the
// last push took to be delivered, within the feed's bounds (see run).
func (c *Changes) Quiet() time.Duration { return time.Duration(c.quiet.Load()) }
