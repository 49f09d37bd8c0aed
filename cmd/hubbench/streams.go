package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
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
	shape    string
	namedCDS bool
	// nodeEveryRequest sends the node in every Delta request, ACKs
	// included, as Envoy < 1.38 does (envoynode.go).
	nodeEveryRequest bool
	services         int             // benchmark CDS clusters every stream should hold
	cds              map[string]bool // their names (the hub also serves e.g. kubernetes.default); istiod: their ServiceEntries' names
	// bulk are the clusters the bulk phase creates, with their endpoint
	// counts (bulk.go); nil without --bulk.
	bulk    map[string]int
	streams []*stream

	// target is the write being measured, if any.
	target atomic.Pointer[writeTarget]

	readyLeft atomic.Int64
	allReady  chan struct{}
	// refused counts streams the server refused before answering them
	// (istiod's new-stream rate limit), dialled again after a backoff.
	refused atomic.Int64

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
	network   string // NETWORK metadata: its member's network ("" for none)
	// targets are what its client subscribes to first by name (see
	// client.targets); watch are the EDS names of the services it must end
	// up holding, those whose writes it is measured on.
	targets []string
	watch   map[string]bool
	cdsWant int // benchmark CDS clusters it should hold

	dialAt    time.Time
	readyAt   atomic.Int64 // unix ns when it first held EDS for all of watch
	readyOnce sync.Once
	onReady   func()

	responses   atomic.Int64
	byType      [4]atomic.Int64 // responses per type, in subscriptionOrder
	resends     atomic.Int64
	cdsClusters atomic.Int64 // benchmark clusters in the stream's current CDS view
	edsHeld     atomic.Int64 // of its services, how many it holds EDS for
	// bulkCDS and bulkEDS are how many of the bulk phase's clusters it
	// holds in CDS, and in EDS with all their endpoints; bulkDoneAt is
	// when it first held all of them in both (unix ns, 0 until then).
	bulkCDS, bulkEDS atomic.Int64
	bulkDoneAt       atomic.Int64
	lastEDS          atomic.Pointer[string]
	err              atomic.Pointer[error]
	istiod           istiodState // the istiod shape's counters (istiod.go)
}

// writeTarget is one measured write: the EDS cluster it changes (for the
// istiod shape, the name of the ServiceEntry, object) and the address it
// adds; arrived[i] is when stream i first saw it (ns after start), 0 while
// it has not; bytes[i] is the size of the response that brought it (the
// istiod shape only).
type writeTarget struct {
	cluster  string
	object   string
	addr     string
	pattern  []byte // SocketAddress.address as encoded in a ClusterLoadAssignment
	start    time.Time
	arrived  []atomic.Int64
	bytes    []atomic.Int64
	left     atomic.Int64
	done     chan struct{}
	watchers []int
}

func newWriteTarget(cluster, object, addr string, streams int, watchers []int) *writeTarget {
	// SocketAddress.address is field 2, a string: tag, length, bytes.
	pattern := protowire.AppendTag(nil, 2, protowire.BytesType)
	pattern = protowire.AppendString(pattern, addr)
	t := &writeTarget{cluster: cluster, object: object, addr: addr, pattern: pattern, arrived: make([]atomic.Int64, streams), bytes: make([]atomic.Int64, streams), done: make(chan struct{}), watchers: watchers}
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
	f := &fleet{addr: addr, delta: cfg.Delta, shape: cfg.Shape, namedCDS: cfg.CDS == cdsNamed, services: cfg.Services, allReady: make(chan struct{}), failed: make(chan struct{})}
	f.nodeEveryRequest = cfg.Delta && cfg.Shape == shapeEnvoy && cfg.DeltaNodeEveryRequest
	if len(l.bulk) > 0 {
		f.bulk = map[string]int{}
		for _, s := range l.bulk {
			f.bulk[s.cluster] = s.endpoints()
		}
	}
	f.ctx, f.cancel = context.WithCancel(ctx)
	f.cds = map[string]bool{}
	for _, s := range l.services {
		if cfg.Shape == shapeIstiod {
			f.cds[s.entry()] = true
		} else {
			f.cds[s.cluster] = true
		}
	}
	for i, svcs := range l.watched {
		s := &stream{
			f: f, idx: i, nodeID: fmt.Sprintf("hubbench-%05d", i), clusterID: l.memberIDs[i%len(l.memberIDs)],
			network: l.memberNetwork(i % len(l.memberIDs)), watch: map[string]bool{},
		}
		if cfg.Shape == shapeIstiod {
			// istiod sends no CLUSTER_ID (docs/architecture.md §3.7).
			s.nodeID, s.clusterID = fmt.Sprintf("istiod-%d", i), ""
		}
		for _, si := range svcs {
			svc := l.services[si]
			s.watch[svc.cluster] = true
			switch cfg.Shape {
			case shapeNamed:
				s.targets = append(s.targets, svc.cluster)
			case shapeGRPC:
				s.targets = append(s.targets, svc.listener())
			}
		}
		s.cdsWant = f.services
		if cfg.CDS == cdsNamed {
			s.cdsWant = len(svcs)
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
			progress("cold connect: %d/%d streams hold their full config", len(f.streams)-int(f.readyLeft.Load()), len(f.streams))
		case <-timer.C:
			return fmt.Errorf("cold connect: after %s %d of %d streams still lack some of their config:\n%s",
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
		if f.shape == shapeIstiod {
			fmt.Fprintf(&b, "  stream %d (node %s): %s, %d responses in all, stream %s\n", i, s.nodeID, s.describeIstiod(), s.responses.Load(), errText)
			continue
		}
		fmt.Fprintf(&b, "  stream %d (node %s, CLUSTER_ID %s): EDS for %d/%d services, %d EDS responses (last version %s), CDS %d/%d clusters (%d responses), %d responses in all, stream %s\n",
			i, s.nodeID, s.clusterID, s.edsHeld.Load(), len(s.watch), s.typeResponses(resourcev3.EndpointType), last, s.cdsClusters.Load(), s.cdsWant, s.typeResponses(resourcev3.ClusterType), s.responses.Load(), errText)
	}
	return b.String()
}

// close ends every stream and connection and waits for their goroutines.
func (f *fleet) close() {
	f.cancel()
	f.wg.Wait()
}

func (s *stream) typeResponses(typeURL string) int64 {
	return s.byType[slices.Index(subscriptionOrder, typeURL)].Load()
}

// typeNames are the short names of subscriptionOrder's types.
var typeNames = []string{"LDS", "RDS", "CDS", "EDS"}

// byType sums the per-stream responses of each type, by short type name.
func (f *fleet) byType() map[string]int64 {
	out := map[string]int64{}
	for _, s := range f.streams {
		if f.shape == shapeIstiod {
			for i, t := range istiodConfigTypes {
				out[istiodKind(t)] += s.istiod.byKind[i].Load()
			}
			continue
		}
		for i, name := range typeNames {
			out[name] += s.byType[i].Load()
		}
	}
	return out
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
	backoff := 250 * time.Millisecond
	err := s.serve()
	for refusedBeforeAnswer(err) && s.responses.Load() == 0 && s.f.ctx.Err() == nil {
		// A server that refuses new streams at its rate limit (istiod:
		// ResourceExhausted) is dialled again after a jittered backoff,
		// as Envoy does; the stream's connect time includes the wait.
		s.f.refused.Add(1)
		select {
		case <-time.After(backoff/2 + rand.N(backoff)):
		case <-s.f.ctx.Done():
		}
		backoff = min(2*backoff, 4*time.Second)
		err = s.serve()
	}
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

// refusedBeforeAnswer reports whether err is a server's refusal of a new
// stream at its rate limit: ResourceExhausted, or the stream closed under a
// send (io.EOF: istiod ends a refused Delta stream so; the caller checks
// that nothing was answered yet). A server that is down (Unavailable) is
// not redialled: the run fails.
func refusedBeforeAnswer(err error) bool {
	return status.Code(err) == codes.ResourceExhausted || errors.Is(err, io.EOF)
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
	if s.f.shape == shapeIstiod {
		return s.serveIstiod(ads)
	}
	node := s.node()
	if s.f.delta {
		return s.serveDelta(ads, node)
	}
	return s.serveSotW(ads, node)
}

// node is the node the stream sends: an Istio sidecar's for the envoy
// shape (envoynode.go), else a minimal one.
func (s *stream) node() *corev3.Node {
	if s.f.shape == shapeEnvoy {
		return envoyNode(s.idx, s.clusterID, s.network)
	}
	md := map[string]*structpb.Value{
		"CLUSTER_ID": structpb.NewStringValue(s.clusterID),
		"NAMESPACE":  structpb.NewStringValue(benchNamespace),
	}
	if s.network != "" {
		md["NETWORK"] = structpb.NewStringValue(s.network)
	}
	if s.f.shape == shapeGRPC {
		md["GENERATOR"] = structpb.NewStringValue("grpc") // as Istio's agent writes it into a gRPC bootstrap
	}
	return &corev3.Node{Id: s.nodeID, Metadata: &structpb.Struct{Fields: md},
		Locality: &corev3.Locality{Region: "region-" + s.clusterID, Zone: zones[s.idx%len(zones)]}}
}

// nodeOnce returns the node for the stream's first request and nil after,
// as clients with set_node_on_first_message_only (Istio's bootstrap) do.
func nodeOnce(node *corev3.Node) func() *corev3.Node {
	sent := false
	return func() *corev3.Node {
		if sent {
			return nil
		}
		sent = true
		return node
	}
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
	c := s.newClient()
	nodeFor := nodeOnce(node)
	acked := map[string][2]string{} // typeURL → last ACKed version and nonce
	// subscribe sends every subscription change, each with the type's last
	// ACKed version and nonce, as a client changing its names does.
	subscribe := func() error {
		for _, ch := range c.changes() {
			req := &discoveryv3.DiscoveryRequest{TypeUrl: ch.typeURL, ResourceNames: ch.sub.names,
				VersionInfo: acked[ch.typeURL][0], ResponseNonce: acked[ch.typeURL][1], Node: nodeFor()}
			if err := st.Send(req); err != nil {
				return fmt.Errorf("subscribing to %d %s names: %w", len(ch.sub.names), ch.typeURL, err)
			}
		}
		return nil
	}
	if err := subscribe(); err != nil {
		return err
	}
	seen := map[string]map[string]bool{}
	var values [][]byte
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
		values = values[:0]
		for _, a := range resp.GetResources() {
			values = append(values, a.GetValue())
		}
		if err := c.applySotW(typeURL, values); err != nil {
			return fmt.Errorf("%s response %s: %w", typeURL, resp.GetVersionInfo(), err)
		}
		s.observe(c, typeURL, resp.GetVersionInfo(), values, now)
		// Like Envoy (whose CDS update pauses EDS until it is applied),
		// subscribe to what the response calls for before ACKing it.
		if err := subscribe(); err != nil {
			return err
		}
		acked[typeURL] = [2]string{resp.GetVersionInfo(), resp.GetNonce()}
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(), ResourceNames: c.subs[typeURL].names}
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
	c := s.newClient()
	nodeFor := nodeOnce(node)
	if s.f.nodeEveryRequest {
		nodeFor = func() *corev3.Node { return node }
	}
	subscribe := func() error {
		for _, ch := range c.changes() {
			// A first wildcard request subscribes nothing by name (the
			// legacy wildcard), as Envoy's first CDS request does.
			req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: ch.typeURL, ResourceNamesSubscribe: ch.added, ResourceNamesUnsubscribe: ch.removed, Node: nodeFor()}
			if err := st.Send(req); err != nil {
				return fmt.Errorf("subscribing to %d and unsubscribing %d %s names: %w", len(ch.added), len(ch.removed), ch.typeURL, err)
			}
		}
		return nil
	}
	if err := subscribe(); err != nil {
		return err
	}
	var values [][]byte
	for {
		resp, err := st.Recv()
		now := time.Now()
		if err != nil {
			return ended(err)
		}
		s.responses.Add(1)
		typeURL := resp.GetTypeUrl()
		c.markAnswered(typeURL)
		values = values[:0]
		for _, r := range resp.GetResources() {
			if !c.subs[typeURL].wants(r.GetName()) {
				continue
			}
			// We never NACK, so a resource sent again with the version we
			// hold is a resend.
			resend, err := c.put(typeURL, r.GetName(), r.GetVersion(), r.GetResource().GetValue())
			if err != nil {
				return fmt.Errorf("%s response %s: %w", typeURL, resp.GetSystemVersionInfo(), err)
			}
			if resend {
				s.resends.Add(1)
			}
			values = append(values, r.GetResource().GetValue())
		}
		for _, name := range resp.GetRemovedResources() {
			c.remove(typeURL, name)
		}
		s.observe(c, typeURL, resp.GetSystemVersionInfo(), values, now)
		if err := subscribe(); err != nil {
			return err
		}
		if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.GetNonce(), Node: nodeFor()}); err != nil {
			return fmt.Errorf("sending an ACK: %w", err)
		}
	}
}

func (s *stream) newClient() *client {
	c := newClient(s.f.shape, s.f.namedCDS, s.targets, s.watch, s.f.cds)
	c.bulk = s.f.bulk
	return c
}

// observe records what a response changed: the counters describe shows,
// readiness, and the arrival of the measured write at this stream when
// one of the response's ClusterLoadAssignments holds its address.
func (s *stream) observe(c *client, typeURL, version string, values [][]byte, now time.Time) {
	if i := slices.Index(subscriptionOrder, typeURL); i >= 0 {
		s.byType[i].Add(1)
	}
	if len(s.f.bulk) > 0 {
		s.bulkCDS.Store(int64(c.bulkCDS))
		s.bulkEDS.Store(int64(c.bulkEDS))
		if n := len(s.f.bulk); c.bulkCDS == n && c.bulkEDS == n {
			s.bulkDoneAt.CompareAndSwap(0, now.UnixNano())
		}
	}
	switch typeURL {
	case resourcev3.ClusterType:
		s.cdsClusters.Store(int64(c.cdsHeld))
	case resourcev3.EndpointType:
		s.lastEDS.Store(&version)
		s.edsHeld.Store(int64(c.edsHeld))
		if c.edsHeld == len(s.watch) {
			s.markReady(now)
		}
		if t := s.f.target.Load(); t != nil && s.watch[t.cluster] && t.arrived[s.idx].Load() == 0 {
			for _, v := range values {
				if t.holds(v) {
					t.arrive(s.idx, now)
					break
				}
			}
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
