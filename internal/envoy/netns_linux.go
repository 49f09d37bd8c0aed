package envoy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` binds its namespaces.
const netnsDir = "/run/netns"

// sysProcAttr makes Envoy die with us, in a process group of its own (so a
// Ctrl-C meant for the caller reaches it only through Stop).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// dialAdmin dials the admin API; for an Envoy in a network namespace, from
// inside that namespace (the socket keeps the namespace it was made in).
// addr is always an IP literal, so the dial makes its socket on the calling
// goroutine, on the thread that joined the namespace.
func (p *AdminAPI) dialAdmin(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	if p.netns == "" {
		return d.DialContext(ctx, network, addr)
	}
	type result struct {
		conn net.Conn
		err  error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			res <- result{err: fmt.Errorf("opening this thread's network namespace: %w", err)}
			return
		}
		defer home.Close()
		target, err := os.Open(filepath.Join(netnsDir, p.netns))
		if err != nil {
			runtime.UnlockOSThread()
			res <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			res <- result{err: fmt.Errorf("joining the network namespace %s: %w", p.netns, err)}
			return
		}
		conn, err := d.DialContext(ctx, network, addr)
		if backErr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); backErr != nil {
			if conn != nil {
				conn.Close()
			}
			res <- result{err: errors.Join(err, fmt.Errorf("leaving the network namespace %s: %w", p.netns, backErr))}
			// Stay locked, off the scheduler, so that no other goroutine
			// runs in the namespace, and do not end the thread: children
			// forked from it would get their Pdeathsig.
			select {}
		}
		runtime.UnlockOSThread()
		res <- result{conn, err}
	}()
	r := <-res
	return r.conn, r.err
}
