package main

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestParseArgs: the demo defaults to loopback listeners and STRICT mTLS,
// hands the hub's flags it takes on to `hub serve` with the flags after
// "--", and refuses after "--" a flag it sets itself.
func TestParseArgs(t *testing.T) {
	var cfg config
	var opts options
	err := parseArgs([]string{"--demo-churn=false", "--admin-addr", "127.0.0.1:0", "--hub-bin", "/bin/hub",
		"--", "--max-workload-cert-ttl", "1m", "--demote-unhealthy-members=false"}, &cfg, &opts)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.mtlsMode != "STRICT" || cfg.xdsAddr != "127.0.0.1:15010" || cfg.adminAddr != "127.0.0.1:0" || opts.churn || !opts.traffic || opts.hubBin != "/bin/hub" {
		t.Errorf("parsed: mtls %q, xds %q, admin %q, churn %v, traffic %v, hub %q; want STRICT, 127.0.0.1:15010, 127.0.0.1:0, false, true, /bin/hub",
			cfg.mtlsMode, cfg.xdsAddr, cfg.adminAddr, opts.churn, opts.traffic, opts.hubBin)
	}
	cfg.kubeconfig = "/tmp/primary.kubeconfig"
	got := strings.Join(cfg.serveArgs(opts.hubArgs), " ")
	for _, want := range []string{"serve --kubeconfig=/tmp/primary.kubeconfig --cluster-id=primary ", " --admin-addr=127.0.0.1:0 ",
		" --mtls-mode=STRICT ", " --bundle-addr=127.0.0.1:8443 ", " --max-workload-cert-ttl 1m --demote-unhealthy-members=false"} {
		if !strings.Contains(got+" ", want) {
			t.Errorf("hub command line %q lacks %q", got, want)
		}
	}

	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--", "--mtls-mode=DISABLE"}, "--mtls-mode after --: the demo sets it"},
		{[]string{"--", "-kubeconfig", "x"}, "--kubeconfig after --"},
		{[]string{"--", "--cluster-id=x"}, "--cluster-id after --"},
		{[]string{"--mtls-mode", "LOOSE"}, "--mtls-mode"},
		{[]string{"--admin-tls-cert", "c.pem"}, "go together"},
		{[]string{"stray"}, `unexpected argument "stray"`},
		{[]string{"--max-workload-cert-ttl", "1m"}, "flag provided but not defined"},
	} {
		var cfg config
		var opts options
		err := parseArgs(tc.args, &cfg, &opts)
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%v: %v; want an error saying %q", tc.args, err, tc.wantErr)
		}
	}
}

// TestTrafficLine: one line for every client that reported (in the given
// order), each member's
// share of the successful calls (in member order, unknown members after),
// the calls, errors and mTLS share; nothing when no client reported since
// the last line.
func TestTrafficLine(t *testing.T) {
	v := newTrafficView([]string{"primary", "west", "east"}, []string{"primary-1", "west-1", "east-1"})
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	if l := v.line(now); l != "" {
		t.Errorf("line before any report: %q", l)
	}
	v.update("east-1", demoStats{Calls: 40, Errors: 20, MTLS: 20, ByMember: map[string]int{"west": 10, "mars": 10}, LastError: "rpc error: code = Unavailable"})
	v.update("west-1", demoStats{Calls: 50, MTLS: 50, ByMember: map[string]int{"primary": 12, "west": 25, "east": 13}})
	want := "traffic 15:04:05  client west-1: primary 24% west 50% east 26% (50 calls/s, 0 errors, 100% mTLS)" +
		" | client east-1: primary 0% west 50% east 0% mars 50% (40 calls/s, 20 errors, 100% mTLS: rpc error: code = Unavailable)"
	if l := v.line(now); l != want {
		t.Errorf("line:\n got %q\nwant %q", l, want)
	}
	if l := v.line(now); l != "" {
		t.Errorf("line without news: %q", l)
	}
}

// TestTrafficLineClientExited: a client that exits is shown as exited,
// not with the figures of its last report as if it still called.
func TestTrafficLineClientExited(t *testing.T) {
	v := newTrafficView([]string{"primary", "west"}, []string{"primary-1", "west-1"})
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	v.update("primary-1", demoStats{Calls: 50, MTLS: 50, ByMember: map[string]int{"primary": 50}})
	v.update("west-1", demoStats{Calls: 50, MTLS: 50, ByMember: map[string]int{"west": 50}})
	_ = v.line(now)
	// west-1's process ends: its output closes.
	c := &demoChild{name: "west-1", stdout: io.NopCloser(strings.NewReader(""))}
	followClient(c, v)
	v.update("primary-1", demoStats{Calls: 50, MTLS: 50, ByMember: map[string]int{"primary": 50}})
	want := "traffic 15:04:05  client primary-1: primary 100% west 0% (50 calls/s, 0 errors, 100% mTLS) | client west-1: exited"
	if l := v.line(now); !strings.HasPrefix(l, want) {
		t.Errorf("line:\n got %q\nwant %q…", l, want)
	}
}

// TestDemoPortsFree: a listener address that is taken is reported with
// its flag before anything starts; free and disabled ones pass.
func TestDemoPortsFree(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := config{adminAddr: taken.Addr().String(), xdsAddr: "127.0.0.1:0", xdsTLSAddr: "127.0.0.1:0"}
	err = demoPortsFree(cfg)
	if err == nil || !strings.Contains(err.Error(), "--admin-addr "+taken.Addr().String()) {
		t.Errorf("with the admin port taken: %v; want an error naming --admin-addr", err)
	}
	cfg.adminAddr = "127.0.0.1:0"
	if err := demoPortsFree(cfg); err != nil {
		t.Errorf("with free ports: %v", err)
	}
}
