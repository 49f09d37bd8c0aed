package hub

import "sync/atomic"

// delivery follows one push from the moment it starts queueing responses
// until its streams have taken every one of them to send (or dropped them:
// the stream ended, or a newer request replaced the watch). The change feed
// starts no push while the previous one is still being delivered
// (Changes.run), so under churn a push's own cost paces the pushes: when
// sending to every stream takes long, because the streams are many, the
// responses large or the machine busy, more changes coalesce into the next
// push instead of piling up as back-to-back pushes of the full state.
type delivery struct {
	left  atomic.Int64 // responses not taken yet, +1 while the push is queueing
	taken atomic.Int64 // responses taken or dropped so far: progress
	done  chan struct{}
}

func newDelivery() *delivery {
	d := &delivery{done: make(chan struct{})}
	d.left.Store(1) // the push's own hold, released by sealed
	return d
}

// token counts one more response of the push; its release says the stream
// took it.
func (d *delivery) token() *deliveryToken {
	d.left.Add(1)
	return &deliveryToken{d: d}
}

// sealed says the push queued its last response.
func (d *delivery) sealed() { d.release() }

func (d *delivery) release() {
	d.taken.Add(1)
	if d.left.Add(-1) == 0 {
		close(d.done)
	}
}

// deliveryToken is one response of a push. Releasing it more than once
// counts once: a response is both taken and, later, its watch cancelled.
type deliveryToken struct {
	d        *delivery
	released atomic.Bool
}

// release says the stream took the response, or dropped it. A nil token
// (a response no push queued) does nothing.
func (t *deliveryToken) release() {
	if t != nil && t.released.CompareAndSwap(false, true) {
		t.d.release()
	}
}
