package hub

import (
	"sync"
	"time"
)

// delivery follows one push from the moment it starts queueing responses
// until its streams have taken them to send (or dropped them: the stream
// ended, or a newer request replaced the watch). The change feed starts no
// push while the previous one is still being delivered (Changes.run), so
// under churn a push's own cost paces the pushes: when sending to every
// stream takes long, because the streams are many, the responses large or
// the machine busy, more changes coalesce into the next push instead of
// piling up as back-to-back pushes of the full state.
//
// Streams that read slowly or not at all must not hold everyone's pushes
// back, so a push counts as delivered once most of its responses are taken
// (deliveredShare); Changes.run also stops waiting for one that makes no
// progress, or that takes far longer than its first half did.
type delivery struct {
	done chan struct{} // closed once delivered

	mu     sync.Mutex
	sealed bool      // the push queued its last response
	start  time.Time // when it was sealed
	total  int       // responses queued
	taken  int       // responses taken or dropped
	half   time.Duration
	closed bool
}

// deliveredShare is the share of its responses whose taking delivers a
// push: the slowest streams (clients that stopped reading, a slow link)
// do not hold the others back.
const deliveredShare = 0.95

func newDelivery() *delivery { return &delivery{done: make(chan struct{})} }

// token counts one more response of the push; its release says the stream
// took it.
func (d *delivery) token() *deliveryToken {
	d.mu.Lock()
	d.total++
	d.mu.Unlock()
	return &deliveryToken{d: d}
}

// seal says the push queued its last response.
func (d *delivery) seal() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sealed, d.start = true, time.Now()
	d.update()
}

func (d *delivery) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.taken++
	d.update()
}

// update records when half the responses were taken and closes done at
// the delivered share; d.mu is held.
func (d *delivery) update() {
	if !d.sealed {
		return
	}
	if d.half == 0 && 2*d.taken >= d.total {
		d.half = max(time.Since(d.start), time.Nanosecond)
	}
	if !d.closed && float64(d.taken) >= deliveredShare*float64(d.total) {
		d.closed = true
		close(d.done)
	}
}

// progress reports how many responses were taken so far, and whether the
// push has taken more than slowFactor times as long as its first half
// did (false while half are not taken yet).
func (d *delivery) progress() (taken int, slow bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.taken, d.half > 0 && time.Since(d.start) > slowFactor*d.half
}

// slowFactor bounds how much longer than its first half a push may take
// to deliver the rest before the next push stops waiting for it.
const slowFactor = 4

// deliveryToken is one response of a push. Releasing it more than once
// counts once: a response is both taken and, later, its watch cancelled.
type deliveryToken struct {
	d    *delivery
	once sync.Once
}

// release says the stream took the response, or dropped it. A nil token
// (a response no push queued) does nothing.
func (t *deliveryToken) release() {
	if t != nil {
		t.once.Do(t.d.release)
	}
}
