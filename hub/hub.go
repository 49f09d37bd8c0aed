// Package hub is the federation core: the federated index of every member's
// services, the push debounce, xDS generation and the ADS gRPC server built
// on go-control-plane.
package hub

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubmesh/hub/clusters"
)

// Options configures a Hub.
type Options struct {
	// DomainSuffix makes service hostnames: <name>.<namespace>.svc.<suffix>.
	DomainSuffix string
	// DebounceAfter and DebounceMax bound push batching (DESIGN.md §4).
	DebounceAfter, DebounceMax time.Duration
	// Secrets and Roots feed SDS; without them no secrets are served.
	Secrets SecretSource
	Roots   RootSource
	// Authorizer, if set, lets a proxy read another namespace's Secrets
	// when its service account may list them there.
	Authorizer SecretAuthorizer
	// Metrics, if set, gets the xDS metrics.
	Metrics prometheus.Registerer
	// Log is the logger; nil means slog.Default().
	Log *slog.Logger
}

// Hub federates every member's services and serves them over ADS.
type Hub struct {
	log      *slog.Logger
	index    *Index
	gen      *generator
	watcher  *watcher
	debounce *debouncer
	proxies  *proxyTracker
	servers  atomic.Int64 // ServeADS calls, to keep stream keys unique
}

// New creates a Hub. Run must be running for changes to reach proxies.
func New(opts Options) (*Hub, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	h := &Hub{log: opts.Log, proxies: newProxyTracker()}
	if opts.Metrics != nil {
		for _, c := range h.proxies.collectors() {
			if err := opts.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("registering xDS metrics: %w", err)
			}
		}
	}
	h.debounce = newDebouncer(opts.DebounceAfter, opts.DebounceMax, h.push)
	h.index = NewIndex(opts.DomainSuffix, h.debounce.add)
	h.gen = newGenerator(h.index)
	h.watcher = newWatcher(h.gen, opts.Log)
	h.watcher.secrets, h.watcher.roots, h.watcher.sar = opts.Secrets, opts.Roots, newSARCache(opts.Authorizer)
	h.proxies.identify = func(old, new *corev3.Node, id identity) {
		if old != nil {
			h.watcher.identities.Delete(old)
		}
		if new != nil {
			h.watcher.identities.Store(new, id)
		}
	}
	return h, nil
}

// sdsKey is the change key that makes every parked SDS watch re-evaluate.
const sdsKey = "\x00sds"

// SecretChanged tells the hub that a member's Secret changed (SDS pushes).
func (h *Hub) SecretChanged(string, clusters.ServiceKey) { h.debounce.add([]string{sdsKey}) }

// RootsChanged tells the hub that a trust domain's roots changed.
func (h *Hub) RootsChanged() { h.debounce.add([]string{sdsKey}) }

// Proxies lists every connected ADS stream with its per-type ACK/NACK state.
func (h *Hub) Proxies() []ProxyStatus { return h.proxies.proxies() }

// ProxyConfig returns what a proxy (its newest stream) currently holds.
func (h *Hub) ProxyConfig(id string) (ProxyConfig, bool) { return h.proxies.config(id) }

// PushesPerSecond returns the xDS responses sent in each of the last 60
// seconds, oldest first.
func (h *Hub) PushesPerSecond() []int { return h.proxies.pushesPerSecond() }

// ServiceSummary is one federated service with its endpoints per member.
type ServiceSummary struct {
	Hostname  string
	Namespace string
	Name      string
	Ports     []clusters.ServicePort
	Endpoints map[string]int // member ID → endpoints (address, port)
}

// Services summarises every federated service, sorted by hostname.
func (h *Hub) Services() []ServiceSummary {
	var out []ServiceSummary
	for _, host := range h.index.Hostnames() {
		members := h.index.Service(host)
		s := ServiceSummary{Hostname: host, Ports: federatedPorts(members), Endpoints: map[string]int{}}
		for id, svc := range members {
			s.Namespace, s.Name = svc.Namespace, svc.Name
			s.Endpoints[id] = len(svc.Endpoints)
		}
		out = append(out, s)
	}
	return out
}

// Sink is where member clusters deliver their services.
func (h *Hub) Sink() clusters.Sink { return h.index }

// Index is the federated index, for read models.
func (h *Hub) Index() *Index { return h.index }

// Run processes changes until ctx is done.
func (h *Hub) Run(ctx context.Context) { h.debounce.run(ctx) }

func (h *Hub) push(hostnames map[string]struct{}) {
	h.gen.invalidate(hostnames)
	_, secrets := hostnames[sdsKey]
	h.watcher.push(secrets, len(hostnames) > 1 || !secrets)
}

// ServeADS serves ADS (and the per-type discovery services) on lis until ctx
// is done: plaintext when tlsCfg is nil (never serving secrets), else mTLS
// with tlsCfg deciding which client certificates are accepted.
func (h *Hub) ServeADS(ctx context.Context, lis net.Listener, tlsCfg *tls.Config) error {
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	srv := grpc.NewServer(opts...)
	// go-control-plane numbers streams per server and per protocol from 1:
	// make the tracker's keys unique across our listeners and SotW/Delta,
	// so that one stream can never be mistaken for (or take the identity
	// of) another.
	seq := h.servers.Add(1)
	sotw := func(id int64) int64 { return seq<<40 | id }
	delta := func(id int64) int64 { return seq<<40 | 1<<39 | id }
	p := h.proxies
	xds := serverv3.NewServer(ctx, h.watcher, serverv3.CallbackFuncs{
		StreamOpenFunc:   func(ctx context.Context, id int64, typ string) error { return p.onStreamOpen(ctx, sotw(id), typ) },
		StreamClosedFunc: func(id int64, n *corev3.Node) { p.onStreamClosed(sotw(id), n) },
		StreamRequestFunc: func(id int64, req *discoveryv3.DiscoveryRequest) error {
			return p.onStreamRequest(sotw(id), req)
		},
		StreamResponseFunc: func(ctx context.Context, id int64, req *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
			p.onStreamResponse(ctx, sotw(id), req, resp)
		},
		DeltaStreamOpenFunc:   func(ctx context.Context, id int64, typ string) error { return p.onStreamOpen(ctx, delta(id), typ) },
		DeltaStreamClosedFunc: func(id int64, n *corev3.Node) { p.onStreamClosed(delta(id), n) },
		StreamDeltaRequestFunc: func(id int64, req *discoveryv3.DeltaDiscoveryRequest) error {
			return p.onDeltaRequest(delta(id), req)
		},
		StreamDeltaResponseFunc: func(id int64, req *discoveryv3.DeltaDiscoveryRequest, resp *discoveryv3.DeltaDiscoveryResponse) {
			p.onDeltaResponse(delta(id), req, resp)
		},
	})
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(srv, xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(srv, xds)
	listenerservice.RegisterListenerDiscoveryServiceServer(srv, xds)
	routeservice.RegisterRouteDiscoveryServiceServer(srv, xds)
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-stopped:
			return
		case <-ctx.Done():
		}
		// Open ADS streams end with ctx; give in-flight sends a moment.
		timer := time.AfterFunc(5*time.Second, srv.Stop)
		defer timer.Stop()
		srv.GracefulStop()
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving ADS on %s: %w", lis.Addr(), err)
	}
	return nil
}
