package tcpproxy

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// TestServeJoinsAndStops: bytes flow both ways with half-closes; Serve
// returns when ctx ends (closing open connections) and when the listener
// fails.
func TestServeJoinsAndStops(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Serve(ctx, lis, func(ctx context.Context, _ net.Conn) net.Conn {
			c, err := net.Dial("tcp", echo.Addr().String())
			if err != nil {
				return nil
			}
			return c
		})
	}()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hello" {
		t.Fatalf("echoed %q, %v", got, err)
	}
	open, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	_ = open.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := open.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("a connection open at the stop is still open: %d, %v", n, err)
	}

	lis2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		Serve(context.Background(), lis2, func(context.Context, net.Conn) net.Conn { return nil })
	}()
	lis2.Close() // the listener fails
	select {
	case <-done2:
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return when its listener failed")
	}
}
