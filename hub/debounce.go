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
type debouncer struct {
	after, max time.Duration
	push       func(hostnames map[string]struct{})

	mu       sync.Mutex
	incoming map[string]struct{} // changes not yet seen by run
	signal   chan struct{}       // one slot: "incoming is not empty"
}

func newDebouncer(after, max time.Duration, push func(map[string]struct{})) *debouncer {
	return &debouncer{after: after, max: max, push: push, incoming: map[string]struct{}{}, signal: make(chan struct{}, 1)}
}

// add records changed hostnames. It never blocks, even after run stopped.
func (d *debouncer) add(hostnames []string) {
	d.mu.Lock()
	for _, h := range hostnames {
		d.incoming[h] = struct{}{}
	}
	d.mu.Unlock()
	select {
	case d.signal <- struct{}{}:
	default:
	}
}

func (d *debouncer) take() map[string]struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.incoming
	d.incoming = map[string]struct{}{}
	return in
}

// run owns the debounce state until ctx is done.
func (d *debouncer) run(ctx context.Context) {
	var (
		pending   = map[string]struct{}{}
		first     time.Time // when the oldest pending change arrived
		lastEvent time.Time
		timer     = time.NewTimer(time.Hour)
	)
	timer.Stop()
	flush := func() {
		if len(pending) == 0 {
			return
		}
		batch := pending
		pending = map[string]struct{}{}
		d.push(batch)
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
			for h := range hosts {
				pending[h] = struct{}{}
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
