package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
)

// TestRestartServesPersistedViewAsStale (docs/architecture.md §4): a hub restarted
// while a member's API server is down serves that member from the view it
// persisted, as Stale, instead of as empty. A live grpc-go xds:/// client
// and a few raw ADS proxies ride through the restart: the client keeps
// reaching the member's backend through the restarted hub, no proxy ever
// gets an empty endpoint set, and when the member's API server returns the
// member is Ready and its changes flow again.
func TestRestartServesPersistedViewAsStale(t *testing.T) {
	t.Parallel()
	e := localcluster.Require(t, env)
	ip := dataPlaneIP(t)
	ctx := testContext(t)
	home := e.Cluster("primary")
	// A member of its own, so stopping its API server touches no other test.
	memberEnv, err := localcluster.Start(ctx, localcluster.Options{Names: []string{"stale-member"}, BinDir: os.Getenv("HUB_K8S_BIN_DIR")})
	if err != nil {
		t.Fatalf("starting the member cluster: %v", err)
	}
	t.Cleanup(memberEnv.Stop)
	member := memberEnv.Cluster("stale-member")

	app := "stale-" + rand.String(5)
	const port = 7070
	b1, b2 := startBackend(t, ip, "stale-1"), startBackend(t, ip, "stale-2")
	endpoint := func(b *backend) []localcluster.Backend {
		return []localcluster.Backend{{IP: b.addr.IP.String(), Port: int32(b.addr.Port)}}
	}
	if err := localcluster.EnsureNamespace(ctx, client(t, member), app); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, client(t, member), app, "echo", "grpc", port, endpoint(b1)); err != nil {
		t.Fatal(err)
	}
	ns := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members",
		map[string][]byte{member.Name: member.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	h := startHub(t, home, "--namespace", ns)
	addr := h.xdsAddr
	host := fmt.Sprintf("echo.%s.svc.cluster.local", app)
	eds := fmt.Sprintf("outbound|%d||%s", port, host)
	xc := startXDSClient(t, addr, fmt.Sprintf("xds:///%s:%d", host, port), home.Name, app)
	xc.waitFor(t, 60*time.Second, "an answer from the member's backend", func(l clientLine) bool { return l.text == "ok stale-1" })
	var f fleet
	for range 5 {
		f = append(f, startProxy(t, []string{addr}, home.Name, eds))
	}
	f.expect(t, 30*time.Second, "before the restart", map[string]int{eds: 1})

	// The leader persisted the member's view, backend included.
	cms := client(t, home).CoreV1().ConfigMaps(ns)
	eventually(t, 60*time.Second, func() error {
		list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: "hub.federation/cluster=" + member.Name + ",hub.federation/member-view-role=manifest"})
		if err != nil || len(list.Items) != 1 {
			return fmt.Errorf("persisted view manifests of %s: %d (%v)", member.Name, len(list.Items), err)
		}
		view, err := gunzip(list.Items[0].BinaryData["view.json.gz"])
		if err != nil {
			return err
		}
		if want := fmt.Sprintf(`"a":%q,"p":%d`, b1.addr.IP.String(), b1.addr.Port); !strings.Contains(view, want) {
			return fmt.Errorf("persisted view %s does not hold %s", view, want)
		}
		return nil
	})

	// The member's API server goes down, then the hub restarts.
	member.StopAPIServer()
	xc.drain()
	restarted := time.Now()
	h.stop(t)
	h2 := startHub(t, home, "--namespace", ns, "--xds-addr", addr)
	c := h2.clusterState(t, 35*time.Second, member.Name, "Stale")
	if !strings.Contains(c.Message, "serving the view persisted at") || c.Services < 1 || c.Endpoints != 1 {
		t.Errorf("restarted hub lists the member as %+v; want Stale from its persisted view with 1 endpoint", c)
	}
	t.Logf("restarted hub ready %s after SIGTERM; member: %s %s", time.Since(restarted).Round(100*time.Millisecond), c.State, c.Message)

	// The grpc-go client is connected to the restarted hub, has acknowledged
	// its endpoints, which hold the member's backend, and keeps reaching it.
	nodeID := fmt.Sprintf("sidecar~198.18.0.1~client.%s~%s.svc.cluster.local", app, app)
	eventually(t, 60*time.Second, func() error {
		var cfg api.ProxyConfig
		if err := h2.tryGetJSON("/api/v1/proxies/"+url.PathEscape(nodeID)+"/config", &cfg); err != nil {
			return err
		}
		acked := false
		for _, ts := range cfg.Proxy.Types {
			acked = acked || ts.Type == "EDS" && ts.AckedVersion != ""
		}
		if !acked {
			return fmt.Errorf("the grpc-go client has not acknowledged endpoints from the restarted hub: %+v", cfg.Proxy.Types)
		}
		for _, r := range cfg.Resources["EDS"] {
			if strings.Contains(string(r), b1.addr.IP.String()) && strings.Contains(string(r), fmt.Sprint(b1.addr.Port)) {
				return nil
			}
		}
		return fmt.Errorf("the restarted hub sent the grpc-go client no endpoint of the member: %s", cfg.Resources["EDS"])
	})
	errsBefore := xc.errs.Load()
	oks := 0
	xc.drain()
	xc.waitFor(t, 30*time.Second, "20 answers from the member's backend through the restarted hub", func(l clientLine) bool {
		if l.text != "ok stale-1" {
			t.Fatalf("the grpc-go client lost the member's backend after the restart: %q", l.text)
		}
		oks++
		return oks == 20
	})
	t.Logf("grpc-go client: %d failed calls around the restart", errsBefore)
	f.expect(t, 30*time.Second, "after the restart", map[string]int{eds: 1})
	f.holdsFor(t, 3*time.Second, map[string]int{eds: 1})

	// The member's API server returns: Ready, and its changes flow again.
	if err := member.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := member.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	h2.clusterState(t, 60*time.Second, member.Name, "Ready")
	t.Logf("member Ready %s after its API server came back", time.Since(back).Round(100*time.Millisecond))
	if err := localcluster.ApplyEndpoints(ctx, client(t, member), app, "echo", "grpc", endpoint(b2)); err != nil {
		t.Fatal(err)
	}
	xc.waitFor(t, 60*time.Second, "an answer from the member's new backend", func(l clientLine) bool { return l.text == "ok stale-2" })
	f.noEmpty(t)
}

// tryGetJSON is getJSON that returns errors instead of failing the test.
func (h *hubProcess) tryGetJSON(path string, v any) error {
	req, err := http.NewRequest(http.MethodGet, h.adminURL+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	return json.Unmarshal(body, v)
}

func gunzip(data []byte) (string, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("persisted view: %w", err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		return "", fmt.Errorf("persisted view: %w", err)
	}
	return string(out), nil
}
