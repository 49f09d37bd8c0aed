// Package xdstest is the one ADS test client of the repository: a State of
// the World or Delta stream to a real gRPC server whose responses are read
// in the background, so that a test can wait for the next response, assert
// that none comes, or see how the server ended the stream. Protocol
// helpers (ACKs, nodes, barriers) build the requests the way Envoy, grpc-go
// and istiod's clients do.
package xdstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// Wait is how long Next and Expect wait for a response before they fail
// the test: generous, because a slow machine must not fail a test.
const Wait = 20 * time.Second

// Stream is one ADS stream. Its responses are read by a goroutine the test
// owns: it ends when the stream does, and the test's cleanup cancels the
// stream and waits for it.
type Stream[Req, Resp any] struct {
	s  grpc.BidiStreamingClient[Req, Resp]
	ch chan *Resp // closed when the stream ends
	// end is how the stream ended, written before ch is closed.
	end      error
	barriers int
}

// SotW is a State of the World ADS stream.
type SotW = Stream[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]

// Delta is a Delta (incremental) ADS stream.
type Delta = Stream[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]

// Dial returns a client connection to addr, plaintext unless opts carry
// transport credentials, closed when the test ends.
func Dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	all := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient(addr, all...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// OpenSotW opens a SotW ADS stream on conn, ended when ctx is or the test
// ends. A stream gRPC could not open has ended: Next returns why.
func OpenSotW(t testing.TB, ctx context.Context, conn *grpc.ClientConn) *SotW {
	t.Helper()
	return open(t, ctx, discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources)
}

// OpenDelta opens a Delta ADS stream on conn, ended when ctx is or the test ends.
func OpenDelta(t testing.TB, ctx context.Context, conn *grpc.ClientConn) *Delta {
	t.Helper()
	return open(t, ctx, discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources)
}

// DialSotW dials addr and opens a SotW stream on a connection of its own.
func DialSotW(t testing.TB, addr string, opts ...grpc.DialOption) *SotW {
	t.Helper()
	return OpenSotW(t, context.Background(), Dial(t, addr, opts...))
}

// DialDelta dials addr and opens a Delta stream on a connection of its own.
func DialDelta(t testing.TB, addr string, opts ...grpc.DialOption) *Delta {
	t.Helper()
	return OpenDelta(t, context.Background(), Dial(t, addr, opts...))
}

func open[Req, Resp any](t testing.TB, ctx context.Context, rpc func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error)) *Stream[Req, Resp] {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	c := &Stream[Req, Resp]{ch: make(chan *Resp, 100)}
	s, err := rpc(ctx)
	if err != nil { // a stream that could not open ends at once, with why
		cancel()
		c.end = err
		close(c.ch)
		return c
	}
	c.s = s
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.ch)
		for {
			r, err := s.Recv()
			if err != nil {
				c.end = err
				return
			}
			select {
			case c.ch <- r:
			case <-ctx.Done():
				c.end = ctx.Err()
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// Send sends req. A stream that has ended is not an error here: its
// status is what Next returns.
func (c *Stream[Req, Resp]) Send(t testing.TB, req *Req) {
	t.Helper()
	if c.s == nil {
		return
	}
	if err := c.s.Send(req); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
}

// CloseSend half-closes the stream, as a client that is done asking.
func (c *Stream[Req, Resp]) CloseSend(t testing.TB) {
	t.Helper()
	if c.s == nil {
		return
	}
	if err := c.s.CloseSend(); err != nil {
		t.Fatal(err)
	}
}

// End reads (and drops) responses until the stream ends and returns how;
// it fails the test if the end does not come within Wait of the last
// response.
func (c *Stream[Req, Resp]) End(t testing.TB) error {
	t.Helper()
	for {
		if _, err := c.Next(t); err != nil {
			return err
		}
	}
}

// Next returns the next response, or the error that ended the stream (the
// same error on every later call); it fails the test when neither comes
// within Wait.
func (c *Stream[Req, Resp]) Next(t testing.TB) (*Resp, error) {
	t.Helper()
	return c.NextWithin(t, Wait)
}

// NextWithin is Next with a wait of its own.
func (c *Stream[Req, Resp]) NextWithin(t testing.TB, wait time.Duration) (*Resp, error) {
	t.Helper()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case r, ok := <-c.ch:
		if !ok {
			return nil, c.end
		}
		return r, nil
	case <-timer.C:
		t.Fatalf("no response and no end of stream within %s", wait)
		return nil, nil
	}
}

// Expect returns the next response and fails the test, naming what it
// waited for, if the stream ended instead.
func (c *Stream[Req, Resp]) Expect(t testing.TB, what string) *Resp {
	t.Helper()
	r, err := c.Next(t)
	if err != nil {
		t.Fatalf("%s: stream ended: %v", what, err)
	}
	return r
}

// ExpectType is Expect for a response that must be of typeURL.
func (c *Stream[Req, Resp]) ExpectType(t testing.TB, typeURL, what string) *Resp {
	t.Helper()
	r := c.Expect(t, what)
	if got := typeOf(r); got != typeURL {
		t.Fatalf("%s: got a %s response; want %s", what, got, typeURL)
	}
	return r
}

// None fails the test if a response arrives within d.
func (c *Stream[Req, Resp]) None(t testing.TB, d time.Duration, what string) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case r, ok := <-c.ch:
		c.notSilent(t, r, ok, what)
	case <-timer.C:
	}
}

// NoneYet fails the test if a response has arrived that was not read: a
// check of this moment, not a wait.
func (c *Stream[Req, Resp]) NoneYet(t testing.TB, what string) {
	t.Helper()
	select {
	case r, ok := <-c.ch:
		c.notSilent(t, r, ok, what)
	default:
	}
}

// notSilent fails the test with what None and NoneYet received: a
// response r, or the stream's end (!ok).
func (c *Stream[Req, Resp]) notSilent(t testing.TB, r *Resp, ok bool, what string) {
	t.Helper()
	if ok {
		t.Fatalf("%s: got a %s response; want none", what, typeOf(r))
	}
	t.Fatalf("%s: stream ended: %v; want it open and silent", what, c.end)
}

// Responses is the channel the responses arrive on, for a test that
// selects on it beside other events; it is closed when the stream ends.
func (c *Stream[Req, Resp]) Responses() <-chan *Resp { return c.ch }

// Refused fails the test unless the stream ends, with one of the codes
// want, before any response.
func (c *Stream[Req, Resp]) Refused(t testing.TB, what string, want ...codes.Code) {
	t.Helper()
	c.RefusedWithin(t, Wait, what, want...)
}

// RefusedWithin is Refused with a wait of its own.
func (c *Stream[Req, Resp]) RefusedWithin(t testing.TB, wait time.Duration, what string, want ...codes.Code) {
	t.Helper()
	r, err := c.NextWithin(t, wait)
	if r != nil {
		t.Fatalf("%s: got a %s response; want the stream refused with %v", what, typeOf(r), want)
	}
	if !slices.Contains(want, status.Code(err)) {
		t.Fatalf("%s: stream ended with %v; want %v", what, err, want)
	}
}

func typeOf(r any) string {
	if r, ok := r.(interface{ GetTypeUrl() string }); ok {
		return r.GetTypeUrl()
	}
	return fmt.Sprintf("%T", r)
}

// Node is an Envoy node of member cluster: CLUSTER_ID in its metadata, as
// istio-agent sets it.
func Node(id, cluster string) *corev3.Node {
	meta, _ := structpb.NewStruct(map[string]any{"CLUSTER_ID": cluster}) // a string is valid
	return &corev3.Node{Id: id, Metadata: meta}
}

// ACK is the SotW request that ACKs r and keeps (or changes to) names, as
// Envoy sends it: the response's version and nonce.
func ACK(r *discoveryv3.DiscoveryResponse, names ...string) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{TypeUrl: r.TypeUrl, ResourceNames: names, ResponseNonce: r.Nonce, VersionInfo: r.VersionInfo}
}

// DeltaACK is the Delta request that ACKs r.
func DeltaACK(r *discoveryv3.DeltaDiscoveryResponse) *discoveryv3.DeltaDiscoveryRequest {
	return &discoveryv3.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce}
}

// Fetch sends req on a SotW stream of its own over conn and returns the
// first response, or why there was none: for a check retried until it
// holds, which returns errors instead of failing the test.
func Fetch(ctx context.Context, conn *grpc.ClientConn, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return s.Recv()
}

// Session runs one SotW stream over conn: it sends firsts, then answers
// each response with the request answer returns (its ACK or NACK, or a new
// subscription), until the stream ends; it returns why (ctx's end
// included). A reconnecting client calls it in a loop.
func Session(ctx context.Context, conn *grpc.ClientConn, firsts []*discoveryv3.DiscoveryRequest, answer func(*discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	for _, req := range firsts {
		if err := s.Send(req); err != nil {
			return err
		}
	}
	for {
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		if err := s.Send(answer(resp)); err != nil {
			return err
		}
	}
}

// Answer runs one Session in the background until the stream ends or the
// test does: the goroutine is the test's, whose cleanup ends the stream
// and waits for it.
func Answer(t testing.TB, conn *grpc.ClientConn, first *discoveryv3.DiscoveryRequest, answer func(*discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = Session(ctx, conn, []*discoveryv3.DiscoveryRequest{first}, answer)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// Barrier asks for a fresh type nobody asked for, which a server answers
// at once (an Istio config type the hub serves empty), and fails the test
// unless its answer is the next response: nothing else was on its way. A
// server answers a stream's requests in order, so this proves "no
// response" without waiting.
func Barrier(t testing.TB, c *SotW, what string) {
	t.Helper()
	c.barriers++
	typeURL := fmt.Sprintf("barrier.test/v1/B%d", c.barriers)
	c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: typeURL})
	r, err := c.Next(t)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if r.TypeUrl != typeURL {
		t.Fatalf("%s: got a %s response with %d resources; want nothing before the barrier", what, r.TypeUrl, len(r.Resources))
	}
}
