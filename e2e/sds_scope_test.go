package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

// TestSDSPushScopedToChangedSecret (issue 13, deliverable 4): a Secret's
// change reaches only the SDS watches whose identity can see that Secret.
// Four proxies ask for a Secret named gw-cert or for roots: of namespace a
// in west (the one rotated), of namespace b in west, of namespace a in
// east, and one of namespace a in west that asks only for ROOTCA.
// Rotating west's a/gw-cert makes pushes evaluate exactly one SDS watch
// (hub_xds_push_evaluations_total: the hub before this change evaluated
// all four) and answers that proxy; the others are sent nothing, which the
// next change they do see shows: it is their very next response.
func TestSDSPushScopedToChangedSecret(t *testing.T) {
	t.Parallel()
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	a, b := "scope-a-"+rand.String(5), "scope-b-"+rand.String(5)
	secret := func(ns, cert string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gw-cert"}, Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"tls.crt": []byte(cert), "tls.key": []byte("KEY")}}
	}
	put := func(c *localcluster.Cluster, ns, cert string) {
		t.Helper()
		cs := client(t, c)
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, "gw-cert", metav1.GetOptions{})
		if err != nil {
			if _, err := cs.CoreV1().Secrets(ns).Create(ctx, secret(ns, cert), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			return
		}
		s.Data["tls.crt"] = []byte(cert)
		if _, err := cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []*localcluster.Cluster{west, east} {
		for _, ns := range []string{a, b} {
			if err := localcluster.EnsureNamespace(ctx, client(t, c), ns); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(west, a, "WEST-A-0")
	put(west, b, "WEST-B-0")
	put(east, a, "EAST-A-0")

	ns := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		west.Name: west.Kubeconfig(), east.Name: east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("scope.test")
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0")
	eventually(t, 60*time.Second, func() error {
		if cl := h.clusters(t); cl[west.Name].State != "Ready" || cl[east.Name].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})
	ca := hubCA(t, home, ns, td)
	creds := workloadCreds(t, ca, h.bundle(t, td))
	tlsAddr := h.addrs["xds-tls"]
	const gw = "kubernetes://gw-cert"
	proxies := []struct {
		name, ns string
		member   *localcluster.Cluster
		names    []string
		first    string // gw-cert's first certificate; "" when not asked
	}{
		{"west-a", a, west, []string{gw}, "WEST-A-0"},
		{"west-b", b, west, []string{gw}, "WEST-B-0"},
		{"east-a", a, east, []string{gw}, "EAST-A-0"},
		{"west-a-roots", a, west, []string{"ROOTCA"}, ""},
	}
	watches := map[string]*sdsWatch{}
	for _, p := range proxies {
		w := openSDS(t, tlsAddr, creds(p.ns, "gateway", p.member.Name), p.member.Name, "scope-"+p.name, p.names...)
		watches[p.name] = w
		eventually(t, 60*time.Second, func() error {
			if w.answered() == 0 {
				return fmt.Errorf("%s has no response", p.name)
			}
			if got := w.last()[gw]; got != p.first {
				return fmt.Errorf("%s holds gw-cert %q; want %q", p.name, got, p.first)
			}
			return nil
		})
	}
	// Whatever the set-up left to push (e.g. a member's Secrets synced,
	// reported while the watches were answered from its cache) is pushed
	// before counting: three pushes after a change no SDS watch concerns
	// (a Service in east's namespace b) mean every change reported before
	// the first was pushed and its evaluations counted (pushes run one at
	// a time; a push that started before a change may not carry it).
	pushes := func() int {
		t.Helper()
		n := 0
		for _, line := range strings.Split(h.scrapeMetrics(t), "\n") {
			if rest, ok := strings.CutPrefix(line, "hub_xds_pushes_total{"); ok {
				v, err := strconv.Atoi(rest[strings.LastIndexByte(rest, ' ')+1:])
				if err != nil {
					t.Fatalf("hub_xds_pushes_total: %q", line)
				}
				n += v
			}
		}
		return n
	}
	for i := range 3 {
		p := pushes()
		if err := localcluster.ApplyService(ctx, client(t, east), b, "flush", "http", 8080,
			[]localcluster.Backend{{IP: fmt.Sprintf("198.18.99.%d", i+1), Port: 8080}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, func() error {
			if n := pushes(); n <= p {
				return fmt.Errorf("no push since %d", p)
			}
			return nil
		})
	}
	before := map[string]int{}
	for name, w := range watches {
		before[name] = w.answered()
	}
	evaluations := func() int {
		t.Helper()
		v := metric(t, h, `hub_xds_push_evaluations_total{type="Secret"}`)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("hub_xds_push_evaluations_total: %q", v)
		}
		return n
	}
	evaluated := evaluations()

	// Rotate west's a/gw-cert: its proxy gets it, and no other SDS watch
	// was evaluated for it (only this test's proxies are connected to this
	// hub; other tests' Secret changes in west and east concern none of them).
	put(west, a, "WEST-A-1")
	eventually(t, 60*time.Second, func() error {
		if got := watches["west-a"].last()[gw]; got != "WEST-A-1" {
			return fmt.Errorf("west-a holds %q", got)
		}
		return nil
	})
	if n := evaluations() - evaluated; n != 1 {
		t.Errorf("rotating one Secret made pushes evaluate %d SDS watches; want 1 (the proxy that holds it)", n)
	}

	// Then a change each other proxy does see; its next response must be
	// that one: nothing was pushed to it for west's a/gw-cert.
	put(west, b, "WEST-B-1")
	put(east, a, "EAST-A-1")
	for name, want := range map[string]string{"west-b": "WEST-B-1", "east-a": "EAST-A-1"} {
		w := watches[name]
		eventually(t, 60*time.Second, func() error {
			if w.answered() == before[name] {
				return fmt.Errorf("%s has no new response", name)
			}
			return nil
		})
		w.mu.Lock()
		next := w.responses[before[name]]
		n := len(w.responses)
		w.mu.Unlock()
		if next[gw] != want {
			t.Errorf("%s: its first response after west's a/gw-cert rotated carries %v; want only its own rotation %q", name, next, want)
		}
		if n != before[name]+1 {
			t.Errorf("%s: %d responses after the rotations; want 1 (its own)", name, n-before[name])
		}
	}
	if n := watches["west-a-roots"].answered(); n != before["west-a-roots"] {
		t.Errorf("a proxy asking only ROOTCA got %d responses for Secret rotations; want none", n-before["west-a-roots"])
	}
}
