package xdsstatus

import (
	"sync/atomic"
	"time"
)

// PerSecond counts events per second over the last minute, without a
// lock: a slot is reset by the first event of its new second, and an event
// counted by another stream in the instant of that reset may be lost (a
// figure for a picture, not an account).
type PerSecond [60]struct {
	at atomic.Int64 // the unix second the slot counts
	n  atomic.Uint32
}

// Count counts one event at now.
func (r *PerSecond) Count(now time.Time) {
	sec := now.Unix()
	slot := &r[sec%60]
	if at := slot.at.Load(); at != sec && slot.at.CompareAndSwap(at, sec) {
		slot.n.Store(0)
	}
	slot.n.Add(1)
}

// Last60 returns the counts of the 60 seconds up to now, oldest first.
func (r *PerSecond) Last60(now time.Time) []int {
	out := make([]int, 60)
	for i := range out {
		sec := now.Unix() - 59 + int64(i)
		if slot := &r[sec%60]; slot.at.Load() == sec {
			out[i] = int(slot.n.Load())
		}
	}
	return out
}
