// Package tcpproxy joins accepted TCP connections to others, both ways,
// until its context ends: the loop under the demo's relay to the hub and
// the e2e tests' relays.
package tcpproxy

import (
	"context"
	"io"
	"net"
	"sync"
)

// Serve accepts connections on lis until ctx is done and joins each to the
// connection connect returns for it (nil: the connection is closed),
// copying both ways with half-closes. When ctx is done it closes lis and
// every open connection, and returns once all its goroutines have ended;
// so it does when lis fails.
func Serve(ctx context.Context, lis net.Listener, connect func(ctx context.Context, in net.Conn) net.Conn) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		open  = map[net.Conn]struct{}{}
		conns sync.WaitGroup
	)
	// track adds c to the open connections (false, and c closed, once
	// stopping); untrack removes and closes it.
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil {
			c.Close()
			return false
		}
		open[c] = struct{}{}
		return true
	}
	untrack := func(c net.Conn) {
		mu.Lock()
		delete(open, c)
		mu.Unlock()
		c.Close()
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		lis.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		in, err := lis.Accept()
		if err != nil {
			cancel() // the listener failed: stop as if ctx ended
			break
		}
		conns.Go(func() {
			if !track(in) {
				return
			}
			defer untrack(in)
			out := connect(ctx, in)
			if out == nil || !track(out) {
				return
			}
			defer untrack(out)
			var pipes sync.WaitGroup
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				// Half-close so the other direction can finish.
				if hc, ok := dst.(interface{ CloseWrite() error }); ok {
					_ = hc.CloseWrite()
				}
			}
			pipes.Go(func() { pipe(out, in) })
			pipes.Go(func() { pipe(in, out) })
			pipes.Wait()
		})
	}
	<-stopped
	conns.Wait()
}
