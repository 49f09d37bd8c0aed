package e2e

// A real Istio pilot-agent (istio-agent, built from the same Istio module as
// adscclient and istiod by e2e/interop/build-istiod.sh) as a child process,
// run as Istio's grpc-agent injection template runs it next to a proxyless
// gRPC workload (DESIGN §3.8): `pilot-agent proxy sidecar` with
// DISABLE_ENVOY=true. It gets the workload's certificate from the hub's CA
// with a real projected service-account token, writes the cert files and a
// gRPC xDS bootstrap, and proxies the workload's xDS stream to the hub.

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/envoy"
	"github.com/hubmesh/hub/internal/localcluster"
)

// pilotAgentBinEnv names the pilot-agent binary; `make test` builds it with
// `e2e/interop/build-istiod.sh pilot-agent` and exports it.
const pilotAgentBinEnv = "HUB_PILOT_AGENT_BIN"

// pilotAgentBin returns $HUB_PILOT_AGENT_BIN, or fails the test in CI and
// skips it elsewhere, saying how to get the binary.
func pilotAgentBin(t *testing.T) string {
	t.Helper()
	const how = "build it with `e2e/interop/build-istiod.sh pilot-agent` (~11 min cold on 2 cores with istiod; prints the cached binary's path) " +
		"and export " + pilotAgentBinEnv + "=<that path>, or run `make test`"
	return binaryFromEnv(t, pilotAgentBinEnv, how)
}

// agentOptions configures startAgent.
type agentOptions struct {
	// Member is the cluster the workload runs in: its ServiceAccount lives
	// there, its token is issued there, and its name is the agent's
	// ISTIO_META_CLUSTER_ID (the hub's ClusterID header).
	Member *localcluster.Cluster
	// Namespace and ServiceAccount of the workload; both are created in
	// Member if missing. The certificate's identity is
	// spiffe://<td>/ns/<Namespace>/sa/<ServiceAccount>.
	Namespace, ServiceAccount string
	// PodName is POD_NAME; empty means "<ServiceAccount>-<random>".
	PodName string
	// PodIP is INSTANCE_IP, the first address in the proxy's node ID; empty
	// means the data-plane address (dataPlaneIP).
	PodIP string
	// HubAddr is the hub's mTLS xDS address (host:port), the agent's
	// discoveryAddress and so also its CA address.
	HubAddr string
	// HubName is a DNS name on the hub's serving certificate (one of its
	// --tls-dns-names): the agent verifies the server by this name
	// (ISTIOD_SAN), as it does with istiod.istio-system.svc in a cluster.
	HubName string
	// RootPEM is the hub's root certificate(s), mounted where the agent
	// reads the control plane's root (istio-ca-root-cert in a cluster).
	RootPEM []byte
	// TrustDomain is TRUST_DOMAIN (and ISTIO_META_MESH_ID).
	TrustDomain string
	// Env is added to the agent's environment last, e.g. SECRET_TTL=10m.
	Env []string
	// Envoy, if set, is the Envoy binary the agent runs as an Istio
	// sidecar's proxy (Istio's bootstrap template from the Istio module,
	// no interception), with DNS capture on: its xDS reaches the hub
	// through the agent, which adds NDS. Empty: a proxyless gRPC
	// workload's agent, no Envoy (the grpc-agent template).
	Envoy string
	// Proxy, if set, makes the agent an Istio data-plane proxy fed by a
	// member istiod (Envoy must be set): a sidecar or an east-west gateway.
	Proxy *dataPlaneProxy
}

// dataPlaneProxy is what makes an agent a real Istio sidecar or gateway:
// its config comes from a member istiod (which takes the federation from
// the hub over MCP), its certificate from the hub's CA, as in a member
// where the hub is the mesh's CA. No iptables: interception mode NONE,
// so istiod binds a sidecar's outbound listeners to 127.0.0.1:<service
// port> and its inbound ones where a Sidecar resource's ingress says.
type dataPlaneProxy struct {
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
	// status and Prometheus listeners take AdminPort+21 and AdminPort+90,
	// so that proxies sharing a network namespace do not collide.
	AdminPort int
	// Stats are prefixes of Envoy statistics to keep beyond those Istio's
	// bootstrap keeps (ProxyConfig proxyStatsMatcher.inclusionPrefixes),
	// e.g. "listener." for listener counters.
	Stats []string
}

// agentProcess is a running pilot-agent.
type agentProcess struct {
	// Name is "<PodName>.<Namespace>", the agent's proxy ID.
	Name string
	// Dir is the agent's working directory; everything it reads and
	// writes is under it (the paths a pod would mount volumes at).
	Dir string
	// BootstrapPath is the gRPC xDS bootstrap the agent wrote
	// (GRPC_XDS_BOOTSTRAP); give it to the workload's grpc-go.
	BootstrapPath string
	// CertDir is OUTPUT_CERTS: key.pem, cert-chain.pem, root-cert.pem.
	CertDir string
	// PodIP is the workload's address (INSTANCE_IP).
	PodIP string
	// LogPath holds the agent's combined stdout/stderr (also streamed into
	// the test log).
	LogPath string
	// Envoy reads the admin API of a data-plane proxy's Envoy (nil
	// without Proxy).
	Envoy *envoy.AdminAPI

	cmd      *exec.Cmd
	done     chan struct{}
	exitErr  error
	stopOnce sync.Once
}

// startAgent runs pilot-agent for a proxyless gRPC workload of
// o.ServiceAccount in o.Namespace of member o.Member, exactly as Istio's
// grpc-agent injection template configures it, in its own working
// directory, and waits until it has written its certificate files and
// its gRPC bootstrap. Its token is a real projected token of the
// ServiceAccount (TokenRequest, audience istio-ca). It binds no TCP port:
// DNS capture is off (as in the template) and the status server (:15020,
// with the Prometheus merge and pprof) is disabled by the pod annotation
// status.sidecar.istio.io/port=0, so any number run side by side; Envoy's
// ports (15000, 15021, 15090) are never bound with DISABLE_ENVOY. The xDS
// proxy listens on a Unix socket under Dir. The agent is stopped at the end
// of the test.
func startAgent(t *testing.T, o agentOptions) *agentProcess {
	t.Helper()
	a := launchAgent(t, o)
	a.waitFiles(t, 2*time.Minute, a.BootstrapPath, filepath.Join(a.CertDir, "cert-chain.pem"), filepath.Join(a.CertDir, "key.pem"),
		filepath.Join(a.CertDir, "root-cert.pem"))
	return a
}

// launchAgent is startAgent without the wait: it returns once the agent
// runs (to watch an agent that cannot get a certificate).
func launchAgent(t *testing.T, o agentOptions) *agentProcess {
	t.Helper()
	bin := pilotAgentBin(t)
	ctx := testContext(t)
	if o.PodIP == "" {
		o.PodIP = dataPlaneIP(t)
	}
	if o.PodName == "" {
		o.PodName = o.ServiceAccount + "-" + rand.String(5)
	}
	cs := client(t, o.Member)
	if err := localcluster.EnsureNamespace(ctx, cs, o.Namespace); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: o.ServiceAccount}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The kubelet's projected volume of the template: audience istio-ca
	// (values global.sds.token.aud), 12 h.
	expiry := int64(43200)
	tr, err := cs.CoreV1().ServiceAccounts(o.Namespace).CreateToken(ctx, o.ServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}, ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of %s/%s in %s: %v", o.Namespace, o.ServiceAccount, o.Member.Name, err)
	}

	// Unix socket paths are limited to 108 bytes: keep the directory short.
	dir, err := os.MkdirTemp("", "agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a := &agentProcess{
		Name:          o.PodName + "." + o.Namespace,
		Dir:           dir,
		BootstrapPath: filepath.Join(dir, "etc/istio/proxy/grpc-bootstrap.json"),
		CertDir:       filepath.Join(dir, "var/lib/istio/data"),
		PodIP:         o.PodIP,
		LogPath:       filepath.Join(dir, "agent.log"),
		done:          make(chan struct{}),
	}
	// The template's volumes, at the paths the agent reads relative to its
	// working directory.
	writeFile(t, filepath.Join(dir, "var/run/secrets/tokens/istio-token"), []byte(tr.Status.Token))
	writeFile(t, filepath.Join(dir, "var/run/secrets/istio/root-cert.pem"), o.RootPEM)
	labels := map[string]string{"app": o.ServiceAccount}
	if o.Proxy != nil && o.Proxy.Labels != nil {
		labels = o.Proxy.Labels
	}
	var labelsFile []byte
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		labelsFile = fmt.Appendf(labelsFile, "%s=%q\n", k, labels[k])
	}
	writeFile(t, filepath.Join(dir, "etc/istio/pod/labels"), labelsFile)
	writeFile(t, filepath.Join(dir, "etc/istio/pod/annotations"), []byte(`status.sidecar.istio.io/port="0"`+"\n"))
	for _, d := range []string{a.CertDir, filepath.Dir(a.BootstrapPath), filepath.Join(dir, "var/run/secrets/workload-spiffe-uds"),
		filepath.Join(dir, "var/run/secrets/workload-spiffe-credentials")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// The injected ProxyConfig (meshConfig.defaultConfig) with the hub as
	// the discovery address; configPath absolute, so that the xDS proxy's
	// socket in the bootstrap is an absolute path.
	envoyBin := "/usr/local/bin/envoy" // never run: DISABLE_ENVOY
	if o.Envoy != "" {
		envoyBin = o.Envoy
	}
	pc := map[string]any{
		"discoveryAddress": o.HubAddr,
		"configPath":       filepath.Join(dir, "etc/istio/proxy"),
		"binaryPath":       envoyBin,
	}
	if p := o.Proxy; p != nil {
		pc["discoveryAddress"] = p.Istiod
		pc["controlPlaneAuthPolicy"] = "NONE"
		pc["proxyAdminPort"] = p.AdminPort
		pc["concurrency"] = 1
		pc["terminationDrainDuration"] = "1s"
		// Every rejected update is counted, whatever Istio's bootstrap
		// keeps (its stats matcher drops per-cluster and RDS statistics).
		matcher := map[string]any{"inclusionSuffixes": []string{"update_rejected"}}
		if len(p.Stats) > 0 {
			matcher["inclusionPrefixes"] = p.Stats
		}
		pc["proxyStatsMatcher"] = matcher
		a.Envoy = envoy.NewAdminAPI(fmt.Sprintf("http://127.0.0.1:%d", p.AdminPort), p.Netns)
	}
	proxyConfig, err := json.Marshal(pc)
	if err != nil {
		t.Fatal(err)
	}

	args := []string{"proxy", "sidecar",
		"--domain", o.Namespace + ".svc.cluster.local",
		"--proxyLogLevel=warning", "--proxyComponentLogLevel=misc:error",
		"--log_output_level=default:info"}
	if o.Envoy != "" {
		args = append(args, "--templateFile", filepath.Join(istioModuleDir(t), "tools/packaging/common/envoy_bootstrap.json"))
	}
	if o.Proxy != nil && o.Proxy.Router {
		args[1] = "router"
	}
	cmd := exec.Command(bin, args...)
	caAddr := o.HubAddr
	if p := o.Proxy; p != nil {
		// The agent verifies its CA by the name it dials (an explicit
		// CA_ADDR gets no ISTIOD_SAN), as in a member where CA_ADDR is the
		// hub's Service name: HubName resolves to the hub's address in a
		// hosts file of the agent's own mount namespace.
		hubHost, port, err := net.SplitHostPort(o.HubAddr)
		if err != nil {
			t.Fatal(err)
		}
		hosts := filepath.Join(dir, "hosts")
		writeFile(t, hosts, fmt.Appendf(nil, "127.0.0.1 localhost\n%s %s\n", hubHost, o.HubName))
		caAddr = net.JoinHostPort(o.HubName, port)
		wrapped := append([]string{"unshare", "--mount", "--", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hosts, bin}, args...)
		if p.Netns != "" {
			wrapped = append([]string{"ip", "netns", "exec", p.Netns}, wrapped...)
		}
		cmd = exec.Command(wrapped[0], wrapped[1:]...)
	}
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		// The grpc-agent template's environment.
		"ISTIO_META_GENERATOR=grpc",
		"OUTPUT_CERTS="+a.CertDir,
		"PILOT_CERT_PROVIDER=istiod",
		"POD_NAME="+o.PodName,
		"POD_NAMESPACE="+o.Namespace,
		"INSTANCE_IP="+o.PodIP,
		"SERVICE_ACCOUNT="+o.ServiceAccount,
		"HOST_IP="+o.PodIP,
		"PROXY_CONFIG="+string(proxyConfig),
		`ISTIO_META_POD_PORTS=[]`,
		"ISTIO_META_APP_CONTAINERS=app",
		"ISTIO_META_CLUSTER_ID="+o.Member.Name,
		"ISTIO_META_NODE_NAME="+o.Member.Name+"-node",
		"ISTIO_META_WORKLOAD_NAME="+o.ServiceAccount,
		"ISTIO_META_MESH_ID="+o.TrustDomain,
		"TRUST_DOMAIN="+o.TrustDomain,
		"ISTIO_META_DNS_CAPTURE=false",
		"DISABLE_ENVOY=true",
		// The app container's GRPC_XDS_BOOTSTRAP, which the agent writes.
		"GRPC_XDS_BOOTSTRAP="+a.BootstrapPath,
		// Outside a cluster: verify the hub by the name on its certificate
		// while dialling its IP (what ISTIOD_SAN is for), and do not probe
		// cloud metadata servers.
		"ISTIOD_SAN="+o.HubName,
		"CLOUD_PLATFORM=none",
	)
	if o.Envoy != "" {
		// An Istio sidecar's environment instead (later values win):
		// Envoy runs, DNS capture on, no proxyless generator.
		cmd.Env = append(cmd.Env, "ISTIO_META_GENERATOR=", "DISABLE_ENVOY=false", "ISTIO_META_DNS_CAPTURE=true",
			"ISTIO_META_INTERCEPTION_MODE=NONE")
	}
	if p := o.Proxy; p != nil {
		// A member istiod's proxy: config from istiod, certificate from
		// the hub, no DNS capture (no iptables to send DNS to the agent).
		cmd.Env = append(cmd.Env, "CA_ADDR="+caAddr, "ISTIO_META_DNS_CAPTURE=false",
			"ISTIO_META_NETWORK="+p.Network,
			fmt.Sprintf("ENVOY_STATUS_PORT=%d", p.AdminPort+21), fmt.Sprintf("ENVOY_PROMETHEUS_PORT=%d", p.AdminPort+90))
		if p.Router {
			cmd.Env = append(cmd.Env, "ISTIO_META_REQUESTED_NETWORK_VIEW="+p.Network, "ISTIO_META_ROUTER_MODE=sni-dnat")
		}
	}
	cmd.Env = append(cmd.Env, o.Env...)
	logFile, err := os.Create(a.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	out := &lineLogger{t: t, prefix: "agent " + a.Name + ": ", file: logFile}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	a.cmd = cmd
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("starting pilot-agent: %v", err)
	}
	go func() {
		a.exitErr = cmd.Wait() // returns once the output is copied
		out.flush()
		logFile.Close()
		close(a.done)
	}()
	t.Cleanup(func() { a.stop(t) })
	return a
}

// waitFiles waits until the agent has written every file (it writes each
// atomically); it fails the test at once if the agent exits.
func (a *agentProcess) waitFiles(t *testing.T, timeout time.Duration, files ...string) {
	t.Helper()
	eventually(t, timeout, func() error {
		if !a.alive() {
			t.Fatalf("pilot-agent %s exited: %v", a.Name, a.exitErr)
		}
		for _, f := range files {
			if _, err := os.Stat(f); err != nil {
				return fmt.Errorf("pilot-agent %s has not written %s yet", a.Name, f)
			}
		}
		return nil
	})
}

func (a *agentProcess) alive() bool {
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and waits for the agent to exit (SIGKILL after 20 s).
func (a *agentProcess) stop(t *testing.T) {
	a.stopOnce.Do(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		case <-time.After(20 * time.Second):
			_ = a.cmd.Process.Kill()
			<-a.done
			t.Logf("pilot-agent %s did not stop within 20s of SIGTERM; killed", a.Name)
		}
	})
}

// certChain reads the agent's cert-chain.pem as DER certificates, leaf first.
func (a *agentProcess) certChain(t *testing.T) [][]byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(a.CertDir, "cert-chain.pem"))
	if err != nil {
		t.Fatal(err)
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
		t.Fatalf("pilot-agent %s: cert-chain.pem holds no certificate", a.Name)
	}
	return ders
}

// logContains reports whether the agent's log holds s.
func (a *agentProcess) logContains(s string) bool {
	data, _ := os.ReadFile(a.LogPath)
	return bytes.Contains(data, []byte(s))
}

// lineLogger writes a child's output to a file and, line by line, to the
// test log with a prefix. exec copies into it from its own goroutine,
// which Wait ends, so it never logs after the test's cleanup.
type lineLogger struct {
	t      *testing.T
	prefix string
	file   io.Writer
	mu     sync.Mutex
	buf    []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.file.Write(p)
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.t.Log(l.prefix + strings.TrimRight(string(l.buf[:i]), "\r"))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

// flush logs a last line without a newline.
func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.t.Log(l.prefix + string(l.buf))
		l.buf = nil
	}
}

// istioModuleDir is the Istio module's directory in the module cache (the
// one e2e/interop builds istiod and pilot-agent from).
func istioModuleDir(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio")
	cmd.Dir = "interop"
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("finding the Istio module (go list -m istio.io/istio in e2e/interop): %v", err)
	}
	return strings.TrimSpace(string(out))
}
