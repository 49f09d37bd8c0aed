package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
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
	// Networks puts the members on this many Istio networks (member i on
	// net-<i mod Networks>), each member with an east-west gateway and
	// every endpoint's pod labelled for Istio mTLS, and every stream on its
	// member's network: the hub splits EDS per network. 1: no networks.
	Networks int `json:"networks,omitempty"`
	// LocalityFailover distributes a DestinationRule with outlier
	// detection for every service (Istio's locality failover: each
	// stream's endpoint assignment is ranked for its member and zone).
	LocalityFailover bool `json:"localityFailover,omitempty"`
	// Streams is the number of ADS streams, each on its own connection; 0
	// is the shape's default (2,000; 10 for the istiod shape).
	Streams int `json:"streams"`
	// Shape is what every stream subscribes to, as a kind of client would
	// (shapes.go): "named" (CDS per --cds and EDS for ServicesPerStream
	// services drawn at random), "envoy" (CDS wildcard, then EDS for every
	// cluster CDS returned) or "grpc" (grpc-go's xds resolver for
	// xds:///<hostname>:<port>: LDS, then RDS, CDS and EDS by name) or
	// "istiod" (a member istiod's config source stream: every Istio config
	// type as a wildcard, istiod.go).
	Shape string `json:"shape"`
	// ServicesPerStream is, for the named shape, how many services each
	// stream subscribes to with EDS, and for the grpc shape how many
	// xds:/// targets its client dials (both capped at Services). 0 is the
	// shape's default (50 and 1); allServices (--services-per-stream all)
	// stands for the envoy shape, which subscribes to every service.
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
	// DeltaNodeEveryRequest makes the envoy shape's Delta streams send
	// their node (a real Envoy 1.40's, 63 KB, envoynode.go) in every
	// request, ACKs included, as Envoy before 1.38 does; false (the
	// default) sends it in the first request only, as the recorded Envoy
	// 1.40 does. SotW streams send it in their first request only
	// (set_node_on_first_message_only).
	DeltaNodeEveryRequest bool `json:"deltaNodeEveryRequest"`
	// CDS is how streams subscribe to clusters: "wildcard" (every cluster,
	// like Envoy sidecars without a Sidecar scope) or "named" (only the
	// clusters of their services, like proxyless gRPC). Only the named
	// shape may choose; empty is the shape's own (envoy and named:
	// wildcard, grpc: named; istiod asks for no clusters and keeps it
	// empty).
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
	// Peer, if "istiod", serves the clients from a real istiod instead
	// of the hub (see peerIstiod); IstiodBin is its pilot-discovery
	// (empty: $HUB_ISTIOD_BIN). HubEnv applies to it too.
	Peer      string `json:"peer,omitempty"`
	IstiodBin string `json:"istiodBin,omitempty"`
	// HubArgs are extra arguments for `hub serve`.
	HubArgs []string `json:"hubArgs,omitempty"`
	// HubEnv are extra NAME=value environment variables for the hub only,
	// e.g. GOMEMLIMIT as deploy/deployment.yaml sets it.
	HubEnv []string `json:"hubEnv,omitempty"`
	// HubPerf, if set, is where `perf record -g` writes a CPU profile of
	// the hub taken over the write phase (read it with `perf report -i`).
	HubPerf string `json:"hubPerf,omitempty"`
	// HubHeap, if set, is where the hub's heap profile (pprof, after a GC)
	// is written once every stream holds its config (go tool pprof FILE).
	HubHeap string `json:"hubHeap,omitempty"`
	// WorkDir, if set, keeps clusters' data and logs and the hub log there
	// (it is not removed); empty uses a temporary directory removed on exit.
	WorkDir string `json:"workDir,omitempty"`
	// Bulk is the number of services the bulk phase creates (bulk.go; 0:
	// no bulk phase), BulkWriters how many concurrent writers create them,
	// BulkTimeout how long every stream may take to hold them all.
	Bulk        int           `json:"bulk,omitempty"`
	BulkWriters int           `json:"bulkWriters,omitempty"`
	BulkTimeout time.Duration `json:"bulkTimeoutNs,omitempty"`
	// CADuration is how long the ca shape issues certificates (ca.go).
	CADuration time.Duration `json:"caDurationNs,omitempty"`
	// Seed makes the choice of services per stream and of written services
	// reproducible.
	Seed uint64 `json:"seed"`

	// APIServers, between 1 and Members-1, is the scale mode (scale.go):
	// Members member IDs registered over this many real API servers, member
	// i on API server i mod APIServers, each ID with its own remote Secret,
	// client certificate and namespace team-<i / APIServers>, which holds
	// ServicesPerMember services of EndpointsPerService endpoints. Services,
	// ServiceMembers and Endpoints are then derived from it (validate). 0
	// (or Members): one API server per member, the layout of layout.go.
	APIServers          int `json:"apiServers,omitempty"`
	ServicesPerMember   int `json:"servicesPerMember,omitempty"`
	EndpointsPerService int `json:"endpointsPerService,omitempty"`
	// AlsoShapes (scale mode) are shapes measured after Shape, each with
	// Streams new streams and Writes writes of its own; nil is the
	// default (envoy when Shape is grpc), empty none.
	AlsoShapes []string `json:"alsoShapes,omitempty"`
	// IdleWindow (scale mode) is how long the hub's idle CPU is measured
	// once every member is Ready and its view persisted.
	IdleWindow time.Duration `json:"idleWindowNs,omitempty"`
	// APISamples (scale mode) is how many times each REST and dashboard
	// page is fetched for its response time.
	APISamples int `json:"apiSamples,omitempty"`
	// Unscoped (scale mode, --watch-scope=false) registers the members
	// without hub.federation/watch-namespaces: each then watches every
	// namespace of its API server, its team's and the others' (what
	// scoped watching saves).
	Unscoped bool `json:"unscoped,omitempty"`

	// RealEnvoys, if positive (envoy shape only), replaces the simulated
	// streams by this many real Envoy processes (realenvoy.go); Streams is
	// then RealEnvoys.
	RealEnvoys int `json:"realEnvoys,omitempty"`

	// Progress, if set, receives progress lines.
	Progress func(format string, args ...any) `json:"-"`
}

// defaultConfig is the documented default run (the 2,000-stream benchmark;
// Streams 0 is filled in by validate).
func defaultConfig() Config {
	return Config{
		Members: 10, Services: 1000, ServiceMembers: 2, Endpoints: 20000, Networks: 1,
		Writes: 20, WriteGap: 300 * time.Millisecond, WriteTimeout: 30 * time.Second,
		ConnectConcurrency: 100, CreateWorkers: 16,
		SyncTimeout: 10 * time.Minute, ConnectTimeout: 10 * time.Minute,
		CADuration:  20 * time.Second,
		BulkWriters: 8, BulkTimeout: 10 * time.Minute,
		Seed:              1,
		ServicesPerMember: 100, EndpointsPerService: 10,
		IdleWindow: 30 * time.Second, APISamples: 20,
	}
}

// allServices is --services-per-stream all: the envoy shape.
const allServices = -1

// perStreamFlag is --services-per-stream: a number or "all".
type perStreamFlag struct{ n *int }

func (p perStreamFlag) String() string {
	switch {
	case p.n == nil || *p.n == 0:
		return "shape default"
	case *p.n == allServices:
		return "all"
	}
	return strconv.Itoa(*p.n)
}

func (p perStreamFlag) Set(v string) error {
	if v == "all" {
		*p.n = allServices
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return fmt.Errorf("want a positive number or all, not %q", v)
	}
	*p.n = n
	return nil
}

// shapeListFlag is --also-shapes: comma-separated shapes, or none.
type shapeListFlag struct{ s *[]string }

func (f shapeListFlag) String() string {
	switch {
	case f.s == nil || *f.s == nil:
		return ""
	case len(*f.s) == 0:
		return "none"
	}
	return strings.Join(*f.s, ",")
}

func (f shapeListFlag) Set(v string) error {
	*f.s = []string{}
	if v == "none" {
		return nil
	}
	for _, shape := range strings.Split(v, ",") {
		if shape = strings.TrimSpace(shape); shape != "" {
			*f.s = append(*f.s, shape)
		}
	}
	return nil
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func (c *Config) register(fs *flag.FlagSet) {
	*c = defaultConfig()
	fs.IntVar(&c.Members, "members", c.Members, "member clusters besides the home cluster (with --apiservers: member IDs, each registered as a distinct cluster)")
	fs.IntVar(&c.APIServers, "apiservers", c.APIServers, "scale mode when below --members: run this many real API servers and register the --members IDs over them, member i on API server i mod N, each with its own remote Secret (hub.federation/watch-namespaces: team-<i/N>), client certificate and namespace holding --services-per-member services; --services, --endpoints and --service-members are then derived. 0: one API server per member")
	fs.IntVar(&c.ServicesPerMember, "services-per-member", c.ServicesPerMember, "scale mode: services in each member's namespace (the members with the same team index serve the same hostnames)")
	fs.IntVar(&c.EndpointsPerService, "endpoints-per-service", c.EndpointsPerService, "scale mode: endpoints of each service in each member")
	fs.Var(shapeListFlag{&c.AlsoShapes}, "also-shapes", "scale mode: comma-separated shapes measured after --shape, each with --streams new streams and --writes writes of its own; none for none (default: envoy when --shape is grpc)")
	fs.Func("watch-scope", "scale mode: register each member with hub.federation/watch-namespaces naming its namespace (true, the default) or without it, so that it watches every namespace of its API server (false)", func(v string) error {
		on, err := strconv.ParseBool(v)
		c.Unscoped = !on
		return err
	})
	fs.DurationVar(&c.IdleWindow, "idle-window", c.IdleWindow, "scale mode: how long the hub's idle CPU is measured once every member is Ready")
	fs.IntVar(&c.APISamples, "api-samples", c.APISamples, "scale mode: fetches of each REST path and dashboard page timed")
	fs.IntVar(&c.Services, "services", c.Services, "services in total, spread evenly over the members")
	fs.IntVar(&c.ServiceMembers, "service-members", c.ServiceMembers, "members every service exists in (its endpoints are split between them)")
	fs.IntVar(&c.Endpoints, "endpoints", c.Endpoints, "endpoints in total, spread evenly over the services")
	fs.IntVar(&c.Networks, "networks", c.Networks, "Istio networks the members are spread over (member i on net-<i mod N>, each with an east-west gateway, every endpoint's pod mTLS; streams on their member's network; a write is timed at the streams of its member's network): 1 for none")
	fs.BoolVar(&c.LocalityFailover, "locality-failover", c.LocalityFailover, "distribute a DestinationRule with outlier detection for every service (*.svc.cluster.local), so each stream's endpoint assignments are ranked for its member and zone (Istio's locality failover); streams carry their member's region and a zone")
	fs.IntVar(&c.Streams, "streams", c.Streams, "ADS streams, each on its own gRPC connection (0: 2000, or 10 with --shape istiod, 200 in scale mode)")
	fs.StringVar(&c.Shape, "shape", c.Shape, "what each stream subscribes to (default named; grpc in scale mode): named (CDS per --cds, EDS for --services-per-stream random services), envoy (CDS wildcard, then EDS for every cluster CDS returned), grpc (grpc-go's xds:///<host>:<port>: LDS, RDS, CDS, EDS by name) istiod (a member istiod's MCP config stream: the 16 Istio config types as wildcards) or ca (istio-agents asking the hub's CA for certificates: --streams callers with RSA-2048 CSRs and real tokens for --ca-duration)")
	fs.Var(perStreamFlag{&c.ServicesPerStream}, "services-per-stream", "named shape: services each stream subscribes to with EDS (default 50); grpc shape: xds:/// targets per client (default 1); all: the envoy shape")
	fs.IntVar(&c.Writes, "writes", c.Writes, "EndpointSlice writes whose convergence is measured, one at a time")
	fs.DurationVar(&c.WriteGap, "write-gap", c.WriteGap, "pause between one write reaching every watcher and the next write")
	fs.DurationVar(&c.WriteTimeout, "write-timeout", c.WriteTimeout, "how long one write may take to reach every watcher")
	fs.BoolVar(&c.Delta, "delta", c.Delta, "use Delta ADS instead of State of the World")
	fs.BoolVar(&c.DeltaNodeEveryRequest, "delta-node-every-request", c.DeltaNodeEveryRequest, "envoy shape with --delta: send the node (63 KB with Envoy 1.40's extensions) in every Delta request, ACKs included, as Envoy < 1.38 does; false (default): in the first request only, as the recorded Envoy 1.40 does (SotW always sends it once: set_node_on_first_message_only)")
	fs.StringVar(&c.CDS, "cds", c.CDS, "named shape's CDS subscription: wildcard (all clusters, the default) or named (only the stream's services)")
	fs.IntVar(&c.ConnectConcurrency, "connect-concurrency", c.ConnectConcurrency, "streams connecting at once (until each holds its full config)")
	fs.IntVar(&c.CreateWorkers, "create-workers", c.CreateWorkers, "concurrent API requests while creating services")
	fs.DurationVar(&c.SyncTimeout, "sync-timeout", c.SyncTimeout, "how long the hub may take to sync every member")
	fs.DurationVar(&c.ConnectTimeout, "connect-timeout", c.ConnectTimeout, "how long all streams may take to get their config")
	fs.StringVar(&c.HubBin, "hub-bin", c.HubBin, "prebuilt hub binary (default: go build ./cmd/hub into a temp dir)")
	fs.StringVar(&c.Peer, "peer", c.Peer, "istiod: serve the same clusters to the same clients from a real istiod instead of the hub (envoy shape), to put its figures beside the hub's")
	fs.StringVar(&c.IstiodBin, "istiod-bin", c.IstiodBin, "--peer istiod: the pilot-discovery binary (default $HUB_ISTIOD_BIN; e2e/interop/build-istiod.sh builds it)")
	fs.Var((*stringList)(&c.HubArgs), "hub-arg", "extra argument for `hub serve` (repeatable), e.g. --hub-arg=--debounce-after=50ms")
	fs.Var((*stringList)(&c.HubEnv), "hub-env", "extra NAME=value environment for the hub process only (repeatable), e.g. --hub-env=GOMEMLIMIT=350MiB")
	fs.StringVar(&c.HubPerf, "hub-perf", c.HubPerf, "record a CPU profile of the hub over the write phase with Linux perf into this file (perf report -i FILE)")
	fs.StringVar(&c.HubHeap, "hub-heap", c.HubHeap, "write the hub's heap profile (after a GC) into this file once every stream holds its config (go tool pprof FILE)")
	fs.StringVar(&c.WorkDir, "work-dir", c.WorkDir, "keep cluster data and all logs in this directory (default: a temp dir removed on exit)")
	fs.IntVar(&c.Bulk, "bulk", c.Bulk, "envoy shape: after the writes, create this many new services (Service + EndpointSlice in --service-members members each) while the streams watch, and report responses per stream, hub CPU, API write time and time to converge (0: no bulk phase)")
	fs.IntVar(&c.BulkWriters, "bulk-writers", c.BulkWriters, "concurrent writers creating the --bulk services")
	fs.DurationVar(&c.BulkTimeout, "bulk-timeout", c.BulkTimeout, "how long every stream may take, from the first bulk create, to hold every new service")
	fs.DurationVar(&c.CADuration, "ca-duration", c.CADuration, "ca shape: how long the callers (--streams, default 16) request certificates")
	fs.IntVar(&c.RealEnvoys, "real-envoys", c.RealEnvoys, fmt.Sprintf("envoy shape: run this many real Envoy processes ($HUB_ENVOY_BIN, --concurrency 1 each, round robin over the members, --delta for Delta ADS) as the fleet instead of simulated streams, and time each write at every Envoy's admin API (0: off; at most %d)", maxRealEnvoys))
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed for choosing services per stream and written services")
}

// validate checks the run and fills in what the shape decides: the shape
// of --services-per-stream all, the default services per stream and the
// CDS subscription.
func (c *Config) validate() error {
	errs := c.validatePeer()
	if c.ServicesPerStream == allServices {
		switch c.Shape {
		case "", shapeNamed, shapeEnvoy:
			c.Shape, c.ServicesPerStream = shapeEnvoy, 0
		default:
			errs = append(errs, fmt.Errorf("--services-per-stream all is the envoy shape, not --shape %s", c.Shape))
			c.ServicesPerStream = 0
		}
	}
	if c.Shape == "" && c.scale() {
		c.Shape = shapeGRPC
	}
	if c.Shape == "" {
		c.Shape = shapeNamed
	}
	errs = append(errs, c.validateScale()...)
	errs = append(errs, c.validateRealEnvoys()...)
	errs = append(errs, c.validateShape()...)
	c.defaultStreams()
	positive := map[string]int{
		"--members": c.Members, "--services": c.Services, "--service-members": c.ServiceMembers,
		"--streams": c.Streams, "--connect-concurrency": c.ConnectConcurrency, "--create-workers": c.CreateWorkers,
	}
	for _, name := range []string{"--members", "--services", "--service-members", "--streams", "--connect-concurrency", "--create-workers"} {
		if positive[name] < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1, not %d", name, positive[name]))
		}
	}
	if c.ServicesPerStream < 0 {
		errs = append(errs, fmt.Errorf("--services-per-stream must be at least 1 or all, not %d", c.ServicesPerStream))
	}
	if c.Shape != shapeIstiod && c.CDS != cdsWildcard && c.CDS != cdsNamed {
		errs = append(errs, fmt.Errorf("--cds must be wildcard or named, not %q", c.CDS))
	}
	if c.Writes < 0 {
		errs = append(errs, fmt.Errorf("--writes must not be negative, not %d", c.Writes))
	}
	if c.Networks < 1 || c.Networks > c.Members && c.Networks > 1 {
		errs = append(errs, fmt.Errorf("--networks must be between 1 and --members (%d), not %d", c.Members, c.Networks))
	}
	errs = append(errs, c.validateSize()...)
	errs = append(errs, c.validateBulk()...)
	if c.WriteTimeout <= 0 || c.SyncTimeout <= 0 || c.ConnectTimeout <= 0 || c.WriteGap < 0 {
		errs = append(errs, errors.New("timeouts must be positive and --write-gap not negative"))
	}
	return errors.Join(errs...)
}

// validatePeer checks --peer: istiod, serving the envoy shape, without the
// hub's own flags. It runs before the shape is settled.
func (c *Config) validatePeer() []error {
	switch {
	case c.Peer == "":
	case c.Peer != peerIstiod:
		return []error{fmt.Errorf("--peer %q: the one peer is istiod", c.Peer)}
	case c.Shape != shapeEnvoy && c.ServicesPerStream != allServices:
		return []error{fmt.Errorf("--peer istiod serves the envoy shape (Envoy's SotW or Delta ADS), not --shape %s", c.Shape)}
	case len(c.HubArgs) > 0 || c.HubPerf != "" || c.HubHeap != "":
		return []error{errors.New("--hub-arg, --hub-perf and --hub-heap are the hub's; --peer istiod runs istiod")}
	}
	return nil
}

// validateShape checks the flags the shape decides and fills in its
// default services per stream and CDS subscription.
func (c *Config) validateShape() []error {
	var errs []error
	switch c.Shape {
	case shapeNamed:
		if c.ServicesPerStream == 0 {
			c.ServicesPerStream = 50
		}
		if c.CDS == "" {
			c.CDS = cdsWildcard
		}
	case shapeEnvoy:
		if c.ServicesPerStream > 0 {
			errs = append(errs, fmt.Errorf("--shape envoy subscribes EDS for every cluster CDS returns: --services-per-stream does not apply"))
		}
		if c.CDS == "" {
			c.CDS = cdsWildcard
		}
		if c.CDS != cdsWildcard {
			errs = append(errs, fmt.Errorf("--shape envoy subscribes CDS as wildcard, not --cds %s", c.CDS))
		}
	case shapeGRPC:
		if c.ServicesPerStream == 0 {
			c.ServicesPerStream = 1
		}
		if c.CDS == "" {
			c.CDS = cdsNamed
		}
		if c.CDS != cdsNamed {
			errs = append(errs, fmt.Errorf("--shape grpc subscribes CDS by name (the clusters of its routes), not --cds %s", c.CDS))
		}
	case shapeIstiod:
		if c.ServicesPerStream > 0 {
			errs = append(errs, fmt.Errorf("--shape istiod receives every ServiceEntry: --services-per-stream does not apply"))
		}
		if c.CDS != "" {
			errs = append(errs, fmt.Errorf("--shape istiod asks for no clusters: --cds does not apply"))
		}
		if c.Delta {
			errs = append(errs, fmt.Errorf("--shape istiod speaks State of the World only (istiod's config client does; the hub serves Istio config over SotW only): --delta does not apply"))
		}
	case shapeCA:
		if c.CADuration <= 0 {
			errs = append(errs, fmt.Errorf("--ca-duration must be positive, not %s", c.CADuration))
		}
		c.CDS = cdsWildcard // unused
	default:
		errs = append(errs, fmt.Errorf("--shape must be named, envoy, grpc, istiod or ca, not %q", c.Shape))
	}
	return errs
}

// defaultStreams fills in the default --streams: 2000, 10 for the istiod
// shape, 16 for the ca shape, 200 in scale mode.
func (c *Config) defaultStreams() {
	if c.Streams == 0 {
		c.Streams = 2000
		switch c.Shape {
		case shapeIstiod:
			c.Streams = 10
		case shapeCA:
			c.Streams = 16
		}
		if c.scale() {
			c.Streams = 200
		}
	}
}

// validateSize checks the run's size: in scale mode, that the endpoints and
// every shape's writes fit the test addresses; otherwise at most 99
// members (one API server each), an endpoint for every member's
// EndpointSlice, and the endpoints and writes within 198.18.0.0/15.
func (c *Config) validateSize() []error {
	var errs []error
	switch {
	case c.scale():
		if n := c.Endpoints + c.Writes*(1+len(c.AlsoShapes)); n > maxScaleAddresses {
			errs = append(errs, fmt.Errorf("--members × --services-per-member × --endpoints-per-service + the writes of every shape (%d) exceed the %d addresses of 198.18.0.0/15 and 100.64.0.0/10", n, maxScaleAddresses))
		}
	case c.Members > 99:
		errs = append(errs, fmt.Errorf("--members must be at most 99 (one API server each; --apiservers for more), not %d", c.Members))
	default:
		if sm := c.serviceMembers(); c.Services > 0 && c.Endpoints < c.Services*sm {
			errs = append(errs, fmt.Errorf("--endpoints (%d) must be at least --services × members per service (%d × %d): every member's EndpointSlice needs an endpoint", c.Endpoints, c.Services, sm))
		}
		if c.Endpoints+c.Writes > maxAddresses {
			errs = append(errs, fmt.Errorf("--endpoints + --writes (%d) exceeds the %d addresses of 198.18.0.0/15", c.Endpoints+c.Writes, maxAddresses))
		}
	}
	return errs
}

// scale reports whether the run is in scale mode: more member IDs than
// API servers (scale.go).
func (c *Config) scale() bool { return c.APIServers > 0 && c.APIServers < c.Members }

// maxScaleMembers bounds --members in scale mode (member IDs have three
// digits).
const maxScaleMembers = 999

// validateScale checks the scale mode's flags and, in scale mode, derives
// Services, ServiceMembers and Endpoints from the layout and fills in the
// default AlsoShapes (after Shape is settled).
func (c *Config) validateScale() []error {
	var errs []error
	if c.APIServers < 0 || c.APIServers > c.Members {
		errs = append(errs, fmt.Errorf("--apiservers must be between 0 and --members (%d), not %d", c.Members, c.APIServers))
	}
	if !c.scale() {
		if len(c.AlsoShapes) > 0 {
			errs = append(errs, errors.New("--also-shapes needs the scale mode (--apiservers below --members)"))
		}
		return errs
	}
	if c.APIServers > 99 {
		errs = append(errs, fmt.Errorf("--apiservers must be at most 99, not %d", c.APIServers))
	}
	if c.Members > maxScaleMembers {
		errs = append(errs, fmt.Errorf("--members must be at most %d, not %d", maxScaleMembers, c.Members))
	}
	if c.ServicesPerMember < 1 || c.EndpointsPerService < 1 {
		errs = append(errs, fmt.Errorf("--services-per-member and --endpoints-per-service must be at least 1, not %d and %d", c.ServicesPerMember, c.EndpointsPerService))
	}
	switch {
	case c.Peer != "":
		errs = append(errs, errors.New("--peer does not apply in scale mode (--apiservers): istiod reads one remote Secret, not one per member"))
	case c.Networks > 1 || c.LocalityFailover:
		errs = append(errs, errors.New("--networks and --locality-failover do not apply in scale mode (--apiservers)"))
	case c.Bulk > 0:
		errs = append(errs, errors.New("--bulk does not apply in scale mode (--apiservers)"))
	}
	scaleShape := func(shape string) bool { return shape == shapeNamed || shape == shapeEnvoy || shape == shapeGRPC }
	if !scaleShape(c.Shape) {
		errs = append(errs, fmt.Errorf("scale mode (--apiservers) measures the named, envoy and grpc shapes, not --shape %s", c.Shape))
	}
	if c.AlsoShapes == nil {
		c.AlsoShapes = []string{}
		if c.Shape == shapeGRPC {
			c.AlsoShapes = []string{shapeEnvoy}
		}
	}
	seen := map[string]bool{c.Shape: true}
	for _, s := range c.AlsoShapes {
		if !scaleShape(s) || seen[s] {
			errs = append(errs, fmt.Errorf("--also-shapes: %q is not a shape (named, envoy, grpc) other than --shape and the others listed", s))
		}
		seen[s] = true
	}
	if c.IdleWindow < 0 || c.APISamples < 1 {
		errs = append(errs, fmt.Errorf("--idle-window must not be negative and --api-samples must be at least 1, not %s and %d", c.IdleWindow, c.APISamples))
	}
	teams := (c.Members + c.APIServers - 1) / c.APIServers
	c.Services = teams * c.ServicesPerMember
	c.ServiceMembers = c.APIServers
	c.Endpoints = c.Members * c.ServicesPerMember * c.EndpointsPerService
	return errs
}

// forShape is the configuration of an extra shape of the scale mode (an
// entry of AlsoShapes): the same run with the shape's own defaults.
func (c Config) forShape(shape string) (Config, error) {
	c.Shape, c.ServicesPerStream, c.CDS, c.AlsoShapes = shape, 0, "", []string{}
	err := c.validate()
	return c, err
}

// validateBulk checks the bulk phase's flags.
func (c *Config) validateBulk() []error {
	var errs []error
	switch {
	case c.Bulk < 0:
		errs = append(errs, fmt.Errorf("--bulk must not be negative, not %d", c.Bulk))
	case c.Bulk == 0:
		return nil
	case c.Shape != shapeEnvoy:
		errs = append(errs, fmt.Errorf("--bulk needs --shape envoy (the only shape that follows new clusters on its own), not %s", c.Shape))
	}
	if c.BulkWriters < 1 {
		errs = append(errs, fmt.Errorf("--bulk-writers must be at least 1, not %d", c.BulkWriters))
	}
	if c.BulkTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--bulk-timeout must be positive, not %s", c.BulkTimeout))
	}
	if n := c.Endpoints + c.Writes + c.Bulk*bulkEndpoints(*c); n > maxAddresses {
		errs = append(errs, fmt.Errorf("--endpoints + --writes + the bulk services' endpoints (%d) exceed the %d addresses of 198.18.0.0/15", n, maxAddresses))
	}
	return errs
}

// serviceMembers is how many members each service really exists in.
func (c *Config) serviceMembers() int { return min(c.ServiceMembers, c.Members) }

// servicesPerStream is how many services each stream really watches
// (after validate).
func (c *Config) servicesPerStream() int {
	if c.Shape == shapeEnvoy || c.Shape == shapeIstiod {
		return c.Services
	}
	return min(c.ServicesPerStream, c.Services)
}

// shapeText says what each stream subscribes to (after validate).
func (c *Config) shapeText() string {
	switch c.Shape {
	case shapeEnvoy:
		return "envoy shape: CDS wildcard, then EDS for every cluster CDS returned"
	case shapeGRPC:
		return fmt.Sprintf("grpc shape: LDS → RDS → CDS → EDS by name for %d xds:/// target(s)", c.servicesPerStream())
	case shapeIstiod:
		return fmt.Sprintf("istiod shape: MCP-over-XDS, %d Istio config types as wildcards on one SotW stream, ServiceEntries for all %d services", len(istiodConfigTypes), c.Services)
	}
	return fmt.Sprintf("named shape: CDS %s and EDS for %d services", c.CDS, c.servicesPerStream())
}

func (c *Config) progress(format string, args ...any) {
	if c.Progress != nil {
		c.Progress(format, args...)
	}
}
