package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// fleet is every ADS stream of a run. Each stream has its own ClientConn
// (its own TCP connection, as separate proxies would) and one goroutine
// that receives, inspects and ACKs every response.
type fleet struct {
	addr     string
	delta    bool
	namedCDS bool
	services int             // benchmark CDS clusters every stream should hold
	cds      map[string]bool // their names (the hub also serves e.g. kubernetes.default)
	streams  []*stream

	// target is the write being measured, if any.
	target atomic.Pointer[writeTarget]

	readyLeft atomic.Int64
	allReady  chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	errOnce  sync.Once
	firstErr error
	failed   chan struct{}
}

// stream is one ADS stream standing for one proxy.
type stream struct {
	f         *fleet
	idx       int
	nodeID    string
	clusterID string // CLUSTER_ID metadata: the member it runs in
	services  []int
	edsNames  []string
	watch     map[string]bool
	cdsWant   int // benchmark CDS clusters it should hold

	dialAt    time.Time
	readyAt   atomic.Int64 // unix ns when it first held EDS for all its services
	readyOnce sync.Once
	onReady   func()

	responses    atomic.Int64
	cdsResponses atomic.Int64
	edsResponses atomic.Int64
	resends      atomic.Int64
	cdsClusters  atomic.Int64 // benchmark clusters in the stream's current CDS view
	edsHeld      atomic.Int64 // of its services, how many it holds EDS for
	lastEDS      atomic.Pointer[string]
	err          atomic.Pointer[error]
}

// writeTarget is one measured write: the EDS cluster it changes and the
// address it adds; arrived[i] is when stream i first saw it (ns after
// start), 0 while it has not.
type writeTarget struct {
	cluster  string
	addr     string
	pattern  []byte // SocketAddress.address as encoded in a ClusterLoadAssignment
	start    time.Time
	arrived  []atomic.Int64
	left     atomic.Int64
	done     chan struct{}
	watchers []int
}

func newWriteTarget(cluster, addr string, streams int, watchers []int) *writeTarget {
	// SocketAddress.address is field 2, a string: tag, length, bytes.
	pattern := protowire.AppendTag(nil, 2, protowire.BytesType)
	pattern = protowire.AppendString(pattern, addr)
	t := &writeTarget{cluster: cluster, addr: addr, pattern: pattern, arrived: make([]atomic.Int64, streams), done: make(chan struct{}), watchers: watchers}
	t.left.Store(int64(len(watchers)))
	if len(watchers) == 0 {
		close(t.done)
	}
	return t
}

func (t *writeTarget) arrive(idx int, at time.Time) {
	d := max(at.Sub(t.start), 1)
	if t.arrived[idx].CompareAndSwap(0, int64(d)) && t.left.Add(-1) == 0 {
		close(t.done)
	}
}

func newFleet(ctx context.Context, addr string, cfg Config, l *layout) *fleet {
	f := &fleet{addr: addr, delta: cfg.Delta, namedCDS: cfg.CDS == "named", services: cfg.Services, allReady: make(chan struct{}), failed: make(chan struct{})}
	f.ctx, f.cancel = context.WithCancel(ctx)
	f.cds = map[string]bool{}
	for _, s := range l.services {
		f.cds[s.cluster] = true
	}
	for i, svcs := range l.watched {
		s := &stream{
			f: f, idx: i, nodeID: fmt.Sprintf("hubbench-%05d", i), clusterID: l.memberIDs[i%len(l.memberIDs)],
			services: svcs, watch: map[string]bool{},
		}
		for _, si := range svcs {
			name := l.services[si].cluster
			s.edsNames = append(s.edsNames, name)
			s.watch[name] = true
		}
		s.cdsWant = f.services
		if f.namedCDS {
			s.cdsWant = len(s.edsNames)
		}
		f.streams = append(f.streams, s)
	}
	f.readyLeft.Store(int64(len(f.streams)))
	if len(f.streams) == 0 {
		close(f.allReady)
	}
	return f
}

func (f *fleet) fail(err error) {
	f.errOnce.Do(func() {
		f.firstErr = err
		close(f.failed)
	})
}

// connect dials every stream, at most concurrency of them connecting at
// once, and returns when every stream holds EDS for all its services.
func (f *fleet) connect(concurrency int, timeout time.Duration, progress func(string, ...any)) error {
	sem := make(chan struct{}, concurrency)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	// The opener is itself in wg, so that close never waits while streams
	// are still being added.
	f.wg.Go(func() {
		for _, s := range f.streams {
			select {
			case sem <- struct{}{}:
			case <-f.ctx.Done():
				return
			case <-f.failed:
				return
			}
			s.onReady = func() { <-sem }
			f.wg.Go(func() { s.run() })
		}
	})
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-f.allReady:
			return nil
		case <-f.failed:
			return f.firstErr
		case <-f.ctx.Done():
			return f.ctx.Err()
		case <-tick.C:
			progress("cold connect: %d/%d streams hold their full EDS", len(f.streams)-int(f.readyLeft.Load()), len(f.streams))
		case <-timer.C:
			return fmt.Errorf("cold connect: after %s %d of %d streams still lack EDS for some of their services:\n%s",
				timeout, f.readyLeft.Load(), len(f.streams), f.describe(f.notReady(), 20))
		}
	}
}

func (f *fleet) notReady() []int {
	var out []int
	for i, s := range f.streams {
		if s.readyAt.Load() == 0 {
			out = append(out, i)
		}
	}
	return out
}

// describe lists up to n streams with what they hold, for error messages.
func (f *fleet) describe(idx []int, n int) string {
	var b bytes.Buffer
	for k, i := range idx {
		if k == n {
			fmt.Fprintf(&b, "  ... and %d more\n", len(idx)-n)
			break
		}
		s := f.streams[i]
		last := "none"
		if v := s.lastEDS.Load(); v != nil {
			last = *v
		}
		errText := "open"
		if e := s.err.Load(); e != nil {
			errText = "failed: " + (*e).Error()
		}
		fmt.Fprintf(&b, "  stream %d (node %s, CLUSTER_ID %s): EDS for %d/%d services, %d EDS responses (last version %s), CDS %d/%d clusters, stream %s\n",
			i, s.nodeID, s.clusterID, s.edsHeld.Load(), len(s.edsNames), s.edsResponses.Load(), last, s.cdsClusters.Load(), s.cdsWant, errText)
	}
	return b.String()
}

// close ends every stream and connection and waits for their goroutines.
func (f *fleet) close() {
	f.cancel()
	f.wg.Wait()
}

// totals sums the per-stream counters.
func (f *fleet) totals() (responses, resends int64) {
	for _, s := range f.streams {
		responses += s.responses.Load()
		resends += s.resends.Load()
	}
	return responses, resends
}

func (s *stream) markReady(at time.Time) {
	s.readyOnce.Do(func() {
		s.readyAt.Store(at.UnixNano())
		if s.f.readyLeft.Add(-1) == 0 {
			close(s.f.allReady)
		}
		if s.onReady != nil {
			s.onReady()
		}
	})
}

func (s *stream) run() {
	s.dialAt = time.Now()
	err := s.serve()
	if s.f.ctx.Err() != nil {
		return // we are closing
	}
	if err == nil {
		err = errors.New("stream ended")
	}
	err = fmt.Errorf("stream %d (node %s): %w", s.idx, s.nodeID, err)
	s.err.Store(&err)
	s.f.fail(err)
}

func (s *stream) serve() error {
	conn, err := grpc.NewClient(s.f.addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	node := &corev3.Node{Id: s.nodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"CLUSTER_ID": structpb.NewStringValue(s.clusterID),
		"NAMESPACE":  structpb.NewStringValue(benchNamespace),
	}}}
	if s.f.delta {
		return s.serveDelta(ads, node)
	}
	return s.serveSotW(ads, node)
}

func ended(err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("the hub closed the stream")
	}
	return err
}

func (s *stream) serveSotW(ads discoveryv3.AggregatedDiscoveryServiceClient, node *corev3.Node) error {
	st, err := ads.StreamAggregatedResources(s.f.ctx)
	if err != nil {
		return err
	}
	names := map[string][]string{resourcev3.ClusterType: nil, resourcev3.EndpointType: s.edsNames}
	if s.f.namedCDS {
		names[resourcev3.ClusterType] = s.edsNames
	}
	for _, typeURL := range []string{resourcev3.ClusterType, resourcev3.EndpointType} {
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names[typeURL]}); err != nil {
			return fmt.Errorf("sending the first %s request: %w", typeURL, err)
		}
	}
	seen := map[string]map[string]bool{}
	heldEDS := map[string]bool{}
	for {
		resp, err := st.Recv()
		now := time.Now()
		if err != nil {
			return ended(err)
		}
		s.responses.Add(1)
		typeURL := resp.GetTypeUrl()
		if seen[typeURL] == nil {
			seen[typeURL] = map[string]bool{}
		}
		// We never NACK, so a version received twice is a resend.
		if seen[typeURL][resp.GetVersionInfo()] {
			s.resends.Add(1)
		}
		seen[typeURL][resp.GetVersionInfo()] = true
		switch typeURL {
		case resourcev3.ClusterType:
			s.cdsResponses.Add(1)
			n := 0
			for _, a := range resp.GetResources() {
				if s.f.cds[resourceName(a.GetValue())] {
					n++
				}
			}
			s.cdsClusters.Store(int64(n))
		case resourcev3.EndpointType:
			s.edsResponses.Add(1)
			v := resp.GetVersionInfo()
			s.lastEDS.Store(&v)
			// Responses carry only what changed: the stream holds the union.
			for _, a := range resp.GetResources() {
				if name := resourceName(a.GetValue()); s.watch[name] {
					heldEDS[name] = true
				}
			}
			held := len(heldEDS)
			s.edsHeld.Store(int64(held))
			if held == len(s.edsNames) {
				s.markReady(now)
			}
			if t := s.f.target.Load(); t != nil && s.watch[t.cluster] && t.arrived[s.idx].Load() == 0 {
				for _, a := range resp.GetResources() {
					if t.holds(a.GetValue()) {
						t.arrive(s.idx, now)
						break
					}
				}
			}
		}
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(), ResourceNames: names[typeURL]}
		if err := st.Send(ack); err != nil {
			return fmt.Errorf("sending an ACK: %w", err)
		}
	}
}

func (s *stream) serveDelta(ads discoveryv3.AggregatedDiscoveryServiceClient, node *corev3.Node) error {
	st, err := ads.DeltaAggregatedResources(s.f.ctx)
	if err != nil {
		return err
	}
	var cdsNames []string // wildcard
	if s.f.namedCDS {
		cdsNames = s.edsNames
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: cdsNames}); err != nil {
		return fmt.Errorf("sending the first CDS request: %w", err)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: s.edsNames}); err != nil {
		return fmt.Errorf("sending the first EDS request: %w", err)
	}
	held := map[string]map[string]string{resourcev3.ClusterType: {}, resourcev3.EndpointType: {}}
	for {
		resp, err := st.Recv()
		now := time.Now()
		if err != nil {
			return ended(err)
		}
		s.responses.Add(1)
		typeURL := resp.GetTypeUrl()
		h := held[typeURL]
		if h == nil {
			h = map[string]string{}
			held[typeURL] = h
		}
		for _, r := range resp.GetResources() {
			// We never NACK, so a resource sent again with the version we
			// hold is a resend.
			if v, ok := h[r.GetName()]; ok && v == r.GetVersion() {
				s.resends.Add(1)
			}
			h[r.GetName()] = r.GetVersion()
		}
		for _, name := range resp.GetRemovedResources() {
			delete(h, name)
		}
		switch typeURL {
		case resourcev3.ClusterType:
			s.cdsResponses.Add(1)
			n := 0
			for name := range h {
				if s.f.cds[name] {
					n++
				}
			}
			s.cdsClusters.Store(int64(n))
		case resourcev3.EndpointType:
			s.edsResponses.Add(1)
			v := resp.GetSystemVersionInfo()
			s.lastEDS.Store(&v)
			n := 0
			for name := range h {
				if s.watch[name] {
					n++
				}
			}
			s.edsHeld.Store(int64(n))
			if n == len(s.edsNames) {
				s.markReady(now)
			}
			if t := s.f.target.Load(); t != nil && s.watch[t.cluster] && t.arrived[s.idx].Load() == 0 {
				for _, r := range resp.GetResources() {
					if r.GetName() == t.cluster && t.holds(r.GetResource().GetValue()) {
						t.arrive(s.idx, now)
						break
					}
				}
			}
		}
		if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.GetNonce()}); err != nil {
			return fmt.Errorf("sending an ACK: %w", err)
		}
	}
}

// holds reports whether an encoded ClusterLoadAssignment is the target's
// cluster and has an endpoint with the target's address. A byte search
// rules out almost every assignment before anything is decoded.
func (t *writeTarget) holds(b []byte) bool {
	if !bytes.Contains(b, t.pattern) {
		return false
	}
	var cla endpointv3.ClusterLoadAssignment
	if err := proto.Unmarshal(b, &cla); err != nil || cla.GetClusterName() != t.cluster {
		return false
	}
	for _, loc := range cla.GetEndpoints() {
		for _, ep := range loc.GetLbEndpoints() {
			if ep.GetEndpoint().GetAddress().GetSocketAddress().GetAddress() == t.addr {
				return true
			}
		}
	}
	return false
}

// claName reads cluster_name (field 1) of an encoded ClusterLoadAssignment
// without decoding the rest.
func resourceName(b []byte) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return ""
			}
			return v
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}
