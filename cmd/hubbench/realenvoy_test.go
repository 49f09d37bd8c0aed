package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hubmesh/hub/internal/envoy"
)

// --real-envoys is bounded, needs the envoy shape and refuses what only
// simulated streams do; a valid one makes the fleet's size the stream
// count.
func TestRealEnvoyFlagsChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"negative", func(c *Config) { c.RealEnvoys = -1 }},
		{"too many", func(c *Config) { c.RealEnvoys = maxRealEnvoys + 1 }},
		{"named shape", func(c *Config) { c.Shape = shapeNamed }},
		{"grpc shape", func(c *Config) { c.Shape = shapeGRPC }},
		{"istiod shape", func(c *Config) { c.Shape = shapeIstiod }},
		{"streams", func(c *Config) { c.Streams = 7 }},
		{"networks", func(c *Config) { c.Networks = 2 }},
		{"locality failover", func(c *Config) { c.LocalityFailover = true }},
		{"scale mode", func(c *Config) { c.APIServers = 2 }},
	} {
		cfg := defaultConfig()
		cfg.Shape, cfg.RealEnvoys = shapeEnvoy, 5
		tc.edit(&cfg)
		if err := cfg.validate(); err == nil {
			t.Errorf("%s: validate accepted it", tc.name)
		} else if !strings.Contains(err.Error(), "--real-envoys") {
			t.Errorf("%s: the error does not name --real-envoys: %v", tc.name, err)
		}
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"SotW", func(*Config) {}},
		{"Delta", func(c *Config) { c.Delta = true }},
		{"istiod", func(c *Config) { c.Peer = peerIstiod }},
		{"max", func(c *Config) { c.RealEnvoys = maxRealEnvoys }},
		{"streams equal", func(c *Config) { c.Streams = 5 }},
		{"bulk", func(c *Config) { c.Bulk = 5 }},
		{"services-per-stream all", func(c *Config) { c.Shape, c.ServicesPerStream = "", allServices }},
	} {
		cfg := defaultConfig()
		cfg.Shape, cfg.RealEnvoys = shapeEnvoy, 5
		tc.edit(&cfg)
		if err := cfg.validate(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if cfg.Streams != cfg.RealEnvoys {
			t.Errorf("%s: streams %d, want --real-envoys %d", tc.name, cfg.Streams, cfg.RealEnvoys)
		}
		if err := cfg.validate(); err != nil { // run validates again
			t.Errorf("%s: a second validate: %v", tc.name, err)
		}
	}
	cfg := defaultConfig()
	if err := cfg.validate(); err != nil || cfg.RealEnvoys != 0 || cfg.Streams != 2000 {
		t.Errorf("default: %v, real Envoys %d, streams %d; want off and 2000 streams", err, cfg.RealEnvoys, cfg.Streams)
	}
}

// The bootstrap gives the Envoy the simulated envoy shape's sidecar node,
// ADS (SotW or Delta) with the node in the first request only, CDS and no
// LDS, a stats inclusion list, and the static sds-grpc cluster only for
// istiod.
func TestRealEnvoyBootstrap(t *testing.T) {
	for _, tc := range []struct {
		delta   bool
		sds     string
		apiType string
	}{{false, "", "GRPC"}, {true, "", "DELTA_GRPC"}, {false, "127.0.0.1:4567", "GRPC"}} {
		raw, err := realEnvoyBootstrap(3, "m002", "127.0.0.1:1234", tc.sds, tc.delta, []string{"outbound|80||svc-00001.bench.svc.cluster.local"})
		if err != nil {
			t.Fatal(err)
		}
		var b struct {
			Node struct {
				ID       string            `json:"id"`
				Cluster  string            `json:"cluster"`
				Metadata map[string]any    `json:"metadata"`
				Locality map[string]string `json:"locality"`
			} `json:"node"`
			StaticResources struct {
				Clusters []struct {
					Name string `json:"name"`
				} `json:"clusters"`
			} `json:"static_resources"`
			DynamicResources map[string]json.RawMessage `json:"dynamic_resources"`
			StatsConfig      json.RawMessage            `json:"stats_config"`
		}
		if err := json.Unmarshal(raw, &b); err != nil {
			t.Fatal(err)
		}
		want := envoyNode(3, "m002", "")
		if b.Node.ID != want.GetId() || !strings.HasPrefix(b.Node.ID, "sidecar~") || b.Node.Cluster != want.GetCluster() {
			t.Errorf("node %q cluster %q, want %q %q", b.Node.ID, b.Node.Cluster, want.GetId(), want.GetCluster())
		}
		if b.Node.Metadata["CLUSTER_ID"] != "m002" || b.Node.Metadata["NAMESPACE"] != benchNamespace || b.Node.Metadata["LABELS"] == nil {
			t.Errorf("node metadata %v lacks CLUSTER_ID m002, NAMESPACE and LABELS", b.Node.Metadata)
		}
		if b.Node.Locality["region"] != "region-m002" {
			t.Errorf("locality %v, want region-m002", b.Node.Locality)
		}
		if _, ok := b.DynamicResources["lds_config"]; ok {
			t.Error("the bootstrap asks for listeners")
		}
		if _, ok := b.DynamicResources["cds_config"]; !ok {
			t.Error("the bootstrap asks for no clusters")
		}
		var ads struct {
			APIType     string `json:"api_type"`
			SetNodeOnce bool   `json:"set_node_on_first_message_only"`
		}
		if err := json.Unmarshal(b.DynamicResources["ads_config"], &ads); err != nil {
			t.Fatal(err)
		}
		if ads.APIType != tc.apiType || !ads.SetNodeOnce {
			t.Errorf("ads_config %+v, want %s with set_node_on_first_message_only", ads, tc.apiType)
		}
		var names []string
		for _, c := range b.StaticResources.Clusters {
			names = append(names, c.Name)
		}
		wantNames := []string{envoy.XDSCluster}
		if tc.sds != "" {
			wantNames = append(wantNames, sdsCluster)
		}
		if !slices.Equal(names, wantNames) {
			t.Errorf("static clusters %v, want %v", names, wantNames)
		}
		if !strings.Contains(string(b.StatsConfig), "svc-00001.bench.svc.cluster.local.membership_total") || !strings.Contains(string(b.StatsConfig), "update_rejected") {
			t.Errorf("stats_config %s does not keep membership_total", b.StatsConfig)
		}
	}
	if _, err := realEnvoyBootstrap(0, "m001", "127.0.0.1:1", "no-port", false, nil); err == nil {
		t.Error("a bad SDS address was accepted")
	}
}

func TestRealEnvoyMember(t *testing.T) {
	ids := []string{"m001", "m002", "m003"}
	var got []string
	for i := range 7 {
		got = append(got, realEnvoyMember(i, ids))
	}
	if want := []string{"m001", "m002", "m003", "m001", "m002", "m003", "m001"}; !slices.Equal(got, want) {
		t.Errorf("members %v, want %v", got, want)
	}
}

func TestNackStats(t *testing.T) {
	got := nackStats(map[string]uint64{
		"cluster_manager.cds.update_rejected":                             2,
		"cluster.outbound|80||a.bench.svc.cluster.local.update_rejected":  1,
		"cluster.outbound|80||b.bench.svc.cluster.local;.update_rejected": 3,
		"cluster.outbound|80||c.bench.svc.cluster.local.update_rejected":  0,
		"cluster.xds-grpc.update_rejected":                                0,
		"cluster_manager.cds.update_success":                              9,
	})
	want := map[string]uint64{"cluster_manager.cds": 2, "cluster.*": 4}
	if len(got) != len(want) || got["cluster_manager.cds"] != 2 || got["cluster.*"] != 4 {
		t.Errorf("nackStats = %v, want %v", got, want)
	}
}

func TestProcMemMiB(t *testing.T) {
	status := "Name:\tenvoy\nVmHWM:\t  90000 kB\nVmRSS:\t   73728 kB\nThreads:\t12\n"
	if v, ok := procMemMiB(status, "VmRSS"); !ok || v != 72 {
		t.Errorf("VmRSS = %v %v, want 72 MiB", v, ok)
	}
	rollup := "00400000-7ffd [rollup]\nRss:              73728 kB\nPss:              30720 kB\n"
	if v, ok := procMemMiB(rollup, "Pss"); !ok || v != 30 {
		t.Errorf("Pss = %v %v, want 30 MiB", v, ok)
	}
	if _, ok := procMemMiB(status, "Pss"); ok {
		t.Error("a missing key was found")
	}
}

// The membership stat matches the cluster's stat under its own name (the
// hub) and under Istio's alt_stat_name "<name>;", and no other cluster's.
func TestMembershipStat(t *testing.T) {
	const c = "outbound|80||svc-00001.bench.svc.cluster.local"
	re := regexp.MustCompile(membershipStat(c))
	for name, want := range map[string]bool{
		"cluster." + c + ".membership_total":                                       true,
		"cluster." + c + ";.membership_total":                                      true,
		"cluster." + c + ".membership_change":                                      false,
		"cluster.outbound|80||svc-000011.bench.svc.cluster.local.membership_total": false,
		"cluster.outbound|80||svc-00001xbench.svc.cluster.local.membership_total":  false,
	} {
		if re.MatchString(name) != want {
			t.Errorf("%s matched %v, want %v", name, !want, want)
		}
	}
}

// In the real-Envoy mode istiod leaves out the Istio-only filters, unless
// --hub-env says otherwise; without it, its environment is --hub-env's.
func TestIstiodPeerEnv(t *testing.T) {
	cfg := defaultConfig()
	cfg.HubEnv = []string{"GOMEMLIMIT=1GiB"}
	if got := istiodPeerEnv(cfg); !slices.Equal(got, cfg.HubEnv) {
		t.Errorf("simulated streams: env %v, want %v", got, cfg.HubEnv)
	}
	cfg.RealEnvoys = 3
	if got, want := istiodPeerEnv(cfg), []string{"GOMEMLIMIT=1GiB", "PILOT_ENABLE_METADATA_EXCHANGE=false", "PILOT_ENABLE_ALPN_FILTER=false"}; !slices.Equal(got, want) {
		t.Errorf("real Envoys: env %v, want %v", got, want)
	}
	cfg.HubEnv = []string{"PILOT_ENABLE_ALPN_FILTER=true"}
	if got, want := istiodPeerEnv(cfg), []string{"PILOT_ENABLE_ALPN_FILTER=true", "PILOT_ENABLE_METADATA_EXCHANGE=false"}; !slices.Equal(got, want) {
		t.Errorf("real Envoys with --hub-env: env %v, want %v", got, want)
	}
}

// TestRunRealEnvoysTiny runs the real-Envoy mode end to end, SotW and
// Delta, against the real hub: 2 Envoys, 4 services, 2 writes. It needs
// $HUB_ENVOY_BIN (make test sets it; skipped elsewhere without it) and
// checks that every Envoy got every write, with no NACK and nothing
// warming; it never judges a time.
func TestRunRealEnvoysTiny(t *testing.T) {
	if _, err := envoy.Binary(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx, hubBin := hubForRun(t)
	for _, delta := range []bool{false, true} {
		cfg := defaultConfig()
		cfg.Members, cfg.Services, cfg.Endpoints, cfg.Writes = 2, 4, 20, 2
		cfg.Shape, cfg.Delta, cfg.RealEnvoys, cfg.HubBin = shapeEnvoy, delta, 2, hubBin
		cfg.Bulk, cfg.BulkWriters = 3, 2
		cfg.WriteGap = 100 * time.Millisecond
		cfg.WriteTimeout, cfg.SyncTimeout, cfg.ConnectTimeout = 20*time.Second, time.Minute, time.Minute
		cfg.Progress = t.Logf
		sum, err := run(ctx, cfg)
		if err != nil {
			t.Fatalf("delta %v: %v", delta, err)
		}
		rs := sum.RealEnvoys
		if rs == nil || rs.Envoys != 2 || rs.Version == "" {
			t.Fatalf("delta %v: real-Envoy summary %+v", delta, rs)
		}
		if len(sum.Writes) != 2 || sum.Convergence.N != 4 {
			t.Errorf("delta %v: %d writes, %d (write, Envoy) pairs; want 2 and 4", delta, len(sum.Writes), sum.Convergence.N)
		}
		if p := sum.Problems(); len(p) > 0 {
			t.Errorf("delta %v: problems %v", delta, p)
		}
		if rs.ActiveClusters.Min < rs.ExpectedClusters || rs.RSS.Min <= 0 || rs.RSSSumMiB <= 0 {
			t.Errorf("delta %v: active clusters %+v (want ≥ %d), RSS %+v sum %.1f", delta, rs.ActiveClusters, rs.ExpectedClusters, rs.RSS, rs.RSSSumMiB)
		}
		if b := rs.Bulk; b == nil || b.Services != 3 || b.ConvergeSeconds <= 0 || b.ResponsesPerEnvoy["Cluster"] <= 0 {
			t.Errorf("delta %v: bulk %+v; want 3 services converged, CDS responses counted", delta, b)
		}
		var text strings.Builder
		sum.WriteText(&text)
		if !strings.Contains(text.String(), "real Envoys") || !strings.Contains(text.String(), "NACKs (update_rejected)") ||
			!strings.Contains(text.String(), "responses per Envoy") {
			t.Errorf("delta %v: the summary lacks the real-Envoy lines:\n%s", delta, text.String())
		}
	}
}

// The written services are the same from run to run (hub and istiod get
// the same writes) and wrap around when there are more writes than
// services.
func TestWrittenServices(t *testing.T) {
	cfg := defaultConfig()
	cfg.Members, cfg.Services, cfg.Endpoints, cfg.Writes = 3, 4, 40, 6
	cfg.Shape, cfg.RealEnvoys = shapeEnvoy, 2
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	a, err := writtenServices(cfg, newLayout(cfg))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := writtenServices(cfg, newLayout(cfg))
	if len(a) != 6 || !slices.Equal(a, b) {
		t.Fatalf("written %v then %v, want the same 6", a, b)
	}
	if !slices.Equal(a[:2], a[4:]) {
		t.Errorf("written %v: the 4 services do not repeat in order", a)
	}
	seen := map[int]bool{}
	for _, s := range a[:4] {
		seen[s] = true
	}
	if len(seen) != 4 {
		t.Errorf("written %v: the first 4 writes are not 4 distinct services", a)
	}
}
