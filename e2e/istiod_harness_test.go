package e2e

// A real istiod (Istio's pilot-discovery, built from the same Istio module as
// adscclient by e2e/interop/build-istiod.sh) as a child process against a
// local cluster's API server, for the MCP-over-XDS tests (DESIGN §3.7).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/hubmesh/hub/internal/istiomod"
	"github.com/hubmesh/hub/internal/localcluster"
)

// istiodBinEnv names the pilot-discovery binary; `make test` builds it with
// e2e/interop/build-istiod.sh and exports it.
const istiodBinEnv = istiomod.IstiodBinEnv

// istiodBin returns $HUB_ISTIOD_BIN, or fails the test in CI and skips it
// elsewhere, saying how to get the binary.
func istiodBin(t *testing.T) string {
	t.Helper()
	const how = "build it with `e2e/interop/build-istiod.sh` (~11 min cold on 2 cores; prints the cached binary's path) " +
		"and export " + istiodBinEnv + "=<that path>, or run `make test`"
	return binaryFromEnv(t, istiodBinEnv, how)
}

// istiodConfigSource is one entry of meshConfig.configSources.
type istiodConfigSource struct {
	// Address is "k8s://" (the cluster's Istio CRDs) or "xds://host:port"
	// (an MCP-over-XDS server such as the hub).
	Address string `json:"address"`
	// TLSSettings is meshConfig's ClientTLSSettings as JSON fields, e.g.
	// {"mode": "SIMPLE", "caCertificates": "<PEM>", "sni": "hub"}; nil:
	// plaintext.
	TLSSettings map[string]any `json:"tlsSettings,omitempty"`
}

// istiodOptions configures startIstiod.
type istiodOptions struct {
	// ConfigSources of the mesh config; empty means [{address: "k8s://"}].
	ConfigSources []istiodConfigSource
	// ClusterID is istiod's cluster ID (--clusterID); empty means the local
	// cluster's name.
	ClusterID string
	// SystemNamespace is istiod's own namespace (POD_NAMESPACE), created if
	// missing; empty means "istio-system".
	SystemNamespace string
	// Env and Args are added to istiod's environment and command line.
	Env, Args []string
}

// istiodProcess is a running istiod.
type istiodProcess struct {
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

// istiodListenRE matches istiod's log lines naming the addresses it bound
// (it binds port 0 as asked and logs the real port).
var istiodListenRE = regexp.MustCompile(`starting (gRPC discovery|HTTP) service at (\S+)`)

// startIstiod runs pilot-discovery against c's API server (admin kubeconfig)
// with the given mesh config sources, on loopback ports the kernel picks,
// with no CA, no injector, no webhooks and no Gateway API controllers, and
// waits until /ready answers 200. The Istio CRDs are installed in c first
// (istiod's k8s:// source watches them). The process is stopped at the end
// of the test; its log is printed when the test failed.
func startIstiod(t *testing.T, c *localcluster.Cluster, o istiodOptions) *istiodProcess {
	t.Helper()
	bin := istiodBin(t)
	ctx := testContext(t)
	installIstioCRDs(t, c)
	if o.SystemNamespace == "" {
		o.SystemNamespace = "istio-system"
	}
	if o.ClusterID == "" {
		o.ClusterID = c.Name
	}
	if len(o.ConfigSources) == 0 {
		o.ConfigSources = []istiodConfigSource{{Address: "k8s://"}}
	}
	if err := localcluster.EnsureNamespace(ctx, client(t, c), o.SystemNamespace); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	writeFile(t, kubeconfig, c.Kubeconfig())
	// Mesh config as JSON (a subset of YAML, which istiod reads).
	mesh, err := json.Marshal(map[string]any{
		"configSources": o.ConfigSources,
		"trustDomain":   "cluster.local",
		"rootNamespace": o.SystemNamespace,
	})
	if err != nil {
		t.Fatal(err)
	}
	meshPath := filepath.Join(dir, "mesh.yaml")
	writeFile(t, meshPath, mesh)
	// An empty networks file: the default path would be looked up relative
	// to the working directory.
	networksPath := filepath.Join(dir, "meshNetworks.yaml")
	writeFile(t, networksPath, []byte("networks: {}\n"))

	p := &istiodProcess{LogPath: filepath.Join(dir, "istiod.log"), done: make(chan struct{})}
	logFile, err := os.Create(p.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"discovery",
		"--kubeconfig", kubeconfig,
		"--meshConfig", meshPath,
		"--networksConfig", networksPath,
		"--clusterID", o.ClusterID,
		"--domain", "cluster.local",
		"--grpcAddr", "127.0.0.1:0",
		"--httpAddr", "127.0.0.1:0",
		"--secureGRPCAddr", "", // no istiod certificate (no CA): no TLS xDS port
		"--httpsAddr", "", // no webhook server
		"--monitoringAddr", "", // metrics and debug on the http port
		"--ctrlz_port", "0",
		"--ctrlz_address", "127.0.0.1",
		"--shutdownDuration", "1s",
		"--keepaliveMaxServerConnectionAge", "30m",
	}, o.Args...)
	p.cmd = exec.Command(bin, args...)
	// The working directory holds no ./var/lib/istio/inject templates, so no
	// sidecar injector starts.
	p.cmd.Dir = dir
	p.cmd.Env = append(os.Environ(),
		"POD_NAMESPACE="+o.SystemNamespace,
		"POD_NAME=istiod-"+c.Name,
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
	p.cmd.Env = append(p.cmd.Env, o.Env...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := p.cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("starting istiod: %v", err)
	}
	go func() {
		p.exitErr = p.cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			data, _ := os.ReadFile(p.LogPath)
			t.Logf("istiod log (%s):\n%s", p.LogPath, tail(string(data), 80))
		}
	})
	eventually(t, 3*time.Minute, func() error {
		if !p.alive() {
			t.Fatalf("istiod exited before it was ready: %v (its log follows)", p.exitErr)
		}
		if p.XDSAddr == "" || p.HTTPURL == "" {
			if err := p.readAddrs(); err != nil {
				return err
			}
		}
		return p.ready()
	})
	p.StartToReady = time.Since(start)
	return p
}

// readAddrs takes the bound xDS and http addresses from istiod's log.
func (p *istiodProcess) readAddrs() error {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return err
	}
	for _, m := range istiodListenRE.FindAllStringSubmatch(string(data), -1) {
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

// ready returns nil when istiod's /ready answers 200 (it has synced its
// config sources and Kubernetes registry), else why not.
func (p *istiodProcess) ready() error {
	body, status, err := p.get("/ready")
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("istiod /ready: %d %s", status, strings.TrimSpace(string(body)))
	}
	return nil
}

func (p *istiodProcess) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// get fetches a path of istiod's http port.
func (p *istiodProcess) get(path string) ([]byte, int, error) {
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

// istiodConfig is one config object istiod holds, as /debug/configz lists
// it (a Kubernetes-style object; for an MCP source, resourceVersion is the
// resource's metadata.version).
type istiodConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string `json:"name"`
		Namespace       string `json:"namespace"`
		ResourceVersion string `json:"resourceVersion"`
		// CreationTimestamp is RFC 3339 (for an MCP source, its create_time).
		CreationTimestamp string            `json:"creationTimestamp"`
		Labels            map[string]string `json:"labels"`
		Annotations       map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

// Key is "<Kind>/<namespace>/<name>", e.g. "ServiceEntry/demo/echo".
func (c istiodConfig) Key() string {
	return c.Kind + "/" + c.Metadata.Namespace + "/" + c.Metadata.Name
}

// configz lists the config istiod holds (/debug/configz), from every source.
func (p *istiodProcess) configz() ([]istiodConfig, error) {
	body, status, err := p.get("/debug/configz")
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("istiod /debug/configz: %d %s", status, tail(string(body), 5))
	}
	var out []istiodConfig
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("istiod /debug/configz: decoding: %w", err)
	}
	return out, nil
}

// waitConfig waits until /debug/configz holds an object with the given key
// (see istiodConfig.Key) and returns it; with gone set, it waits until
// there is none and returns the zero value.
func (p *istiodProcess) waitConfig(t *testing.T, timeout time.Duration, key string, gone bool) istiodConfig {
	t.Helper()
	var found istiodConfig
	eventually(t, timeout, func() error {
		if !p.alive() {
			t.Fatalf("istiod exited: %v", p.exitErr)
		}
		list, err := p.configz()
		if err != nil {
			return err
		}
		var keys []string
		for _, c := range list {
			if c.Key() == key {
				if gone {
					return fmt.Errorf("istiod still holds %s", key)
				}
				found = c
				return nil
			}
			keys = append(keys, c.Key())
		}
		if gone {
			return nil
		}
		return fmt.Errorf("istiod holds no %s; it holds %v", key, keys)
	})
	return found
}

// RSS returns istiod's resident set size in bytes (/proc/<pid>/status).
func (p *istiodProcess) RSS() (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
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

// stop sends SIGTERM and waits for istiod to exit (SIGKILL after 20 s).
func (p *istiodProcess) stop(t *testing.T) {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Logf("istiod did not stop within 20s of SIGTERM; killed")
		}
	})
}

// istioCRDs reads the Istio CRD manifest of the Istio module istiod is
// built from (next to $HUB_ISTIOD_BIN, else in the module cache).
func istioCRDs(t *testing.T) []byte {
	t.Helper()
	data, err := istiomod.CRDs()
	if err != nil {
		t.Fatalf("reading the Istio CRDs: %v", err)
	}
	return data
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installIstioCRDs creates every Istio CRD in c (those that exist are left
// as they are: CRDs are cluster-wide and shared by the tests of a run) and
// waits until each is Established.
func installIstioCRDs(t *testing.T, c *localcluster.Cluster) {
	t.Helper()
	ctx := testContext(t)
	dc, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	crds := dc.Resource(crdGVR)
	dec := k8syaml.NewYAMLOrJSONDecoder(bytes.NewReader(istioCRDs(t)), 64*1024)
	var names []string
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding the Istio CRDs: %v", err)
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if _, err := crds.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating CRD %s: %v", u.GetName(), err)
		}
		names = append(names, u.GetName())
	}
	if len(names) == 0 {
		t.Fatal("the Istio CRD manifest holds no CustomResourceDefinition")
	}
	eventually(t, time.Minute, func() error {
		for _, n := range names {
			if err := crdEstablished(ctx, crds, n); err != nil {
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

// mark returns how many lines r has printed so far (for waitLineAfter).
func (r *adscRun) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lines)
}

// waitLineAfter waits, without polling, until a line printed after mark
// satisfies match, so that a state that held earlier (e.g. a CDS list
// before an object was added) does not match.
func (r *adscRun) waitLineAfter(t *testing.T, mark int, timeout time.Duration, what string, match func(adscLine) bool) adscLine {
	t.Helper()
	deadline := time.After(timeout)
	seen := mark
	for {
		r.mu.Lock()
		lines, more := r.lines[seen:], r.more
		seen = len(r.lines)
		r.mu.Unlock()
		for _, l := range lines {
			if match(l) {
				return l
			}
		}
		select {
		case <-more:
		case <-r.done:
			r.mu.Lock()
			rest := len(r.lines) > seen
			r.mu.Unlock()
			if !rest {
				t.Fatalf("adscclient %s exited (code %d) before %s", r.name, r.code, what)
			}
		case <-deadline:
			t.Fatalf("adscclient %s: no %s within %s", r.name, what, timeout)
		}
	}
}
