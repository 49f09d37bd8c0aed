package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	_ "google.golang.org/grpc/xds" // registers the xds:/// resolver and balancers
)

// The grpc-go xDS client runs as a child process (this test binary, re-run
// with clientRoleEnv set) because grpc-go reads GRPC_XDS_BOOTSTRAP_CONFIG
// once per process.
const (
	clientRoleEnv   = "HUB_E2E_ROLE"
	clientTargetEnv = "HUB_E2E_TARGET"
)

// runXDSClient calls the target's TestService in a loop and prints one line
// per call: "ok <server id>" (followed by " peer=<identity>" when the
// server reports the caller's identity, see echoServer) or "err <message>".
// The target may list several (comma-separated): they are called in turn,
// over one xDS client. Its credentials are insecure, or xDS ones
// (clientCredsEnv). It exits when stdin closes.
func runXDSClient() {
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	creds, err := clientCreds()
	if err != nil {
		fmt.Printf("fatal %v\n", err)
		os.Exit(1)
	}
	var clients []testgrpc.TestServiceClient
	for _, target := range strings.Split(os.Getenv(clientTargetEnv), ",") {
		conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
		if err != nil {
			fmt.Printf("fatal %v\n", err)
			os.Exit(1)
		}
		clients = append(clients, testgrpc.NewTestServiceClient(conn))
	}
	alsoEmpty := os.Getenv(clientEmptyCallEnv) != ""
	load, _ := time.ParseDuration(os.Getenv(clientLoadEnv))
	for i := 0; ; i++ {
		c := clients[i%len(clients)]
		if alsoEmpty {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
			cancel()
			if err != nil {
				fmt.Printf("empty err %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			} else {
				fmt.Printf("empty ok\n")
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{FillServerId: true})
		cancel()
		if err != nil {
			fmt.Printf("err %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if caller := resp.GetUsername(); caller != "" {
			fmt.Printf("ok %s peer=%s\n", resp.GetServerId(), caller)
		} else {
			fmt.Printf("ok %s\n", resp.GetServerId())
		}
		if load > 0 { // once, after the first answer
			r := loadRun(context.Background(), 4, load, func(ctx context.Context) error {
				_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{})
				return err
			})
			fmt.Printf("load %s\n", r)
			load = 0
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// xdsClient is the parent's handle on a running child client.
type xdsClient struct {
	lines chan clientLine
	stdin io.WriteCloser
	cmd   *exec.Cmd
	// Every call's outcome is counted, whether or not the test reads lines.
	oks, errs atomic.Int64
}

type clientLine struct {
	at   time.Time
	text string
}

// startXDSClient starts a grpc-go xDS client child for target against the
// hub's plaintext port.
func startXDSClient(t *testing.T, xdsAddr, target, clusterID, namespace string) *xdsClient {
	t.Helper()
	return startXDSClientWith(t, xdsAddr, `[{"type":"insecure"}]`, nil, target, clusterID, namespace)
}

// startXDSClientWith starts a grpc-go xDS client child whose bootstrap
// connects to xdsAddr with channelCreds (JSON), with extra environment.
func startXDSClientWith(t *testing.T, xdsAddr, channelCreds string, env []string, target, clusterID, namespace string) *xdsClient {
	t.Helper()
	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":%s,"server_features":["xds_v3"]}],
"node":{"id":"sidecar~198.18.0.1~client.%s~%s.svc.cluster.local","metadata":{"CLUSTER_ID":%q,"NAMESPACE":%q}}}`,
		xdsAddr, channelCreds, namespace, namespace, clusterID, namespace)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), clientRoleEnv+"=xdsclient", clientTargetEnv+"="+target, "GRPC_XDS_BOOTSTRAP_CONFIG="+bootstrap)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting xDS client: %v", err)
	}
	c := &xdsClient{lines: make(chan clientLine, 4096), stdin: stdin, cmd: cmd}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ok ") {
				c.oks.Add(1)
			} else {
				c.errs.Add(1)
			}
			select {
			case c.lines <- clientLine{time.Now(), sc.Text()}:
			default: // the test is not reading right now; drop
			}
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
		wg.Wait()
	})
	return c
}

// waitFor reads client lines until match returns true for one, and returns
// that line. Lines before it are passed to match too.
func (c *xdsClient) waitFor(t *testing.T, timeout time.Duration, what string, match func(clientLine) bool) clientLine {
	t.Helper()
	deadline := time.After(timeout)
	var last string
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("xDS client exited while waiting for %s (last line %q)", what, last)
			}
			last = l.text
			if match(l) {
				return l
			}
		case <-deadline:
			t.Fatalf("xDS client: no %s within %s (last line %q)", what, timeout, last)
		}
	}
}

// drain discards buffered lines, so that later reads see only new calls.
func (c *xdsClient) drain() {
	for {
		select {
		case <-c.lines:
		default:
			return
		}
	}
}

// backend is a real gRPC TestService server that answers with its name
// only (workload.Echo also names the caller, which these tests' lines do
// not expect).
type backend struct {
	testgrpc.UnimplementedTestServiceServer
	name string
	addr *net.TCPAddr
	// stop stops serving (its listener closes: calls are refused); it is
	// also called when the test ends.
	stop func()
}

func (b *backend) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{ServerId: b.name, Hostname: b.name}, nil
}

// startBackend serves a backend on ip with a free port until the test ends.
func startBackend(t *testing.T, ip, name string) *backend {
	t.Helper()
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("listening on %s: %v", ip, err)
	}
	b := &backend{name: name, addr: lis.Addr().(*net.TCPAddr)}
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, b)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	var once sync.Once
	b.stop = func() {
		once.Do(func() {
			srv.Stop()
			<-done
		})
	}
	t.Cleanup(b.stop)
	return b
}

// dataPlaneIP returns a non-loopback address of this machine that backends
// can bind to and EndpointSlices accept (docs/architecture.md §5): HUB_TEST_DATAPLANE_IP,
// set by `make test` inside its network namespace.
func dataPlaneIP(t *testing.T) string {
	t.Helper()
	ip := os.Getenv("HUB_TEST_DATAPLANE_IP")
	if ip == "" {
		ip = "198.18.0.1"
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err == nil {
		l.Close()
		return ip
	}
	missing(t, fmt.Sprintf("data-plane address %s is not on this machine (%v); run through `make test`, which creates a network namespace with it", ip, err))
	return ""
}
