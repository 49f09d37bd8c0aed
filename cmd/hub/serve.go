package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub"
	"github.com/hubmesh/hub/trust"
	"github.com/hubmesh/hub/web"
)

// serve runs the hub until ctx is done: membership from the home cluster,
// the federated index with ADS on --xds-addr, and the admin API.
func serve(ctx context.Context, cfg config, log *slog.Logger) error {
	home, err := homeConfig(cfg.kubeconfig)
	if err != nil {
		return err
	}
	policy, err := clusters.ParsePolicy(cfg.kubeconfigAllow)
	if err != nil {
		return fmt.Errorf("--kubeconfig-allow: %w", err)
	}
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
	var h *hub.Hub
	var registry *clusters.Registry
	fed := trust.New(trust.Config{Client: homeClient, Namespace: cfg.namespace, TrustDomain: td, Log: log,
		OnChange: func() { h.RootsChanged() }})
	h, err = hub.New(hub.Options{
		DomainSuffix:  cfg.domainSuffix,
		DebounceAfter: cfg.debounceAfter,
		DebounceMax:   cfg.debounceMax,
		Secrets: hub.SecretSourceFunc(func(cluster string, key clusters.ServiceKey) (*clusters.TLSSecret, error) {
			return registry.TLSSecret(cluster, key)
		}),
		Authorizer: hub.AuthorizerFunc(func(ctx context.Context, cluster, saNS, sa, ns string) (bool, error) {
			return registry.CanListSecrets(ctx, cluster, saNS, sa, ns)
		}),
		Roots:   fed,
		Metrics: metrics,
		Log:     log,
	})
	if err != nil {
		return err
	}
	registry, err = clusters.NewRegistry(clusters.Config{
		Home:           home,
		HomeID:         cfg.clusterID,
		Namespace:      cfg.namespace,
		SyncTimeout:    cfg.remoteClusterTimeout,
		Policy:         policy,
		Sink:           h.Sink(),
		OnSecretChange: h.SecretChanged,
		Metrics:        metrics,
		Log:            log,
	})
	if err != nil {
		return err
	}
	var auth api.Authenticator = api.NewKubeAuth(homeClient, cfg.namespace)
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
	apiCfg := api.Config{
		Membership: registry,
		Registrar:  clusters.NewRegistrar(homeClient.CoreV1().Secrets(cfg.namespace), cfg.namespace, cfg.clusterID, policy),
		Federation: h,
		Trust:      fed,
		Auth:       auth,
		Metrics:    metrics,
		Log:        log,
	}
	admin := &http.Server{
		Handler:           web.NewHandler(web.Config{API: apiCfg, Secure: false}),
		ReadHeaderTimeout: 10 * time.Second,
	}

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
	if listeners["xds"] == nil || listeners["admin"] == nil {
		for _, l := range listeners {
			l.Close()
		}
		return errors.New("--xds-addr and --admin-addr must not be empty")
	}
	addrs := []any{"cluster", cfg.clusterID, "namespace", cfg.namespace, "trustDomain", td.Name()}
	for name, l := range listeners {
		addrs = append(addrs, name, l.Addr().String())
	}
	log.Info("hub listening", addrs...)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 8)
	parts := 0
	run := func(name string, fn func() error) {
		parts++
		go func() {
			err := fn()
			if err != nil {
				err = fmt.Errorf("%s: %w", name, err)
			}
			errs <- err
			cancel() // one part stopping stops the hub
		}()
	}
	run("index", func() error { h.Run(ctx); return nil })
	run("registry", func() error { return registry.Run(ctx) })
	run("trust", func() error { return fed.Run(ctx) })
	run("xds", func() error { return h.ServeADS(ctx, listeners["xds"], nil) })
	if l := listeners["xds-tls"]; l != nil {
		run("xds-tls", func() error { return h.ServeADS(ctx, l, fed.ServerTLSConfig()) })
	}
	if l := listeners["bundle"]; l != nil {
		run("bundle", func() error { return fed.ServeBundleEndpoint(ctx, l, webCert) })
	}
	run("admin", func() error {
		go func() {
			<-ctx.Done()
			shutdownCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
			defer done()
			_ = admin.Shutdown(shutdownCtx)
		}()
		if err := admin.Serve(listeners["admin"]); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	var first error
	for range parts {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func listen(addr, what string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for %s on %q: %w", what, addr, err)
	}
	return lis, nil
}

// startTrust loads our CA from the home cluster, retrying for a minute so
// that a hub starting alongside its API server does not crash-loop.
func startTrust(ctx context.Context, fed *trust.Federation, log *slog.Logger) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := fed.Start(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
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
// given, else in-cluster, else $KUBECONFIG or ~/.kube/config.
func homeConfig(path string) (*rest.Config, error) {
	if path == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading home cluster kubeconfig: %w", err)
	}
	return cfg, nil
}
