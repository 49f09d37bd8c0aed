package clusters

import (
	"context"
	"net"
	"sync"
	"time"
)

// connTracker dials a member's API server and remembers every connection,
// so that stopping the member closes them all at once: idle-connection
// cleanup alone leaves HTTP/2 connections whose streams are still winding
// down (and their read goroutines) alive for up to the idle timeout.
type connTracker struct {
	dialer net.Dialer
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

// newConnTracker returns a tracker whose dials guard checks, after name
// resolution, for every address connected (nil: no check).
func newConnTracker(guard *dialGuard) *connTracker {
	t := &connTracker{
		dialer: net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second},
		conns:  map[*trackedConn]struct{}{},
	}
	if guard != nil {
		t.dialer.ControlContext = guard.control
	}
	return t
}

// DialContext has the signature of rest.Config.Dial.
func (t *connTracker) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := t.dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, t: t}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	t.conns[tc] = struct{}{}
	return tc, nil
}

// closeAll closes every open connection and refuses new ones.
func (t *connTracker) closeAll() {
	t.mu.Lock()
	t.closed = true
	conns := t.conns
	t.conns = map[*trackedConn]struct{}{}
	t.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	t    *connTracker
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}
