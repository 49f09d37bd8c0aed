package e2e

// A real Istio pilot-agent (internal/pilotagent) for a workload of a member:
// its ServiceAccount and a real projected token come from the member's API
// server, its output goes to the test log, and it is stopped when the test
// ends.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/pilotagent"
)

// pilotAgentBin returns $HUB_PILOT_AGENT_BIN, or fails the test in CI and
// skips it elsewhere, saying how to get the binary.
func pilotAgentBin(t *testing.T) string {
	t.Helper()
	const how = "build it with `e2e/interop/build-istiod.sh pilot-agent` (~11 min cold on 2 cores with istiod; prints the cached binary's path) " +
		"and export " + pilotagent.BinEnv + "=<that path>, or run `make test`"
	return binaryFromEnv(t, pilotagent.BinEnv, how)
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

// dataPlaneProxy makes an agent a real Istio sidecar or gateway fed by a
// member istiod (pilotagent.Proxy).
type dataPlaneProxy = pilotagent.Proxy

// agentProcess is a running pilot-agent, stopped when the test ends.
type agentProcess struct {
	*pilotagent.Process
	out *lineLogger
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
	token, err := pilotagent.Token(ctx, client(t, o.Member), o.Namespace, o.ServiceAccount)
	if err != nil {
		t.Fatalf("%s: %v", o.Member.Name, err)
	}
	// Unix socket paths are limited to 108 bytes: keep the directory short.
	dir, err := os.MkdirTemp("", "agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	out := &lineLogger{t: t, prefix: "agent " + o.PodName + "." + o.Namespace + ": "}
	p, err := pilotagent.Start(pilotagent.Options{Bin: bin, Dir: dir, Token: token, RootPEM: o.RootPEM, ClusterID: o.Member.Name,
		Namespace: o.Namespace, ServiceAccount: o.ServiceAccount, PodName: o.PodName, PodIP: o.PodIP, TrustDomain: o.TrustDomain,
		HubAddr: o.HubAddr, HubName: o.HubName, Envoy: o.Envoy, Proxy: o.Proxy, Env: o.Env, Output: out})
	if err != nil {
		t.Fatal(err)
	}
	a := &agentProcess{Process: p, out: out}
	t.Cleanup(func() { a.stop(t) })
	return a
}

// waitFiles waits until the agent has written every file; it fails the
// test at once if the agent exits.
func (a *agentProcess) waitFiles(t *testing.T, timeout time.Duration, files ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(testContext(t), timeout)
	defer cancel()
	if err := a.WaitFiles(ctx, files...); err != nil {
		t.Fatal(err)
	}
}

func (a *agentProcess) alive() bool { return a.Exited() == nil }

// stop stops the agent and its Envoy (pilotagent.Process.Stop) and logs a
// last line without a newline.
func (a *agentProcess) stop(t *testing.T) {
	if a.Stop() {
		t.Logf("pilot-agent %s did not stop within 20s of SIGTERM; killed its process group", a.Name)
	}
	a.out.flush()
}

// certChain reads the agent's cert-chain.pem as DER certificates, leaf first.
func (a *agentProcess) certChain(t *testing.T) [][]byte {
	t.Helper()
	ders, err := a.CertChain()
	if err != nil {
		t.Fatal(err)
	}
	return ders
}

func (a *agentProcess) logContains(s string) bool { return a.LogContains(s) }

// lineLogger writes a child's output line by line to the test log with a
// prefix. exec copies into it from its own goroutine, which Wait ends, so
// it never logs after the test's cleanup.
type lineLogger struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
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
