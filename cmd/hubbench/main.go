// Command hubbench measures the hub end to end with real parts: real local
// Kubernetes API servers (internal/localcluster) hold the services, the real
// hub binary runs as a child process, and hubbench opens the ADS streams
// itself, one gRPC connection per stream, like a fleet of proxies.
//
//	hubbench [--members 10] [--services 1000] [--endpoints 20000] [--streams 2000]
//	         [--shape named|envoy|grpc|istiod|ca] [--services-per-stream N|all]
//	         [--writes 20] [--delta] [--delta-node-every-request]
//	         [--bulk N --bulk-writers 8] [--real-envoys N] [--json]
//	hubbench --members 300 --apiservers 10 [--services-per-member 100]
//	         [--endpoints-per-service 10] [--also-shapes envoy] [--idle-window 30s]
//
// The shape is what every stream subscribes to, like a kind of client
// (shapes.go): envoy (CDS wildcard, then EDS for every cluster CDS
// returned), grpc (grpc-go's xds:///<host>:<port>: LDS, RDS, CDS and EDS by
// name), istiod (a member istiod taking Istio config over MCP-over-XDS: 16
// config types as wildcards, measured on the ServiceEntry of the written
// service; 10 streams by default), ca (istio-agents asking the hub's CA for
// certificates, ca.go) or named (the default: CDS wildcard and
// EDS for 50 random services).
//
// It reports how long the hub takes to sync every member, how long every
// stream takes to receive its first full configuration (cold connect), how
// long an EndpointSlice write takes to reach every stream that watches it
// (convergence), how many responses were resent, the hub process's memory
// and CPU, also per write, and its live heap per stream. With --bulk (envoy
// shape), W writers then create N new services while the streams watch
// (bulk.go): responses per stream, hub CPU, API write time and time to
// converge. With --apiservers N below --members (the scale mode, scale.go)
// the members are many IDs registered over N real API servers, each with
// its own remote Secret, client certificate and namespace, and it also
// reports time to every member Ready (after start and after a restart),
// memory per member and per endpoint, idle CPU, REST and dashboard
// response times and each shape's convergence. With --real-envoys N
// (envoy shape, also with --peer istiod) N real Envoy processes are the
// fleet instead of simulated streams, and every write is timed at each
// Envoy's admin API, with their NACKs, warming clusters and memory
// (realenvoy.go). See docs/performance.md for the figures and how to read
// them.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var cfg Config
	var asJSON, requireTargets bool
	fs := flag.NewFlagSet("hubbench", flag.ContinueOnError)
	cfg.register(fs)
	fs.BoolVar(&asJSON, "json", false, "print the summary as JSON on stdout (progress still goes to stderr)")
	fs.BoolVar(&requireTargets, "require-targets", false, "exit 1 when a target of the shape is missed (named: p99 convergence ≤ 250 ms, hub peak RSS ≤ 400 MiB; envoy: p99 ≤ 150 ms, peak RSS ≤ 600 MiB (Delta 400), hub CPU ≤ 15 ms per write; grpc: p99 ≤ 50 ms; istiod: p99 ≤ 20 ms)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "hubbench: unexpected arguments %q\n", fs.Args())
		os.Exit(2)
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "hubbench: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second interrupt kills us at once (children die with us)
	}()
	cfg.Progress = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s hubbench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}

	if cfg.Shape == shapeCA {
		sum, err := runCA(ctx, cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "hubbench: FAILED: %v\n", err)
			os.Exit(1)
		}
		if asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(sum)
		} else {
			sum.WriteText(os.Stdout)
		}
		return
	}
	sum, err := run(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(os.Stderr, "hubbench: interrupted: %v\n", err)
			stop()
			os.Exit(130)
		}
		fmt.Fprintf(os.Stderr, "hubbench: FAILED: %v\n", err)
		os.Exit(1)
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			fmt.Fprintf(os.Stderr, "hubbench: writing JSON: %v\n", err)
			os.Exit(1)
		}
	} else {
		sum.WriteText(os.Stdout)
	}
	problems := sum.Problems()
	if requireTargets {
		problems = append(problems, sum.Missed()...)
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(os.Stderr, "hubbench: FAILED: %s\n", p)
		}
		os.Exit(1)
	}
}
