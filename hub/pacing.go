package hub

import "sync/atomic"

// deliveries counts what the fleet of streams takes in: the responses the
// watcher hands to streams and the ones clients answer (ACK or NACK). The
// change feed paces pushes by it (Changes.run): the time from a push until
// its clients answered most of what it handed them is what the push cost,
// the CPU of the hub, of the network and of the clients together, and the
// changes made meanwhile wait for it and then for a quiet period that long
// (see Changes.run).
//
// A SotW client that never answers is handed nothing more of that type (a
// response is handed only to a stream that asked again), so it slows at
// most the push that reached it; a Delta stream is answered on every request,
// so up to 64 of its responses may be unanswered. What a stream was sent
// counts as answered when it closes, and so does a SotW response the server
// dropped for a newer request or never sent (streamRecord.handed). Clients
// that answer late, on more than a tenth of the responses of every push,
// hold every push back up to `max`: that bound is all pacing guarantees
// against them.
type deliveries struct {
	handed   atomic.Int64
	answered atomic.Int64
	waiter   atomic.Pointer[deliveryWaiter]
}

// deliveryWaiter is the change feed waiting for answered to reach target.
type deliveryWaiter struct {
	target int64
	done   chan struct{}
}

// A push counts as delivered once all but unanswered of what it handed out
// are answered: a few slow or vanished clients do not hold the mesh's pushes
// back, and a small fleet (tests, a few proxies) is never paced.
func unanswered(handed int64) int64 { return max(handed/10, 16) }

// mark is where the counters stand before a push.
type mark struct{ handed, answered int64 }

func (d *deliveries) mark() mark {
	return mark{handed: d.handed.Load(), answered: d.answered.Load()}
}

// hand counts a response handed to a stream.
func (d *deliveries) hand() {
	if d != nil {
		d.handed.Add(1)
	}
}

// answer counts n responses answered by their clients (or lost with their
// stream) and wakes the waiter once its target is reached.
func (d *deliveries) answer(n int) {
	if d == nil || n <= 0 {
		return
	}
	got := d.answered.Add(int64(n))
	if w := d.waiter.Load(); w != nil && got >= w.target && d.waiter.CompareAndSwap(w, nil) {
		close(w.done)
	}
}

// await returns a channel closed once clients answered all but
// unanswered(n) of the n responses handed since m (answers since m count,
// whichever response they answer), or nil when nothing was handed. It
// replaces any earlier wait.
func (d *deliveries) await(m mark) <-chan struct{} {
	n := d.handed.Load() - m.handed
	if n <= 0 {
		d.waiter.Store(nil)
		return nil
	}
	w := &deliveryWaiter{target: m.answered + n - unanswered(n), done: make(chan struct{})}
	d.waiter.Store(w)
	if d.answered.Load() >= w.target && d.waiter.CompareAndSwap(w, nil) {
		close(w.done)
	}
	return w.done
}

// stopWaiting drops the current wait, if any.
func (d *deliveries) stopWaiting() { d.waiter.Store(nil) }
