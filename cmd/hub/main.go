// Command hub federates a service mesh across Kubernetes clusters.
//
//	hub [serve] [flags]      run the hub (default)
//	hub register [flags]     register a member cluster (register.go)
//
// The demo is a command of its own, cmd/hubdemo, which runs this binary.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub"
	"github.com/hubmesh/hub/hub/ca"
	"github.com/hubmesh/hub/hub/xdsgen"
	"github.com/hubmesh/hub/internal/expiry"
	"github.com/hubmesh/hub/trust"
)

// config is every flag of `hub serve` (docs/architecture.md §3.1).
type config struct {
	kubeconfig           string
	clusterID            string
	namespace            string
	secretsNamespace     string
	rootNamespace        string
	distributeFrom       string
	homeGatewayNS        string
	trustDomain          string
	domainSuffix         string
	federatedDomain      string
	xdsAddr              string
	xdsTLSAddr           string
	tlsDNSNames          string
	adminAddr            string
	bundleAddr           string
	bundleProfile        string
	bundleCert           string
	bundleKey            string
	remoteClusterTimeout time.Duration
	debounceAfter        time.Duration
	debounceMax          time.Duration
	accessReviewTimeout  time.Duration
	apiTokenFile         string
	apiAudience          string
	adminTLSCert         string
	adminTLSKey          string
	kubeconfigAllow      string
	memberServerCIDRs    string
	memberServerDeny     string
	memberMaxObjects     int
	logLevel             string
	newStreamsPerSecond  float64
	shutdownGrace        time.Duration
	maxWorkloadCertTTL   time.Duration
	expiryWarning        time.Duration
	xdsLimits            xdsLimits
	mtlsMode             string
	demoteUnhealthy      bool
	exportMode           string
	hardening            hardeningFlags
}

// xdsLimits are the bounds on xDS input (hub.Limits).
type xdsLimits struct {
	maxRequestBytes         int
	maxStreamsPerConnection int
	maxStreams              int
	maxNodeMetadataBytes    int
	maxResourceNames        int
}

func (c *config) register(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig of the home cluster (default: in-cluster, else $KUBECONFIG)")
	fs.StringVar(&c.clusterID, "cluster-id", "primary", "the home cluster's own cluster ID")
	fs.StringVar(&c.namespace, "namespace", "hub-system", "the hub's own namespace: its state (leader Lease, CA key Secret, persisted member views, federation ConfigMaps); never the root namespace by default")
	fs.StringVar(&c.secretsNamespace, "remote-secrets-namespace", "istio-system", "namespace of the remote Secrets (label istio/multiCluster=true) that register members, where istioctl create-remote-secret puts them")
	fs.StringVar(&c.rootNamespace, "root-namespace", "istio-system", "Istio's root namespace in the members (meshConfig.rootNamespace): objects there apply mesh-wide")
	fs.StringVar(&c.homeGatewayNS, "home-gateway-namespaces", "", "comma-separated namespaces of the home cluster, besides istio-system, whose Services labelled topology.istio.io/network may be its east-west gateways (a member's are named by its remote Secret's hub.federation/gateway-namespaces)")
	fs.StringVar(&c.distributeFrom, "distribute-namespaces", "", "comma-separated namespaces of the home cluster whose objects labelled hub.federation/distribute=true are served to member istiods (default: the root namespace alone)")
	fs.StringVar(&c.trustDomain, "trust-domain", "cluster.local", "our SPIFFE trust domain")
	fs.StringVar(&c.domainSuffix, "domain-suffix", "cluster.local", "service hostname suffix")
	fs.StringVar(&c.federatedDomain, "federated-domain", "clusterset.local", "hostname suffix of the ServiceEntries served to member istiods (<name>.<namespace>.svc.<suffix>); must differ from --domain-suffix")
	fs.StringVar(&c.xdsAddr, "xds-addr", ":15010", "plaintext ADS address (unauthenticated: keep it in-cluster; empty turns it off)")
	fs.StringVar(&c.xdsTLSAddr, "xds-tls-addr", ":15012", "mTLS ADS/SDS and CA address; streams without a client certificate or token may read Istio config only (istiod configSources over SIMPLE TLS); empty turns it off")
	fs.StringVar(&c.tlsDNSNames, "tls-dns-names", "", "comma-separated DNS names on the hub's serving certificate (mTLS xDS port, https_spiffe bundle endpoint) for clients that verify the server by name, e.g. hub.hub-system.svc")
	fs.StringVar(&c.adminAddr, "admin-addr", ":8080", "dashboard, REST API, /metrics, /healthz, /readyz address")
	fs.StringVar(&c.bundleAddr, "bundle-addr", ":8443", "SPIFFE bundle endpoint address (empty disables)")
	fs.StringVar(&c.bundleProfile, "bundle-profile", "https_spiffe", "bundle endpoint profile: https_spiffe or https_web")
	fs.StringVar(&c.bundleCert, "bundle-cert", "", "serving certificate for the https_web bundle profile")
	fs.StringVar(&c.bundleKey, "bundle-key", "", "serving key for the https_web bundle profile")
	fs.DurationVar(&c.remoteClusterTimeout, "remote-cluster-timeout", 30*time.Second, "after this a member that has not synced stops blocking readiness")
	fs.DurationVar(&c.debounceAfter, "debounce-after", 100*time.Millisecond, "shortest push debounce quiet period; it grows to the time the last push took until its proxies acknowledged it")
	fs.DurationVar(&c.debounceMax, "debounce-max", 10*time.Second, "longest a change waits for a push")
	fs.DurationVar(&c.accessReviewTimeout, "access-review-timeout", 5*time.Second, "longest a member may take to answer one SubjectAccessReview (SDS of another namespace); meanwhile the proxy asking keeps what it has")
	fs.StringVar(&c.apiTokenFile, "api-token-file", "", "file of static API bearer tokens (default: Kubernetes TokenReview)")
	fs.StringVar(&c.apiAudience, "api-audience", "", "audience API tokens must be issued for (TokenReview spec.audiences; default: the API server's own)")
	fs.StringVar(&c.adminTLSCert, "admin-tls-cert", "", "serving certificate (PEM) for the admin port; with --admin-tls-key it serves HTTPS and the session cookie is Secure")
	fs.StringVar(&c.adminTLSKey, "admin-tls-key", "", "serving key (PEM) for the admin port")
	fs.StringVar(&c.kubeconfigAllow, "kubeconfig-allow", "", "comma-separated extras remote kubeconfigs may use: exec, auth-provider (handed to client-go as configured; the hub registers oidc, which then contacts its issuer), files, proxy-url (default: inline credentials only)")
	fs.StringVar(&c.memberServerCIDRs, "member-server-cidrs", "", "comma-separated CIDRs member API servers must be in, checked on every connection (empty: anywhere not denied)")
	fs.StringVar(&c.memberServerDeny, "member-server-deny-cidrs", "169.254.0.0/16,fe80::/10", "comma-separated CIDRs member API servers may never be in, checked on every connection (unspecified addresses are always refused)")
	fs.IntVar(&c.memberMaxObjects, "member-max-objects", 200000, "a member whose Services, EndpointSlices, Nodes and Secrets exceed this many objects is stopped and marked Invalid")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.Float64Var(&c.newStreamsPerSecond, "new-streams-per-second", 200, "new xDS streams admitted per second (burst: twice that); more wait")
	fs.IntVar(&c.xdsLimits.maxRequestBytes, "xds-max-request-bytes", hub.DefaultMaxRequestBytes, "largest xDS request message accepted (bytes)")
	fs.IntVar(&c.xdsLimits.maxStreamsPerConnection, "xds-max-streams-per-connection", hub.DefaultMaxStreamsPerConnection, "concurrent xDS streams per client connection")
	fs.IntVar(&c.xdsLimits.maxStreams, "xds-max-streams", hub.DefaultMaxStreams, "open xDS streams of this replica; more are refused with ResourceExhausted")
	fs.IntVar(&c.xdsLimits.maxNodeMetadataBytes, "xds-max-node-metadata-bytes", hub.DefaultMaxNodeMetadataBytes, "largest xDS node metadata accepted (bytes, marshalled)")
	fs.IntVar(&c.xdsLimits.maxResourceNames, "xds-max-resource-names", hub.DefaultMaxResourceNames, "resource names one xDS stream may subscribe to per type")
	fs.DurationVar(&c.maxWorkloadCertTTL, "max-workload-cert-ttl", ca.DefaultMaxWorkloadCertTTL, "longest workload certificate the Istio CA API on --xds-tls-addr issues (requests above it get InvalidArgument; without validity_duration they get 24h, or this if shorter)")
	fs.StringVar(&c.exportMode, "export-mode", string(clusters.ExportAll), "which members' Services are federated to the other members: all (every Service but those labelled hub.federation/export: \"false\") or serviceexport (only Services with a Multi-Cluster Services ServiceExport of the same name; a member without the CRD exports none); either way a Service annotated hub.federation/export-to: a,b goes to those members only, and its own member's proxies always get it")
	fs.BoolVar(&c.demoteUnhealthy, "demote-unhealthy-members", true, "serve the endpoints of a member that is Stale, Unreachable or TimedOut one priority behind the healthy members' (never dropped while it is the only one; restored on recovery)")
	fs.StringVar(&c.mtlsMode, "mtls-mode", string(xdsgen.DefaultMTLSMode), "mesh-wide mTLS mode of proxyless gRPC workloads (xDS credentials) where no PeerAuthentication in the root namespace sets one, as Istio's modes apply to them: STRICT (clients use mTLS where no DestinationRule says otherwise, servers require client certificates), PERMISSIVE or DISABLE (plaintext: a gRPC server cannot accept both on one port); distributed PeerAuthentications and DestinationRules decide per workload and per service")
	fs.DurationVar(&c.expiryWarning, "expiry-warning", expiry.DefaultWarning, "warn this long before a member's kubeconfig credential (token exp, client certificate), the hub CA's root or chain, or a peer's bundle expires: a Warning Event, a dashboard badge, the expiry state in the API")
	c.hardening.register(fs)
	fs.DurationVar(&c.shutdownGrace, "shutdown-grace", 10*time.Second, "on SIGTERM: readiness fails at once, xDS streams are closed one by one over half of this, the rest are cut at its end")
}

func (c *config) validate() error {
	if c.bundleProfile != "https_spiffe" && c.bundleProfile != "https_web" {
		return fmt.Errorf("--bundle-profile must be https_spiffe or https_web, not %q", c.bundleProfile)
	}
	if c.debounceAfter < 0 || c.debounceMax < c.debounceAfter {
		return fmt.Errorf("--debounce-max (%s) must be at least --debounce-after (%s), both non-negative", c.debounceMax, c.debounceAfter)
	}
	for flag, ns := range map[string]string{"--namespace": c.namespace, "--remote-secrets-namespace": c.secretsNamespace, "--root-namespace": c.rootNamespace} {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("%s %q is not a namespace name: %s", flag, ns, strings.Join(errs, "; "))
		}
	}
	if _, err := c.distributeNamespaces(); err != nil {
		return fmt.Errorf("--distribute-namespaces: %w", err)
	}
	if _, err := trust.ParseDNSNames(c.tlsDNSNames); err != nil {
		return fmt.Errorf("--tls-dns-names: %w", err)
	}
	if errs := validation.IsDNS1123Subdomain(c.federatedDomain); len(errs) > 0 {
		return fmt.Errorf("--federated-domain %q is not a DNS name: %s", c.federatedDomain, strings.Join(errs, "; "))
	}
	if c.federatedDomain == c.domainSuffix {
		return fmt.Errorf("--federated-domain must differ from --domain-suffix (%q): federated hosts would collide with each member's own Services", c.domainSuffix)
	}
	if _, err := xdsgen.ParseMTLSMode(c.mtlsMode); err != nil {
		return fmt.Errorf("--mtls-mode: %w", err)
	}
	if c.accessReviewTimeout <= 0 {
		return fmt.Errorf("--access-review-timeout must be positive, not %s", c.accessReviewTimeout)
	}
	if c.newStreamsPerSecond <= 0 {
		return fmt.Errorf("--new-streams-per-second must be positive, not %v", c.newStreamsPerSecond)
	}
	if c.maxWorkloadCertTTL < time.Second {
		return fmt.Errorf("--max-workload-cert-ttl must be at least 1s, not %s", c.maxWorkloadCertTTL)
	}
	if c.expiryWarning <= 0 {
		return fmt.Errorf("--expiry-warning must be positive, not %s", c.expiryWarning)
	}
	if c.shutdownGrace <= 0 {
		return fmt.Errorf("--shutdown-grace must be positive, not %s", c.shutdownGrace)
	}
	if (c.adminTLSCert == "") != (c.adminTLSKey == "") {
		return errors.New("--admin-tls-cert and --admin-tls-key go together")
	}
	if c.apiAudience != "" && c.apiTokenFile != "" {
		return errors.New("--api-audience applies to Kubernetes TokenReviews; it cannot be used with --api-token-file")
	}
	for name, v := range map[string]int{
		"--xds-max-request-bytes": c.xdsLimits.maxRequestBytes, "--xds-max-streams-per-connection": c.xdsLimits.maxStreamsPerConnection,
		"--xds-max-streams": c.xdsLimits.maxStreams, "--xds-max-node-metadata-bytes": c.xdsLimits.maxNodeMetadataBytes,
		"--xds-max-resource-names": c.xdsLimits.maxResourceNames,
	} {
		if v <= 0 {
			return fmt.Errorf("%s must be positive, not %d", name, v)
		}
	}
	if int64(c.xdsLimits.maxStreamsPerConnection) > math.MaxUint32 {
		return fmt.Errorf("--xds-max-streams-per-connection must be at most %d, not %d", uint32(math.MaxUint32), c.xdsLimits.maxStreamsPerConnection)
	}
	if _, err := clusters.ParseCIDRs(c.memberServerCIDRs); err != nil {
		return fmt.Errorf("--member-server-cidrs: %w", err)
	}
	if _, err := clusters.ParseCIDRs(c.memberServerDeny); err != nil {
		return fmt.Errorf("--member-server-deny-cidrs: %w", err)
	}
	if c.memberMaxObjects <= 0 {
		return fmt.Errorf("--member-max-objects must be positive, not %d", c.memberMaxObjects)
	}
	if _, err := clusters.ParseExportMode(c.exportMode); err != nil {
		return fmt.Errorf("--export-mode: %w", err)
	}
	if err := c.hardening.validate(); err != nil {
		return err
	}
	if c.remoteClusterTimeout <= 0 {
		return fmt.Errorf("--remote-cluster-timeout must be positive, not %s", c.remoteClusterTimeout)
	}
	return nil
}

// distributeNamespaces lists the namespaces distributed objects may come
// from: --distribute-namespaces, else the root namespace alone.
func (c *config) distributeNamespaces() ([]string, error) {
	if strings.TrimSpace(c.distributeFrom) == "" {
		return []string{c.rootNamespace}, nil
	}
	var out []string
	for ns := range strings.SplitSeq(c.distributeFrom, ",") {
		ns = strings.TrimSpace(ns)
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("%q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out, nil
}

// parseFlags parses args, then fills every flag not given on the command line
// from HUB_<NAME> (upper case, dashes as underscores).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 { // flags after a stray word would be ignored silently
		return fmt.Errorf("unexpected argument %q (flags must come before it; the command is the first word)", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		env := "HUB_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && !given[f.Name] {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", env, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// command returns the flag set of a subcommand, filling cfg when parsed,
// and the function that runs it; ok is false for an unknown command.
func command(cmd string, cfg *config) (fs *flag.FlagSet, run func(context.Context, config, *slog.Logger) error, ok bool) {
	fs = flag.NewFlagSet("hub "+cmd, flag.ContinueOnError)
	cfg.register(fs)
	switch cmd {
	case "serve":
		return fs, serve, true
	}
	return nil, nil, false
}

func main() {
	args := os.Args[1:]
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if cmd == "register" { // its own flags (register.go), none of serve's
		os.Exit(registerMain(ctx, args, os.Stdout, os.Stderr))
	}
	cfg := new(config)
	fs, run, ok := command(cmd, cfg)
	if !ok {
		fmt.Fprintf(os.Stderr, "hub: unknown command %q (want serve or register; the demo is make demo, cmd/hubdemo)\n", cmd)
		os.Exit(2)
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "hub %s: %v\n", cmd, err)
		os.Exit(2)
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "hub %s: %v\n", cmd, err)
		os.Exit(2)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "hub %s: --log-level: %v\n", cmd, err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)
	klog.SetSlogLogger(log) // client-go's own messages (leader election, reflectors) as JSON too
	if err := run(ctx, *cfg, log); err != nil {
		log.Error("hub stopped", "error", err)
		os.Exit(1)
	}
}
