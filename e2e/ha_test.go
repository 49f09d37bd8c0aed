package e2e

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/leader"
	"github.com/hubmesh/hub/internal/localcluster"
)

// kill ends the hub with SIGKILL (a crash) and waits for it.
func (h *hubProcess) kill() {
	h.stopOnce.Do(func() {
		h.Kill()
	})
}

// seedEcho creates namespace ns in c with a Service echo of n endpoints at
// 198.18.<third>.1..n (members that share the Service need their own
// addresses: the hub lists an address once).
func seedEcho(t *testing.T, c *localcluster.Cluster, ns string, n int, third byte) string {
	t.Helper()
	ctx := testContext(t)
	if err := localcluster.EnsureNamespace(ctx, client(t, c), ns); err != nil {
		t.Fatal(err)
	}
	var backends []localcluster.Backend
	for i := range n {
		backends = append(backends, localcluster.Backend{IP: fmt.Sprintf("198.18.%d.%d", third, i+1), Port: 8080})
	}
	if err := localcluster.ApplyService(ctx, client(t, c), ns, "echo", "http", 80, backends); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("outbound|80||echo.%s.svc.cluster.local", ns)
}

// hubLeaseHolder is the identity holding the hub's Lease in ns, if any.
func hubLeaseHolder(t *testing.T, home *localcluster.Cluster, ns string) string {
	t.Helper()
	l, err := client(t, home).CoordinationV1().Leases(ns).Get(testContext(t), leader.LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func (h *hubProcess) pid() string { return strconv.Itoa(h.PID()) }

// TestHAFailover runs two replicas against the same home cluster: both
// serve identical configuration, one leads, and when the leader crashes the
// other takes the Lease within its duration while the crashed replica's
// proxies reconnect to the survivor and get byte-identical resources.
// Singleton writes (Events) come from the leader only.
func TestHAFailover(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west := e.Cluster("primary"), e.Cluster("west")
	ctx := testContext(t)
	app := "ha-" + rand.String(5)
	eds := seedEcho(t, west, app, 3, 1)
	ns := hubNamespace(t, home)
	secrets := client(t, home).CoreV1().Secrets(ns)
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{"west": west.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := startHub(t, home, "--namespace", ns)
	b := startHub(t, home, "--namespace", ns)
	byPID := map[string]*hubProcess{a.pid(): a, b.pid(): b}
	var lead, survivor *hubProcess
	eventually(t, 30*time.Second, func() error {
		holder := hubLeaseHolder(t, home, ns)
		i := strings.LastIndexByte(holder, '-')
		if i < 0 || byPID[holder[i+1:]] == nil {
			return fmt.Errorf("lease holder %q is neither replica", holder)
		}
		lead = byPID[holder[i+1:]]
		return nil
	})
	survivor = a
	if lead == a {
		survivor = b
	}
	pLead := startProxy(t, []string{lead.xdsAddr, survivor.xdsAddr}, "west", eds)
	pSurvivor := startProxy(t, []string{survivor.xdsAddr}, "west", eds)
	eventually(t, 30*time.Second, func() error {
		l, s := pLead.snapshot(), pSurvivor.snapshot()
		if l.Endpoints[eds] != 3 || s.Endpoints[eds] != 3 {
			return fmt.Errorf("endpoints: via leader %v, via survivor %v", l.Endpoints, s.Endpoints)
		}
		if !sameConfig(l, s, eds) {
			return fmt.Errorf("replicas serve different resources:\n%v\n%v", l.Held, s.Held)
		}
		return nil
	})
	before := pLead.snapshot()

	// An Event-worthy change is recorded once, by the leader, although both
	// replicas see it.
	countEvents := func(substr string) int {
		list, err := client(t, home).CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ev := range list.Items {
			if strings.Contains(ev.Message, substr) {
				n += max(int(ev.Count), 1)
			}
		}
		return n
	}
	addBadKey := func(key string) {
		s, err := secrets.Get(ctx, "members", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Data[key] = []byte("not: [a kubeconfig")
		if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	addBadKey("bad-one")
	for _, h := range []*hubProcess{a, b} {
		eventually(t, 20*time.Second, func() error {
			if st := h.clusters(t)["bad-one"].State; st != "Invalid" {
				return fmt.Errorf("bad-one is %q", st)
			}
			return nil
		})
	}
	eventually(t, 10*time.Second, func() error {
		if n := countEvents("cluster bad-one"); n != 1 {
			return fmt.Errorf("%d events for bad-one; want exactly 1 (from the leader)", n)
		}
		return nil
	})

	// The leader crashes.
	killed := time.Now()
	lead.kill()
	eventually(t, leader.LeaseDuration+2*leader.RetryPeriod+5*time.Second, func() error {
		if h := hubLeaseHolder(t, home, ns); !strings.HasSuffix(h, "-"+survivor.pid()) {
			return fmt.Errorf("lease still held by %q", h)
		}
		return nil
	})
	takeover := time.Since(killed)
	t.Logf("leader killed → survivor holds the Lease after %s (lease duration %s)", takeover.Round(100*time.Millisecond), leader.LeaseDuration)
	// client-go's follower counts the lease duration from when it observed
	// the last renewal (up to one retry period late) and tries again every
	// retry period; a few seconds more allow for a loaded machine.
	if bound := leader.LeaseDuration + 2*leader.RetryPeriod + 3*time.Second; takeover > bound {
		t.Errorf("takeover took %s; want within the lease duration %s (+ 2 retry periods + 3 s slack = %s)", takeover, leader.LeaseDuration, bound)
	}
	eventually(t, 20*time.Second, func() error {
		s := pLead.snapshot()
		if s.Addr != survivor.xdsAddr || s.Reconnects == 0 {
			return fmt.Errorf("the killed replica's proxy is on %s after %d reconnects", s.Addr, s.Reconnects)
		}
		if !sameConfig(s, before, eds) {
			return fmt.Errorf("after failover the proxy holds %v; before %v", s.Held, before.Held)
		}
		return nil
	})
	if s := pLead.snapshot(); s.EmptyEDS != 0 {
		t.Errorf("the failing-over proxy got %d empty endpoint pushes", s.EmptyEDS)
	}
	// The gauge is set by the survivor after its Lease write: wait for it.
	eventually(t, 10*time.Second, func() error {
		if v := metric(t, survivor, "hub_leader"); v != "1" {
			return fmt.Errorf("survivor hub_leader = %q; want 1", v)
		}
		return nil
	})
	// The survivor, now leader, records Events.
	addBadKey("bad-two")
	eventually(t, 20*time.Second, func() error {
		if n := countEvents("cluster bad-two"); n != 1 {
			return fmt.Errorf("%d events for bad-two; want 1 from the new leader", n)
		}
		return nil
	})
}

// TestGracefulShutdown: on SIGTERM readiness fails first, then the xDS
// streams are closed one by one within --shutdown-grace (each client
// reconnects elsewhere), and the hub exits 0.
func TestGracefulShutdown(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west := e.Cluster("primary"), e.Cluster("west")
	ctx := testContext(t)
	app := "term-" + rand.String(5)
	eds := seedEcho(t, west, app, 2, 1)
	ns := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{"west": west.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const grace = 6 * time.Second
	h := startHub(t, home, "--namespace", ns, "--shutdown-grace", grace.String())
	other := startHub(t, home, "--namespace", ns) // where proxies go next
	var proxies []*proxy
	for range 20 {
		proxies = append(proxies, startProxy(t, []string{h.xdsAddr, other.xdsAddr}, "west", eds))
	}
	eventually(t, 30*time.Second, func() error {
		for _, p := range proxies {
			if s := p.snapshot(); s.Endpoints[eds] != 2 || s.Addr != h.xdsAddr {
				return fmt.Errorf("proxy on %q has %v", s.Addr, s.Endpoints)
			}
		}
		return nil
	})
	want := proxies[0].snapshot()

	start := time.Now()
	if err := h.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Readiness fails while streams are still being served.
	eventually(t, 5*time.Second, func() error {
		resp, err := http.Get(h.adminURL + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			return fmt.Errorf("readyz %s", resp.Status)
		}
		return nil
	})
	onOld := 0
	for _, p := range proxies {
		if p.snapshot().Addr == h.xdsAddr && p.snapshot().Reconnects == 0 {
			onOld++
		}
	}
	t.Logf("readiness failed %s after SIGTERM with %d of %d streams still open", time.Since(start).Round(time.Millisecond), onOld, len(proxies))
	if onOld == 0 {
		t.Errorf("every stream was closed before readiness failed")
	}
	select {
	case <-h.Done():
	case <-time.After(grace + 10*time.Second):
		t.Fatalf("hub still running %s after SIGTERM (grace %s)", time.Since(start), grace)
	}
	h.stopOnce.Do(func() {})
	if err := h.Err(); err != nil {
		t.Errorf("hub exited with %v after SIGTERM", err)
	}
	took := time.Since(start)
	t.Logf("SIGTERM → exit: %s (grace %s)", took.Round(time.Millisecond), grace)
	// Every proxy moved to the other replica with identical resources and
	// never saw an empty endpoint set.
	eventually(t, 20*time.Second, func() error {
		for _, p := range proxies {
			s := p.snapshot()
			if s.Addr != other.xdsAddr || !sameConfig(s, want, eds) {
				return fmt.Errorf("proxy on %s holds %v", s.Addr, s.Endpoints)
			}
			if s.EmptyEDS != 0 {
				t.Fatalf("a proxy got %d empty endpoint pushes", s.EmptyEDS)
			}
		}
		return nil
	})
	data, _ := readFile(h.logPath)
	if !strings.Contains(data, `"msg":"xDS listener drained"`) || !strings.Contains(data, `"streams":20`) {
		t.Errorf("hub log has no drain of 20 streams:\n%s", tail(data, 15))
	}
}

// metric returns the value of an unlabelled metric on the hub's /metrics.
func metric(t *testing.T, h *hubProcess, name string) string {
	t.Helper()
	for _, line := range strings.Split(h.scrapeMetrics(t), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}
