package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub"
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
	h, err := hub.New(hub.Options{
		DomainSuffix:  cfg.domainSuffix,
		DebounceAfter: cfg.debounceAfter,
		DebounceMax:   cfg.debounceMax,
		Metrics:       metrics,
		Log:           log,
	})
	if err != nil {
		return err
	}
	registry, err := clusters.NewRegistry(clusters.Config{
		Home:        home,
		HomeID:      cfg.clusterID,
		Namespace:   cfg.namespace,
		SyncTimeout: cfg.remoteClusterTimeout,
		Policy:      policy,
		Sink:        h.Sink(),
		Metrics:     metrics,
		Log:         log,
	})
	if err != nil {
		return err
	}
	homeClient, err := kubernetes.NewForConfig(home)
	if err != nil {
		return fmt.Errorf("building home cluster client: %w", err)
	}
	var auth api.Authenticator = api.NewKubeAuth(homeClient, cfg.namespace)
	if cfg.apiTokenFile != "" {
		if auth, err = api.LoadStaticTokens(cfg.apiTokenFile); err != nil {
			return err
		}
	}
	apiCfg := api.Config{
		Membership: registry,
		Registrar:  clusters.NewRegistrar(homeClient.CoreV1().Secrets(cfg.namespace), cfg.namespace, cfg.clusterID, policy),
		Federation: h,
		Auth:       auth,
		Metrics:    metrics,
		Log:        log,
	}
	admin := &http.Server{
		Handler:           web.NewHandler(web.Config{API: apiCfg, Secure: false}),
		ReadHeaderTimeout: 10 * time.Second,
	}

	xdsLis, err := listen(cfg.xdsAddr, "xds")
	if err != nil {
		return err
	}
	adminLis, err := listen(cfg.adminAddr, "admin")
	if err != nil {
		xdsLis.Close()
		return err
	}
	log.Info("hub listening", "xds", xdsLis.Addr().String(), "admin", adminLis.Addr().String(), "cluster", cfg.clusterID, "namespace", cfg.namespace)
	for flagName, addr := range map[string]string{"xds-tls-addr": cfg.xdsTLSAddr, "bundle-addr": cfg.bundleAddr} {
		if addr != "" {
			log.Warn("listener disabled: not built yet", "flag", flagName, "addr", addr)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 4)
	run := func(name string, fn func() error) {
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
	run("xds", func() error { return h.ServeADS(ctx, xdsLis) })
	run("admin", func() error {
		go func() {
			<-ctx.Done()
			shutdownCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
			defer done()
			_ = admin.Shutdown(shutdownCtx)
		}()
		if err := admin.Serve(adminLis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	var first error
	for range 4 {
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
