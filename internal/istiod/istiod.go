// Package istiod runs a real istiod (Istio's pilot-discovery, built from the
// same Istio module as e2e/interop by e2e/interop/build-istiod.sh) as a child
// process against a local cluster's API server: the e2e tests read its
// config from the hub (MCP-over-XDS, docs/architecture.md §3.7), and hubbench
// (--peer istiod) serves the same client shapes from it to measure the hub
// beside it.
package istiod

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/hubmesh/hub/internal/istiomod"
)

// ConfigSource is one entry of meshConfig.configSources.
type ConfigSource struct {
	// Address is "k8s://" (the cluster's Istio CRDs) or "xds://host:port"
	// (an MCP-over-XDS server such as the hub).
	Address string `json:"address"`
	// TLSSettings is meshConfig's ClientTLSSettings as JSON fields, e.g.
	// {"mode": "SIMPLE", "caCertificates": "<PEM>", "sni": "hub"}; nil:
	// plaintext.
	TLSSettings map[string]any `json:"tlsSettings,omitempty"`
}

// TLSSource is the config source of an istiod reading the hub's MCP over
// TLS on addr: tlsSettings SIMPLE (istiod's config-source client presents
// no certificate), the hub verified against rootsPEM by serverName, a DNS
// name on its serving certificate (--tls-dns-names), sent as SNI.
func TLSSource(addr string, rootsPEM []byte, serverName string) ConfigSource {
	return ConfigSource{Address: "xds://" + addr, TLSSettings: map[string]any{
		"mode": "SIMPLE", "caCertificates": string(rootsPEM), "subjectAltNames": []string{serverName}, "sni": serverName,
	}}
}

// UpstreamEnvoyEnv is what istiod needs to configure upstream Envoy (the
// PyPI build, without Istio's own filters): no metadata exchange filters
// (their Wasm/native filter is not in upstream Envoy) and no istio.alpn
// filter. The mesh config Start writes sets no default metrics provider,
// so no stats filter is added either.
var UpstreamEnvoyEnv = []string{"PILOT_ENABLE_METADATA_EXCHANGE=false", "PILOT_ENABLE_ALPN_FILTER=false"}

// Options configures Start.
type Options struct {
	// Bin is the pilot-discovery binary.
	Bin string
	// Dir is where istiod's kubeconfig, mesh config and log are written,
	// and its working directory.
	Dir string
	// Kubeconfig is the admin kubeconfig of istiod's own cluster.
	Kubeconfig []byte
	// ConfigSources of the mesh config; empty means [{address: "k8s://"}].
	ConfigSources []ConfigSource
	// ClusterID is istiod's cluster ID (--clusterID).
	ClusterID string
	// TrustDomain is meshConfig.trustDomain, the trust domain of the
	// identities istiod writes into its proxies' config; empty means
	// "cluster.local". Proxies whose certificates come from the hub's CA
	// need the hub's (--trust-domain).
	TrustDomain string
	// Host is the address istiod's plaintext gRPC xDS port binds (port 0);
	// empty means 127.0.0.1. Proxies in another network namespace need
	// one they can reach. The http port stays on 127.0.0.1: istiod serves
	// /debug without authentication only to loopback callers.
	Host string
	// SystemNamespace is istiod's own namespace (POD_NAMESPACE), which must
	// exist; empty means "istio-system". Remote secrets there
	// (istio/multiCluster=true) make istiod read other clusters.
	SystemNamespace string
	// Env and Args are added to istiod's environment and command line.
	Env, Args []string
	// ReadyTimeout bounds the wait for /ready (zero: 3 minutes).
	ReadyTimeout time.Duration
}

// Process is a running istiod.
type Process struct {
	// XDSAddr is the plaintext gRPC xDS address (host:port) for clients.
	XDSAddr string
	// HTTPURL is the http port (http://host:port): /ready, /debug/*
	// (configz, syncz, adsz, ...) and /metrics (no separate monitoring port).
	HTTPURL string
	// LogPath is istiod's combined stdout/stderr.
	LogPath string
	// StartToReady is how long it took from exec to /ready answering 200.
	StartToReady time.Duration

	cmd      *exec.Cmd
	done     chan struct{}
	exitErr  error
	stopOnce sync.Once
}

// listenRE matches istiod's log lines naming the addresses it bound (it
// binds port 0 as asked and logs the real port).
var listenRE = regexp.MustCompile(`starting (gRPC discovery|HTTP) service at (\S+)`)

// Start runs pilot-discovery against the cluster of o.Kubeconfig with the
// given mesh config sources, on loopback ports the kernel picks, with no CA,
// no injector, no webhooks and no Gateway API controllers, and waits until
// /ready answers 200. The Istio CRDs must be installed (InstallCRDs): its
// k8s:// source watches them. The caller stops it (Stop); so does the
// caller's death (Pdeathsig).
func Start(ctx context.Context, o Options) (*Process, error) {
	o = withDefaults(o)
	kubeconfig, meshPath, networksPath, err := writeConfigFiles(o)
	if err != nil {
		return nil, err
	}

	p := &Process{LogPath: filepath.Join(o.Dir, "istiod.log"), done: make(chan struct{})}
	logFile, err := os.Create(p.LogPath)
	if err != nil {
		return nil, err
	}
	p.cmd = discoveryCommand(o, kubeconfig, meshPath, networksPath)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := p.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting istiod: %w", err)
	}
	go func() {
		p.exitErr = p.cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	if err := p.waitReady(ctx, o.ReadyTimeout); err != nil {
		p.Stop()
		return nil, fmt.Errorf("istiod not ready: %w (log: %s)", err, p.LogPath)
	}
	p.StartToReady = time.Since(start)
	return p, nil
}

// withDefaults returns o with its empty fields set to their defaults.
func withDefaults(o Options) Options {
	if o.SystemNamespace == "" {
		o.SystemNamespace = "istio-system"
	}
	if len(o.ConfigSources) == 0 {
		o.ConfigSources = []ConfigSource{{Address: "k8s://"}}
	}
	if o.TrustDomain == "" {
		o.TrustDomain = "cluster.local"
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 3 * time.Minute
	}
	return o
}

// writeConfigFiles writes istiod's kubeconfig, mesh config and (empty) mesh
// networks file into o.Dir and returns their paths.
func writeConfigFiles(o Options) (kubeconfig, meshPath, networksPath string, err error) {
	kubeconfig = filepath.Join(o.Dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, o.Kubeconfig, 0o600); err != nil {
		return "", "", "", err
	}
	// Mesh config as JSON (a subset of YAML, which istiod reads).
	mesh, err := json.Marshal(map[string]any{
		"configSources": o.ConfigSources,
		"trustDomain":   o.TrustDomain,
		"rootNamespace": o.SystemNamespace,
	})
	if err != nil {
		return "", "", "", err
	}
	meshPath = filepath.Join(o.Dir, "mesh.yaml")
	if err := os.WriteFile(meshPath, mesh, 0o644); err != nil {
		return "", "", "", err
	}
	// An empty networks file: the default path would be looked up relative
	// to the working directory.
	networksPath = filepath.Join(o.Dir, "meshNetworks.yaml")
	if err := os.WriteFile(networksPath, []byte("networks: {}\n"), 0o644); err != nil {
		return "", "", "", err
	}
	return kubeconfig, meshPath, networksPath, nil
}

// discoveryCommand builds the pilot-discovery command (command line,
// working directory and environment) for o and the files writeConfigFiles
// wrote.
func discoveryCommand(o Options, kubeconfig, meshPath, networksPath string) *exec.Cmd {
	args := append([]string{"discovery",
		"--kubeconfig", kubeconfig,
		"--meshConfig", meshPath,
		"--networksConfig", networksPath,
		"--clusterID", o.ClusterID,
		"--domain", "cluster.local",
		"--grpcAddr", net.JoinHostPort(o.Host, "0"),
		"--httpAddr", "127.0.0.1:0",
		"--secureGRPCAddr", "", // no istiod certificate (no CA): no TLS xDS port
		"--httpsAddr", "", // no webhook server
		"--monitoringAddr", "", // metrics and debug on the http port
		"--ctrlz_port", "0",
		"--ctrlz_address", "127.0.0.1",
		"--shutdownDuration", "1s",
		"--keepaliveMaxServerConnectionAge", "30m",
	}, o.Args...)
	cmd := exec.Command(o.Bin, args...)
	// The working directory holds no ./var/lib/istio/inject templates, so no
	// sidecar injector starts.
	cmd.Dir = o.Dir
	cmd.Env = append(os.Environ(),
		"POD_NAMESPACE="+o.SystemNamespace,
		"POD_NAME=istiod-"+o.ClusterID,
		"REVISION=default",
		"ENABLE_CA_SERVER=false",         // no Istio CA (and so no istiod DNS certificate)
		"ENABLE_LEADER_ELECTION=false",   // one istiod per cluster; start its controllers at once
		"PILOT_ENABLE_GATEWAY_API=false", // no Gateway API CRDs on local clusters
		"PILOT_ENABLE_GATEWAY_API_STATUS=false",
		"PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER=false",
		"VALIDATION_WEBHOOK_CONFIG_NAME=", // empty: no validating webhook configuration to patch
		"INJECTION_WEBHOOK_CONFIG_NAME=",  // empty: no injection webhook configuration to patch
		"KUBECONFIG="+kubeconfig,
	)
	cmd.Env = append(cmd.Env, o.Env...)
	return cmd
}

// waitReady waits up to timeout for istiod to log its addresses and answer
// 200 on /ready. It gives up at once if istiod exits, and then returns
// why it exited.
func (p *Process) waitReady(ctx context.Context, timeout time.Duration) error {
	readyCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	go func() { // an istiod that exits is not waited for
		select {
		case <-p.done:
			cancel()
		case <-readyCtx.Done():
		}
	}()
	err := until(readyCtx, func() error {
		if p.XDSAddr == "" || p.HTTPURL == "" {
			if err := p.readAddrs(); err != nil {
				return err
			}
		}
		return p.Ready()
	})
	if exit := p.Exited(); exit != nil {
		err = exit
	}
	return err
}

// readAddrs takes the bound xDS and http addresses from istiod's log.
func (p *Process) readAddrs() error {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return err
	}
	for _, m := range listenRE.FindAllStringSubmatch(string(data), -1) {
		switch m[1] {
		case "gRPC discovery":
			p.XDSAddr = m[2]
		case "HTTP":
			p.HTTPURL = "http://" + m[2]
		}
	}
	if p.XDSAddr == "" || p.HTTPURL == "" {
		return errors.New("istiod has not logged its gRPC and HTTP addresses yet")
	}
	return nil
}

// Ready returns nil when istiod's /ready answers 200 (it has synced its
// config sources and Kubernetes registry), else why not.
func (p *Process) Ready() error {
	body, status, err := p.Get("/ready")
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("istiod /ready: %d %s", status, strings.TrimSpace(string(body)))
	}
	return nil
}

// Exited returns why istiod exited, or nil while it runs.
func (p *Process) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("istiod exited: %v (log: %s)", p.exitErr, p.LogPath)
	default:
		return nil
	}
}

// PID is istiod's process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Get fetches a path of istiod's http port.
func (p *Process) Get(path string) ([]byte, int, error) {
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(p.HTTPURL + path)
	if err != nil {
		return nil, 0, fmt.Errorf("istiod GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("istiod GET %s: reading the body: %w", path, err)
	}
	return body, resp.StatusCode, nil
}

// RSS returns istiod's resident set size in bytes (/proc/<pid>/status).
func (p *Process) RSS() (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
	if err != nil {
		return 0, fmt.Errorf("reading istiod's /proc status: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing VmRSS %q: %w", v, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("no VmRSS in istiod's /proc status")
}

// Stop sends SIGTERM and waits for istiod to exit, SIGKILLing it after 20
// s; killed says it had to.
func (p *Process) Stop() (killed bool) {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			killed = true
		}
	})
	return killed
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRDs creates every Istio CRD of the Istio module istiod is built
// from (istiomod.CRDs) in the cluster of cfg (those that exist are left as
// they are: CRDs are cluster-wide) and waits until each is Established.
func InstallCRDs(ctx context.Context, cfg *rest.Config) error {
	data, err := istiomod.CRDs()
	if err != nil {
		return fmt.Errorf("reading the Istio CRDs: %w", err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crds := dc.Resource(crdGVR)
	dec := k8syaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 64*1024)
	var names []string
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("decoding the Istio CRDs: %w", err)
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if _, err := crds.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", u.GetName(), err)
		}
		names = append(names, u.GetName())
	}
	if len(names) == 0 {
		return errors.New("the Istio CRD manifest holds no CustomResourceDefinition")
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return until(waitCtx, func() error {
		for _, n := range names {
			if err := crdEstablished(waitCtx, crds, n); err != nil {
				return err
			}
		}
		return nil
	})
}

func crdEstablished(ctx context.Context, crds dynamic.ResourceInterface, name string) error {
	u, err := crds.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading CRD %s: %w", name, err)
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return nil
		}
	}
	return fmt.Errorf("CRD %s is not Established yet", name)
}

// until checks cond every 100 ms until it returns nil or ctx ends (then
// cond's last error).
func until(ctx context.Context, cond func() error) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-tick.C:
		}
	}
}
