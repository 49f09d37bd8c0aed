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

// TestPilotAgentProxylessMTLS: the workloads of TestProxylessGRPCMTLS run
// as Istio runs proxyless gRPC, each next to a real pilot-agent that got
// its certificate from the hub's CA with a real token and wrote the cert
// files and the gRPC bootstrap the workload reads (GRPC_XDS_BOOTSTRAP);
// their xDS goes through the agents' proxies to the hub's mTLS port. In
// STRICT an xDS-credentials client in east calls the xDS-enabled server in
// west over mTLS, the server sees the client's SPIFFE ID, and a client
// without a certificate (insecure credentials, behind its own agent) is
// refused.
func TestPilotAgentProxylessMTLS(t *testing.T) {
	e := localcluster.Require(t, env)
	west := e.Cluster("west")
	ctx := testContext(t)
	ip := dataPlaneIP(t)
	pilotAgentBin(t)
	app := "amtls-" + rand.String(5)
	if err := localcluster.EnsureNamespace(ctx, client(t, west), app); err != nil {
		t.Fatal(err)
	}
	h := startAgentHub(t, e, spiffeid.RequireTrustDomainFromString("amtls.test"), "--mtls-mode", "STRICT")

	sa := h.agent(t, west, app, "echo")
	srv := startChild(t, "xdsserver", serverListenEnv+"="+net.JoinHostPort(ip, "0"), serverIDEnv+"=west", "GRPC_XDS_BOOTSTRAP="+sa.BootstrapPath)
	addr, err := net.ResolveTCPAddr("tcp", strings.TrimPrefix(srv.waitLine(t, 30*time.Second, "listening "), "listening "))
	if err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, client(t, west), app, "echo", "grpc", 7070,
		[]localcluster.Backend{{IP: addr.IP.String(), Port: int32(addr.Port)}}); err != nil {
		t.Fatal(err)
	}
	srv.waitLine(t, 60*time.Second, "serving")

	ca := h.agent(t, e.Cluster("east"), app, "caller")
	target := fmt.Sprintf("xds:///echo.%s.svc.cluster.local:7070", app)
	caller := spiffeid.RequireFromPath(h.td, "/ns/"+app+"/sa/caller").String()
	mtls := startChild(t, "xdsclient", clientTargetEnv+"="+target, clientCredsEnv+"=xds", "GRPC_XDS_BOOTSTRAP="+ca.BootstrapPath)
	if got := mtls.waitLine(t, 60*time.Second, "ok "); got != "ok west peer="+caller {
		t.Fatalf("xDS-credentials client behind its agent: %q; want ok west peer=%s", got, caller)
	}
	// One agent per workload, as in a pod: an agent's xDS proxy serves
	// one downstream stream at a time ("registered overlapping stream;
	// closing previous"), so two workloads behind one agent would take
	// turns losing their xDS stream.
	pa := h.agent(t, e.Cluster("east"), app, "plain")
	plain := startChild(t, "xdsclient", clientTargetEnv+"="+target, "GRPC_XDS_BOOTSTRAP="+pa.BootstrapPath)
	for range 3 {
		if l := plain.waitLine(t, 60*time.Second, ""); !strings.HasPrefix(l, "err ") {
			t.Fatalf("client without a certificate in STRICT: %q; want its calls refused", l)
		}
	}
	mtls.waitLine(t, 30*time.Second, "ok west peer="+caller)
	noNacks(t, h.hubProcess, app)
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
// interval would fail new handshakes once it expires (README: keep
// workload certificates well above 15 minutes).
func TestPilotAgentRotationKeepsMTLSCallsFlowing(t *testing.T) {
	t.Parallel() // it mostly waits for the agents' timers
	e := localcluster.Require(t, env)
	west := e.Cluster("west")
	ctx := testContext(t)
	ip := dataPlaneIP(t)
	pilotAgentBin(t)
	app := "arot-" + rand.String(5)
	if err := localcluster.EnsureNamespace(ctx, client(t, west), app); err != nil {
		t.Fatal(err)
	}
	h := startAgentHub(t, e, spiffeid.RequireTrustDomainFromString("arot.test"), "--mtls-mode", "STRICT")
	// Renewed when 85% of the lifetime is left (±1% jitter): ~18 s after
	// issuance, 100 s before the old certificate expires.
	short := []string{"SECRET_TTL=2m", "SECRET_GRACE_PERIOD_RATIO=0.85"}

	sa := h.agent(t, west, app, "echo", short...)
	srv := startChild(t, "xdsserver", serverListenEnv+"="+net.JoinHostPort(ip, "0"), serverIDEnv+"=west", "GRPC_XDS_BOOTSTRAP="+sa.BootstrapPath)
	addr, err := net.ResolveTCPAddr("tcp", strings.TrimPrefix(srv.waitLine(t, 30*time.Second, "listening "), "listening "))
	if err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, client(t, west), app, "echo", "grpc", 7070,
		[]localcluster.Backend{{IP: addr.IP.String(), Port: int32(addr.Port)}}); err != nil {
		t.Fatal(err)
	}
	srv.waitLine(t, 60*time.Second, "serving")

	ca := h.agent(t, e.Cluster("east"), app, "caller", short...)
	target := fmt.Sprintf("xds:///echo.%s.svc.cluster.local:7070", app)
	caller := spiffeid.RequireFromPath(h.td, "/ns/"+app+"/sa/caller").String()
	calls := startChild(t, "xdsclient", clientTargetEnv+"="+target, clientCredsEnv+"=xds", "GRPC_XDS_BOOTSTRAP="+ca.BootstrapPath)
	if got := calls.waitLine(t, 60*time.Second, "ok "); got != "ok west peer="+caller {
		t.Fatalf("xDS-credentials client behind its agent: %q; want ok west peer=%s", got, caller)
	}
	errsBefore, oksBefore := calls.errs.Load(), calls.oks.Load()

	first := map[*agentProcess]*x509.Certificate{
		sa: h.checkWorkloadCert(t, sa, app, "echo", "west"),
		ca: h.checkWorkloadCert(t, ca, app, "caller", "east"),
	}
	eventually(t, 3*time.Minute, func() error {
		for a, leaf := range first {
			if !a.alive() {
				t.Fatalf("pilot-agent %s exited: %v", a.Name, a.exitErr)
			}
			if c, err := x509.ParseCertificate(a.certChain(t)[0]); err != nil || c.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
				return fmt.Errorf("agent %s has not rotated its certificate yet (%v)", a.Name, err)
			}
		}
		return nil
	})
	h.checkWorkloadCert(t, sa, app, "echo", "west")
	h.checkWorkloadCert(t, ca, app, "caller", "east")
	// A few more calls after both rotations, then count.
	want := calls.oks.Load() + 20
	eventually(t, 30*time.Second, func() error {
		if n := calls.oks.Load(); n < want {
			return fmt.Errorf("%d calls succeeded; want %d", n, want)
		}
		return nil
	})
	if n := calls.errs.Load() - errsBefore; n != 0 {
		t.Errorf("%d calls failed across the rotations; want none", n)
	}
	t.Logf("%d calls succeeded across both agents' rotations, none failed", calls.oks.Load()-oksBefore)

	// One workload per agent (its xDS proxy serves one downstream stream):
	// the first client goes before the next one starts.
	calls.stdin.Close()
	for range calls.lines {
	}
	fresh := startChild(t, "xdsclient", clientTargetEnv+"="+target, clientCredsEnv+"=xds", "GRPC_XDS_BOOTSTRAP="+ca.BootstrapPath)
	if got := fresh.waitLine(t, 60*time.Second, "ok "); got != "ok west peer="+caller {
		t.Fatalf("a client started after the rotation: %q; want ok west peer=%s", got, caller)
	}
	noNacks(t, h.hubProcess, app)
}
