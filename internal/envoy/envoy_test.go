package envoy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
)

func freePort(t *testing.T) uint32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint32(l.Addr().(*net.TCPAddr).Port)
}

// TestStaticEnvoy runs a real Envoy on a static bootstrap and reads it back
// through every admin reader.
func TestStaticEnvoy(t *testing.T) {
	bin := BinaryT(t)
	backendPort, listenerPort := freePort(t), freePort(t)
	bs, err := Marshal(&bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: "static-test", Cluster: "test"},
		Admin: LoopbackAdmin(),
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: []*listenerv3.Listener{DirectResponseListener("hello", "127.0.0.1", listenerPort, 200, "hello from envoy\n")},
			Clusters:  []*clusterv3.Cluster{StaticCluster("backend", "127.0.0.1", backendPort)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := Start(ctx, Options{Bin: bin, Bootstrap: bs, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("envoy log, last lines:\n%s", p.LogTail(40))
		}
		_ = p.Stop()
	}()
	if !strings.HasPrefix(p.Admin(), "http://127.0.0.1:") {
		t.Errorf("Admin() = %q, want http://127.0.0.1:<port>", p.Admin())
	}
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	info, err := p.ServerInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info.GetVersion(), "/"+Version+"/") {
		t.Errorf("/server_info version = %q, want Envoy %s", info.GetVersion(), Version)
	}
	if info.GetState() != adminv3.ServerInfo_LIVE {
		t.Errorf("/server_info state = %v, want LIVE", info.GetState())
	}
	t.Logf("envoy %s, pid %d, admin %s", info.GetVersion(), p.PID(), p.Admin())

	// The listener answers (and its counters then move).
	resp, err := http.Get("http://127.0.0.1:" + itoa(listenerPort) + "/anything")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello from envoy\n" {
		t.Errorf("GET listener: %d %q, want 200 %q", resp.StatusCode, body, "hello from envoy\n")
	}

	stats, err := p.Stats(ctx, `^(server\.|http\.hello\.|cluster\.backend\.)`)
	if err != nil {
		t.Fatal(err)
	}
	if got := stats["http.hello.downstream_rq_2xx"]; got != 1 {
		t.Errorf("http.hello.downstream_rq_2xx = %d, want 1", got)
	}
	if _, ok := stats["server.uptime"]; !ok {
		t.Errorf("no server.uptime gauge in %d stats", len(stats))
	}
	if got, ok := stats["cluster.backend.membership_total"]; !ok || got != 1 {
		t.Errorf("cluster.backend.membership_total = %d (present %v), want 1", got, ok)
	}
	for name := range stats {
		if !strings.HasPrefix(name, "server.") && !strings.HasPrefix(name, "http.hello.") && !strings.HasPrefix(name, "cluster.backend.") {
			t.Errorf("stat %s does not match the filter", name)
		}
	}

	clusters, err := p.Clusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var backend *ClusterStatus
	for i := range clusters {
		if clusters[i].Name == "backend" {
			backend = &clusters[i]
		}
	}
	if backend == nil {
		t.Fatalf("no cluster backend in %+v", clusters)
	}
	want := "127.0.0.1:" + itoa(backendPort)
	if backend.AddedViaAPI || len(backend.Hosts) != 1 || backend.Hosts[0].Address != want || !backend.Hosts[0].Healthy() {
		t.Errorf("cluster backend = %+v, want one healthy static host %s", *backend, want)
	}

	dump, err := p.ConfigDump(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	var sawListener, sawCluster, sawBootstrap bool
	for _, c := range dump.GetConfigs() {
		m, err := c.UnmarshalNew()
		if err != nil {
			t.Errorf("config dump entry %s: %v", c.GetTypeUrl(), err)
			continue
		}
		switch m := m.(type) {
		case *adminv3.BootstrapConfigDump:
			sawBootstrap = m.GetBootstrap().GetNode().GetId() == "static-test"
		case *adminv3.ListenersConfigDump:
			for _, l := range m.GetStaticListeners() {
				var ln listenerv3.Listener
				if err := l.GetListener().UnmarshalTo(&ln); err == nil && ln.GetName() == "hello" {
					sawListener = true
				}
			}
		case *adminv3.ClustersConfigDump:
			for _, c := range m.GetStaticClusters() {
				var cl clusterv3.Cluster
				if err := c.GetCluster().UnmarshalTo(&cl); err == nil && cl.GetName() == "backend" {
					sawCluster = true
				}
			}
		}
	}
	if !sawBootstrap || !sawListener || !sawCluster {
		t.Errorf("config dump: bootstrap with node static-test %v, static listener hello %v, static cluster backend %v; want all", sawBootstrap, sawListener, sawCluster)
	}

	if _, err := p.Get(ctx, "/no-such-page"); err == nil {
		t.Error("Get of an unknown admin page did not fail")
	}

	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	select {
	case <-p.Done():
	default:
		t.Error("Done not closed after Stop")
	}
	log, err := p.Log()
	if err != nil || !strings.Contains(log, "starting main dispatch loop") {
		t.Errorf("Log() = %d bytes (err %v), want Envoy's log", len(log), err)
	}
}

// TestStartFailure: an Envoy that rejects its bootstrap makes Start fail
// with the reason from its log.
func TestStartFailure(t *testing.T) {
	bin := BinaryT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Start(ctx, Options{Bin: bin, Bootstrap: []byte(`{"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}}, "no_such_field": 1}`), Dir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "no_such_field") {
		t.Fatalf("Start with a bad bootstrap: %v, want an error quoting the log about no_such_field", err)
	}
}

// TestStartWithoutConfig: an ADS Envoy whose xDS server is not there
// starts (its admin API answers) but is not ready.
func TestStartWithoutConfig(t *testing.T) {
	js, err := ADS{NodeID: "lonely", NodeCluster: "c", XDSAddr: "127.0.0.1:" + itoa(freePort(t)), LDS: true}.JSON()
	if err != nil {
		t.Fatal(err)
	}
	p := StartT(t, Options{Bootstrap: js, ID: "lonely-cli"})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = p.WaitReady(ctx)
	if err == nil || !strings.Contains(err.Error(), "INITIALIZING") {
		t.Errorf("WaitReady without an xDS server: %v, want a not-ready error saying INITIALIZING", err)
	}
	info, err := p.ServerInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if id := info.GetNode().GetId(); id != "lonely-cli" {
		t.Errorf("node id %q, want lonely-cli (Options.ID)", id)
	}
}

// TestNetns runs Envoy in a network namespace of its own (as root) and
// reads its admin API from outside, through the namespace.
func TestNetns(t *testing.T) {
	bin := BinaryT(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	ns := "hub-envoy-test-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	if out, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v: %s", ns, err, out)
	}
	port := freePort(t)
	bs, err := Marshal(&bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: "netns-test", Cluster: "test"},
		Admin: LoopbackAdmin(),
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: []*listenerv3.Listener{DirectResponseListener("hello", "127.0.0.1", port, 200, "hi")},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := StartT(t, Options{Bin: bin, Bootstrap: bs, Netns: ns})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	stats, err := p.Stats(ctx, `^listener_manager\.total_listeners_active$`)
	if err != nil {
		t.Fatal(err)
	}
	if got := stats["listener_manager.total_listeners_active"]; got != 1 {
		t.Errorf("listener_manager.total_listeners_active = %d, want 1", got)
	}
	// The listener is in the namespace, not here.
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+itoa(port), time.Second); err == nil {
		c.Close()
		t.Errorf("the namespace's listener 127.0.0.1:%d answers outside it", port)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
}

// TestADSBootstrapValidates checks that Envoy itself accepts what ADS builds
// (envoy --mode validate), in each of its shapes.
func TestADSBootstrapValidates(t *testing.T) {
	bin := BinaryT(t)
	dir := t.TempDir()
	tlsFiles := writeTestCerts(t, dir)
	zero := time.Duration(0)
	cases := map[string]ADS{
		"sotw plaintext": {
			NodeID: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", NodeCluster: "a.ns",
			XDSAddr: "127.0.0.1:15010",
		},
		"delta mtls lds": {
			NodeID: "router~10.0.0.2~gw.ns~ns.svc.cluster.local", NodeCluster: "gw.ns",
			Metadata: map[string]string{"CLUSTER_ID": "west", "NAMESPACE": "ns", "NETWORK": "net-main"},
			Locality: Locality{Region: "eu", Zone: "eu-1"},
			XDSAddr:  "127.0.0.1:15012", Delta: true, SetNodeOnFirstMessageOnly: true,
			TLS: tlsFiles, InitialFetchTimeout: &zero, LDS: true,
			StaticListeners: []*listenerv3.Listener{
				HTTPListener("http", "127.0.0.1", 15080, "http.80", true),
				HTTPListener("http-inline", "127.0.0.1", 15081, "inline", false),
				TCPListener("tcp", "127.0.0.1", 15443, "backend"),
			},
			StaticClusters: []*clusterv3.Cluster{StaticCluster("backend", "127.0.0.1", 8080)},
		},
		"dns xds server": {
			NodeID: "n", NodeCluster: "c", XDSAddr: "hub.hub-system.svc:15010",
			TLS: &TLSFiles{CAFile: tlsFiles.CAFile, ServerName: "hub.hub-system.svc"},
		},
	}
	for name, a := range cases {
		t.Run(name, func(t *testing.T) {
			js, err := a.JSON()
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "bootstrap.json")
			if err := os.WriteFile(file, js, 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "--mode", "validate", "-c", file, "-l", "warning", "--disable-hot-restart", "--use-dynamic-base-id").CombinedOutput()
			if err != nil {
				t.Fatalf("envoy --mode validate: %v\n%s\nbootstrap:\n%s", err, out, js)
			}
			if !strings.Contains(string(out), "OK") {
				t.Errorf("envoy --mode validate said:\n%s", out)
			}
		})
	}
}

func TestADSErrors(t *testing.T) {
	for _, addr := range []string{"", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000"} {
		if _, err := (ADS{NodeID: "n", NodeCluster: "c", XDSAddr: addr}).JSON(); err == nil {
			t.Errorf("XDSAddr %q: no error", addr)
		}
	}
}

func TestParseStats(t *testing.T) {
	got, err := ParseStats([]byte(`{"stats":[{"name":"a.b","value":3},{"name":"g","value":0},{"name":"t","value":"text"},{"histograms":{"supported_quantiles":[0]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["a.b"] != 3 || got["g"] != 0 {
		t.Errorf("parseStats = %v", got)
	}
}

func TestBinary(t *testing.T) {
	t.Setenv(BinEnv, "")
	if _, err := Binary(); err == nil || !strings.Contains(err.Error(), "install.sh") {
		t.Errorf("Binary() with %s unset: %v, want an error naming install.sh", BinEnv, err)
	}
	t.Setenv(BinEnv, filepath.Join(t.TempDir(), "missing"))
	if _, err := Binary(); err == nil || !strings.Contains(err.Error(), "install.sh") {
		t.Errorf("Binary() with a missing file: %v, want an error naming install.sh", err)
	}
}

// writeTestCerts writes a CA and a client certificate it signed, as PEM.
func writeTestCerts(t *testing.T, dir string) *TLSFiles {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "envoy"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f := &TLSFiles{
		CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"),
		CAFile: filepath.Join(dir, "ca.pem"), ServerName: "hub.hub-system.svc",
	}
	for file, block := range map[string]*pem.Block{
		f.CertFile: {Type: "CERTIFICATE", Bytes: leafDER},
		f.KeyFile:  {Type: "PRIVATE KEY", Bytes: keyDER},
		f.CAFile:   {Type: "CERTIFICATE", Bytes: caDER},
	} {
		if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func itoa(n uint32) string { return strconv.Itoa(int(n)) }

// TestStopAfterCrash: Stop on an Envoy that already died says so.
func TestStopAfterCrash(t *testing.T) {
	bin := BinaryT(t)
	bs, err := Marshal(&bootstrapv3.Bootstrap{Admin: LoopbackAdmin(), Node: &corev3.Node{Id: "n", Cluster: "c"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := Start(ctx, Options{Bin: bin, Bootstrap: bs, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if err := p.Stop(); err == nil || !strings.Contains(err.Error(), "already exited") {
		t.Errorf("Stop after SIGKILL: %v, want an error saying it had already exited", err)
	}
	if err := p.WaitReady(ctx); err == nil {
		t.Error("WaitReady on a dead Envoy did not fail")
	}
}

// TestUnknownAnyDecodes: a config dump holding an Any of a type nobody
// registered still decodes (the Any keeps its type URL, loses its content).
func TestUnknownAnyDecodes(t *testing.T) {
	js := `{"configs": [
	  {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump", "version_info": "v1",
	   "dynamic_listeners": [{"name": "l", "active_state": {"listener": {
	     "@type": "type.googleapis.com/envoy.config.listener.v3.Listener", "name": "l",
	     "filter_chains": [{"filters": [{"name": "x", "typed_config": {"@type": "type.googleapis.com/example.unknown.v1.Filter", "some_field": {"nested": [1, 2]}}}]}]}}}]},
	  {"@type": "type.googleapis.com/example.unknown.v1.ConfigDump", "anything": true}
	]}`
	dump := &adminv3.ConfigDump{}
	if err := unmarshal([]byte(js), dump); err != nil {
		t.Fatal(err)
	}
	if n := len(dump.GetConfigs()); n != 2 {
		t.Fatalf("%d configs, want 2", n)
	}
	var lcd adminv3.ListenersConfigDump
	if err := dump.GetConfigs()[0].UnmarshalTo(&lcd); err != nil {
		t.Fatal(err)
	}
	var l listenerv3.Listener
	if err := lcd.GetDynamicListeners()[0].GetActiveState().GetListener().UnmarshalTo(&l); err != nil {
		t.Fatal(err)
	}
	if got := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().GetTypeUrl(); got != "type.googleapis.com/example.unknown.v1.Filter" {
		t.Errorf("unknown filter's type URL = %q", got)
	}
	if got := dump.GetConfigs()[1].GetTypeUrl(); got != "type.googleapis.com/example.unknown.v1.ConfigDump" {
		t.Errorf("unknown config's type URL = %q", got)
	}
}
