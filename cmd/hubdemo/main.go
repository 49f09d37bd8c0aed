// Command hubdemo is the hub's demo: three real local clusters, sample
// workloads and the real hub binary (`hub serve`, as deployed) on them.
//
//	hubdemo [flags] [-- hub serve flags]
//
// It also runs this binary as its workloads (gRPC backends and clients) in
// a hidden role selected by the environment variable HUB_DEMO_CHILD (see
// demo_child.go); that is not a command.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/hubmesh/hub/hub/xdsgen"
)

// config is what the demo knows of the hub it runs: the flags of `hub
// serve` that the demo sets up its clusters, workloads and banner by. The
// demo takes them itself and hands them on to the hub (serveArgs).
type config struct {
	kubeconfig       string // the home cluster's, written by the demo
	adminAddr        string
	xdsAddr          string
	xdsTLSAddr       string
	bundleAddr       string
	mtlsMode         string
	trustDomain      string
	domainSuffix     string
	federatedDomain  string
	tlsDNSNames      string
	namespace        string
	secretsNamespace string
	rootNamespace    string
	adminTLSCert     string
	adminTLSKey      string
}

// register adds the `hub serve` flags of config to fs, with the demo's
// defaults: a laptop's, listeners on loopback, and mTLS required (the
// workloads hold certificates from the hub's CA). It returns the names of
// the `hub serve` flags the demo sets itself, which may not follow "--":
// those and the two that make the first cluster home.
func (c *config) register(fs *flag.FlagSet) (handedOn map[string]bool) {
	handedOn = map[string]bool{"kubeconfig": true, "cluster-id": true}
	for _, f := range []struct {
		p              *string
		name, def, use string
	}{
		{&c.adminAddr, "admin-addr", "127.0.0.1:8080", "the hub's dashboard and REST API address"},
		{&c.xdsAddr, "xds-addr", "127.0.0.1:15010", "the hub's plaintext ADS address (the workloads' xDS server)"},
		{&c.xdsTLSAddr, "xds-tls-addr", "127.0.0.1:15012", "the hub's mTLS ADS/SDS and CA address (the workloads' certificates)"},
		{&c.bundleAddr, "bundle-addr", "127.0.0.1:8443", "the hub's SPIFFE bundle endpoint address (empty disables)"},
		{&c.mtlsMode, "mtls-mode", string(xdsgen.MTLSStrict), "the hub's mesh-wide mTLS mode: STRICT, PERMISSIVE or DISABLE (plaintext workloads, no certificates)"},
		{&c.trustDomain, "trust-domain", "cluster.local", "the hub's SPIFFE trust domain"},
		{&c.domainSuffix, "domain-suffix", "cluster.local", "service hostname suffix"},
		{&c.federatedDomain, "federated-domain", "clusterset.local", "hostname suffix of the federated hosts (the sidecars call echo by it)"},
		{&c.tlsDNSNames, "tls-dns-names", demoHubName, "DNS names on the hub's serving certificate (member istiods and the sidecars' agents verify the hub by the first)"},
		{&c.namespace, "namespace", "hub-system", "the hub's own namespace in the home cluster"},
		{&c.secretsNamespace, "remote-secrets-namespace", "istio-system", "namespace of the remote Secrets that register the members"},
		{&c.rootNamespace, "root-namespace", "istio-system", "Istio's root namespace (the demo's DestinationRule goes there)"},
		{&c.adminTLSCert, "admin-tls-cert", "", "serving certificate (PEM) for the hub's admin port"},
		{&c.adminTLSKey, "admin-tls-key", "", "serving key (PEM) for the hub's admin port"},
	} {
		fs.StringVar(f.p, f.name, f.def, f.use+" (handed on to hub serve)")
		handedOn[f.name] = true
	}
	return handedOn
}

// serveArgs is the hub's command line: `hub serve` with config's flags and
// extra (the flags after "--").
func (c config) serveArgs(extra []string) []string {
	args := []string{"serve",
		"--kubeconfig=" + c.kubeconfig, "--cluster-id=" + demoClusters[0].name,
		"--admin-addr=" + c.adminAddr, "--xds-addr=" + c.xdsAddr, "--xds-tls-addr=" + c.xdsTLSAddr, "--bundle-addr=" + c.bundleAddr,
		"--mtls-mode=" + c.mtlsMode, "--trust-domain=" + c.trustDomain, "--domain-suffix=" + c.domainSuffix,
		"--federated-domain=" + c.federatedDomain, "--tls-dns-names=" + c.tlsDNSNames,
		"--namespace=" + c.namespace, "--remote-secrets-namespace=" + c.secretsNamespace, "--root-namespace=" + c.rootNamespace,
		"--admin-tls-cert=" + c.adminTLSCert, "--admin-tls-key=" + c.adminTLSKey,
	}
	return append(args, extra...)
}

// options is the demo's command line.
type options struct {
	hubBin  string   // the hub binary
	churn   bool     // scale a member's echo backends
	traffic bool     // run the workloads (as root)
	hubArgs []string // more `hub serve` flags, after "--"
}

// parseArgs parses the demo's command line into cfg and opts: the demo's
// flags, then after "--" more flags of `hub serve`, which the hub checks
// (those the demo sets itself are refused here).
func parseArgs(args []string, cfg *config, opts *options) error {
	fs := flag.NewFlagSet("hubdemo", flag.ContinueOnError)
	handedOn := cfg.register(fs)
	fs.StringVar(&opts.hubBin, "hub-bin", "", "the hub binary to run (default: hub in this binary's directory, as make demo builds them)")
	fs.BoolVar(&opts.churn, "demo-churn", true, fmt.Sprintf("scale %s's echo backends between 1 and 2 every %s, so the hub keeps pushing", demoChurnMember, demoChurnEvery))
	fs.BoolVar(&opts.traffic, "demo-traffic", true, "as root with iproute2: run real gRPC backends and xds:/// clients (mTLS with certificates from the hub) in a network namespace of the demo")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: hubdemo [flags] [-- hub serve flags]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	// flag stops at "--" and drops it; anything else left is a stray word.
	if n := len(args) - fs.NArg(); fs.NArg() > 0 && (n == 0 || args[n-1] != "--") {
		return fmt.Errorf("unexpected argument %q (flags of hub serve the demo does not take itself go after --)", fs.Arg(0))
	}
	opts.hubArgs = fs.Args()
	for _, a := range opts.hubArgs {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && handedOn[name] {
			return fmt.Errorf("--%s after --: the demo sets it; give it before --", name)
		}
	}
	if _, err := xdsgen.ParseMTLSMode(cfg.mtlsMode); err != nil {
		return fmt.Errorf("--mtls-mode: %w", err)
	}
	if (cfg.adminTLSCert == "") != (cfg.adminTLSKey == "") {
		return errors.New("--admin-tls-cert and --admin-tls-key go together")
	}
	if opts.hubBin == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("locating this binary (give --hub-bin): %w", err)
		}
		opts.hubBin = filepath.Join(filepath.Dir(self), "hub")
	}
	return nil
}

func main() {
	if role := os.Getenv(demoChildEnv); role != "" {
		os.Exit(runDemoChild(role))
	}
	var (
		cfg  config
		opts options
	)
	if err := parseArgs(os.Args[1:], &cfg, &opts); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "hubdemo: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo(ctx, cfg, opts); err != nil {
		fmt.Fprintf(os.Stderr, "hubdemo: %v\n", err)
		os.Exit(1)
	}
}
