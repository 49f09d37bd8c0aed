package feed

import (
	"testing"
	"time"
)

// A step is one event the debouncer sees at a time after the test's start,
// and what it must answer.
type step struct {
	at   time.Duration
	kind stepKind
	// change: how many reports the batch is, and whether it goes at once.
	reports int
	leading bool
	// push: the time the push left the fleet idle, and whether the feed
	// waits for its delivery.
	idled      time.Duration
	delivering bool
	// fire: the trigger expected (none: the changes wait on).
	trigger PushTrigger
	none    bool
	// due: when the pending changes may go.
	due time.Duration
}

type stepKind int

const (
	change  stepKind = iota // changes taken from the feed
	push                    // the pending changes handed to a push
	deliver                 // the last push delivered
	fire                    // the timer fired
	due                     // when pending changes go
	giveUp                  // the feed stops waiting for an undelivered push
)

func TestDebouncer(t *testing.T) {
	const after, maxWait = 100 * time.Millisecond, time.Second
	cases := []struct {
		name  string
		steps []step
	}{
		{"the first change after a calm period goes at once", []step{
			{at: 0, kind: change, reports: 1, leading: true},
		}},
		{"a change within `after` of another waits for the quiet period", []step{
			{at: 0, kind: change, reports: 1, leading: true},
			{at: 0, kind: push},
			{at: 10 * time.Millisecond, kind: change, reports: 1},
			{at: 10 * time.Millisecond, kind: due, due: 110 * time.Millisecond},
			{at: 50 * time.Millisecond, kind: fire, none: true},
			{at: 110 * time.Millisecond, kind: fire, trigger: QuietAfter},
		}},
		{"several reports in one batch are churn", []step{
			{at: 0, kind: change, reports: 3},
			{at: 0, kind: due, due: 100 * time.Millisecond},
		}},
		{"churn never waits longer than max", []step{
			{at: 0, kind: change, reports: 2},
			{at: 90 * time.Millisecond, kind: change, reports: 1},
			{at: 180 * time.Millisecond, kind: change, reports: 1},
			{at: 270 * time.Millisecond, kind: change, reports: 1},
			{at: 360 * time.Millisecond, kind: change, reports: 1},
			{at: 450 * time.Millisecond, kind: change, reports: 1},
			{at: 540 * time.Millisecond, kind: change, reports: 1},
			{at: 630 * time.Millisecond, kind: change, reports: 1},
			{at: 720 * time.Millisecond, kind: change, reports: 1},
			{at: 810 * time.Millisecond, kind: change, reports: 1},
			{at: 900 * time.Millisecond, kind: change, reports: 1},
			{at: 990 * time.Millisecond, kind: change, reports: 1},
			{at: 990 * time.Millisecond, kind: due, due: time.Second},
			{at: time.Second, kind: fire, trigger: MaxWait},
		}},
		{"a change while a push is delivered waits for the delivery, then for its cost", []step{
			{at: 0, kind: change, reports: 1, leading: true},
			{at: 0, kind: push, delivering: true},
			{at: 50 * time.Millisecond, kind: change, reports: 1},
			{at: 50 * time.Millisecond, kind: due, due: time.Second}, // given up on by then
			{at: 400 * time.Millisecond, kind: deliver},
			// quiet = 400ms (the push's cost): the last change + 400ms, the
			// fleet rested max(after, 200ms) since 400ms, spacing after.
			{at: 400 * time.Millisecond, kind: due, due: 600 * time.Millisecond},
			{at: 600 * time.Millisecond, kind: fire, trigger: QuietAfter},
		}},
		{"an undelivered push is given up on after max", []step{
			{at: 0, kind: change, reports: 1, leading: true},
			{at: 0, kind: push, delivering: true},
			{at: 999 * time.Millisecond, kind: giveUp, none: true},
			{at: time.Second, kind: giveUp},
			{at: 1100 * time.Millisecond, kind: change, reports: 1, leading: true},
		}},
		{"the time a paced push left the fleet idle is no cost of it", []step{
			{at: 0, kind: change, reports: 2},
			{at: 100 * time.Millisecond, kind: fire, trigger: QuietAfter},
			{at: 100 * time.Millisecond, kind: push, idled: 300 * time.Millisecond, delivering: true},
			{at: 500 * time.Millisecond, kind: deliver}, // cost 100ms, not 400ms
			{at: 510 * time.Millisecond, kind: change, reports: 1},
			// churn spacing doubled from after: 200ms from 400ms (pushedAt).
			{at: 510 * time.Millisecond, kind: due, due: 610 * time.Millisecond},
		}},
		{"under sustained churn pushes back off, doubling their spacing", []step{
			{at: 0, kind: change, reports: 2},
			{at: 100 * time.Millisecond, kind: fire, trigger: QuietAfter},
			{at: 100 * time.Millisecond, kind: push, delivering: true}, // spacing 200ms
			{at: 150 * time.Millisecond, kind: deliver},
			{at: 160 * time.Millisecond, kind: change, reports: 2},
			{at: 160 * time.Millisecond, kind: due, due: 300 * time.Millisecond},
			{at: 300 * time.Millisecond, kind: fire, trigger: QuietAfter},
			{at: 300 * time.Millisecond, kind: push, delivering: true}, // spacing 400ms
			{at: 350 * time.Millisecond, kind: deliver},
			{at: 360 * time.Millisecond, kind: change, reports: 2},
			{at: 360 * time.Millisecond, kind: due, due: 700 * time.Millisecond},
		}},
		{"a writer that waits for each push is no churn", []step{
			{at: 0, kind: change, reports: 1, leading: true},
			{at: 0, kind: push, delivering: true},
			{at: 300 * time.Millisecond, kind: deliver}, // cost 300ms: rest max(100ms, 150ms)
			{at: 400 * time.Millisecond, kind: change, reports: 1},
			// not calm (rested 100ms of 150ms), no churn: `after` from it.
			{at: 400 * time.Millisecond, kind: due, due: 500 * time.Millisecond},
			{at: 500 * time.Millisecond, kind: fire, trigger: QuietAfter},
			{at: 500 * time.Millisecond, kind: push, delivering: true},
			{at: 800 * time.Millisecond, kind: deliver},
			{at: 1000 * time.Millisecond, kind: change, reports: 1, leading: true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			d := newDebouncer(after, maxWait)
			for i, s := range tc.steps {
				now := start.Add(s.at)
				switch s.kind {
				case change:
					b := Batch{Hosts: map[string]struct{}{"h": {}}, Since: now, latest: now, reports: s.reports}
					if got := d.changed(&b, now); got != s.leading {
						t.Fatalf("step %d: leading edge %v, want %v", i, got, s.leading)
					}
				case push:
					if b := d.take(); b.Empty() {
						t.Fatalf("step %d: nothing to push", i)
					}
					d.pushed(now, s.idled, s.delivering)
					if !s.delivering {
						d.delivered(now)
					}
				case deliver:
					d.delivered(now)
				case fire:
					trigger, ok := d.fired(now)
					if ok == s.none || ok && trigger != s.trigger {
						t.Fatalf("step %d: fired %v %v, want %v (none %v)", i, trigger, ok, s.trigger, s.none)
					}
				case due:
					got, ok := d.due()
					if !ok || got.Sub(start) != s.due {
						t.Fatalf("step %d: due at %v (%v), want %v", i, got.Sub(start), ok, s.due)
					}
				case giveUp:
					if got := d.giveUp(now); got == s.none {
						t.Fatalf("step %d: gave up %v, want %v", i, got, !s.none)
					}
				}
			}
		})
	}
}
