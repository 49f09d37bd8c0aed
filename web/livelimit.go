package web

import (
	"errors"
	"slices"
	"sync"
)

// Default bounds of live streams (Server-Sent Events). A browser opens one
// stream per open dashboard tab; eight tabs of one session are live at once,
// and a ninth displaces the oldest, which is told so and stops (it does not
// reconnect, so tabs never take turns evicting each other). Across all
// sessions at most DefaultMaxLiveStreams are open; more are refused with 503
// (each stream renders its page on every tick, so this bounds that work).
const (
	DefaultMaxLiveStreamsPerSession = 8
	DefaultMaxLiveStreams           = 1000
)

// errLiveStreamsFull refuses a stream when the hub holds its maximum.
var errLiveStreamsFull = errors.New("too many live streams on the hub")

// liveStreams counts the open live streams per session and in all.
type liveStreams struct {
	maxPerSession, max int

	mu        sync.Mutex
	bySession map[string][]*liveStream // oldest first
	total     int
}

// liveStream is one open stream; displaced is closed when a newer stream of
// its session took its place.
type liveStream struct{ displaced chan struct{} }

func newLiveStreams(maxPerSession, max int) *liveStreams {
	return &liveStreams{maxPerSession: maxPerSession, max: max, bySession: map[string][]*liveStream{}}
}

// open registers a new stream of session: the session's oldest stream is
// displaced if it holds maxPerSession, and errLiveStreamsFull is returned
// if the hub holds max streams of other sessions.
func (l *liveStreams) open(session string) (*liveStream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if list := l.bySession[session]; len(list) >= l.maxPerSession {
		close(list[0].displaced)
		l.bySession[session] = slices.Delete(list, 0, 1)
		l.total--
	}
	if l.total >= l.max {
		return nil, errLiveStreamsFull
	}
	ls := &liveStream{displaced: make(chan struct{})}
	l.bySession[session] = append(l.bySession[session], ls)
	l.total++
	return ls, nil
}

// close forgets a stream that ended (a displaced one is already gone).
func (l *liveStreams) close(session string, ls *liveStream) {
	l.mu.Lock()
	defer l.mu.Unlock()
	list := l.bySession[session]
	i := slices.Index(list, ls)
	if i < 0 {
		return
	}
	list = slices.Delete(list, i, i+1)
	l.total--
	if len(list) == 0 {
		delete(l.bySession, session)
		return
	}
	l.bySession[session] = list
}

// count returns the open streams of session and in all.
func (l *liveStreams) count(session string) (int, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.bySession[session]), l.total
}
