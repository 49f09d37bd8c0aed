package hub

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hubmesh/hub/hub/wire"
)

// streamSet tracks the open gRPC streams of one listener so that a shutdown
// can close them one at a time: each client reconnects (to another replica
// behind the Service) while the rest are still served, instead of the whole
// fleet reconnecting in the same second.
type streamSet struct {
	names *wire.InternedNames // the streams' SotW resource_names (wire.RequestStream)

	mu   sync.Mutex
	open map[*drainableStream]struct{}
}

func newStreamSet() *streamSet {
	return &streamSet{names: wire.NewInternedNames(), open: map[*drainableStream]struct{}{}}
}

// interceptor gives every stream a context the set can cancel, and its
// own request decoding (wire.RequestStream). A stream
// closed by a drain ends with Unavailable, which every xDS client retries.
func (s *streamSet) interceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	ds := &drainableStream{ServerStream: wire.NewRequestStream(ss, s.names), ctx: ctx, cancel: cancel}
	s.mu.Lock()
	s.open[ds] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.open, ds)
		s.mu.Unlock()
	}()
	err := handler(srv, ds)
	if ctx.Err() != nil && ss.Context().Err() == nil {
		return status.Error(codes.Unavailable, "hub replica is shutting down; reconnect")
	}
	return err
}

// drain closes every open stream, spread evenly over spread, and returns
// the number closed; streams that opened meanwhile (before the GOAWAY
// reached their client) are closed right after. When ctx ends first the
// rest are closed at once.
func (s *streamSet) drain(ctx context.Context, spread time.Duration) int {
	n := s.closeSpread(ctx, spread)
	for late := s.closeSpread(ctx, 0); late > 0; late = s.closeSpread(ctx, 0) {
		n += late
	}
	return n
}

// closeSpread cancels the streams open now, one every spread/n.
func (s *streamSet) closeSpread(ctx context.Context, spread time.Duration) int {
	s.mu.Lock()
	cancels := make([]context.CancelFunc, 0, len(s.open))
	for ds := range s.open {
		cancels = append(cancels, ds.cancel)
		delete(s.open, ds) // cancelled once; the interceptor's delete is then a no-op
	}
	s.mu.Unlock()
	if len(cancels) == 0 {
		return 0
	}
	step := spread / time.Duration(len(cancels))
	for i, cancel := range cancels {
		cancel()
		if i == len(cancels)-1 || step <= 0 {
			continue
		}
		select {
		case <-time.After(step):
		case <-ctx.Done():
			for _, c := range cancels[i+1:] {
				c()
			}
			return len(cancels)
		}
	}
	return len(cancels)
}

// drainableStream is a server stream whose Context ends when the stream
// set cancels it; the stream loops (adsServer) end with it.
type drainableStream struct {
	grpc.ServerStream
	ctx    context.Context
	cancel context.CancelFunc
}

func (d *drainableStream) Context() context.Context { return d.ctx }
