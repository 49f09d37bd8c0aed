// Package expiry is how the hub reports what expires: a member's
// credentials, its own CA, peers' bundles. It grades a time against the
// warning window (--expiry-warning), words it the same way for the API,
// the dashboard and Events, and remembers which threshold crossings were
// already warned of, so that each is told once rather than on every check.
package expiry

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// DefaultWarning is how far ahead the hub warns by default (seven days).
const DefaultWarning = 7 * 24 * time.Hour

// Level grades an expiry time at some moment.
type Level int

// Levels, in increasing urgency.
const (
	// Valid: further away than the warning window (or unknown).
	Valid Level = iota
	// Expiring: within the warning window, not yet passed.
	Expiring
	// Expired: passed.
	Expired
)

// String is the level as the API shows it: "valid", "expiring" or "expired".
func (l Level) String() string {
	switch l {
	case Expiring:
		return "expiring"
	case Expired:
		return "expired"
	}
	return "valid"
}

// LevelAt grades notAfter at now against a warning window of warn
// (DefaultWarning when warn ≤ 0). A zero notAfter (unknown) is Valid.
func LevelAt(notAfter, now time.Time, warn time.Duration) Level {
	if warn <= 0 {
		warn = DefaultWarning
	}
	switch {
	case notAfter.IsZero():
		return Valid
	case !now.Before(notAfter):
		return Expired
	case notAfter.Sub(now) <= warn:
		return Expiring
	}
	return Valid
}

// Badge is the short form the dashboard shows: "expires in 3d" ("in 5h",
// "in 12m" below a day or an hour) or "expired"; "" for a zero notAfter.
func Badge(notAfter, now time.Time) string {
	if notAfter.IsZero() {
		return ""
	}
	if !now.Before(notAfter) {
		return "expired"
	}
	return "expires in " + Approx(notAfter.Sub(now))
}

// Approx rounds a positive duration down to whole days, hours or minutes
// ("3d", "5h", "12m"; "0m" below a minute).
func Approx(d time.Duration) string {
	switch {
	case d >= 24*time.Hour:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	case d >= time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dm", int(d/time.Minute))
}

// Sentence says when notAfter is, for messages: "expires at <RFC 3339>
// (in 3d)" or "expired at <RFC 3339> (5h ago)".
func Sentence(notAfter, now time.Time) string {
	at := notAfter.UTC().Format(time.RFC3339)
	if !now.Before(notAfter) {
		return "expired at " + at + " (" + Approx(now.Sub(notAfter)) + " ago)"
	}
	return "expires at " + at + " (in " + Approx(notAfter.Sub(now)) + ")"
}

// Warned remembers, per object, the expiry and the highest level already
// warned of, so that a warning goes out once per threshold crossing: when
// an object first becomes Expiring, when it becomes Expired, and again
// only for a new expiry time (a rotated credential). Safe for concurrent
// use.
type Warned struct {
	mu sync.Mutex
	m  map[string]warned
}

type warned struct {
	notAfter time.Time
	level    Level
}

// Due reports whether level, for the object key expiring at notAfter, is
// a crossing not yet warned of.
func (w *Warned) Due(key string, notAfter time.Time, level Level) bool {
	if level == Valid || notAfter.IsZero() {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	prev, ok := w.m[key]
	return !ok || !prev.notAfter.Equal(notAfter) || prev.level < level
}

// Mark records that level was warned of for key expiring at notAfter.
func (w *Warned) Mark(key string, notAfter time.Time, level Level) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]warned{}
	}
	w.m[key] = warned{notAfter: notAfter, level: level}
}

// Retain forgets every object whose key keep rejects (objects that are
// gone), so that the memory stays as large as what is watched.
func (w *Warned) Retain(keep func(key string) bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.m {
		if !keep(k) {
			delete(w.m, k)
		}
	}
}

// CheckEvery is how often Watch checks when nothing asks it to: threshold
// crossings are told within it.
const CheckEvery = time.Minute

// Kick wakes a Watch (make it with NewKick).
type Kick chan struct{}

// NewKick makes a Kick.
func NewKick() Kick { return make(Kick, 1) }

// Now asks the Watch to check now; it never blocks.
func (k Kick) Now() {
	select {
	case k <- struct{}{}:
	default:
	}
}

// Watch calls check with the time at once, then every CheckEvery and
// whenever kick is kicked, until ctx is done.
func Watch(ctx context.Context, kick Kick, check func(now time.Time)) {
	tick := time.NewTicker(CheckEvery)
	defer tick.Stop()
	for {
		check(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-kick:
		}
	}
}
