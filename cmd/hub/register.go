package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/hubmesh/hub/clusters/register"
	"github.com/hubmesh/hub/deploy"
)

// registerFlags are the flags of `hub register`: a member's remote Secret
// from a kubeconfig context (clusters/register). Unlike `hub serve`'s,
// they are not read from HUB_<NAME>: --kubeconfig here is the member's.
type registerFlags struct {
	kubeconfig, context       string
	clusterID                 string
	hubKubeconfig, hubContext string
	namespace                 string
	server                    string
	network                   string
	tokenTTL                  time.Duration
	rotate                    bool
	hubURL, hubTokenFile      string
	hubCAFile                 string
	wait, settle              time.Duration
	dryRun                    bool
	output                    string
	showToken                 bool
}

func (f *registerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "the member's kubeconfig, used as kubectl uses it (default: $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&f.context, "context", "", "the member's context in --kubeconfig (default: its current context)")
	fs.StringVar(&f.clusterID, "cluster-id", "", "the member's cluster ID (default: the context's name)")
	fs.StringVar(&f.hubKubeconfig, "hub-kubeconfig", "", "kubeconfig of the hub's home cluster, where the remote Secret goes (default: $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&f.hubContext, "hub-context", "", "context of the hub's home cluster in --hub-kubeconfig (one of the two is required unless -o yaml or --dry-run)")
	fs.StringVar(&f.namespace, "namespace", "istio-system", "namespace of the remote Secrets in the home cluster (the hub's --remote-secrets-namespace)")
	fs.StringVar(&f.server, "server", "", "the member's API server address as the hub reaches it (default: the context's)")
	fs.StringVar(&f.network, "network", "", "the member's Istio network, confirmed on the remote Secret (annotation hub.federation/network)")
	fs.DurationVar(&f.tokenTTL, "token-ttl", register.DefaultTokenTTL, "lifetime of the member's token; rotate before it ends (10m to 672h)")
	fs.BoolVar(&f.rotate, "rotate", false, "replace a registered member's token make-before-break: the old one is revoked once the hub is Ready with the new one (needs --hub-url)")
	fs.StringVar(&f.hubURL, "hub-url", "", "the hub's admin URL (REST API): wait until it reports the member Ready with the new kubeconfig")
	fs.StringVar(&f.hubTokenFile, "hub-token-file", "", "file holding a bearer token for --hub-url (sent over https://, or http:// to a loopback address only)")
	fs.StringVar(&f.hubCAFile, "hub-ca-file", "", "PEM roots to verify an https --hub-url by (default: the system's)")
	fs.DurationVar(&f.wait, "wait", 2*time.Minute, "longest wait for the hub to report the member Ready")
	fs.DurationVar(&f.settle, "settle", 15*time.Second, "with --rotate: how long every answer of --hub-url must show the member Ready with the new kubeconfig before the old token is revoked (each poll a new connection, so that the hub's Service reaches each replica)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "change nothing anywhere: print the member RBAC and the remote Secret (token redacted)")
	fs.StringVar(&f.output, "o", "", "yaml: print the remote Secret instead of writing it into the home cluster (needs --show-token: it holds a live token)")
	fs.BoolVar(&f.showToken, "show-token", false, "allow -o yaml to print the token")
}

// registerMain runs `hub register` and returns its exit code.
func registerMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hub register", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f registerFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hub register: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := runRegister(ctx, f, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "hub register: %v\n", err)
		return 1
	}
	return 0
}

func runRegister(ctx context.Context, f registerFlags, stdout, stderr io.Writer) error {
	switch {
	case f.output != "" && f.output != "yaml":
		return fmt.Errorf("-o %q: only yaml is known", f.output)
	case f.output == "yaml" && !f.showToken && !f.dryRun:
		return errors.New("-o yaml prints a live token: add --show-token, or use --dry-run to see the Secret without one")
	case f.output == "yaml" && f.rotate:
		return errors.New("--rotate writes the remote Secret itself (make-before-break): it cannot be combined with -o yaml")
	case !f.dryRun && f.output == "" && f.hubKubeconfig == "" && f.hubContext == "":
		return errors.New("say where the hub's home cluster is: --hub-context and/or --hub-kubeconfig (or print the Secret with -o yaml)")
	}
	member, ctxName, err := loadMember(f.kubeconfig, f.context)
	if err != nil {
		return err
	}
	if f.server != "" {
		member.Server = f.server
	}
	opts := register.Options{
		ClusterID: f.clusterID, Member: member, Network: f.network, TokenTTL: f.tokenTTL, Rotate: f.rotate,
		Namespace: f.namespace, Wait: f.wait,
		Progress: func(format string, args ...any) { fmt.Fprintf(stderr, "hub register: "+format+"\n", args...) },
	}
	if opts.ClusterID == "" {
		opts.ClusterID = ctxName
	}
	if f.dryRun {
		return dryRun(stdout, opts)
	}
	if f.output == "" {
		hubCfg, _, err := loadConfig(f.hubKubeconfig, f.hubContext, "the hub's home cluster")
		if err != nil {
			return err
		}
		home, err := kubernetes.NewForConfig(hubCfg)
		if err != nil {
			return fmt.Errorf("home cluster client: %w", err)
		}
		opts.Secrets = home.CoreV1().Secrets(f.namespace)
		opts.HomeServer = hubCfg.Host
	}
	if f.hubURL != "" {
		if opts.Hub, err = hubClient(f); err != nil {
			return err
		}
	}
	res, err := register.Register(ctx, opts)
	if err != nil {
		return err
	}
	if f.output == "yaml" {
		return printSecret(stdout, register.RemoteSecret(f.namespace, opts.ClusterID, res.Kubeconfig, f.network))
	}
	if len(res.NotReady) > 0 {
		fmt.Fprintf(stderr, "hub register: warning: the hub reported cluster %s %s while it switched\n", opts.ClusterID, strings.Join(res.NotReady, ", "))
	}
	return nil
}

// loadMember reads the member's context as kubectl would (exec plugins and
// files included: it is the operator's own access) and what the written
// kubeconfig needs from it.
func loadMember(path, context string) (register.Member, string, error) {
	cfg, name, err := loadConfig(path, context, "the member")
	if err != nil {
		return register.Member{}, "", err
	}
	if cfg.Insecure {
		return register.Member{}, "", fmt.Errorf("context %q skips TLS verification (insecure-skip-tls-verify): the hub needs the CA of the member's API server, which that context does not have", name)
	}
	tlsCfg := *cfg
	if err := rest.LoadTLSFiles(&tlsCfg); err != nil {
		return register.Member{}, "", fmt.Errorf("context %q: %w", name, err)
	}
	return register.Member{Context: name, Config: cfg, Server: cfg.Host, CAData: tlsCfg.CAData, TLSServerName: cfg.ServerName}, name, nil
}

// loadConfig resolves a context of a kubeconfig (kubectl's loading rules
// when path is empty), saying which context it took.
func loadConfig(path, context, what string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	raw, err := rules.Load()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig of %s: %w", what, err)
	}
	name := context
	if name == "" {
		name = raw.CurrentContext
	}
	if name == "" {
		return nil, "", fmt.Errorf("kubeconfig of %s has no current context: name one", what)
	}
	if _, ok := raw.Contexts[name]; !ok {
		known := make([]string, 0, len(raw.Contexts))
		for n := range raw.Contexts {
			known = append(known, n)
		}
		slices.Sort(known)
		return nil, "", fmt.Errorf("context %q of %s is not in its kubeconfig (it has: %s)", name, what, strings.Join(known, ", "))
	}
	cfg, err := clientcmd.NewNonInteractiveClientConfig(*raw, name, &clientcmd.ConfigOverrides{}, rules).ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("context %q of %s: %w", name, what, err)
	}
	return cfg, name, nil
}

func hubClient(f registerFlags) (*register.Hub, error) {
	h := &register.Hub{URL: f.hubURL, Settle: f.settle}
	if f.hubTokenFile != "" {
		data, err := os.ReadFile(f.hubTokenFile)
		if err != nil {
			return nil, fmt.Errorf("--hub-token-file: %w", err)
		}
		h.Token = strings.TrimSpace(string(data))
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.hubCAFile != "" {
		data, err := os.ReadFile(f.hubCAFile)
		if err != nil {
			return nil, fmt.Errorf("--hub-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("--hub-ca-file %s holds no PEM certificate", f.hubCAFile)
		}
		tlsCfg.RootCAs = pool
	}
	// No keep-alive: each poll dials the hub's Service again (register.Hub.Settle).
	h.Client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment, DisableKeepAlives: true}}
	return h, nil
}

// redacted stands for the token in what --dry-run prints.
const redacted = "REDACTED"

// dryRun prints what a registration would apply in the member and write in
// the home cluster, touching neither; the kubeconfig is checked as the hub
// would check it, with a placeholder token.
func dryRun(out io.Writer, o register.Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	kubeconfig, err := register.Kubeconfig(o.ClusterID, o.Member, redacted)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "# In the member: deploy/remote-member-rbac.yaml (with its ServiceAccount; the namespace created if absent), and a Secret per credential generation.\n%s", deploy.RemoteMemberRBAC)
	fmt.Fprintf(out, "---\n# In the hub's home cluster (the token is minted in the member when this runs for real, valid %s):\n", o.TokenTTL)
	return printSecret(out, register.RemoteSecret(o.Namespace, o.ClusterID, kubeconfig, o.Network))
}

// printSecret prints a Secret as YAML with its data as stringData,
// readable and applied as is by kubectl.
func printSecret(out io.Writer, s *corev1.Secret) error {
	s.StringData = map[string]string{}
	for k, v := range s.Data {
		s.StringData[k] = string(v)
	}
	s.Data = nil
	data, err := yaml.Marshal(s)
	if err != nil {
		return err
	}
	_, err = out.Write(data)
	return err
}
