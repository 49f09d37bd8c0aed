// Package pilotagent runs a real Istio pilot-agent (istio-agent, built from
// the same Istio module as istiod by e2e/interop/build-istiod.sh) as a child
// process, for the e2e tests and the demo: either next to a proxyless gRPC
// workload as Istio's grpc-agent injection template runs it (DISABLE_ENVOY,
// the hub as xDS server and CA), or as a real Istio data-plane proxy, a
// sidecar or an east-west gateway running Envoy, configured by a member
// istiod while the hub stays its CA (Proxy).
//
// Without iptables: a data-plane proxy's interception mode is NONE, so
// istiod binds a sidecar's outbound listeners to 127.0.0.1:<service port>
// and its inbound ones where a Sidecar resource's ingress says.
//
// It does not import testing, so the demo can use it too.
package pilotagent

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/envoy"
	"github.com/hubmesh/hub/internal/istiomod"
)

// BinEnv names the pilot-agent binary; `make test` builds it with
// `e2e/interop/build-istiod.sh pilot-agent` and exports it.
const BinEnv = "HUB_PILOT_AGENT_BIN"

// stopWait is how long Stop waits after SIGTERM before it kills the
// agent's whole process group.
const stopWait = 20 * time.Second

// Options configures Start.
type Options struct {
	// Bin is the pilot-agent binary.
	Bin string
	// Dir is the agent's working directory, which must exist and be empty;
	// everything it reads and writes is under it (the paths a pod would
	// mount volumes at). Unix socket paths are limited to 108 bytes: keep
	// it short (os.MkdirTemp("", "agent-")).
	Dir string
	// Token is the workload's projected service-account token (audience
	// istio-ca), e.g. from Token; it expires, SetToken replaces it.
	Token []byte
	// RootPEM is the hub's root certificate(s), mounted where the agent
	// reads the control plane's root (istio-ca-root-cert in a cluster).
	RootPEM []byte
	// ClusterID is the member the workload runs in: ISTIO_META_CLUSTER_ID,
	// the hub's ClusterID header.
	ClusterID string
	// Namespace and ServiceAccount of the workload; the certificate's
	// identity is spiffe://<TrustDomain>/ns/<Namespace>/sa/<ServiceAccount>.
	Namespace, ServiceAccount string
	// PodName is POD_NAME (required).
	PodName string
	// PodIP is INSTANCE_IP, the first address in the proxy's node ID.
	PodIP string
	// TrustDomain is TRUST_DOMAIN (and ISTIO_META_MESH_ID).
	TrustDomain string
	// HubAddr is the hub's mTLS xDS address (host:port): the agent's
	// discoveryAddress (without Proxy) and its CA address.
	HubAddr string
	// HubName is a DNS name on the hub's serving certificate (one of its
	// --tls-dns-names): the agent verifies the server by this name, as it
	// does with istiod.istio-system.svc in a cluster.
	HubName string
	// Envoy, if set, is the Envoy binary the agent runs with Istio's
	// bootstrap template from the Istio module. Empty: a proxyless gRPC
	// workload's agent, no Envoy (the grpc-agent template).
	Envoy string
	// Proxy, if set, makes the agent an Istio data-plane proxy fed by a
	// member istiod (Envoy must be set): a sidecar or an east-west gateway.
	Proxy *Proxy
	// Env is added to the agent's environment last, e.g. SECRET_TTL=10m.
	Env []string
	// Output, if set, also gets the agent's combined stdout and stderr
	// (LogPath always does).
	Output io.Writer
}

// Proxy is what makes an agent a real Istio sidecar or gateway: its config
// comes from a member istiod (which takes the federation from the hub over
// MCP), its certificate from the hub's CA, as in a member where the hub is
// the mesh's CA.
type Proxy struct {
	// Istiod is the member istiod's plaintext xDS address (ProxyConfig
	// discoveryAddress, controlPlaneAuthPolicy NONE); the hub (HubAddr)
	// stays the CA (CA_ADDR).
	Istiod string
	// Router runs `pilot-agent proxy router` (a gateway) instead of
	// `proxy sidecar`.
	Router bool
	// Network is ISTIO_META_NETWORK; a router also asks for that
	// network's endpoints only (ISTIO_META_REQUESTED_NETWORK_VIEW), as
	// Istio's gen-eastwest-gateway.sh configures the east-west gateway.
	Network string
	// Labels are the pod's labels (default app=<ServiceAccount>).
	Labels map[string]string
	// Netns, when set, is the network namespace the agent and its Envoy
	// run in (`ip netns exec`).
	Netns string
	// AdminPort is Envoy's admin port (ProxyConfig proxyAdminPort); Envoy's
	// status and Prometheus listeners take AdminPort+21 and AdminPort+90
	// (on 0.0.0.0), so that proxies sharing a network namespace do not
	// collide. Keep all three below the kernel's ephemeral ports (Linux:
	// 32768–60999): a connection's local port may take one of those at any
	// time, and Envoy then exits (cannot bind).
	AdminPort int
	// Stats are prefixes of Envoy statistics to keep beyond those Istio's
	// bootstrap keeps (ProxyConfig proxyStatsMatcher.inclusionPrefixes),
	// e.g. "listener." for listener counters.
	Stats []string
}

// Process is a running pilot-agent.
type Process struct {
	// Name is "<PodName>.<Namespace>", the agent's proxy ID.
	Name string
	// Dir is the agent's working directory.
	Dir string
	// BootstrapPath is the gRPC xDS bootstrap the agent writes
	// (GRPC_XDS_BOOTSTRAP); give it to the workload's grpc-go.
	BootstrapPath string
	// CertDir is OUTPUT_CERTS: key.pem, cert-chain.pem, root-cert.pem.
	CertDir string
	// PodIP is the workload's address (INSTANCE_IP).
	PodIP string
	// LogPath holds the agent's combined stdout and stderr.
	LogPath string
	// Envoy reads the admin API of a data-plane proxy's Envoy (nil
	// without Proxy).
	Envoy *envoy.AdminAPI

	cmd      *exec.Cmd
	done     chan struct{}
	exitErr  error
	stopOnce sync.Once
	killed   bool
}

// Token makes sure namespace ns and ServiceAccount sa exist in the
// cluster of cs and returns a token of sa as the kubelet projects it into
// an injected pod: audience istio-ca (values global.sds.token.aud), 12 h.
func Token(ctx context.Context, cs kubernetes.Interface, ns, sa string) ([]byte, error) {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating ServiceAccount %s/%s: %w", ns, sa, err)
	}
	expiry := int64(43200)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}, ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("a token of %s/%s: %w", ns, sa, err)
	}
	return []byte(tr.Status.Token), nil
}

// Start runs pilot-agent as Istio's injection templates configure it, in
// o.Dir, and returns once it runs (WaitFiles waits for what it writes).
// Without Proxy it binds no TCP port: DNS capture is off (as in the
// grpc-agent template) and the status server (:15020) is disabled by the
// pod annotation status.sidecar.istio.io/port=0, so any number run side by
// side; its xDS proxy listens on a Unix socket under Dir.
//
// An agent running Envoy runs in a PID namespace of its own (unshare --pid
// --kill-child), so that its Envoy dies with it however it ends; a
// data-plane proxy's also in a mount namespace of its own where /etc/hosts
// resolves HubName to the hub's address: the agent verifies its CA by the
// name it dials (an explicit CA_ADDR gets no ISTIOD_SAN), as in a member
// where CA_ADDR is the hub's Service name. That needs root.
//
// The agent is in a process group of its own, which Stop ends, and dies
// with the calling thread's process (Pdeathsig).
func Start(o Options) (*Process, error) {
	if o.PodName == "" || o.Namespace == "" || o.ServiceAccount == "" {
		return nil, errors.New("pilot-agent needs a pod name, a namespace and a service account")
	}
	if o.Proxy != nil && o.Envoy == "" {
		return nil, errors.New("a data-plane proxy's pilot-agent needs Envoy")
	}
	dir := o.Dir
	p := &Process{
		Name:          o.PodName + "." + o.Namespace,
		Dir:           dir,
		BootstrapPath: filepath.Join(dir, "etc/istio/proxy/grpc-bootstrap.json"),
		CertDir:       filepath.Join(dir, "var/lib/istio/data"),
		PodIP:         o.PodIP,
		LogPath:       filepath.Join(dir, "agent.log"),
		done:          make(chan struct{}),
	}
	if err := writePodFiles(o, p); err != nil {
		return nil, err
	}
	if px := o.Proxy; px != nil {
		p.Envoy = envoy.NewAdminAPI(fmt.Sprintf("http://127.0.0.1:%d", px.AdminPort), px.Netns)
	}
	proxyConfig, err := proxyConfigJSON(o)
	if err != nil {
		return nil, err
	}
	argv, caAddr, err := commandLine(o)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = environment(o, p, proxyConfig, caAddr)
	logFile, err := os.Create(p.LogPath)
	if err != nil {
		return nil, err
	}
	var out io.Writer = logFile
	if o.Output != nil {
		out = io.MultiWriter(logFile, o.Output)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second // a process holding its output cannot hold Wait
	p.cmd = cmd
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting pilot-agent: %w", err)
	}
	go func() { // owned by the process: ends when it exits
		p.exitErr = cmd.Wait() // returns once the output is copied
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// writePodFiles writes what the injection template mounts into a pod (the
// token, the root certificate, the pod's labels and annotations) under
// o.Dir and makes the directories the agent writes into.
func writePodFiles(o Options, p *Process) error {
	labels := map[string]string{"app": o.ServiceAccount}
	if o.Proxy != nil && o.Proxy.Labels != nil {
		labels = o.Proxy.Labels
	}
	var labelsFile []byte
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		labelsFile = fmt.Appendf(labelsFile, "%s=%q\n", k, labels[k])
	}
	// The template's volumes, at the paths the agent reads relative to its
	// working directory.
	files := map[string][]byte{
		"var/run/secrets/tokens/istio-token":  o.Token,
		"var/run/secrets/istio/root-cert.pem": o.RootPEM,
		"etc/istio/pod/labels":                labelsFile,
		"etc/istio/pod/annotations":           []byte(`status.sidecar.istio.io/port="0"` + "\n"),
	}
	for name, data := range files {
		if err := writeFile(filepath.Join(o.Dir, name), data); err != nil {
			return err
		}
	}
	for _, d := range []string{p.CertDir, filepath.Dir(p.BootstrapPath), filepath.Join(o.Dir, "var/run/secrets/workload-spiffe-uds"),
		filepath.Join(o.Dir, "var/run/secrets/workload-spiffe-credentials")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// proxyConfigJSON is the injected ProxyConfig (meshConfig.defaultConfig)
// as JSON: the hub as the discovery address, or with Proxy the member
// istiod and the proxy's Envoy settings.
func proxyConfigJSON(o Options) ([]byte, error) {
	// configPath absolute, so that the xDS proxy's socket in the bootstrap
	// is an absolute path.
	envoyBin := "/usr/local/bin/envoy" // never run: DISABLE_ENVOY
	if o.Envoy != "" {
		envoyBin = o.Envoy
	}
	pc := map[string]any{
		"discoveryAddress": o.HubAddr,
		"configPath":       filepath.Join(o.Dir, "etc/istio/proxy"),
		"binaryPath":       envoyBin,
	}
	if px := o.Proxy; px != nil {
		pc["discoveryAddress"] = px.Istiod
		pc["controlPlaneAuthPolicy"] = "NONE"
		pc["proxyAdminPort"] = px.AdminPort
		pc["concurrency"] = 1
		pc["terminationDrainDuration"] = "1s"
		// Every rejected update is counted, whatever Istio's bootstrap
		// keeps (its stats matcher drops per-cluster and RDS statistics).
		matcher := map[string]any{"inclusionSuffixes": []string{"update_rejected"}}
		if len(px.Stats) > 0 {
			matcher["inclusionPrefixes"] = px.Stats
		}
		pc["proxyStatsMatcher"] = matcher
	}
	return json.Marshal(pc)
}

// commandLine builds the agent's command line: pilot-agent itself, wrapped
// in unshare (and ip netns exec) when it runs Envoy. For a data-plane proxy
// it writes the hosts file its mount namespace sees as /etc/hosts, and it
// returns the CA address the agent dials: the hub by HubName there, else
// HubAddr.
func commandLine(o Options) (argv []string, caAddr string, err error) {
	args := []string{"proxy", "sidecar",
		"--domain", o.Namespace + ".svc.cluster.local",
		"--proxyLogLevel=warning", "--proxyComponentLogLevel=misc:error",
		"--log_output_level=default:info"}
	if o.Envoy != "" {
		template, err := istiomod.EnvoyBootstrapTemplate()
		if err != nil {
			return nil, "", err
		}
		args = append(args, "--templateFile", template)
	}
	if o.Proxy != nil && o.Proxy.Router {
		args[1] = "router"
	}
	argv = append([]string{o.Bin}, args...)
	caAddr = o.HubAddr
	switch px := o.Proxy; {
	case px != nil:
		hubHost, port, err := net.SplitHostPort(o.HubAddr)
		if err != nil {
			return nil, "", fmt.Errorf("the hub's address %q: %w", o.HubAddr, err)
		}
		hosts := filepath.Join(o.Dir, "hosts")
		if err := writeFile(hosts, fmt.Appendf(nil, "127.0.0.1 localhost\n%s %s\n", hubHost, o.HubName)); err != nil {
			return nil, "", err
		}
		caAddr = net.JoinHostPort(o.HubName, port)
		argv = append([]string{"unshare", "--mount", "--pid", "--fork", "--kill-child", "--",
			"sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hosts}, argv...)
		if px.Netns != "" {
			argv = append([]string{"ip", "netns", "exec", px.Netns}, argv...)
		}
	case o.Envoy != "":
		argv = append([]string{"unshare", "--pid", "--fork", "--kill-child", "--"}, argv...)
	}
	return argv, caAddr, nil
}

// environment is the agent's environment: the grpc-agent template's, then
// an Istio sidecar's when it runs Envoy, a member istiod's proxy's with
// Proxy, and o.Env last.
func environment(o Options, p *Process, proxyConfig []byte, caAddr string) []string {
	env := append(os.Environ(),
		// The grpc-agent template's environment.
		"ISTIO_META_GENERATOR=grpc",
		"OUTPUT_CERTS="+p.CertDir,
		"PILOT_CERT_PROVIDER=istiod",
		"POD_NAME="+o.PodName,
		"POD_NAMESPACE="+o.Namespace,
		"INSTANCE_IP="+o.PodIP,
		"SERVICE_ACCOUNT="+o.ServiceAccount,
		"HOST_IP="+o.PodIP,
		"PROXY_CONFIG="+string(proxyConfig),
		`ISTIO_META_POD_PORTS=[]`,
		"ISTIO_META_APP_CONTAINERS=app",
		"ISTIO_META_CLUSTER_ID="+o.ClusterID,
		"ISTIO_META_NODE_NAME="+o.ClusterID+"-node",
		"ISTIO_META_WORKLOAD_NAME="+o.ServiceAccount,
		"ISTIO_META_MESH_ID="+o.TrustDomain,
		"TRUST_DOMAIN="+o.TrustDomain,
		"ISTIO_META_DNS_CAPTURE=false",
		"DISABLE_ENVOY=true",
		// The app container's GRPC_XDS_BOOTSTRAP, which the agent writes.
		"GRPC_XDS_BOOTSTRAP="+p.BootstrapPath,
		// Outside a cluster: verify the hub by the name on its certificate
		// while dialling its IP (what ISTIOD_SAN is for), and do not probe
		// cloud metadata servers.
		"ISTIOD_SAN="+o.HubName,
		"CLOUD_PLATFORM=none",
	)
	if o.Envoy != "" {
		// An Istio sidecar's environment instead (later values win):
		// Envoy runs, DNS capture on, no proxyless generator.
		env = append(env, "ISTIO_META_GENERATOR=", "DISABLE_ENVOY=false", "ISTIO_META_DNS_CAPTURE=true",
			"ISTIO_META_INTERCEPTION_MODE=NONE")
	}
	if px := o.Proxy; px != nil {
		// A member istiod's proxy: config from istiod, certificate from
		// the hub, no DNS capture (no iptables to send DNS to the agent).
		env = append(env, "CA_ADDR="+caAddr, "ISTIO_META_DNS_CAPTURE=false",
			"ISTIO_META_NETWORK="+px.Network,
			fmt.Sprintf("ENVOY_STATUS_PORT=%d", px.AdminPort+21), fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", px.AdminPort+90))
		if px.Router {
			env = append(env, "ISTIO_META_REQUESTED_NETWORK_VIEW="+px.Network, "ISTIO_META_ROUTER_MODE=sni-dnat")
		}
	}
	return append(env, o.Env...)
}

// Done is closed when the agent has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited returns how the agent ended, and nil while it runs.
func (p *Process) Exited() error {
	select {
	case <-p.done:
		if p.exitErr == nil {
			return errors.New("pilot-agent exited")
		}
		return fmt.Errorf("pilot-agent exited: %w", p.exitErr)
	default:
		return nil
	}
}

// WaitFiles waits until the agent has written every file (it writes each
// atomically); it returns at once if the agent exits.
func (p *Process) WaitFiles(ctx context.Context, files ...string) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		missing := ""
		for _, f := range files {
			if _, err := os.Stat(f); err != nil {
				missing = f
				break
			}
		}
		if missing == "" {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s: %w", p.Name, p.Exited())
		case <-ctx.Done():
			return fmt.Errorf("pilot-agent %s has not written %s: %w", p.Name, missing, ctx.Err())
		case <-tick.C:
		}
	}
}

// Stop sends SIGTERM to the agent's process group (the agent, which drains
// its Envoy, and that Envoy) and waits for the agent to exit, killing the
// whole group after 20 s; the group is killed after a clean exit too, so
// that nothing the agent started outlives it. An agent that had exited
// before is left alone (its Envoy died with its PID namespace; its group ID
// may be another's by now). It is idempotent and reports whether it had to
// kill.
func (p *Process) Stop() (killed bool) {
	p.stopOnce.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		pgid := p.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(stopWait):
			p.killed = true
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	})
	return p.killed
}

// SetToken replaces the workload's token (the kubelet refreshes a projected
// token before it expires; the agent reads it for every certificate).
func (p *Process) SetToken(token []byte) error {
	path := filepath.Join(p.Dir, "var/run/secrets/tokens/istio-token")
	tmp := path + ".new"
	if err := os.WriteFile(tmp, token, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// CertChain reads the agent's cert-chain.pem as DER certificates, leaf
// first.
func (p *Process) CertChain() ([][]byte, error) {
	data, err := os.ReadFile(filepath.Join(p.CertDir, "cert-chain.pem"))
	if err != nil {
		return nil, err
	}
	var ders [][]byte
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			ders = append(ders, b.Bytes)
		}
	}
	if len(ders) == 0 {
		return nil, fmt.Errorf("pilot-agent %s: cert-chain.pem holds no certificate", p.Name)
	}
	return ders, nil
}

// LogContains reports whether the agent's log holds s.
func (p *Process) LogContains(s string) bool {
	data, _ := os.ReadFile(p.LogPath)
	return bytes.Contains(data, []byte(s))
}

func writeFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}
