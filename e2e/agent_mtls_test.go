package e2e

import (
	"crypto/x509"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

// agentMTLS is a hub in STRICT mode with the workloads of
// TestProxylessGRPCMTLS run as Istio runs proxyless gRPC: an xDS-enabled
// echo server in west and an xDS-credentials client in east, each next to
// its own real pilot-agent that got its certificate from the hub's CA with
// a real token and wrote the cert files and the gRPC bootstrap the
// workload reads (GRPC_XDS_BOOTSTRAP); their xDS goes through the agents'
// proxies to the hub's mTLS port.
type agentMTLS struct {
	h                   *agentHub
	server, clientAgent *agentProcess // west's and east's agents
	calls               *child        // the client, calling continuously
	app, target, caller string        // namespace; xds:/// target; the client's SPIFFE ID
}

// startAgentMTLS starts them (agentEnv: extra environment of both agents)
// and returns once the client's first call came back over mTLS.
func startAgentMTLS(t *testing.T, td, prefix string, agentEnv ...string) *agentMTLS {
	t.Helper()
	e := localcluster.Require(t, env)
	west := e.Cluster("west")
	ctx := testContext(t)
	ip := dataPlaneIP(t)
	pilotAgentBin(t)
	m := &agentMTLS{app: prefix + rand.String(5)}
	if err := localcluster.EnsureNamespace(ctx, client(t, west), m.app); err != nil {
		t.Fatal(err)
	}
	m.h = startAgentHub(t, e, spiffeid.RequireTrustDomainFromString(td), "--mtls-mode", "STRICT")

	m.server = m.h.agent(t, west, m.app, "echo", agentEnv...)
	srv := startChild(t, "xdsserver", serverListenEnv+"="+net.JoinHostPort(ip, "0"), serverIDEnv+"=west", "GRPC_XDS_BOOTSTRAP="+m.server.BootstrapPath)
	addr, err := net.ResolveTCPAddr("tcp", strings.TrimPrefix(srv.waitLine(t, 30*time.Second, "listening "), "listening "))
	if err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, client(t, west), m.app, "echo", "grpc", 7070,
		[]localcluster.Backend{{IP: addr.IP.String(), Port: int32(addr.Port)}}); err != nil {
		t.Fatal(err)
	}
	srv.waitLine(t, 60*time.Second, "serving")

	m.clientAgent = m.h.agent(t, e.Cluster("east"), m.app, "caller", agentEnv...)
	m.target = fmt.Sprintf("xds:///echo.%s.svc.cluster.local:7070", m.app)
	m.caller = spiffeid.RequireFromPath(m.h.td, "/ns/"+m.app+"/sa/caller").String()
	m.calls = m.startClient(t)
	return m
}

// startClient starts an xDS-credentials client behind east's agent and
// waits for its first call to come back from west over mTLS with the
// client's identity. One workload per agent, as in a pod: an agent's xDS
// proxy serves one downstream stream at a time ("registered overlapping
// stream; closing previous"), so a running client must be stopped first.
func (m *agentMTLS) startClient(t *testing.T) *child {
	t.Helper()
	c := startChild(t, "xdsclient", clientTargetEnv+"="+m.target, clientCredsEnv+"=xds", "GRPC_XDS_BOOTSTRAP="+m.clientAgent.BootstrapPath)
	if got := c.waitLine(t, 60*time.Second, "ok "); got != "ok west peer="+m.caller {
		t.Fatalf("xDS-credentials client behind its agent: %q; want ok west peer=%s", got, m.caller)
	}
	return c
}

// TestPilotAgentProxylessMTLS: in STRICT the client in east calls the
// server in west over mTLS and the server sees the client's SPIFFE ID
// (startAgentMTLS); a client without a certificate (insecure credentials,
// behind its own agent) is refused.
func TestPilotAgentProxylessMTLS(t *testing.T) {
	m := startAgentMTLS(t, "amtls.test", "amtls-")
	pa := m.h.agent(t, localcluster.Require(t, env).Cluster("east"), m.app, "plain")
	plain := startChild(t, "xdsclient", clientTargetEnv+"="+m.target, "GRPC_XDS_BOOTSTRAP="+pa.BootstrapPath)
	for range 3 {
		if l := plain.waitLine(t, 60*time.Second, ""); !strings.HasPrefix(l, "err ") {
			t.Fatalf("client without a certificate in STRICT: %q; want its calls refused", l)
		}
	}
	m.calls.waitLine(t, 30*time.Second, "ok west peer="+m.caller)
	noNacks(t, m.h.hubProcess, m.app)
}

// TestPilotAgentRotationKeepsMTLSCallsFlowing: with two-minute
// certificates both real agents (server in west, client in east) rotate
// theirs from the hub's CA while the client keeps calling the server over
// mTLS; no call fails, and a client started after the rotation (a new
// handshake with the rotated files) is accepted with its SPIFFE ID.
//
// grpc-go re-reads the agent's files only every 15 minutes (the
// refresh_interval Istio's agent writes into the bootstrap), so a running
// workload keeps presenting the certificate it loaded; connections are
// unaffected by a rotation, and a certificate shorter-lived than that
// interval would fail new handshakes once it expires (docs/security.md: keep
// workload certificates well above 15 minutes).
func TestPilotAgentRotationKeepsMTLSCallsFlowing(t *testing.T) {
	t.Parallel() // it mostly waits for the agents' timers
	// Renewed when 85% of the lifetime is left (±1% jitter): ~18 s after
	// issuance, 100 s before the old certificate expires.
	m := startAgentMTLS(t, "arot.test", "arot-", "SECRET_TTL=2m", "SECRET_GRACE_PERIOD_RATIO=0.85")
	errsBefore, oksBefore := m.calls.errs.Load(), m.calls.oks.Load()

	first := map[*agentProcess]*x509.Certificate{
		m.server:      m.h.checkWorkloadCert(t, m.server, m.app, "echo", "west"),
		m.clientAgent: m.h.checkWorkloadCert(t, m.clientAgent, m.app, "caller", "east"),
	}
	eventually(t, 3*time.Minute, func() error {
		for a, leaf := range first {
			if !a.alive() {
				t.Fatalf("%s: %v", a.Name, a.Exited())
			}
			if c, err := x509.ParseCertificate(a.certChain(t)[0]); err != nil || c.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
				return fmt.Errorf("agent %s has not rotated its certificate yet (%v)", a.Name, err)
			}
		}
		return nil
	})
	m.h.checkWorkloadCert(t, m.server, m.app, "echo", "west")
	m.h.checkWorkloadCert(t, m.clientAgent, m.app, "caller", "east")
	// A few more calls after both rotations, then count.
	want := m.calls.oks.Load() + 20
	eventually(t, 30*time.Second, func() error {
		if n := m.calls.oks.Load(); n < want {
			return fmt.Errorf("%d calls succeeded; want %d", n, want)
		}
		return nil
	})
	if n := m.calls.errs.Load() - errsBefore; n != 0 {
		t.Errorf("%d calls failed across the rotations; want none", n)
	}
	t.Logf("%d calls succeeded across both agents' rotations, none failed", m.calls.oks.Load()-oksBefore)

	m.calls.stdin.Close()
	for range m.calls.lines { // until it exited
	}
	m.startClient(t)
	noNacks(t, m.h.hubProcess, m.app)
}
