package e2e

import (
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
