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

// serve runs the hub until ctx is done: membership from the home cluster,
// the federated index with ADS on --xds-addr and --xds-tls-addr (either may
// be off), and the admin server (REST API
// and dashboard) on --admin-addr.
//
// The parts are built in dependency order, each complete when it is made:
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
// Then the listeners open (logged as "hub listening" with their addresses
// by name: xds, admin, xds-tls, bundle; the demo, cmd/hubdemo, and the
// tests read that line) and everything runs until ctx is done.
func serve(ctx context.Context, cfg config, log *slog.Logger) error {
	home, err := homeConfig(cfg.kubeconfig)
	if err != nil {
		return err
	}
	policy, err := clusters.ParsePolicy(cfg.kubeconfigAllow)
	if err != nil {
		return fmt.Errorf("--kubeconfig-allow: %w", err)
	}
	if policy.ServerCIDRs, err = clusters.ParseCIDRs(cfg.memberServerCIDRs); err != nil {
		return fmt.Errorf("--member-server-cidrs: %w", err)
	}
	if policy.DenyCIDRs, err = clusters.ParseCIDRs(cfg.memberServerDeny); err != nil {
		return fmt.Errorf("--member-server-deny-cidrs: %w", err)
	}
	policy.MaxObjects = cfg.memberMaxObjects
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	homeClient, err := kubernetes.NewForConfig(home)
	if err != nil {
		return fmt.Errorf("building home cluster client: %w", err)
	}
	td, err := spiffeid.TrustDomainFromString(cfg.trustDomain)
	if err != nil {
		return fmt.Errorf("--trust-domain: %w", err)
	}

	elector := leader.New(homeClient, cfg.namespace, replicaName(), log)
	metrics.MustRegister(elector.Collector())
	changes := feed.NewChanges(cfg.debounceAfter, cfg.debounceMax)
	index := feed.NewIndex(cfg.domainSuffix, changes)
	dnsNames, err := trust.ParseDNSNames(cfg.tlsDNSNames)
	if err != nil {
		return fmt.Errorf("--tls-dns-names: %w", err)
	}
	endpointGuard, err := cfg.hardening.endpointGuard()
	if err != nil {
		return err
	}
	fed := trust.New(trust.Config{Client: homeClient, Namespace: cfg.namespace, TrustDomain: td, Log: log,
		OnChange: changes.RootsChanged, IsLeader: elector.IsLeader, DNSNames: dnsNames, EndpointGuard: endpointGuard,
		ExpiryWarning: cfg.expiryWarning})
	metrics.MustRegister(fed.Collector())
	elector.OnStartedLeading(fed.LeadershipGained)
	registry, err := clusters.NewRegistry(clusters.Config{
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
		IsLeader:              elector.IsLeader,
		ExpiryWarning:         cfg.expiryWarning,
	})
	if err != nil {
		return err
	}
	distributeFrom, err := cfg.distributeNamespaces()
	if err != nil {
		return fmt.Errorf("--distribute-namespaces: %w", err)
	}
	distributed, err := distribute.New(home, distribute.Options{
		Namespaces: distributeFrom,
		Hosts:      distribute.HostGuard{FederatedDomain: cfg.federatedDomain, DomainSuffix: cfg.domainSuffix, Federated: index.Has, Hostnames: index.FederatedHostnames},
		OnChange:   changes.ConfigChanged,
		MayWrite:   elector.IsLeader,
		Log:        log,
	})
	if err != nil {
		return fmt.Errorf("watching Istio objects to distribute: %w", err)
	}
	h, err := hub.New(hub.Options{
		Changes:             changes,
		Index:               index,
		FederatedDomain:     cfg.federatedDomain,
		Policy:              distributed,
		Rules:               distributed,
		Secrets:             registry,
		Authorizer:          registry,
		AccessReviewTimeout: cfg.accessReviewTimeout,
		Tokens:              registry,
		Signer:              fed,
		Members:             registry,
		MaxWorkloadCertTTL:  cfg.maxWorkloadCertTTL,
		Roots:               fed,
		Namespace:           cfg.namespace,
		RootNamespace:       cfg.rootNamespace,
		IdentityScopes:      registry,
		Settled:             registry.Ready,
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
		Log:                 log,
	})
	if err != nil {
		return err
	}
	var audiences []string
	if cfg.apiAudience != "" {
		audiences = []string{cfg.apiAudience}
	}
	var auth api.Authenticator = api.NewKubeAuth(homeClient, cfg.secretsNamespace, api.KubeAuthOptions{Audiences: audiences})
	if cfg.apiTokenFile != "" {
		if auth, err = api.LoadStaticTokens(cfg.apiTokenFile); err != nil {
			return err
		}
	}
	if err := startTrust(ctx, fed, log); err != nil {
		return err
	}
	var webCert *tls.Certificate
	if cfg.bundleAddr != "" && cfg.bundleProfile == string(trust.ProfileHTTPSWeb) {
		cert, err := tls.LoadX509KeyPair(cfg.bundleCert, cfg.bundleKey)
		if err != nil {
			return fmt.Errorf("--bundle-profile=https_web needs --bundle-cert and --bundle-key: %w", err)
		}
		webCert = &cert
	}
	var draining atomic.Bool
	membership := readiness{registry, &draining}
	registrar := clusters.NewRegistrar(homeClient.CoreV1().Secrets(cfg.secretsNamespace), cfg.secretsNamespace, cfg.clusterID, policy)
	dashboard := web.New(web.Config{
		Membership:   membership,
		Registrar:    registrar,
		Federation:   h,
		Trust:        fed,
		Distribution: distributed,
		CA:           h,
		Auth:         auth,
		Log:          log,
	})
	admin, err := web.NewServer(adminHandler(api.Config{
		Membership:   membership,
		Registrar:    registrar,
		Federation:   h,
		Trust:        fed,
		Distribution: distributed,
		CA:           h,
		Auth:         auth,
		Metrics:      metrics,
		OpenMetrics:  cfg.hardening.metricsAuth == metricsAuthNone,
		Log:          log,
	}, dashboard), web.ServerOptions{TLSCertFile: cfg.adminTLSCert, TLSKeyFile: cfg.adminTLSKey, Log: log})
	if err != nil {
		return fmt.Errorf("admin server: %w", err)
	}
	admin.RegisterOnShutdown(dashboard.Shutdown)

	listeners := map[string]net.Listener{}
	for name, addr := range map[string]string{"xds": cfg.xdsAddr, "admin": cfg.adminAddr, "xds-tls": cfg.xdsTLSAddr, "bundle": cfg.bundleAddr} {
		if addr == "" {
			log.Info("listener disabled", "listener", name)
			continue
		}
		lis, err := listen(addr, name)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return err
		}
		listeners[name] = lis
	}
	if err := requireListeners(listeners); err != nil {
		for _, l := range listeners {
			l.Close()
		}
		return err
	}
	addrs := []any{"cluster", cfg.clusterID, "namespace", cfg.namespace, "remoteSecretsNamespace", cfg.secretsNamespace, "trustDomain", td.Name(), "adminTLS", admin.TLS()}
	for name, l := range listeners {
		addrs = append(addrs, name, l.Addr().String())
	}
	log.Info(listening.Message, addrs...)

	// Shutdown (SIGTERM, or any part failing): readiness fails first, the
	// xDS listeners drain their streams while everything else keeps running
	// (so the streams not yet closed still get pushes), then the rest stops.
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
	run(&coreParts, "index", func() error { h.Run(coreCtx); return nil })
	run(&coreParts, "registry", func() error { return registry.Run(coreCtx) })
	run(&coreParts, "trust", func() error { return fed.Run(coreCtx) })
	run(&coreParts, "distribute", func() error { return distributed.Run(coreCtx) })
	run(&coreParts, "leader election", func() error { return elector.Run(coreCtx) })
	if l := listeners["xds"]; l != nil {
		run(&xdsParts, "xds", func() error { return h.ServeADS(xdsCtx, l, nil) })
	}
	if l := listeners["xds-tls"]; l != nil {
		run(&xdsParts, "xds-tls", func() error { return h.ServeADS(xdsCtx, l, fed.ServerTLSConfig()) })
	}
	if l := listeners["bundle"]; l != nil {
		run(&coreParts, "bundle", func() error { return fed.ServeBundleEndpoint(coreCtx, l, webCert) })
	}
	run(&coreParts, "admin", func() error { return admin.Serve(coreCtx, listeners["admin"]) })
	<-xdsCtx.Done()
	draining.Store(true)
	log.Info("shutting down: readiness is failing, draining xDS streams", "grace", cfg.shutdownGrace.String())
	xdsParts.Wait()
	stopCore()
	coreParts.Wait()
	log.Info("hub stopped")
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
func startTrust(ctx context.Context, fed *trust.Federation, log *slog.Logger) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := fed.Start(ctx)
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
