package hub

import (
	"context"
	"sync"
	"time"
)

// debouncer batches change notifications without delaying the first change
// after a quiet period: a change arriving when nothing happened for `after`
// is pushed at once (leading edge); later changes are collected until `after`
// passes without another one, but never longer than `max` (DESIGN.md §4).
// Each batch is pushed with the time its oldest change was added, from
// which push latency is measured.
type debouncer struct {
	after, max time.Duration
	push       func(hostnames map[string]struct{}, since time.Time)

	mu       sync.Mutex
	incoming map[string]time.Time // changes not yet seen by run, with when each was first added
	signal   chan struct{}        // one slot: "incoming is not empty"
}

func newDebouncer(after, max time.Duration, push func(map[string]struct{}, time.Time)) *debouncer {
	return &debouncer{after: after, max: max, push: push, incoming: map[string]time.Time{}, signal: make(chan struct{}, 1)}
}

// add records changed hostnames, stamped with the time of the call (for
// the index: when a member's change reached it). It never blocks, even
// after run stopped.
func (d *debouncer) add(hostnames []string) {
	now := time.Now()
	d.mu.Lock()
	for _, h := range hostnames {
		if _, ok := d.incoming[h]; !ok {
			d.incoming[h] = now
		}
	}
	d.mu.Unlock()
	select {
	case d.signal <- struct{}{}:
	default:
	}
}

func (d *debouncer) take() map[string]time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.incoming
	d.incoming = map[string]time.Time{}
	return in
}

// run owns the debounce state until ctx is done.
func (d *debouncer) run(ctx context.Context) {
	var (
		pending   = map[string]struct{}{}
		first     time.Time // when run took the oldest pending change
		since     time.Time // when the oldest pending change was added
		lastEvent time.Time
		timer     = time.NewTimer(time.Hour)
	)
	timer.Stop()
	flush := func() {
		if len(pending) == 0 {
			return
		}
		batch, at := pending, since
		pending, since = map[string]struct{}{}, time.Time{}
		d.push(batch, at)
	}
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-d.signal:
			hosts := d.take()
			if len(hosts) == 0 {
				continue
			}
			now := time.Now()
			quiet := len(pending) == 0 && now.Sub(lastEvent) >= d.after
			lastEvent = now
			if len(pending) == 0 {
				first = now
			}
			for h, at := range hosts {
				pending[h] = struct{}{}
				if since.IsZero() || at.Before(since) {
					since = at
				}
			}
			if quiet {
				flush()
				continue
			}
			deadline := now.Add(d.after)
			if limit := first.Add(d.max); deadline.After(limit) {
				deadline = limit
			}
			timer.Reset(time.Until(deadline))
		case <-timer.C:
			flush()
		}
	}
}
