package main

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDemoRelayOnlyFromTheNamespace: the relay to the hub's plaintext xDS
// port, opened as the demo opens it (Listen on the namespace's loopback),
// relays a connection made inside the demo's network namespace, and refuses
// connections from outside it: the veth's namespace-side address (the way
// into the namespace from this host, or from the LAN were it forwarded) and
// its host-side address (where the relay listened before).
func TestDemoRelayOnlyFromTheNamespace(t *testing.T) {
	ns := testDemoNetns(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The "hub": on this namespace's loopback, greeting whoever connects.
	hub, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()
	go func() {
		for {
			c, err := hub.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hub\n"))
			c.Close()
		}
	}()
	lis, err := ns.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayed := make(chan struct{})
	go func() { defer close(relayed); relay(relayCtx, lis, hub.Addr().String()) }()
	defer func() { stopRelay(); <-relayed }()
	port := strconv.Itoa(lis.Addr().(*net.TCPAddr).Port)

	// Inside the namespace: relayed to the hub.
	err = ns.do(func() error {
		c, err := net.DialTimeout("tcp", lis.Addr().String(), 10*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "hub\n" {
			return errors.New("no greeting from the hub through the relay: " + line)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("from inside the namespace: %v", err)
	}
	// Outside: nothing listens there for anyone else.
	for _, ip := range []net.IP{demoVethNsIP, demoVethHostIP} {
		addr := net.JoinHostPort(ip.String(), port)
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err == nil {
			c.Close()
			t.Errorf("%s accepted a connection from outside the namespace", addr)
		} else if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s from outside the namespace: %v; want connection refused", addr, err)
		}
	}
}

// TestDemoNetnsHandsBackItsThread: the thread that ran fn in the namespace
// is back in this process's network namespace and still alive when do
// returns. A thread that ended would SIGKILL every child it had forked with
// Pdeathsig (the demo's API servers, etcd and workloads); one left in the
// namespace would run other goroutines there.
func TestDemoNetnsHandsBackItsThread(t *testing.T) {
	ns := testDemoNetns(t)
	home, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var tid int
	var inside string
	err = ns.do(func() (err error) {
		tid = unix.Gettid()
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside == home {
		t.Fatalf("fn ran in this process's network namespace %s, not the demo's", home)
	}
	after, err := os.Readlink("/proc/self/task/" + strconv.Itoa(tid) + "/ns/net")
	if err != nil {
		t.Fatalf("the thread that ran fn is gone: %v", err)
	}
	if after != home {
		t.Fatalf("the thread that ran fn is in %s after do, want %s", after, home)
	}
}

// testDemoNetns makes a demo network namespace, removed when the test
// ends; outside CI the test skips where none can be made.
func testDemoNetns(t *testing.T) *demoNetns {
	t.Helper()
	if ok, why := canRunNetns(); !ok {
		if os.Getenv("CI") != "" {
			t.Fatalf("the demo's network namespace cannot be made here (%s)", why)
		}
		t.Skipf("outside CI: the demo's network namespace cannot be made here (%s)", why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns, err := newDemoNetns(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	return ns
}
