package feed

import "time"

// debouncer decides when the pending changes go (see Changes.Run for the
// rules). It holds the debounce state and does nothing else: no clock, no
// timer, no I/O. Run feeds it the time of every event, so its tests are
// tables of events and times.
type debouncer struct {
	after, max time.Duration

	pending    Batch
	churn      bool      // pending holds changes that piled up
	first      time.Time // when the oldest pending change was taken
	lastChange time.Time // when the newest change taken so far was reported
	quiet      time.Duration
	spacing    time.Duration // the least time between two pushes' starts
	delivering bool          // the last push is being delivered
	pushedAt   time.Time     // when the last push started, plus the time it left the fleet idle
	idleSince  time.Time     // when the last push was delivered (or given up on)
}

func newDebouncer(after, max time.Duration) *debouncer {
	return &debouncer{after: after, max: max, quiet: after, spacing: after}
}

// changed takes in changes taken from the feed at now and reports whether
// they go at once: the first change after a calm period (the leading edge).
func (d *debouncer) changed(in *Batch, now time.Time) (leadingEdge bool) {
	// Judged by when changes were reported, not when they were taken, so
	// that changes made during a long push are not mistaken for the first
	// after a calm period.
	if !d.pending.Empty() || d.delivering || in.reports > 1 || in.Since.Sub(d.lastChange) < d.after {
		d.churn = true
	}
	calm := !d.churn && in.Since.Sub(d.idleSince) >= d.rested() && now.Sub(d.pushedAt) >= d.spacing
	d.lastChange = in.latest
	if d.pending.Empty() {
		d.first = now
	}
	d.pending.merge(in)
	return calm
}

// fired says, when the timer set for due fires at now, whether the pending
// changes go and what let them.
func (d *debouncer) fired(now time.Time) (PushTrigger, bool) {
	if d.pending.Empty() {
		return 0, false
	}
	if due, _ := d.due(); now.Before(due) {
		return 0, false
	}
	if !now.Before(d.first.Add(d.max)) {
		return MaxWait, true
	}
	return QuietAfter, true
}

// due returns when the pending changes may go, at the latest `max` from
// the first of them; false when nothing is pending.
func (d *debouncer) due() (time.Time, bool) {
	if d.pending.Empty() {
		return time.Time{}, false
	}
	due := d.first.Add(d.max)
	if d.delivering {
		if g := d.pushedAt.Add(d.max); g.Before(due) {
			return g, true // then given up on, and due again
		}
		return due, true
	}
	wait := d.after
	if d.churn {
		wait = d.quiet
	}
	q := later(d.lastChange.Add(wait), d.idleSince.Add(d.rested()), d.pushedAt.Add(d.spacing))
	if q.Before(due) {
		due = q
	}
	return due, true
}

func later(ts ...time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

// rested is how long the fleet must have been idle before a push that is
// not forced by max: `after`, and half the last push's cost.
func (d *debouncer) rested() time.Duration { return max(d.after, d.quiet/2) }

// take hands out the pending changes for a push starting now: a push of
// churn doubles the spacing (from the last push's cost, up to `max`), one
// without resets it to `after`.
func (d *debouncer) take() Batch {
	if d.churn {
		d.spacing = min(max(2*d.spacing, d.quiet), d.max)
	} else {
		d.spacing = d.after
	}
	b := d.pending
	b.Churn = d.churn
	d.pending, d.churn = Batch{}, false
	return b
}

// pushed records a push that started at start and left the fleet idle for
// idled while pacing its waves (no cost of it); delivering says whether
// the feed waits for it to be delivered.
func (d *debouncer) pushed(start time.Time, idled time.Duration, delivering bool) {
	d.pushedAt, d.delivering = start.Add(idled), delivering
}

// delivered records that the last push was delivered at now: its cost,
// the time since it started, is the quiet period from now on.
func (d *debouncer) delivered(now time.Time) {
	d.delivering, d.idleSince = false, now
	d.quiet = min(max(now.Sub(d.pushedAt), d.after), d.max)
}

// giveUp stops waiting for a push not delivered within max and reports
// whether it did; pacing starts over.
func (d *debouncer) giveUp(now time.Time) bool {
	if !d.delivering || now.Sub(d.pushedAt) < d.max {
		return false
	}
	d.delivering, d.idleSince, d.quiet = false, now, d.after
	return true
}
