package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/xds"

	"github.com/hubmesh/hub/internal/workload"
)

// The demo's workloads are this binary run again by the demo in a hidden
// role, inside the demo's network namespace: the command line (and `hubdemo
// -h`) knows nothing of them. demoChildEnv selects the role; the others
// configure it. Both roles read their gRPC xDS bootstrap from the file
// GRPC_XDS_BOOTSTRAP names (the hub's xDS port, the member they pretend to
// run in, a file_watcher certificate provider for mTLS), as a workload
// next to Istio's agent does, and exit when their stdin closes.
const (
	demoChildEnv  = "HUB_DEMO_CHILD"  // "server" or "client"
	demoListenEnv = "HUB_DEMO_LISTEN" // server: ip:port to serve on
	demoMemberEnv = "HUB_DEMO_MEMBER" // server: the member it answers as
	demoTargetEnv = "HUB_DEMO_TARGET" // client: the xds:/// target it calls, or its sidecar's outbound address
	demoRateEnv   = "HUB_DEMO_RATE"   // client: calls per second
	// demoAuthorityEnv makes a client a sidecar's app: plaintext to the
	// target (its sidecar's outbound listener) with this :authority (the
	// host:port the sidecar routes by).
	demoAuthorityEnv = "HUB_DEMO_AUTHORITY"
)

// runDemoChild runs the role and returns the process's exit code.
func runDemoChild(role string) int {
	go func() { // the demo closes our stdin to stop us
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	var err error
	switch role {
	case "server":
		err = runDemoServer(os.Getenv(demoListenEnv), os.Getenv(demoMemberEnv))
	case "client":
		err = runDemoClient(os.Getenv(demoTargetEnv), os.Getenv(demoRateEnv), os.Getenv(demoAuthorityEnv))
	default:
		err = fmt.Errorf("unknown demo role %q", role)
	}
	fmt.Fprintf(os.Stderr, "hubdemo %s: %v\n", role, err)
	return 1
}

// runDemoServer serves workload.Echo, answering as member, as an
// xDS-enabled gRPC server: the hub's
// inbound listener for addr decides whether callers must present a
// certificate (--mtls-mode). It logs its serving mode changes.
func runDemoServer(addr, member string) error {
	creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		return fmt.Errorf("xDS server credentials: %w", err)
	}
	srv, err := xds.NewGRPCServer(grpc.Creds(creds), xds.ServingModeCallback(func(a net.Addr, args xds.ServingModeChangeArgs) {
		fmt.Printf("%s %s %v\n", a, args.Mode, args.Err)
	}))
	if err != nil {
		return fmt.Errorf("xDS gRPC server: %w", err)
	}
	testgrpc.RegisterTestServiceServer(srv, &workload.Echo{ID: member})
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	fmt.Printf("listening %s as %s\n", lis.Addr(), member)
	return srv.Serve(lis)
}

// demoStats is what a demo client reports once a second on stdout (one
// JSON object per line): the calls of the last second by the member that
// answered, the failed ones, and the successful ones over mTLS (the server
// saw the client's SPIFFE ID).
type demoStats struct {
	Calls     int            `json:"calls"`
	Errors    int            `json:"errors"`
	MTLS      int            `json:"mtls"`
	ByMember  map[string]int `json:"byMember"`
	LastError string         `json:"lastError,omitempty"`
}

// runDemoClient calls target's TestService at about rate calls per second
// and reports demoStats every second: over xDS credentials (mTLS where the
// hub's clusters say so), or, with authority, in plaintext to its sidecar,
// which carries the call over Istio mTLS.
func runDemoClient(target, rate, authority string) error {
	var perSecond int
	if _, err := fmt.Sscan(rate, &perSecond); err != nil || perSecond <= 0 {
		return fmt.Errorf("%s=%q: want a positive number", demoRateEnv, rate)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority(authority)}
	if authority == "" {
		creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
		if err != nil {
			return fmt.Errorf("xDS client credentials: %w", err)
		}
		opts = []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return fmt.Errorf("dialing %s: %w", target, err)
	}
	defer conn.Close()
	echo := testgrpc.NewTestServiceClient(conn)

	var mu sync.Mutex
	cur := demoStats{ByMember: map[string]int{}}
	go func() { // reporter: lives as long as the process
		out := json.NewEncoder(os.Stdout)
		for range time.Tick(time.Second) {
			mu.Lock()
			s := cur
			cur = demoStats{ByMember: map[string]int{}}
			mu.Unlock()
			_ = out.Encode(s)
		}
	}()
	tick := time.NewTicker(time.Second / time.Duration(perSecond))
	defer tick.Stop()
	for range tick.C {
		// Generous: a call that fails shows on the terminal as an error.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := echo.UnaryCall(ctx, &testgrpc.SimpleRequest{FillServerId: true})
		cancel()
		mu.Lock()
		cur.Calls++
		if err != nil {
			cur.Errors++
			cur.LastError = strings.ReplaceAll(err.Error(), "\n", " ")
		} else {
			cur.ByMember[resp.GetServerId()]++
			if strings.HasPrefix(resp.GetUsername(), "spiffe://") {
				cur.MTLS++
			}
		}
		mu.Unlock()
	}
	return nil
}
