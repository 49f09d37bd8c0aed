// Package hub is the federation core: the federated index of every member's
// services and the change feed that batches and paces pushes (hub/feed),
// the xDS resources generated from it (hub/xdsgen), and the ADS gRPC
// server that serves them (its own stream loops over go-control-plane's
// generated types): to proxyless gRPC and Envoy clients, SDS (Secrets,
// roots, workload certificates), Istio config over MCP to member istiods
// (package mcp), and syncz and proxy status to istioctl. Istio's CA API
// (hub/ca) sits beside it on the mTLS listener; both know who is calling
// from hub/authn, and the access policies of hub/authz and the member
// access reviews decide what each caller may read.
package hub

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/ca"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/pacing"
	"github.com/hubmesh/hub/hub/sds"
	"github.com/hubmesh/hub/hub/wire"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/mcp"
)

// Options configures a Hub.
type Options struct {
	// Changes is the change feed Run consumes (feed.NewChanges), which the
	// Index, the Secret and root sources report to. Nil: a feed of the
	// hub's own with DefaultDebounceAfter and DefaultDebounceMax.
	Changes *feed.Changes
	// Index is the federated index served (feed.NewIndex, reporting to
	// Changes). Nil: an index of the hub's own, with DomainSuffix.
	Index *feed.Index
	// DomainSuffix makes service hostnames of the hub's own index:
	// <name>.<namespace>.svc.<suffix>.
	DomainSuffix string
	// FederatedDomain makes the hosts of the ServiceEntries served to
	// member istiods: <name>.<namespace>.svc.<FederatedDomain> (empty:
	// mcp.DefaultFederatedDomain, clusterset.local).
	FederatedDomain string
	// Policy, if set, has the Istio objects distributed from the home
	// cluster (distribute.Source, reporting to Changes): served to member
	// istiods unchanged.
	Policy mcp.Policy
	// Rules, if set, has the Istio objects the hub's own xDS reads
	// (distribute.Source.Rules, reporting to Changes): DestinationRules
	// (locality load balancing, outlier detection, client mTLS of
	// proxyless gRPC), AuthorizationPolicies and PeerAuthentications
	// (proxyless gRPC servers' inbound listeners). Until the policies are
	// read, proxyless servers get no inbound listener.
	Rules RuleSource
	// Secrets and Roots feed SDS; without them no secrets are served.
	Secrets sds.SecretSource
	Roots   authn.RootSource
	// Authorizer, if set, lets a proxy read another namespace's Secrets
	// when its service account may list them there.
	Authorizer SecretAuthorizer
	// AccessReviewTimeout bounds each access review the Authorizer runs
	// (zero: 5 seconds); a review that fails is tried again 5 seconds
	// later.
	AccessReviewTimeout time.Duration
	// Tokens, if set, authenticates proxies on the mTLS listener that
	// present a Kubernetes service-account token instead of a certificate.
	Tokens authn.TokenReviewer
	// Signer, if set, serves Istio's CA API
	// (istio.v1.auth.IstioCertificateService) on the mTLS listener only:
	// workload certificates for callers authenticated by Tokens or by a
	// certificate it issued. It needs Roots.
	Signer ca.WorkloadSigner
	// Members, if set, tells the CA API which members are in the
	// federation: a certificate bound to one that is not (removed,
	// invalid) is neither renewed nor issued for a remembered token.
	Members ca.Members
	// MaxWorkloadCertTTL is the longest workload certificate the CA API
	// issues; a longer request is refused with InvalidArgument. Zero means
	// ca.DefaultMaxWorkloadCertTTL.
	MaxWorkloadCertTTL time.Duration
	// Namespace is the hub's own namespace: its Secrets are never served
	// over SDS, in any member, and no member asserts identities in it.
	Namespace string
	// RootNamespace is Istio's root namespace in the members: only the
	// home cluster and members whose remote Secret allows it
	// (clusters.AnnotationAllowRootNamespaceIdentities) assert identities
	// in it. Empty: no namespace is the root namespace.
	RootNamespace string
	// IdentityScopes, if set, tells which identities each member may
	// assert (synced, and its remote Secret's annotations): the CA signs
	// and SDS serves only those. Nil: every member counts as synced,
	// without annotations.
	IdentityScopes authn.IdentityScopes
	// Limits bounds what xDS clients may send (zero fields: defaults).
	Limits Limits
	// MTLSMode is the mesh-wide mTLS mode of proxyless gRPC workloads
	// (see xdsgen.MTLSMode; "": xdsgen.DefaultMTLSMode). STRICT needs
	// Roots: clients accept identities of its local trust domain.
	MTLSMode xdsgen.MTLSMode
	// KeepUnhealthyFirst turns off the demotion of members that are not
	// healthy (Stale, Unreachable, TimedOut): by default their endpoints go
	// one priority behind the healthy members' (docs/architecture.md §3.9).
	KeepUnhealthyFirst bool
	// Settled reports whether membership has settled: the home cluster and
	// every member synced, timed out, or served from its persisted view
	// (clusters.Registry.Ready). Until it first has, new streams are
	// refused with Unavailable, as istiod refuses them before its caches
	// sync, so that no proxy is handed a partial mesh after a restart (its
	// client retries); after that it is not asked again. Nil: settled.
	Settled func() (bool, string)
	// NewStreamsPerSecond bounds how fast new ADS streams are admitted (a
	// token bucket with a burst of twice the rate); streams beyond it wait.
	// Zero means DefaultNewStreamsPerSecond.
	NewStreamsPerSecond float64
	// DrainGrace bounds a listener's shutdown: when ServeADS's context
	// ends, new streams are refused and open ones are closed one by one over
	// the first half of it; whatever is left at its end is cut. Zero means
	// DefaultDrainGrace.
	DrainGrace time.Duration
	// Metrics, if set, gets the xDS metrics.
	Metrics prometheus.Registerer
	// Log is the logger; nil means slog.Default().
	Log *slog.Logger
	// Instance names this replica where xDS clients see it: the ID of the
	// control plane in TypeSyncz responses (istioctl proxy-status's ISTIOD
	// column). Empty: the host name (a pod's name in Kubernetes).
	Instance string
}

// Hub federates every member's services and serves them over ADS.
type Hub struct {
	log     *slog.Logger
	grace   time.Duration
	limits  Limits
	settled func() (bool, string)
	open    atomic.Bool   // settled once: streams are accepted
	admit   *rate.Limiter // new streams
	changes *feed.Changes
	index   *feed.Index
	gen     *xdsgen.Generator
	config  *mcp.Generator   // Istio config for member istiods (MCP-over-XDS)
	inputs  *generatorInputs // applies a batch's policy inputs before the watcher routes it
	watcher *watcher
	reviews *accessReviews // may be nil
	proxies *proxyTracker
	syncz   *syncz
	ca      *ca.Server         // nil: no CA API
	codec   *wire.Codec        // the ADS servers' gRPC codec
	fleet   *pacing.Deliveries // what the streams take in: paces the pushes
	// held are what the streams hold, names what the Delta streams
	// subscribe to (sotwSubscription, deltaSubscription): shared between
	// them.
	held  *resourceHoldings
	names *nameHoldings
	// streamIDs numbers the ADS streams of every listener, for display and
	// to tell a proxy's newest stream (a stream is known by its *conn).
	streamIDs atomic.Int64
}

// New creates a Hub. Run must be running for changes to reach proxies.
// The parts are built in dependency order, each complete when it is made:
// the change feed and the index (unless given), the xDS and Istio config
// generators and what applies their inputs, the access reviews, the
// identity scope and the token reviewer, the CA, the watcher that reads
// them all, the stream tracker
// (the registry of open streams and their status), and the sync status of
// both.
func New(opts Options) (*Hub, error) {
	opts = opts.withDefaults()
	changes, index := opts.Changes, opts.Index
	if changes == nil {
		changes = feed.NewChanges(DefaultDebounceAfter, DefaultDebounceMax)
	}
	if index == nil {
		index = feed.NewIndex(opts.DomainSuffix, changes)
	}
	gen, err := newGenerator(index, opts)
	if err != nil {
		return nil, err
	}
	var trustDomain string
	if opts.Roots != nil {
		trustDomain = opts.Roots.LocalTrustDomain()
	}
	reviews := newAccessReviews(opts.Authorizer, changes.ReviewDecided, opts.Log)
	if reviews != nil && opts.AccessReviewTimeout > 0 {
		reviews.timeout = opts.AccessReviewTimeout
	}
	scope := authn.NewScope(opts.IdentityScopes, opts.Namespace, opts.RootNamespace)
	var tokens *authn.TokenAuth
	if opts.Tokens != nil && opts.Roots != nil {
		tokens = authn.NewTokenAuth(opts.Tokens, opts.Roots.LocalTrustDomain, scope)
	}
	caServer, workload, err := newCA(opts, tokens, scope)
	if err != nil {
		return nil, err
	}
	config := mcp.New(index, mcp.Options{FederatedDomain: opts.FederatedDomain, Policy: opts.Policy, TrustDomain: trustDomain})
	fleet := &pacing.Deliveries{}
	watcher := newWatcher(watcherInputs{
		gen: gen, config: config, roots: opts.Roots, workload: workload, sds: newSDS(opts, scope, reviews),
		scope: scope, maxNames: opts.Limits.MaxResourceNames,
		log: opts.Log, workers: runtime.GOMAXPROCS(0), latency: xdsstatus.NewPushLatency(), fleet: fleet, paceLimit: changes.Limit(),
	})
	held := newHoldings[heldResource]()
	proxies := newProxyTracker(trackerInputs{
		log: opts.Log, limits: opts.Limits, tokens: tokens, roots: opts.Roots, fleet: fleet, held: held,
	})
	h := &Hub{
		log:     opts.Log,
		grace:   opts.DrainGrace,
		limits:  opts.Limits,
		settled: opts.Settled,
		admit:   rate.NewLimiter(rate.Limit(opts.NewStreamsPerSecond), int(2*opts.NewStreamsPerSecond)+1),
		changes: changes,
		index:   index,
		gen:     gen,
		config:  config,
		inputs:  &generatorInputs{gen: gen, config: config, rules: opts.Rules, log: opts.Log},
		watcher: watcher,
		reviews: reviews,
		proxies: proxies,
		syncz:   newSyncz(proxies, opts.Roots, scope, opts.RootNamespace, opts.Instance, opts.Limits),
		ca:      caServer,
		codec:   wire.NewCodec(),
		fleet:   fleet,
		held:    held,
		names:   newHoldings[struct{}](),
	}
	if opts.Metrics != nil {
		collectors := append(h.xdsCollectors(), scope.Collectors()...)
		if tokens != nil {
			collectors = append(collectors, tokens.Collectors()...)
		}
		if caServer != nil {
			collectors = append(collectors, caServer.Collectors()...)
		}
		for _, c := range collectors {
			if err := opts.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("registering the hub's metrics: %w", err)
			}
		}
	}
	return h, nil
}

// newCA builds the CA API and the workload certificates SDS serves, when
// the options have a signer (nil, nil otherwise).
func newCA(opts Options, tokens *authn.TokenAuth, scope *authn.Scope) (*ca.Server, *workloadCerts, error) {
	if opts.Signer == nil {
		return nil, nil, nil
	}
	if opts.Roots == nil {
		return nil, nil, errors.New("the CA API (Options.Signer) needs Options.Roots")
	}
	server := ca.New(ca.Options{Signer: opts.Signer, Roots: opts.Roots, Tokens: tokens, Scope: scope,
		Members: opts.Members, MaxTTL: opts.MaxWorkloadCertTTL, Log: opts.Log})
	ttl := ca.DefaultWorkloadCertTTL
	if opts.MaxWorkloadCertTTL > 0 {
		ttl = min(ttl, opts.MaxWorkloadCertTTL)
	}
	return server, &workloadCerts{signer: opts.Signer, ttl: ttl}, nil
}

// withDefaults fills in the options left zero.
func (opts Options) withDefaults() Options {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.NewStreamsPerSecond <= 0 {
		opts.NewStreamsPerSecond = DefaultNewStreamsPerSecond
	}
	if opts.DrainGrace <= 0 {
		opts.DrainGrace = DefaultDrainGrace
	}
	opts.Limits = opts.Limits.withDefaults()
	return opts
}

// newGenerator builds the xDS generator over index, with the mesh-wide mTLS
// mode and the demotion of unhealthy members the options set.
func newGenerator(index *feed.Index, opts Options) (*xdsgen.Generator, error) {
	gen := xdsgen.New(index)
	if err := gen.SetMTLS(opts.MTLSMode, opts.Roots, opts.RootNamespace); err != nil {
		return nil, err
	}
	if opts.Rules != nil {
		gen.AwaitSecurity() // no inbound listener before the policies are read
	}
	gen.SetDemoteUnhealthy(!opts.KeepUnhealthyFirst)
	return gen, nil
}

// xdsCollectors are the metrics of the xDS side: streams, pushes, latency
// and policies.
func (h *Hub) xdsCollectors() []prometheus.Collector {
	quiet := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hub_xds_push_quiet_seconds",
		Help: "The quiet period batched changes wait for before a push: the time the last push took until its clients answered all but 10% (at least 16) of its responses, within --debounce-after and --debounce-max.",
	}, func() float64 { return h.changes.Quiet().Seconds() })
	pending := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hub_xds_policies_pending",
		Help: "1 while the distributed AuthorizationPolicies and PeerAuthentications have not been read (since start): proxyless gRPC servers get no inbound listener, and streams asking for one no LDS response, until they are.",
	}, func() float64 {
		if _, known := h.gen.Security(); known {
			return 0
		}
		return 1
	})
	out := append(h.proxies.collectors(), h.watcher.latency.Collector(), h.watcher.evaluations, h.watcher.policyServers, pending, quiet)
	for t := range feed.PushTriggers {
		out = append(out, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "hub_xds_pushes_total",
			Help:        "Pushes of batched changes, by what let them go: leading_edge (the first change after a quiet period), quiet (no change for the quiet period), max_wait (a change waited --debounce-max).",
			ConstLabels: prometheus.Labels{"trigger": t.String()},
		}, func() float64 { return float64(h.changes.Pushes(t)) }))
	}
	return out
}

// DefaultNewStreamsPerSecond is how many new ADS streams a hub admits per
// second unless told otherwise: a restarted hub's fleet reconnects within
// seconds without starving the streams already served.
const DefaultNewStreamsPerSecond = 200

// adsWindowBytes is the ADS servers' HTTP/2 stream and connection window.
const adsWindowBytes = 1 << 20

// DefaultDrainGrace is how long a listener drains its streams on shutdown
// unless told otherwise.
const DefaultDrainGrace = 10 * time.Second

// DefaultDebounceAfter and DefaultDebounceMax bound the batching of a
// hub's own change feed (Options.Changes).
const (
	DefaultDebounceAfter = 100 * time.Millisecond
	DefaultDebounceMax   = 10 * time.Second
)

// Proxies lists every connected ADS stream with its per-type ACK/NACK state.
func (h *Hub) Proxies() []xdsstatus.Proxy { return h.proxies.proxies(h.watcher.serverSecurity) }

// RefusedStreams are the most recent xDS streams the hub ended because of
// what their clients sent, newest first.
func (h *Hub) RefusedStreams() []xdsstatus.Refused { return h.proxies.refused.List() }

// ProxyConfig returns what a proxy (its newest stream) currently holds.
func (h *Hub) ProxyConfig(id string) (xdsstatus.ProxyConfig, bool) {
	return h.proxies.config(id, h.watcher.serverSecurity)
}

// PushLatency summarises push latency over the last five minutes: from a
// member's change reaching the hub to each pushed response being handed to
// a stream (responses to a stream's own request are not counted).
func (h *Hub) PushLatency() xdsstatus.Latency { return h.watcher.latency.Summary() }

// PushesPerSecond returns the xDS responses sent in each of the last 60
// seconds, oldest first.
func (h *Hub) PushesPerSecond() []int { return h.proxies.pushesPerSecond() }

// Certificates summarises the workload certificates the CA API issued and
// the requests it refused; ok is false when the hub serves no CA API.
func (h *Hub) Certificates() (ca.CertificateStats, bool) {
	if h.ca == nil {
		return ca.CertificateStats{}, false
	}
	return h.ca.Stats(), true
}

// ServiceSummary is one federated service with its endpoints per member.
type ServiceSummary struct {
	Hostname  string
	Namespace string
	Name      string
	Ports     []clusters.ServicePort
	Endpoints map[string]int // member ID → endpoints (address, port)
	// Restricted are the members whose view is not offered to every
	// other member (clusters.Service.Restricted), with what they say:
	// NotExported, ExportTo and ExportReason.
	Restricted map[string]*clusters.Service
}

// MemberExchange is what one member exports to the others and imports
// from them, in services (hostnames).
type MemberExchange struct {
	// Exported are its services offered to every other member;
	// ExportedToSome those offered to some (hub.federation/export-to);
	// NotExported those kept home.
	Exported, ExportedToSome, NotExported int
	// Imported are the services its proxies get from another member's
	// view (exported to it); of them, Only those it has no view of itself.
	Imported, ImportedOnly int
}

// Exchange works out what a member exports and imports (one pass over
// the index: call it for one member at a time).
func (h *Hub) Exchange(member string) MemberExchange {
	var ex MemberExchange
	for _, host := range h.index.Hostnames() {
		members := h.index.Service(host)
		own, has := members[member]
		if has {
			switch {
			case own.NotExported:
				ex.NotExported++
			case own.ExportTo != nil:
				ex.ExportedToSome++
			default:
				ex.Exported++
			}
		}
		for id, s := range members {
			if id != member && s.ExportedTo(member) {
				ex.Imported++
				if !has {
					ex.ImportedOnly++
				}
				break
			}
		}
	}
	return ex
}

// Services summarises every federated service, sorted by hostname.
func (h *Hub) Services() []ServiceSummary {
	var out []ServiceSummary
	for _, host := range h.index.Hostnames() {
		members := h.index.Service(host)
		s := ServiceSummary{Hostname: host, Ports: xdsgen.FederatedPorts(members), Endpoints: map[string]int{}}
		for id, svc := range members {
			s.Namespace, s.Name = svc.Namespace, svc.Name
			s.Endpoints[id] = len(svc.Endpoints)
			if svc.Restricted() {
				if s.Restricted == nil {
					s.Restricted = map[string]*clusters.Service{}
				}
				s.Restricted[id] = svc
			}
		}
		out = append(out, s)
	}
	return out
}

// Run consumes the change feed until ctx is done, then ends the access
// reviews still running.
func (h *Hub) Run(ctx context.Context) {
	defer h.reviews.close()
	if wc := h.watcher.workload; wc != nil {
		done := make(chan struct{})
		defer func() { <-done }()
		go func() {
			defer close(done)
			renewWorkloadCerts(ctx, wc, h.changes.RootsChanged)
		}()
	}
	h.changes.Run(ctx, h.push)
}

// push applies what b changed of the generators' inputs, then has the
// watcher send it to the streams it concerns (see watcher.push).
func (h *Hub) push(ctx context.Context, b *feed.Batch) (delivered <-chan struct{}, idled time.Duration) {
	m := h.fleet.Mark() // before the inputs: what the streams answer meanwhile counts for this push
	return h.watcher.push(ctx, b, m, h.inputs.apply(b))
}

// renewWorkloadCerts re-evaluates the SDS subscribers of roots and
// workload certificates (renew) whenever a workload certificate SDS issued
// is due for renewal, until ctx is done.
func renewWorkloadCerts(ctx context.Context, wc *workloadCerts, renew func()) {
	tick := time.NewTicker(workloadRenewalTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if wc.renewalDue(now) {
				renew()
			}
		}
	}
}

// admitStream refuses streams with Unavailable until membership has first
// settled (Options.Settled), then waits for the new-stream rate limit; a
// stream whose client gives up first is refused with ResourceExhausted.
// Clients retry both.
func (h *Hub) admitStream(ctx context.Context) error {
	if !h.open.Load() {
		if h.settled != nil {
			if ok, _ := h.settled(); !ok { // which members: /readyz says (not for anonymous clients)
				return status.Error(codes.Unavailable, "hub is still syncing its member clusters; retry")
			}
		}
		h.open.Store(true)
	}
	if err := h.admit.Wait(ctx); err != nil {
		return status.Errorf(codes.ResourceExhausted, "hub is admitting new xDS streams at its limit; retry: %v", err)
	}
	return nil
}

// ServeADS serves ADS (and the per-type discovery services) on lis:
// plaintext when tlsCfg is nil (never serving secrets), else mTLS with
// tlsCfg deciding which client certificates are accepted; there a stream
// without a verified certificate or a valid service-account token may read
// Istio config only (istiod's config sources over SIMPLE TLS; anything else
// is refused with Unauthenticated), and Istio's CA API is served beside ADS
// when the hub has a signer (Options.Signer); never in plaintext. Both answer
// TypeSyncz, each to whom TypeSyncz says. When ctx ends it drains (see
// Options.DrainGrace) and returns once every stream is gone; pushes keep
// flowing to the streams not yet closed as long as Run runs.
func (h *Hub) ServeADS(ctx context.Context, lis net.Listener, tlsCfg *tls.Config) error {
	streams := newStreamSet()
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.StreamInterceptor(streams.interceptor),
		// Thousands of mostly idle proxy connections: keep each one's read
		// buffer small (requests are ACKs of a few hundred bytes; grpc-go
		// already releases write buffers after each flush).
		grpc.ReadBufferSize(8 << 10),
		// A fixed HTTP/2 window instead of grpc-go's BDP estimation, which
		// pings and grows windows up to 16 MiB per connection: 1 MiB holds
		// an Envoy SotW ACK of 1,000 names (~48 KB) many times over,
		// costs no pings, and bounds what a client can have buffered on a
		// connection.
		grpc.InitialWindowSize(adsWindowBytes),
		grpc.InitialConnWindowSize(adsWindowBytes),
		// Bounded input (see Limits).
		grpc.MaxRecvMsgSize(h.limits.MaxRequestBytes),
		grpc.MaxConcurrentStreams(h.limits.MaxStreamsPerConnection),
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		// One encoding per shared resource list, not one per stream.
		grpc.ForceServerCodecV2(h.codec),
	}
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	srv := grpc.NewServer(opts...)
	// Streams outlive ctx until the drain is over: then done ends them.
	done := make(chan struct{})
	var endStreams sync.Once
	stopServing := func() { endStreams.Do(func() { close(done) }) }
	defer stopServing()
	xds := &adsServer{
		tracker: h.proxies, watcher: h.watcher, held: h.held, names: h.names, fleet: h.fleet, syncz: h.syncz, admit: h.admitStream, done: done,
		streamIDs: &h.streamIDs,
	}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(srv, xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(srv, xds)
	listenerservice.RegisterListenerDiscoveryServiceServer(srv, xds)
	routeservice.RegisterRouteDiscoveryServiceServer(srv, xds)
	if tlsCfg != nil && h.ca != nil {
		securityv1alpha1.RegisterIstioCertificateServiceServer(srv, h.ca)
	}
	served := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		select {
		case <-served:
			return
		case <-ctx.Done():
		}
		h.drain(srv, streams, lis.Addr())
		stopServing()
	}()
	err := srv.Serve(lis)
	close(served)
	<-drained
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving ADS on %s: %w", lis.Addr(), err)
	}
	return nil
}

// drain stops accepting connections, closes the open streams one by one
// over half the grace period and cuts what is left when it ends.
func (h *Hub) drain(srv *grpc.Server, streams *streamSet, addr net.Addr) {
	start := time.Now()
	deadline, cancel := context.WithTimeout(context.Background(), h.grace)
	defer cancel()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }() // GOAWAY: no new streams; waits for open ones
	n := streams.drain(deadline, h.grace/2)
	select {
	case <-stopped:
	case <-deadline.Done():
		srv.Stop()
		<-stopped
	}
	h.log.Info("xDS listener drained", "address", addr.String(), "streams", n, "took", time.Since(start).Round(time.Millisecond).String())
}
