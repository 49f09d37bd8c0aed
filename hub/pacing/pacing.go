// Package pacing paces the hub's pushes by what the streams take in: it
// counts the responses handed to streams and those their clients answered
// (Deliveries), tells a push when its clients answered most of it (Await),
// and hands a push to a large fleet in waves (Pace).
package pacing

import (
	"context"
	"sync/atomic"
	"time"
)

// Deliveries counts what the fleet of streams takes in: the responses the
// watcher hands to streams and the ones clients answer (ACK or NACK). A
// push tells the change feed when its clients answered most of what it
// handed them (the hub's watcher.push, Await): the time that took is what the push
// cost, the CPU of the hub, of the network and of the clients together,
// and the changes made meanwhile wait for it and then for a quiet period
// that long (see feed.Changes.Run).
//
// A SotW client that never answers is handed nothing more of that type (a
// response is handed only to a stream that asked again), so it slows at
// most the push that reached it; a Delta stream is answered on every request,
// so up to 64 of its responses may be unanswered. What a stream was sent
// counts as answered when it closes, and so does a SotW response the stream's loop
// dropped for a newer request or never sent (the hub records what it handed). Clients
// that answer late, on more than a tenth of the responses of every push,
// hold every push back up to `max`: that bound is all pacing guarantees
// against them.
type Deliveries struct {
	handed   atomic.Int64
	answered atomic.Int64
	waiter   atomic.Pointer[answerWait]
}

// answerWait is a wait for answered to reach target: a push's (the
// change feed's) or a wave's (pace).
type answerWait struct {
	target int64
	done   chan struct{}
}

// A push counts as delivered once all but unanswered of what it handed out
// are answered: a few slow or vanished clients do not hold the mesh's pushes
// back, and a small fleet (tests, a few proxies) is never paced.
func unanswered(handed int64) int64 { return max(handed/10, 16) }

// Mark is where the counters stand before a push: Await counts from it.
type Mark struct{ handed, answered int64 }

// Mark returns where the counters stand now (the zero Mark for a nil d).
func (d *Deliveries) Mark() Mark {
	if d == nil {
		return Mark{}
	}
	return Mark{handed: d.handed.Load(), answered: d.answered.Load()}
}

// Hand counts a response handed to a stream.
func (d *Deliveries) Hand() {
	if d != nil {
		d.handed.Add(1)
	}
}

// Answer counts n responses answered by their clients (or lost with their
// stream) and wakes the waiter once its target is reached.
func (d *Deliveries) Answer(n int) {
	if d == nil || n <= 0 {
		return
	}
	got := d.answered.Add(int64(n))
	if w := d.waiter.Load(); w != nil && got >= w.target && d.waiter.CompareAndSwap(w, nil) {
		close(w.done)
	}
}

// Await returns a channel closed once clients answered all but
// unanswered(n) of the n responses handed since m (answers since m count,
// whichever response they answer), or nil when nothing was handed (or d
// is nil: nobody counts). It replaces any earlier wait.
func (d *Deliveries) Await(m Mark) <-chan struct{} {
	if d == nil {
		return nil
	}
	n := d.handed.Load() - m.handed
	if n <= 0 {
		d.waiter.Store(nil)
		return nil
	}
	w := &answerWait{target: m.answered + n - unanswered(n), done: make(chan struct{})}
	d.waiter.Store(w)
	if d.answered.Load() >= w.target && d.waiter.CompareAndSwap(w, nil) {
		close(w.done)
	}
	return w.done
}

// stopWaiting drops the current wait, if any.
func (d *Deliveries) stopWaiting() { d.waiter.Store(nil) }

// A paced push (Pace) reaches its streams in at most paceWaves waves of at
// least MinWave streams each.
const (
	paceWaves = 8
	MinWave   = 32
)

// idlePerBusy is how long a paced push leaves the fleet idle after a wave,
// for each unit of time the wave took.
const idlePerBusy = 2

// Pace hands a push of churn to its streams in waves: push(wave) answers
// a wave's streams; once the fleet answered all but a few of the responses
// it was handed (Await), Pace leaves it idle for idlePerBusy times as long
// as the wave took before the next one. So while changes keep coming the
// fleet is busy about a third of the time, and the API servers and
// workloads on the machines it shares keep the rest (istiod gets there by
// pushing to at most 100 proxies at once, PILOT_PUSH_THROTTLE, each
// slowly). A stream reached by a later wave gets what the hub generates
// then. Waiting and idling end at limit from the push's start: what is
// left then goes at once, so that the change feed, blocked meanwhile, is
// held back at most limit. A fleet of fewer than 2*MinWave streams, or no
// d, gets the push in one go. Pace returns when the last stream is handed
// its response, or when ctx is done, with the time it left the fleet idle.
func Pace[S any](ctx context.Context, d *Deliveries, streams []S, limit time.Duration, push func([]S)) (idled time.Duration) {
	if d == nil || len(streams) < 2*MinWave {
		push(streams)
		return 0
	}
	size := max(MinWave, (len(streams)+paceWaves-1)/paceWaves)
	deadline := time.Now().Add(limit)
	timer := time.NewTimer(limit)
	defer timer.Stop()
	// wait waits for ch (nil: nothing to wait for) or for d, whichever is
	// first; it reports false once ctx is done.
	wait := func(ch <-chan struct{}, d time.Duration) bool {
		if d <= 0 {
			return ctx.Err() == nil
		}
		timer.Reset(d)
		select {
		case <-ch:
		case <-timer.C:
		case <-ctx.Done():
			return false
		}
		return true
	}
	for len(streams) > 0 && ctx.Err() == nil {
		if !time.Now().Before(deadline) {
			push(streams)
			return idled
		}
		n := min(size, len(streams))
		wave := streams[:n]
		streams = streams[n:]
		start, m := time.Now(), d.Mark()
		push(wave)
		if len(streams) == 0 {
			break
		}
		answered := d.Await(m)
		ok := answered == nil || wait(answered, time.Until(deadline))
		d.stopWaiting()
		if !ok {
			break
		}
		now := time.Now()
		idle := min(idlePerBusy*now.Sub(start), deadline.Sub(now))
		if !wait(nil, idle) {
			break
		}
		idled += max(idle, 0)
	}
	return idled
}

// Answered is how many responses clients answered so far.
func (d *Deliveries) Answered() int64 { return d.answered.Load() }
