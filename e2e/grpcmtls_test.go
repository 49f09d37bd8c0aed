package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/xds"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"

	xdscreds "google.golang.org/grpc/credentials/xds"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/workload"
	"github.com/hubmesh/hub/trust"
)

// The xDS-enabled gRPC server child (role "xdsserver") and the client
// child with xDS credentials (role "xdsclient", HUB_E2E_CLIENT_CREDS=xds)
// read their bootstrap from the file GRPC_XDS_BOOTSTRAP names, as a
// workload run by Istio's agent does, so a harness that runs them under a
// real pilot-agent can reuse them unchanged. Their stdout is one
// machine-readable line per event:
//
//	server: "listening <ip:port>", "serving", "not-serving <reason>",
//	        "call peer=<SPIFFE ID of the caller, or - for plaintext>"
//	client: "ok <server id> peer=<the caller's identity the server saw>", "err <message>"
//	        (and with HUB_E2E_CLIENT_EMPTYCALL "empty ok", "empty err <message>";
//	        with HUB_E2E_CLIENT_LOAD once "load <loadResult>")
const (
	serverListenEnv = "HUB_E2E_LISTEN"       // ip:port the server listens on (port 0: a free one)
	serverIDEnv     = "HUB_E2E_SERVER_ID"    // what the server answers as server_id, e.g. its member
	clientCredsEnv  = "HUB_E2E_CLIENT_CREDS" // "xds": xDS client credentials (insecure fallback); else insecure
	// clientEmptyCallEnv, when set, makes the client call EmptyCall before
	// each UnaryCall, printing "empty ok" or "empty err <message>".
	clientEmptyCallEnv = "HUB_E2E_CLIENT_EMPTYCALL"
	// clientLoadEnv, when set to a duration, makes the client, after its
	// first answer, call from 4 goroutines back to back for that long and
	// print "load <loadResult>" (loadRun), once.
	clientLoadEnv = "HUB_E2E_CLIENT_LOAD"
)

// echoServer answers with its id and the caller's identity
// (workload.Peer), printing "call peer=<identity>" for every call.
func echoServer(id string) *workload.Echo {
	return &workload.Echo{ID: id, OnCall: func(caller string) { fmt.Printf("call peer=%s\n", caller) }}
}

// runXDSServer serves TestService with xDS server credentials (insecure
// fallback) on HUB_E2E_LISTEN until stdin closes.
func runXDSServer() {
	fail := func(err error) {
		fmt.Printf("fatal %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		fail(err)
	}
	srv, err := xds.NewGRPCServer(grpc.Creds(creds), xds.ServingModeCallback(func(_ net.Addr, args xds.ServingModeChangeArgs) {
		if args.Err != nil {
			fmt.Printf("not-serving %s\n", strings.ReplaceAll(args.Err.Error(), "\n", " "))
			return
		}
		fmt.Printf("%s\n", strings.ToLower(strings.ReplaceAll(args.Mode.String(), "_", "-"))) // serving, not-serving
	}))
	if err != nil {
		fail(err)
	}
	testgrpc.RegisterTestServiceServer(srv, echoServer(os.Getenv(serverIDEnv)))
	lis, err := net.Listen("tcp", os.Getenv(serverListenEnv))
	if err != nil {
		fail(err)
	}
	fmt.Printf("listening %s\n", lis.Addr())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		srv.Stop()
		os.Exit(0)
	}()
	if err := srv.Serve(lis); err != nil {
		fail(err)
	}
	select {} // Stop was called: the stdin goroutine exits
}

// clientCreds are the xDS client child's transport credentials.
func clientCreds() (credentials.TransportCredentials, error) {
	if os.Getenv(clientCredsEnv) == "xds" {
		return xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	}
	return insecure.NewCredentials(), nil
}

// child is a running child process of this test binary and its stdout lines.
type child struct {
	lines chan string
	stdin io.WriteCloser
	// oks and errs count every "ok " and "err " line, read or dropped.
	oks, errs atomic.Int64
}

// startChild runs this test binary in role with env, until the test ends.
func startChild(t *testing.T, role string, env ...string) *child {
	t.Helper()
	return startCommand(t, role, exec.Command(os.Args[0], "-test.run=^$"), env...)
}

// startCommand is startChild for a command that runs this test binary
// (e.g. inside another network namespace).
func startCommand(t *testing.T, role string, cmd *exec.Cmd, env ...string) *child {
	t.Helper()
	cmd.Env = append(append(os.Environ(), clientRoleEnv+"="+role), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", role, err)
	}
	c := &child{lines: make(chan string, 4096), stdin: stdin}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			switch l := sc.Text(); {
			case strings.HasPrefix(l, "ok "):
				c.oks.Add(1)
			case strings.HasPrefix(l, "err "):
				c.errs.Add(1)
			}
			select {
			case c.lines <- sc.Text():
			default: // not read: drop
			}
		}
	})
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
		wg.Wait()
	})
	return c
}

// waitLine returns the first line with prefix.
func (c *child) waitLine(t *testing.T, timeout time.Duration, prefix string) string {
	t.Helper()
	deadline := time.After(timeout)
	var last string
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited while waiting for %q (last line %q)", prefix, last)
			}
			last = l
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			t.Fatalf("no line %q within %s (last line %q)", prefix, timeout, last)
		}
	}
}

// workloadFiles writes what Istio's agent writes for a workload
// (OUTPUT_CERTS: key.pem, cert-chain.pem, root-cert.pem) for id, bound to
// member, and a gRPC bootstrap like the agent's (one file_watcher
// certificate provider "default", the inbound listener name template,
// node metadata GENERATOR=grpc) whose xds_servers is xdsAddr (plaintext;
// the agent's own proxy in a real pod). It returns the bootstrap's path.
func workloadFiles(t *testing.T, ca *trust.CA, rootsPEM []byte, id spiffeid.ID, member, ip, xdsAddr string) string {
	t.Helper()
	dir := t.TempDir()
	svid, err := ca.IssueWorkloadSVID(id, member, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	chainPEM, keyPEM, err := svid.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ns, sa := idParts(t, id)
	data, err := workload.Bootstrap{XDSAddr: xdsAddr, NodeID: workload.NodeID(ip, sa, ns), ClusterID: member, Namespace: ns, CertDir: dir}.JSON()
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"cert-chain.pem": chainPEM, "key.pem": keyPEM, "root-cert.pem": rootsPEM, "grpc-bootstrap.json": data} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "grpc-bootstrap.json")
}

// idParts returns a workload identity's namespace and service account.
func idParts(t *testing.T, id spiffeid.ID) (ns, sa string) {
	t.Helper()
	parts := strings.Split(id.Path(), "/")
	if len(parts) != 5 || parts[1] != "ns" || parts[3] != "sa" {
		t.Fatalf("%s is not /ns/<ns>/sa/<sa>", id)
	}
	return parts[2], parts[4]
}

// TestProxylessGRPCMTLS: a grpc-go xDS-enabled server (xDS server
// credentials) in member west and grpc-go clients in member east, all
// configured by the hub's xDS and holding certificates of the hub's CA.
// STRICT: a client with xDS credentials calls over mTLS and the server sees
// its SPIFFE ID; a plaintext client is refused. PERMISSIVE: the plaintext
// client's calls succeed (and the xDS-credentials client falls back to
// plaintext, as Istio's proxyless gRPC does).
func TestProxylessGRPCMTLS(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west := e.Cluster("primary"), e.Cluster("west")
	ctx := testContext(t)
	ip := dataPlaneIP(t)
	app := "pgrpc-" + rand.String(5)
	if err := localcluster.EnsureNamespace(ctx, client(t, west), app); err != nil {
		t.Fatal(err)
	}
	ns := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"west": west.Kubeconfig(), "east": e.Cluster("east").Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("pgrpc.test")
	serverID := spiffeid.RequireFromPath(td, "/ns/"+app+"/sa/echo")
	clientID := spiffeid.RequireFromPath(td, "/ns/"+app+"/sa/caller")
	target := fmt.Sprintf("xds:///echo.%s.svc.cluster.local:7070", app)

	for _, mode := range []string{"STRICT", "PERMISSIVE"} {
		t.Run(mode, func(t *testing.T) {
			h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--mtls-mode", mode)
			ca := hubCA(t, home, ns, td)
			var roots []byte
			for _, c := range h.bundle(t, td).X509Authorities() {
				roots = append(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
			}

			// A federated trust domain's workloads are accepted where the
			// server's ROOTCA file holds that domain's roots too (Istio's
			// agent writes only our root there; see the report).
			peerCA, err := trust.NewSelfSignedCA(spiffeid.RequireTrustDomainFromString("peer.test"), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			serverRoots := append(append([]byte(nil), roots...), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: peerCA.Cert.Raw})...)
			srv := startChild(t, "xdsserver", serverListenEnv+"="+net.JoinHostPort(ip, "0"), serverIDEnv+"=west",
				"GRPC_XDS_BOOTSTRAP="+workloadFiles(t, ca, serverRoots, serverID, "west", ip, h.xdsAddr))
			addr, err := net.ResolveTCPAddr("tcp", strings.TrimPrefix(srv.waitLine(t, 30*time.Second, "listening "), "listening "))
			if err != nil {
				t.Fatal(err)
			}
			if err := localcluster.ApplyService(ctx, client(t, west), app, "echo", "grpc", 7070,
				[]localcluster.Backend{{IP: addr.IP.String(), Port: int32(addr.Port)}}); err != nil {
				t.Fatal(err)
			}
			// The server serves once the hub gave it its inbound listener.
			srv.waitLine(t, 60*time.Second, "serving")

			xdsEnv := []string{clientTargetEnv + "=" + target, clientCredsEnv + "=xds",
				"GRPC_XDS_BOOTSTRAP=" + workloadFiles(t, ca, roots, clientID, "east", ip, h.xdsAddr)}
			plainEnv := []string{clientTargetEnv + "=" + target,
				"GRPC_XDS_BOOTSTRAP=" + workloadFiles(t, ca, roots, spiffeid.RequireFromPath(td, "/ns/"+app+"/sa/plain"), "east", ip, h.xdsAddr)}
			if mode == "STRICT" {
				mtls := startChild(t, "xdsclient", xdsEnv...)
				want := "ok west peer=" + clientID.String()
				got := mtls.waitLine(t, 60*time.Second, "ok ")
				if got != want {
					t.Fatalf("xDS-credentials client: %q; want %q (an mTLS call that the server saw as the client's SPIFFE ID)", got, want)
				}
				srv.waitLine(t, 10*time.Second, "call peer="+clientID.String())

				// A client without a certificate: its calls are refused
				// by the server's TLS, however long it tries.
				plain := startChild(t, "xdsclient", plainEnv...)
				for i := range 5 {
					l := plain.waitLine(t, 60*time.Second, "")
					if !strings.HasPrefix(l, "err ") {
						t.Fatalf("plaintext client in STRICT: %q; want its calls refused", l)
					}
					if i == 0 {
						t.Logf("plaintext client in STRICT: %s", l)
					}
				}
				// And the mTLS client still works meanwhile.
				mtls.waitLine(t, 30*time.Second, want)

				peerID := spiffeid.RequireFromPath(peerCA.TrustDomain, "/ns/"+app+"/sa/visitor")
				visitor := startChild(t, "xdsclient", clientTargetEnv+"="+target, clientCredsEnv+"=xds",
					"GRPC_XDS_BOOTSTRAP="+workloadFiles(t, peerCA, roots, peerID, "east", ip, h.xdsAddr))
				if got := visitor.waitLine(t, 60*time.Second, "ok "); got != "ok west peer="+peerID.String() {
					t.Fatalf("client of a federated trust domain: %q; want ok west peer=%s", got, peerID)
				}

				// The Service declares its identity (Istio's annotation):
				// clients accept exactly it. Declaring another one makes
				// new clients refuse the server; its own makes them accept.
				for _, tc := range []struct {
					sa string
					ok bool
				}{{"someone-else", false}, {"echo", true}} {
					annotate(t, ctx, west, app, "echo", clusters.AnnotationKubernetesServiceAccounts, tc.sa)
					waitClusterSAN(t, h, "sidecar~"+ip+"~caller."+app+"~"+app+".svc.cluster.local",
						"spiffe://"+td.Name()+"/ns/"+app+"/sa/"+tc.sa)
					c := startChild(t, "xdsclient", xdsEnv...)
					l := c.waitLine(t, 60*time.Second, "")
					if strings.HasPrefix(l, "ok ") != tc.ok {
						t.Fatalf("service declaring %s: a new client's first call %q; want ok=%v", tc.sa, l, tc.ok)
					}
					t.Logf("service declaring %s: %s", tc.sa, l)
				}
				noNacks(t, h, app)
				return
			}
			plain := startChild(t, "xdsclient", plainEnv...)
			if got := plain.waitLine(t, 60*time.Second, "ok "); got != "ok west peer=-" {
				t.Fatalf("plaintext client in PERMISSIVE: %q; want a plaintext call (ok west peer=-)", got)
			}
			xc := startChild(t, "xdsclient", xdsEnv...)
			if got := xc.waitLine(t, 60*time.Second, "ok "); got != "ok west peer=-" {
				t.Fatalf("xDS-credentials client in PERMISSIVE: %q; want plaintext, as Istio's proxyless gRPC (ok west peer=-)", got)
			}
			noNacks(t, h, app)
		})
	}
}

// noNacks asserts that none of the app's gRPC streams the hub lists
// (server and clients) rejected anything it was sent, and that the server
// (pod echo or echo-<random>) acknowledged its inbound listener.
func noNacks(t *testing.T, h *hubProcess, app string) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		var proxies api.List[api.Proxy]
		h.getJSON(t, "/api/v1/proxies", &proxies)
		serverAcked := false
		for _, p := range proxies.Items {
			if !strings.Contains(p.ID, "."+app+"~") {
				continue
			}
			for _, ts := range p.Types {
				if ts.Nacks > 0 {
					t.Fatalf("proxy %s NACKed %s: %s", p.ID, ts.Type, ts.NackError)
				}
				// The server's pod is echo (or echo-<random> under an agent).
				if strings.Contains(p.ID, "~echo") && ts.Type == "LDS" && ts.AckedVersion != "" {
					serverAcked = true
				}
			}
		}
		if !serverAcked {
			return fmt.Errorf("the server's inbound listener is not acknowledged yet: %+v", proxies.Items)
		}
		return nil
	})
}

// annotate sets an annotation of a Service.
func annotate(t *testing.T, ctx context.Context, c *localcluster.Cluster, ns, name, key, value string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client(t, c).CoreV1().Services(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotating service %s/%s: %v", ns, name, err)
	}
}

// waitClusterSAN waits until the Cluster the hub last sent to a proxy
// (its newest stream) matches exactly san as the peer's identity.
func waitClusterSAN(t *testing.T, h *hubProcess, proxyID, san string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		_, body := h.do(t, "GET", "/api/v1/proxies/"+url.PathEscape(proxyID)+"/config", "")
		if !strings.Contains(body, san) {
			return fmt.Errorf("the Clusters of %s do not name %s yet", proxyID, san)
		}
		return nil
	})
}
