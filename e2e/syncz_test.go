package e2e

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
)

// istioctlBin returns $HUB_ISTIOCTL_BIN, or fails the test in CI and skips
// it elsewhere, saying how to get the binary.
func istioctlBin(t *testing.T) string {
	t.Helper()
	const how = "build it with `e2e/interop/build-istiod.sh istioctl` (prints the cached binary's path) " +
		"and export HUB_ISTIOCTL_BIN=<that path>, or run `make test`"
	return binaryFromEnv(t, "HUB_ISTIOCTL_BIN", how)
}

// istioctlRow is one row of `istioctl proxy-status`'s table: its cells by
// column header.
type istioctlRow map[string]string

// proxyStatus runs `istioctl proxy-status` (the real binary, built from the
// Istio module the e2e tests use) with args against the home cluster's
// kubeconfig (istioctl makes a Kubernetes client before it dials
// --xds-address) and parses its table by proxy name.
func proxyStatus(t *testing.T, kubeconfig string, args ...string) (map[string]istioctlRow, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, istioctlBin(t), append([]string{"proxy-status", "--kubeconfig", kubeconfig, "--timeout", "20s"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("istioctl proxy-status %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), tail(stderr.String(), 20))
	}
	return parseTable(stdout.String())
}

// cellGap separates the column headers of istioctl's table (tabwriter
// with a padding of 5); a header holds single spaces at most ("SUBSCRIBED
// TYPES").
var cellGap = regexp.MustCompile(`\s{3,}`)

// parseTable reads a table whose first line is its header, keyed by the
// NAME column. tabwriter aligns every cell to its column's start in the
// header, so a row is cut at those offsets (a cell may be empty).
func parseTable(out string) (map[string]istioctlRow, error) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "NAME") {
		return nil, fmt.Errorf("istioctl printed no table:\n%s", out)
	}
	head := strings.TrimRight(lines[0], " ")
	starts := []int{0}
	for _, gap := range cellGap.FindAllStringIndex(head, -1) {
		starts = append(starts, gap[1])
	}
	rows := map[string]istioctlRow{}
	for _, l := range lines[1:] {
		row := istioctlRow{}
		for i, at := range starts {
			end := len(head)
			if i+1 < len(starts) {
				end = starts[i+1]
			}
			name := strings.TrimSpace(head[at:end])
			if i+1 == len(starts) {
				end = len(l)
			}
			if at > len(l) {
				return nil, fmt.Errorf("istioctl row %q ends before column %s (%q)", l, name, lines[0])
			}
			row[name] = strings.TrimSpace(l[at:min(end, len(l))])
		}
		rows[row["NAME"]] = row
	}
	return rows, nil
}

// synced reports whether the row's types are all SYNCED ("SYNCED (4s)").
func (r istioctlRow) synced(types ...string) error {
	for _, typ := range types {
		if !strings.HasPrefix(r[typ], "SYNCED") {
			return fmt.Errorf("%s %s is %q, want SYNCED", r["NAME"], typ, r[typ])
		}
	}
	return nil
}

// TestIstioctlProxyStatus runs the real istioctl against the hub
// (istio.io/debug/syncz, docs/architecture.md §3.4): on the plaintext port
// `proxy-status --xds-address --plaintext` lists every connected proxy
// (a grpc-go xDS client on the plaintext port, two Istio adsc clients of two
// namespaces on the mTLS port) with its member and the types it ACKed
// SYNCED; on the mTLS port with `--cert-dir` (a workload certificate of
// the hub's CA, as istioctl reads it) a tenant's identity lists its own
// namespace's proxies only, and the root namespace's identity of the home
// cluster lists all of them.
func TestIstioctlProxyStatus(t *testing.T) {
	istioctlBin(t)
	adscBin(t) // skip (or fail in CI) before setting anything up
	e := localcluster.Require(t, env)
	ip := dataPlaneIP(t)
	home, west := e.Cluster("primary"), e.Cluster("west")
	ctx := testContext(t)
	ns := hubNamespace(t, home)
	tenantA, tenantB := "syncz-a-"+rand.String(5), "syncz-b-"+rand.String(5)
	const port = 7070
	backend := startBackend(t, ip, "west-1")
	for _, app := range []string{tenantA, tenantB} {
		if err := localcluster.EnsureNamespace(ctx, client(t, west), app); err != nil {
			t.Fatal(err)
		}
		if err := localcluster.ApplyService(ctx, client(t, west), app, "echo", "grpc", port,
			[]localcluster.Backend{{IP: backend.addr.IP.String(), Port: int32(backend.addr.Port)}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"west": west.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("syncz.test")
	const hubName = "hub.syncz.test"
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0", "--tls-dns-names", hubName)
	tlsAddr := h.addrs["xds-tls"]
	eventually(t, 30*time.Second, func() error {
		var list api.List[api.Service]
		h.getJSON(t, "/api/v1/services", &list)
		n := 0
		for _, s := range list.Items {
			if (s.Namespace == tenantA || s.Namespace == tenantB) && s.Name == "echo" && s.Endpoints["west"] == 1 {
				n++
			}
		}
		if n != 2 {
			return fmt.Errorf("%d of the two echo services federated from west", n)
		}
		return nil
	})

	// Files as istioctl's --cert-dir and adsc read them: the hub's roots,
	// and per identity its chain and key.
	dir := t.TempDir()
	ca := hubCA(t, home, ns, td)
	var rootsPEM []byte
	for _, c := range h.bundle(t, td).X509Authorities() {
		rootsPEM = append(rootsPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	certDir := func(namespace, member string) string {
		d := filepath.Join(dir, namespace+"-"+member)
		writeSVID(t, ca, spiffeid.RequireFromPath(td, "/ns/"+namespace+"/sa/default"), member, d)
		writeFile(t, filepath.Join(d, "root-cert.pem"), rootsPEM)
		return d
	}

	// The proxies: proxyless gRPC on the plaintext port (tenant A's node,
	// its namespace unverified), and one Istio adsc client per tenant on
	// the mTLS port, each with its namespace's certificate.
	grpcID := fmt.Sprintf("sidecar~198.18.0.1~client.%s~%s.svc.cluster.local", tenantA, tenantA)
	xc := startXDSClient(t, h.xdsAddr, fmt.Sprintf("xds:///echo.%s.svc.cluster.local:%d", tenantA, port), "west", tenantA)
	xc.waitFor(t, 60*time.Second, "an answer from west-1", func(l clientLine) bool { return l.text == "ok west-1" })
	adscID := func(app string) string {
		return fmt.Sprintf("sidecar~198.18.0.7~echo.%s~%s.svc.cluster.local", app, app)
	}
	for _, app := range []string{tenantA, tenantB} {
		d := certDir(app, "west")
		edsCluster := fmt.Sprintf("outbound|%d||echo.%s.svc.cluster.local", port, app)
		run := startAdsc(t, "syncz/"+app, "--addr", tlsAddr, "--cert", filepath.Join(d, "cert-chain.pem"), "--key", filepath.Join(d, "key.pem"),
			"--ca", filepath.Join(d, "root-cert.pem"), "--server-spiffe-id", "spiffe://"+td.Name()+"/hub", "--cluster-id", "west",
			"--node-id", adscID(app), "--watch", "cds,eds:"+edsCluster, "--follow", "--log-level", "warn")
		run.waitLine(t, 30*time.Second, "EDS of "+edsCluster, func(l adscLine) bool { return l.Type == "eds" && l.Cluster == edsCluster })
	}

	// The plaintext port: every proxy, each type it ACKed SYNCED (ACKs
	// follow the responses: wait for them).
	kubeconfig := filepath.Join(dir, "home.kubeconfig")
	writeFile(t, kubeconfig, home.Kubeconfig())
	started := time.Now()
	var rows map[string]istioctlRow
	eventually(t, 60*time.Second, func() error {
		var err error
		if rows, err = proxyStatus(t, kubeconfig, "--xds-address", h.xdsAddr, "--plaintext", "-v", "1"); err != nil {
			return err
		}
		for _, id := range []string{grpcID, adscID(tenantA), adscID(tenantB)} {
			if rows[id] == nil {
				return fmt.Errorf("istioctl lists %v; want %s", slices.Sorted(maps.Keys(rows)), id)
			}
		}
		if err := rows[grpcID].synced("LDS", "RDS", "CDS", "EDS"); err != nil {
			return err
		}
		for _, app := range []string{tenantA, tenantB} {
			if err := rows[adscID(app)].synced("CDS", "EDS"); err != nil {
				return err
			}
		}
		return nil
	})
	t.Logf("istioctl proxy-status -v 1 on the plaintext port (%s until all SYNCED):\n%s", time.Since(started).Round(time.Millisecond), formatRows(rows))
	if len(rows) != 3 {
		t.Errorf("istioctl lists %v; want the three proxies only (not istioctl's own stream)", slices.Sorted(maps.Keys(rows)))
	}
	// The default table: each proxy's member, the hub as its control
	// plane, its subscribed types.
	rows, err := proxyStatus(t, kubeconfig, "--xds-address", h.xdsAddr, "--plaintext")
	if err != nil {
		t.Fatal(err)
	}
	for id, row := range rows {
		if row["CLUSTER"] != "west" || row["ISTIOD"] == "" || row["ISTIOD"] == "MISSING" || row["ISTIOD"] == "INVALID" {
			t.Errorf("istioctl's row of %s: %v; want CLUSTER west and the hub's instance as ISTIOD", id, row)
		}
	}
	if got := rows[grpcID]["SUBSCRIBED TYPES"]; got != "4 (CDS,LDS,EDS,RDS)" {
		t.Errorf("the gRPC client subscribes to %q; want 4 (CDS,LDS,EDS,RDS)", got)
	}

	// The mTLS port, with istioctl's --cert-dir: tenant A's identity sees
	// its own adsc client only (not tenant B's, not the plaintext client
	// whose node claims tenant A); B's its own; the home cluster's root
	// namespace identity every proxy.
	for _, c := range []struct {
		who  string
		dir  string
		want []string
	}{
		{"tenant A", certDir(tenantA, "west"), []string{adscID(tenantA)}},
		{"tenant B", certDir(tenantB, "west"), []string{adscID(tenantB)}},
		{"the root namespace", certDir("istio-system", home.Name), []string{adscID(tenantA), adscID(tenantB), grpcID}},
	} {
		rows, err := proxyStatus(t, kubeconfig, "--xds-address", tlsAddr, "--cert-dir", c.dir, "--authority", hubName, "-v", "1")
		if err != nil {
			t.Fatalf("%s: %v", c.who, err)
		}
		if got := slices.Sorted(maps.Keys(rows)); !slices.Equal(got, slices.Sorted(slices.Values(c.want))) {
			t.Errorf("%s's identity on the mTLS port: istioctl lists %v; want %v", c.who, got, c.want)
		}
		for _, id := range c.want {
			if err := rows[id].synced("CDS", "EDS"); err != nil {
				t.Errorf("%s: %v", c.who, err)
			}
		}
	}
}

func formatRows(rows map[string]istioctlRow) string {
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(rows)) {
		fmt.Fprintf(&b, "  %v\n", rows[id])
	}
	return b.String()
}
