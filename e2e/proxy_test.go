package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hubmesh/hub/internal/xdstest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/util/rand"
)

// proxy is a raw ADS client that behaves like a sidecar behind a Service:
// it subscribes to every cluster (CDS) and to some EDS names, ACKs every
// response, and when its stream ends it reconnects, trying the hub
// addresses in order. It records what it holds and every protocol oddity a
// chaos test must rule out.
type proxy struct {
	addrs   []string
	cluster string
	eds     []string

	mu         sync.Mutex
	state      proxyState
	cancel     context.CancelFunc
	done       chan struct{}
	lastErrStr string
}

// proxyState is a copy of what a proxy has seen.
type proxyState struct {
	Addr       string                       // hub address of the current stream
	Held       map[string]map[string]string // type URL → name → sha256 of the resource
	Endpoints  map[string]int               // EDS name → endpoints in the last response
	Responses  int
	Reconnects int
	// EmptyEDS counts ClusterLoadAssignments with no endpoints for a name
	// that had endpoints before: a hub must never push those because a
	// member is unreachable or restarting.
	EmptyEDS int
}

func startProxy(t *testing.T, addrs []string, cluster string, eds ...string) *proxy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &proxy{addrs: addrs, cluster: cluster, eds: eds, cancel: cancel, done: make(chan struct{}),
		state: proxyState{Held: map[string]map[string]string{}, Endpoints: map[string]int{}}}
	go p.run(ctx)
	t.Cleanup(p.stop)
	return p
}

func (p *proxy) stop() {
	p.cancel()
	<-p.done
}

func (p *proxy) run(ctx context.Context) {
	defer close(p.done)
	node := &corev3.Node{Id: "sidecar~198.18.0.9~proxy-" + rand.String(6) + ".chaos~chaos.svc.cluster.local"}
	node.Metadata, _ = structpb.NewStruct(map[string]any{"CLUSTER_ID": p.cluster})
	for i := 0; ctx.Err() == nil; i++ {
		addr := p.addrs[i%len(p.addrs)]
		err := p.stream(ctx, addr, node)
		p.mu.Lock()
		p.state.Reconnects++
		if err != nil {
			p.lastErrStr = err.Error()
		}
		p.mu.Unlock()
		select { // client backoff, as Envoy and grpc-go do
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *proxy) stream(ctx context.Context, addr string, node *corev3.Node) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	cds := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}
	eds := &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: p.eds}
	return xdstest.Session(ctx, conn, []*discoveryv3.DiscoveryRequest{cds, eds}, func(resp *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
		p.record(addr, resp)
		if resp.TypeUrl == resourcev3.EndpointType {
			return xdstest.ACK(resp, p.eds...)
		}
		return xdstest.ACK(resp)
	})
}

func (p *proxy) record(addr string, resp *discoveryv3.DiscoveryResponse) {
	held := map[string]string{}
	endpoints := map[string]int{}
	for _, a := range resp.Resources {
		sum := sha256.Sum256(a.Value)
		switch resp.TypeUrl {
		case resourcev3.EndpointType:
			var cla endpointv3.ClusterLoadAssignment
			if err := a.UnmarshalTo(&cla); err != nil {
				continue
			}
			n := 0
			for _, l := range cla.Endpoints {
				n += len(l.LbEndpoints)
			}
			endpoints[cla.ClusterName] = n
			held[cla.ClusterName] = hex.EncodeToString(sum[:8])
		case resourcev3.ClusterType:
			var c clusterv3.Cluster
			if err := a.UnmarshalTo(&c); err != nil {
				continue
			}
			held[c.Name] = hex.EncodeToString(sum[:8])
		default:
			held[resp.TypeUrl+"#"+hex.EncodeToString(sum[:8])] = hex.EncodeToString(sum[:8])
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state.Addr = addr
	p.state.Responses++
	p.state.Held[resp.TypeUrl] = held
	if resp.TypeUrl == resourcev3.EndpointType {
		for name, n := range endpoints {
			if n == 0 && p.state.Endpoints[name] > 0 {
				p.state.EmptyEDS++
			}
		}
		p.state.Endpoints = endpoints
	}
}

// snapshot copies the proxy's state.
func (p *proxy) snapshot() proxyState {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state
	s.Held = map[string]map[string]string{}
	for k, v := range p.state.Held {
		s.Held[k] = maps.Clone(v)
	}
	s.Endpoints = maps.Clone(p.state.Endpoints)
	return s
}

// sameConfig reports whether two proxies hold byte-identical clusters and
// endpoints for each of the clusters named, the test's own: tests running
// in parallel change the rest of the mesh at any time.
func sameConfig(a, b proxyState, clusters ...string) bool {
	for _, c := range clusters {
		for _, typeURL := range []string{resourcev3.ClusterType, resourcev3.EndpointType} {
			x, ok := a.Held[typeURL][c]
			if !ok || x != b.Held[typeURL][c] {
				return false
			}
		}
	}
	return len(clusters) > 0
}
