package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/internal/leader"
	"github.com/hubmesh/hub/internal/listening"
	"github.com/hubmesh/hub/trust"
	"github.com/hubmesh/hub/web"
)

// serve runs the hub until ctx is done: it builds the parts (build), opens
// the listeners (listen) and runs everything (app.run).
func serve(ctx context.Context, cfg config, log *slog.Logger) error {
	a, err := build(ctx, cfg, log)
	if err != nil {
		return err
	}
	listeners, err := a.listen()
	if err != nil {
		return err
	}
	return a.run(ctx, listeners)
}

// app is the hub's parts, built and not yet running.
type app struct {
	cfg         config
	log         *slog.Logger
	elector     *leader.Elector
	trust       *trust.Domains
	registry    *clusters.Registry
	distributed *distribute.Source
	hub         *hub.Hub
	admin       *web.Server
	webCert     *tls.Certificate // the bundle endpoint's, for --bundle-profile=https_web
	draining    *atomic.Bool     // readiness fails once set
}

// build makes the hub's parts in dependency order, each complete when it is
// made: membership from the home cluster, the federated index with ADS on
// --xds-addr and --xds-tls-addr (either may be off), and the admin server
// (REST API and dashboard) on --admin-addr.
//  1. the leader elector;
//  2. the change feed (feed.Changes), which every part below reports to;
//  3. the federated index (feed.Index), reporting changed hostnames to it;
//  4. trust federation, reporting root changes to the feed;
//  5. the member registry, delivering services to the index and Secret
//     changes to the feed;
//  6. the Istio objects labelled for distribution in the home cluster
//     (distribute.Source), reporting changed kinds to the feed;
//  7. the hub, consuming the feed and serving the index, with the registry
//     as its Secret source, access authorizer, token reviewer and
//     readiness, trust federation as its roots and the signer of its CA
//     API (Istio's CreateCertificate), and the distributed
//     objects as Istio config for member istiods;
//  8. the admin server: the REST API (package api) and the dashboard
//     (package web) on one router.
//
// It loads our CA (trust) before it returns: ctx bounds that.
func build(ctx context.Context, cfg config, log *slog.Logger) (*app, error) {
	home, err := homeConfig(cfg.kubeconfig)
	if err != nil {
		return nil, err
	}
	policy, err := memberPolicy(cfg)
	if err != nil {
		return nil, err
	}
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	homeClient, err := kubernetes.NewForConfig(home)
	if err != nil {
		return nil, fmt.Errorf("building home cluster client: %w", err)
	}
	a := &app{cfg: cfg, log: log, draining: &atomic.Bool{}}
	a.elector = leader.New(homeClient, cfg.namespace, replicaName(), log)
	metrics.MustRegister(a.elector.Collector())
	changes := feed.NewChanges(cfg.debounceAfter, cfg.debounceMax)
	index := feed.NewIndex(cfg.domainSuffix, changes)
	if a.trust, err = newTrust(cfg, homeClient, changes, a.elector, log); err != nil {
		return nil, err
	}
	metrics.MustRegister(a.trust.Collector())
	a.elector.OnStartedLeading(a.trust.LeadershipGained)
	a.registry, err = clusters.NewRegistry(clusters.Config{
		Home:                  home,
		HomeID:                cfg.clusterID,
		HomeGatewayNamespaces: cfg.homeGatewayNS,
		Namespace:             cfg.secretsNamespace,
		StateNamespace:        cfg.namespace,
		SyncTimeout:           cfg.remoteClusterTimeout,
		Policy:                policy,
		Sink:                  index,
		States:                index,
		DemoteUnhealthy:       cfg.demoteUnhealthy,
		ExportMode:            clusters.ExportMode(cfg.exportMode),
		SecretEvents:          changes,
		Metrics:               metrics,
		Log:                   log,
		IsLeader:              a.elector.IsLeader,
		ExpiryWarning:         cfg.expiryWarning,
	})
	if err != nil {
		return nil, err
	}
	distributeFrom, err := cfg.distributeNamespaces()
	if err != nil {
		return nil, fmt.Errorf("--distribute-namespaces: %w", err)
	}
	a.distributed, err = distribute.New(home, distribute.Options{
		Namespaces: distributeFrom,
		Hosts:      distribute.HostGuard{FederatedDomain: cfg.federatedDomain, DomainSuffix: cfg.domainSuffix, Federated: index.Has, Hostnames: index.FederatedHostnames},
		OnChange:   changes.ConfigChanged,
		MayWrite:   a.elector.IsLeader,
		Log:        log,
	})
	if err != nil {
		return nil, fmt.Errorf("watching Istio objects to distribute: %w", err)
	}
	if a.hub, err = hub.New(a.hubOptions(changes, index, metrics)); err != nil {
		return nil, err
	}
	auth, err := apiAuth(cfg, homeClient)
	if err != nil {
		return nil, err
	}
	if err := startTrust(ctx, a.trust, log); err != nil {
		return nil, err
	}
	if a.webCert, err = bundleCert(cfg); err != nil {
		return nil, err
	}
	if a.admin, err = a.adminServer(homeClient, policy, auth, metrics); err != nil {
		return nil, err
	}
	return a, nil
}

// bundleCert is the bundle endpoint's certificate for
// --bundle-profile=https_web (nil for the SPIFFE profile).
func bundleCert(cfg config) (*tls.Certificate, error) {
	if cfg.bundleAddr == "" || cfg.bundleProfile != string(trust.ProfileHTTPSWeb) {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.bundleCert, cfg.bundleKey)
	if err != nil {
		return nil, fmt.Errorf("--bundle-profile=https_web needs --bundle-cert and --bundle-key: %w", err)
	}
	return &cert, nil
}

// memberPolicy is what a member's kubeconfig may say (--kubeconfig-allow,
// --member-server-cidrs, --member-server-deny-cidrs, --member-max-objects).
func memberPolicy(cfg config) (clusters.KubeconfigPolicy, error) {
	policy, err := clusters.ParsePolicy(cfg.kubeconfigAllow)
	if err != nil {
		return policy, fmt.Errorf("--kubeconfig-allow: %w", err)
	}
	if policy.ServerCIDRs, err = clusters.ParseCIDRs(cfg.memberServerCIDRs); err != nil {
		return policy, fmt.Errorf("--member-server-cidrs: %w", err)
	}
	if policy.DenyCIDRs, err = clusters.ParseCIDRs(cfg.memberServerDeny); err != nil {
		return policy, fmt.Errorf("--member-server-deny-cidrs: %w", err)
	}
	policy.MaxObjects = cfg.memberMaxObjects
	return policy, nil
}

// newTrust builds the trust federation: our CA, our trust domain's bundle
// and the peers' (--trust-domain, --tls-dns-names, the hardening flags).
func newTrust(cfg config, homeClient kubernetes.Interface, changes *feed.Changes, elector *leader.Elector, log *slog.Logger) (*trust.Domains, error) {
	td, err := spiffeid.TrustDomainFromString(cfg.trustDomain)
	if err != nil {
		return nil, fmt.Errorf("--trust-domain: %w", err)
	}
	dnsNames, err := trust.ParseDNSNames(cfg.tlsDNSNames)
	if err != nil {
		return nil, fmt.Errorf("--tls-dns-names: %w", err)
	}
	endpointGuard, err := cfg.hardening.endpointGuard()
	if err != nil {
		return nil, err
	}
	return trust.New(trust.Config{Client: homeClient, Namespace: cfg.namespace, TrustDomain: td, Log: log,
		OnChange: changes.RootsChanged, IsLeader: elector.IsLeader, DNSNames: dnsNames, EndpointGuard: endpointGuard,
		ExpiryWarning: cfg.expiryWarning}), nil
}

// hubOptions wires the hub to the parts built before it (see build).
func (a *app) hubOptions(changes *feed.Changes, index *feed.Index, metrics *prometheus.Registry) hub.Options {
	cfg := a.cfg
	return hub.Options{
		Changes:             changes,
		Index:               index,
		FederatedDomain:     cfg.federatedDomain,
		Policy:              a.distributed,
		Rules:               a.distributed,
		Secrets:             a.registry,
		Authorizer:          a.registry,
		AccessReviewTimeout: cfg.accessReviewTimeout,
		Tokens:              a.registry,
		Signer:              a.trust,
		Members:             a.registry,
		MaxWorkloadCertTTL:  cfg.maxWorkloadCertTTL,
		Roots:               a.trust,
		Namespace:           cfg.namespace,
		RootNamespace:       cfg.rootNamespace,
		IdentityScopes:      a.registry,
		Settled:             a.registry.Ready,
		Limits: hub.Limits{
			MaxRequestBytes:         cfg.xdsLimits.maxRequestBytes,
			MaxStreamsPerConnection: uint32(cfg.xdsLimits.maxStreamsPerConnection),
			MaxStreams:              cfg.xdsLimits.maxStreams,
			MaxNodeMetadataBytes:    cfg.xdsLimits.maxNodeMetadataBytes,
			MaxResourceNames:        cfg.xdsLimits.maxResourceNames,
		},
		NewStreamsPerSecond: cfg.newStreamsPerSecond,
		DrainGrace:          cfg.shutdownGrace,
		MTLSMode:            xdsgen.MTLSMode(cfg.mtlsMode),
		KeepUnhealthyFirst:  !cfg.demoteUnhealthy,
		Metrics:             metrics,
		Log:                 a.log,
	}
}

// apiAuth is who may call the admin server: the tokens of
// --api-token-file, else Kubernetes TokenReviews in the home cluster.
func apiAuth(cfg config, homeClient kubernetes.Interface) (api.Authenticator, error) {
	if cfg.apiTokenFile != "" {
		return api.LoadStaticTokens(cfg.apiTokenFile)
	}
	var audiences []string
	if cfg.apiAudience != "" {
		audiences = []string{cfg.apiAudience}
	}
	return api.NewKubeAuth(homeClient, cfg.secretsNamespace, api.KubeAuthOptions{Audiences: audiences}), nil
}

// adminServer builds the admin server: the REST API and the dashboard on
// one router, authenticated by auth.
func (a *app) adminServer(homeClient kubernetes.Interface, policy clusters.KubeconfigPolicy, auth api.Authenticator, metrics *prometheus.Registry) (*web.Server, error) {
	cfg := a.cfg
	membership := readiness{a.registry, a.draining}
	registrar := clusters.NewRegistrar(homeClient.CoreV1().Secrets(cfg.secretsNamespace), cfg.secretsNamespace, cfg.clusterID, policy)
	dashboard := web.New(web.Config{
		Membership:   membership,
		Registrar:    registrar,
		Serving:      a.hub,
		Trust:        a.trust,
		Distribution: a.distributed,
		CA:           a.hub,
		Auth:         auth,
		Log:          a.log,
	})
	admin, err := web.NewServer(adminHandler(api.Config{
		Membership:   membership,
		Registrar:    registrar,
		Serving:      a.hub,
		Trust:        a.trust,
		Distribution: a.distributed,
		CA:           a.hub,
		Auth:         auth,
		Metrics:      metrics,
		OpenMetrics:  cfg.hardening.metricsAuth == metricsAuthNone,
		Log:          a.log,
	}, dashboard), web.ServerOptions{TLSCertFile: cfg.adminTLSCert, TLSKeyFile: cfg.adminTLSKey, Log: a.log})
	if err != nil {
		return nil, fmt.Errorf("admin server: %w", err)
	}
	admin.RegisterOnShutdown(dashboard.Shutdown)
	return admin, nil
}

// listen opens the listeners and logs them as "hub listening" with their
// addresses by name: xds, admin, xds-tls, bundle (the demo, cmd/hubdemo,
// and the tests read that line).
func (a *app) listen() (map[string]net.Listener, error) {
	cfg := a.cfg
	listeners := map[string]net.Listener{}
	closeAll := func() {
		for _, l := range listeners {
			l.Close()
		}
	}
	for name, addr := range map[string]string{"xds": cfg.xdsAddr, "admin": cfg.adminAddr, "xds-tls": cfg.xdsTLSAddr, "bundle": cfg.bundleAddr} {
		if addr == "" {
			a.log.Info("listener disabled", "listener", name)
			continue
		}
		lis, err := listen(addr, name)
		if err != nil {
			closeAll()
			return nil, err
		}
		listeners[name] = lis
	}
	if err := requireListeners(listeners); err != nil {
		closeAll()
		return nil, err
	}
	addrs := []any{"cluster", cfg.clusterID, "namespace", cfg.namespace, "remoteSecretsNamespace", cfg.secretsNamespace, "trustDomain", cfg.trustDomain, "adminTLS", a.admin.TLS()}
	for name, l := range listeners {
		addrs = append(addrs, name, l.Addr().String())
	}
	a.log.Info(listening.Message, addrs...)
	return listeners, nil
}

// run runs every part until ctx is done or one of them stops. Shutdown
// (SIGTERM, or any part failing): readiness fails first, the xDS listeners
// drain their streams while everything else keeps running (so the streams
// not yet closed still get pushes), then the rest stops.
func (a *app) run(ctx context.Context, listeners map[string]net.Listener) error {
	xdsCtx, stopXDS := context.WithCancel(ctx)
	defer stopXDS()
	coreCtx, stopCore := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCore()
	var errs []error
	var errMu sync.Mutex
	var xdsParts, coreParts sync.WaitGroup
	run := func(group *sync.WaitGroup, name string, fn func() error) {
		group.Go(func() {
			if err := fn(); err != nil {
				errMu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				errMu.Unlock()
			}
			stopXDS() // one part stopping stops the hub
		})
	}
	run(&coreParts, "index", func() error { a.hub.Run(coreCtx); return nil })
	run(&coreParts, "registry", func() error { return a.registry.Run(coreCtx) })
	run(&coreParts, "trust", func() error { return a.trust.Run(coreCtx) })
	run(&coreParts, "distribute", func() error { return a.distributed.Run(coreCtx) })
	run(&coreParts, "leader election", func() error { return a.elector.Run(coreCtx) })
	if l := listeners["xds"]; l != nil {
		run(&xdsParts, "xds", func() error { return a.hub.ServeADS(xdsCtx, l, nil) })
	}
	if l := listeners["xds-tls"]; l != nil {
		run(&xdsParts, "xds-tls", func() error { return a.hub.ServeADS(xdsCtx, l, a.trust.ServerTLSConfig()) })
	}
	if l := listeners["bundle"]; l != nil {
		run(&coreParts, "bundle", func() error { return a.trust.ServeBundleEndpoint(coreCtx, l, a.webCert) })
	}
	run(&coreParts, "admin", func() error { return a.admin.Serve(coreCtx, listeners["admin"]) })
	<-xdsCtx.Done()
	a.draining.Store(true)
	a.log.Info("shutting down: readiness is failing, draining xDS streams", "grace", a.cfg.shutdownGrace.String())
	xdsParts.Wait()
	stopCore()
	coreParts.Wait()
	a.log.Info("hub stopped")
	return errors.Join(errs...)
}

// requireListeners checks that the hub has an admin port and at least one
// xDS port: --xds-addr="" turns the plaintext port off, --xds-tls-addr=""
// the mTLS one, not both.
func requireListeners(listeners map[string]net.Listener) error {
	if listeners["admin"] == nil {
		return errors.New("--admin-addr must not be empty")
	}
	if listeners["xds"] == nil && listeners["xds-tls"] == nil {
		return errors.New("--xds-addr and --xds-tls-addr are both empty: the hub needs at least one xDS port")
	}
	return nil
}

// readiness fails /readyz as soon as the hub starts shutting down, so that
// load balancers stop sending new proxies before streams are drained.
type readiness struct {
	api.Membership
	draining *atomic.Bool
}

func (r readiness) Ready() (bool, string) {
	if r.draining.Load() {
		return false, "shutting down"
	}
	return r.Membership.Ready()
}

// replicaName names this replica in the leader election: the pod name in
// Kubernetes (POD_NAME from the downward API), else host and process ID.
func replicaName() string {
	if name := os.Getenv("POD_NAME"); name != "" {
		return name
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

func listen(addr, what string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for %s on %q: %w", what, addr, err)
	}
	return lis, nil
}

// startTrust loads our CA from the home cluster, retrying API errors for a
// minute so that a hub starting alongside its API server does not
// crash-loop. Stored CA material that cannot be read fails at once:
// retrying cannot repair it.
func startTrust(ctx context.Context, domains *trust.Domains, log *slog.Logger) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := domains.Start(ctx)
		if err == nil {
			return nil
		}
		var corrupt *trust.CorruptStateError
		if errors.As(err, &corrupt) || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("loading our CA: %w", err)
		}
		log.Warn("loading our CA; retrying", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}

// homeConfig loads the home cluster's client configuration: --kubeconfig if
// given, else in-cluster, else $KUBECONFIG or ~/.kube/config, with
// homeQPS and homeBurst unless the kubeconfig sets its own.
func homeConfig(path string) (*rest.Config, error) {
	var cfg *rest.Config
	if path == "" {
		cfg, _ = rest.InClusterConfig()
	}
	if cfg == nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = path
		var err error
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("loading home cluster kubeconfig: %w", err)
		}
	}
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = homeQPS, homeBurst
	}
	return cfg, nil
}

// homeQPS and homeBurst bound the hub's requests to its home cluster
// (client-go's default, 5 and 10, made the first persisted views of 300
// members take minutes: a view write is 2 to 4 requests). istiod's
// defaults are 80 and 160.
const (
	homeQPS   = 50
	homeBurst = 100
)
