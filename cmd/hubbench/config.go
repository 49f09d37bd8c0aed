package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"
)

// Config is one benchmark run.
type Config struct {
	// Members is the number of member clusters besides the home cluster.
	Members int `json:"members"`
	// Services is the total number of distinct services; each lives in
	// ServiceMembers members (see layout.go).
	Services int `json:"services"`
	// ServiceMembers is how many members every service exists in (capped
	// at Members): its endpoints are split between them.
	ServiceMembers int `json:"serviceMembers"`
	// Endpoints is the total number of endpoints over all services.
	Endpoints int `json:"endpoints"`
	// Streams is the number of ADS streams, each on its own connection.
	Streams int `json:"streams"`
	// ServicesPerStream is how many services each stream subscribes to
	// with EDS (capped at Services); CDS is always wildcard.
	ServicesPerStream int `json:"servicesPerStream"`
	// Writes is the number of EndpointSlice writes whose convergence is
	// measured, one at a time.
	Writes int `json:"writes"`
	// WriteGap is the pause after one write has reached every watcher and
	// before the next is issued.
	WriteGap time.Duration `json:"writeGapNs"`
	// WriteTimeout bounds how long one write may take to reach every
	// watcher before the run fails listing the stragglers.
	WriteTimeout time.Duration `json:"writeTimeoutNs"`
	// Delta uses Delta (incremental) ADS instead of State of the World.
	Delta bool `json:"delta"`
	// CDS is how streams subscribe to clusters: "wildcard" (every cluster,
	// like Envoy sidecars without a Sidecar scope) or "named" (only the
	// clusters of their services, like proxyless gRPC).
	CDS string `json:"cds"`
	// ConnectConcurrency bounds the streams being connected at once: a
	// stream counts as connecting until it holds its full configuration.
	ConnectConcurrency int `json:"connectConcurrency"`
	// CreateWorkers bounds concurrent object creation in the API servers.
	CreateWorkers int `json:"createWorkers"`
	// SyncTimeout and ConnectTimeout bound member sync and cold connect.
	SyncTimeout    time.Duration `json:"syncTimeoutNs"`
	ConnectTimeout time.Duration `json:"connectTimeoutNs"`
	// HubBin is a prebuilt hub binary; empty builds ./cmd/hub.
	HubBin string `json:"hubBin,omitempty"`
	// HubArgs are extra arguments for `hub serve`.
	HubArgs []string `json:"hubArgs,omitempty"`
	// HubEnv are extra NAME=value environment variables for the hub only,
	// e.g. GOMEMLIMIT as deploy/deployment.yaml sets it.
	HubEnv []string `json:"hubEnv,omitempty"`
	// WorkDir, if set, keeps clusters' data and logs and the hub log there
	// (it is not removed); empty uses a temporary directory removed on exit.
	WorkDir string `json:"workDir,omitempty"`
	// Seed makes the choice of services per stream and of written services
	// reproducible.
	Seed uint64 `json:"seed"`

	// Progress, if set, receives progress lines.
	Progress func(format string, args ...any) `json:"-"`
}

// defaultConfig is the documented default run (the 2,000-stream benchmark).
func defaultConfig() Config {
	return Config{
		Members: 10, Services: 1000, ServiceMembers: 2, Endpoints: 20000,
		Streams: 2000, ServicesPerStream: 50, Writes: 20, CDS: "wildcard",
		WriteGap: 300 * time.Millisecond, WriteTimeout: 30 * time.Second,
		ConnectConcurrency: 100, CreateWorkers: 16,
		SyncTimeout: 10 * time.Minute, ConnectTimeout: 10 * time.Minute,
		Seed: 1,
	}
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func (c *Config) register(fs *flag.FlagSet) {
	*c = defaultConfig()
	fs.IntVar(&c.Members, "members", c.Members, "member clusters besides the home cluster")
	fs.IntVar(&c.Services, "services", c.Services, "services in total, spread evenly over the members")
	fs.IntVar(&c.ServiceMembers, "service-members", c.ServiceMembers, "members every service exists in (its endpoints are split between them)")
	fs.IntVar(&c.Endpoints, "endpoints", c.Endpoints, "endpoints in total, spread evenly over the services")
	fs.IntVar(&c.Streams, "streams", c.Streams, "ADS streams, each on its own gRPC connection")
	fs.IntVar(&c.ServicesPerStream, "services-per-stream", c.ServicesPerStream, "services each stream subscribes to with EDS (CDS is wildcard)")
	fs.IntVar(&c.Writes, "writes", c.Writes, "EndpointSlice writes whose convergence is measured, one at a time")
	fs.DurationVar(&c.WriteGap, "write-gap", c.WriteGap, "pause between one write reaching every watcher and the next write")
	fs.DurationVar(&c.WriteTimeout, "write-timeout", c.WriteTimeout, "how long one write may take to reach every watcher")
	fs.BoolVar(&c.Delta, "delta", c.Delta, "use Delta ADS instead of State of the World")
	fs.StringVar(&c.CDS, "cds", c.CDS, "CDS subscription: wildcard (all clusters) or named (only the stream's services)")
	fs.IntVar(&c.ConnectConcurrency, "connect-concurrency", c.ConnectConcurrency, "streams connecting at once (until each holds its full config)")
	fs.IntVar(&c.CreateWorkers, "create-workers", c.CreateWorkers, "concurrent API requests while creating services")
	fs.DurationVar(&c.SyncTimeout, "sync-timeout", c.SyncTimeout, "how long the hub may take to sync every member")
	fs.DurationVar(&c.ConnectTimeout, "connect-timeout", c.ConnectTimeout, "how long all streams may take to get their config")
	fs.StringVar(&c.HubBin, "hub-bin", c.HubBin, "prebuilt hub binary (default: go build ./cmd/hub into a temp dir)")
	fs.Var((*stringList)(&c.HubArgs), "hub-arg", "extra argument for `hub serve` (repeatable), e.g. --hub-arg=--debounce-after=50ms")
	fs.Var((*stringList)(&c.HubEnv), "hub-env", "extra NAME=value environment for the hub process only (repeatable), e.g. --hub-env=GOMEMLIMIT=350MiB")
	fs.StringVar(&c.WorkDir, "work-dir", c.WorkDir, "keep cluster data and all logs in this directory (default: a temp dir removed on exit)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed for choosing services per stream and written services")
}

func (c *Config) validate() error {
	var errs []error
	positive := map[string]int{
		"--members": c.Members, "--services": c.Services, "--service-members": c.ServiceMembers,
		"--streams": c.Streams, "--services-per-stream": c.ServicesPerStream,
		"--connect-concurrency": c.ConnectConcurrency, "--create-workers": c.CreateWorkers,
	}
	for _, name := range []string{"--members", "--services", "--service-members", "--streams", "--services-per-stream", "--connect-concurrency", "--create-workers"} {
		if positive[name] < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1, not %d", name, positive[name]))
		}
	}
	if c.CDS != "wildcard" && c.CDS != "named" {
		errs = append(errs, fmt.Errorf("--cds must be wildcard or named, not %q", c.CDS))
	}
	if c.Writes < 0 {
		errs = append(errs, fmt.Errorf("--writes must not be negative, not %d", c.Writes))
	}
	if c.Members > 99 {
		errs = append(errs, fmt.Errorf("--members must be at most 99 (one API server each), not %d", c.Members))
	}
	if sm := c.serviceMembers(); c.Services > 0 && c.Endpoints < c.Services*sm {
		errs = append(errs, fmt.Errorf("--endpoints (%d) must be at least --services × members per service (%d × %d): every member's EndpointSlice needs an endpoint", c.Endpoints, c.Services, sm))
	}
	if c.Endpoints+c.Writes > maxAddresses {
		errs = append(errs, fmt.Errorf("--endpoints + --writes (%d) exceeds the %d addresses of 198.18.0.0/15", c.Endpoints+c.Writes, maxAddresses))
	}
	if c.WriteTimeout <= 0 || c.SyncTimeout <= 0 || c.ConnectTimeout <= 0 || c.WriteGap < 0 {
		errs = append(errs, errors.New("timeouts must be positive and --write-gap not negative"))
	}
	return errors.Join(errs...)
}

// serviceMembers is how many members each service really exists in.
func (c *Config) serviceMembers() int { return min(c.ServiceMembers, c.Members) }

// servicesPerStream is how many services each stream really watches.
func (c *Config) servicesPerStream() int { return min(c.ServicesPerStream, c.Services) }

func (c *Config) progress(format string, args ...any) {
	if c.Progress != nil {
		c.Progress(format, args...)
	}
}
