package hub

import (
	"context"
	"sync"
	"sync/atomic"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hubmesh/hub/hub/authz"
	"github.com/hubmesh/hub/hub/pacing"
	"github.com/hubmesh/hub/hub/xdsgen"
)

// adsServer is the hub's xDS server (docs/architecture.md §3.6): the handlers of ADS
// and of the per-type discovery services, each running one stream's loop.
// A loop holds its stream's conn (one object per stream), takes the
// stream's requests in order, has the tracker check and record them
// (proxyTracker), hands each one with the conn to the watcher as a watch
// (watcher.CreateWatch, CreateDeltaWatch) and sends what the watcher
// answers, one response at a time, from the stream's own goroutine.
//
// It keeps go-control-plane's protocol behaviour (a stale SotW nonce is
// ignored; a request replaces its type's watch; SotW and Delta wildcard
// semantics, legacy wildcard included, through go-control-plane's
// stream.Subscription for Delta and sotwSubscription for SotW) without
// its per-request work: a SotW ACK that repeats its type's last names (the
// same interned slice, see wire.RequestStream) is neither re-checked nor turned
// into a new map of names, and there is no select over a channel per
// watch.
type adsServer struct {
	// REST xDS (Fetch*) is not served: Unimplemented.
	clusterservice.UnimplementedClusterDiscoveryServiceServer
	endpointservice.UnimplementedEndpointDiscoveryServiceServer
	listenerservice.UnimplementedListenerDiscoveryServiceServer
	routeservice.UnimplementedRouteDiscoveryServiceServer

	tracker *proxyTracker
	watcher *watcher
	held    *resourceHoldings  // what the streams hold, shared
	names   *nameHoldings      // what the Delta streams subscribe to, shared
	fleet   *pacing.Deliveries // may be nil
	syncz   *syncz             // answers TypeSyncz
	admit   func(context.Context) error
	// done ends every stream (nil error): the listener's drain is over.
	done <-chan struct{}
	// streamIDs numbers the streams of every listener of the hub.
	streamIDs *atomic.Int64
}

// StreamAggregatedResources implements ADS over SotW.
func (a *adsServer) StreamAggregatedResources(st grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	return a.serveSotw(st, resourcev3.AnyType)
}

// DeltaAggregatedResources implements ADS over Delta (incremental) xDS.
func (a *adsServer) DeltaAggregatedResources(st grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	return a.serveDelta(st, resourcev3.AnyType)
}

// The per-type discovery services (CDS, EDS, LDS, RDS) are the same loops
// with a default type URL.
type (
	sotwStream  = grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
	deltaStream = grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]
)

func (a *adsServer) StreamClusters(st sotwStream) error {
	return a.serveSotw(st, resourcev3.ClusterType)
}

func (a *adsServer) StreamEndpoints(st sotwStream) error {
	return a.serveSotw(st, resourcev3.EndpointType)
}

func (a *adsServer) StreamListeners(st sotwStream) error {
	return a.serveSotw(st, resourcev3.ListenerType)
}

func (a *adsServer) StreamRoutes(st sotwStream) error { return a.serveSotw(st, resourcev3.RouteType) }

func (a *adsServer) DeltaClusters(st deltaStream) error {
	return a.serveDelta(st, resourcev3.ClusterType)
}

func (a *adsServer) DeltaEndpoints(st deltaStream) error {
	return a.serveDelta(st, resourcev3.EndpointType)
}

func (a *adsServer) DeltaListeners(st deltaStream) error {
	return a.serveDelta(st, resourcev3.ListenerType)
}

func (a *adsServer) DeltaRoutes(st deltaStream) error { return a.serveDelta(st, resourcev3.RouteType) }

var errNoType = status.Error(codes.InvalidArgument, "type URL is required for ADS")

// outbox is where a stream's watches put their responses for the stream's
// loop to send. put never blocks: a watch answers at most once, and a
// stream has at most one watch per type.
type outbox struct {
	mu    sync.Mutex
	queue []reply
	wake  chan struct{} // one slot: something was put
}

func newOutbox() *outbox { return &outbox{wake: make(chan struct{}, 1)} }

func (o *outbox) put(r reply) {
	o.mu.Lock()
	o.queue = append(o.queue, r)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// take returns what was put since the last take, oldest first.
func (o *outbox) take() []reply {
	o.mu.Lock()
	defer o.mu.Unlock()
	q := o.queue
	o.queue = nil
	return q
}

// receive reads a stream's requests on a goroutine of its own (gRPC's
// RecvMsg blocks) and hands them over one at a time; the channel closes
// when the stream ends or the loop is gone.
func receive[R any](st interface{ Recv() (*R, error) }, stop <-chan struct{}) <-chan *R {
	reqs := make(chan *R)
	go func() {
		defer close(reqs)
		for {
			req, err := st.Recv()
			if err != nil {
				return
			}
			select {
			case reqs <- req:
			case <-stop:
				return
			}
		}
	}()
	return reqs
}

// streamConn is a stream's state as its loop (serveStream) drives it.
type streamConn[R any] interface {
	handle(req *R, defaultType string) error
	sendQueued() error
	close()
}

// serveStream is a stream's loop: it admits and registers the stream,
// then takes its requests in order and sends what its watches answer,
// until the stream, its listener's drain or an error ends it.
func serveStream[R any](a *adsServer, st interface {
	Context() context.Context
	Recv() (*R, error)
}, defaultType string, sc *conn, c streamConn[R]) error {
	defer c.close()
	ctx := st.Context()
	if err := a.admit(ctx); err != nil {
		return err
	}
	if err := a.tracker.onStreamOpen(ctx, sc, defaultType); err != nil {
		a.tracker.onRefused(sc, err)
		return err
	}
	out := sc.out
	stop := make(chan struct{})
	defer close(stop)
	reqs := receive(st, stop)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.done:
			return nil
		case <-out.wake:
			if err := c.sendQueued(); err != nil {
				return err
			}
		case req, ok := <-reqs:
			if !ok {
				return nil
			}
			// What the watches answered before this request goes first:
			// the request may acknowledge it.
			if err := c.sendQueued(); err != nil {
				return err
			}
			if err := c.handle(req, defaultType); err != nil {
				a.tracker.onRefused(sc, err)
				return err
			}
		}
	}
}

// forgetUnread drops what the hub never reads of a node once the node was
// checked (Limits) and recorded (proxyTracker.request): a stream keeps its
// node for as long as it lives. Envoy lists every extension compiled into
// it (~130, 10–20 KB decoded), and an Istio sidecar's metadata (~17 KB
// encoded: labels, annotations, the pod's ports, the agent's settings)
// decodes to ~9 KB of structs; of the metadata only readNodeMetadata stay,
// and a proxyless gRPC node's LABELS, bounded (authz.TrimLabels).
func forgetUnread(n *corev3.Node) {
	n.Extensions, n.ClientFeatures, n.DynamicParameters = nil, nil, nil
	fields := n.GetMetadata().GetFields()
	if len(fields) == 0 {
		return
	}
	kept := map[string]*structpb.Value{}
	for _, k := range readNodeMetadata {
		if v, ok := fields[k]; ok {
			kept[k] = v
		}
	}
	trimmed := false
	if v, ok := fields["LABELS"]; ok && xdsgen.Proxyless(n) {
		kept["LABELS"] = authz.TrimLabels(v) // which policies select a proxyless server (authz.WorkloadOf)
		trimmed = kept["LABELS"] != v
	}
	if len(kept) < len(fields) || trimmed {
		n.Metadata = &structpb.Struct{Fields: kept}
	}
}

// readNodeMetadata are the node metadata keys the hub reads (as Istio
// names them): the proxy's member cluster, namespace, generator (grpc:
// proxyless; api: an istiod taking config), Istio version, network and
// service account; and, of a proxyless gRPC node only, its LABELS.
var readNodeMetadata = []string{"CLUSTER_ID", "NAMESPACE", "GENERATOR", "ISTIO_VERSION", "NETWORK", "SERVICE_ACCOUNT"}

// sameSlice reports whether a and b are the same slice (not only equal):
// an interned resource_names list (wire.RequestStream) repeated by an ACK, or
// what a stream holds published again unchanged.
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || unsafe.SliceData(a) == unsafe.SliceData(b))
}
