package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

// TestRotationAndOutageWithLiveClient rotates a member's credentials and
// then kills its API server while a grpc-go xDS client keeps calling through
// the hub: no call fails and no EDS response ever lacks the member's
// endpoints.
func TestRotationAndOutageWithLiveClient(t *testing.T) {
	e := localcluster.Require(t, env)
	ip := dataPlaneIP(t)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	homeClient := client(t, home)
	ns := "e2e-" + rand.String(6)
	for _, c := range []*localcluster.Cluster{home, west, east} {
		if err := localcluster.EnsureNamespace(ctx, client(t, c), ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := localcluster.EnsureNamespace(ctx, homeClient, "istio-system"); err != nil {
		t.Fatal(err)
	}
	westB, eastB := startBackend(t, ip, "west-a"), startBackend(t, ip, "east-a")
	const port = 7070
	for c, b := range map[*localcluster.Cluster]*backend{west: westB, east: eastB} {
		if err := localcluster.ApplyService(ctx, client(t, c), ns, "echo", "grpc", port,
			[]localcluster.Backend{{IP: b.addr.IP.String(), Port: int32(b.addr.Port)}}); err != nil {
			t.Fatal(err)
		}
	}
	secretName := "remote-" + ns
	secrets := homeClient.CoreV1().Secrets("istio-system")
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret("istio-system", secretName, map[string][]byte{
		"west": west.Kubeconfig(), "east": east.Kubeconfig(),
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = secrets.Delete(ctx, secretName, metav1.DeleteOptions{}) })

	h := startHub(t, home)
	host := fmt.Sprintf("echo.%s.svc.cluster.local", ns)
	eds := watchEDS(t, h.xdsAddr, fmt.Sprintf("outbound|%d||%s", port, host))
	xc := startXDSClient(t, h.xdsAddr, fmt.Sprintf("xds:///%s:%d", host, port), "east", ns)
	seen := map[string]bool{}
	xc.waitFor(t, 60*time.Second, "answers from both members", func(l clientLine) bool {
		if name, ok := strings.CutPrefix(l.text, "ok "); ok {
			seen[name] = true
		}
		return seen["west-a"] && seen["east-a"]
	})
	errsBefore := xc.errs.Load()

	// Rotate west to a freshly issued client certificate.
	fresh, err := west.NewCertKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	cur, err := secrets.Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Data["west"] = fresh
	if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		evs, err := homeClient.CoreV1().Events("istio-system").List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": secretName, "reason": "KubeconfigRotated"}.AsSelector().String()})
		if err != nil || len(evs.Items) == 0 {
			return fmt.Errorf("no KubeconfigRotated event yet (%v)", err)
		}
		return nil
	})
	oks := xc.oks.Load()
	xc.drain()
	requireOnly(t, xc, 50, "west-a", "east-a")
	t.Logf("rotation: %d calls around it, %d failed", xc.oks.Load()-oks, xc.errs.Load()-errsBefore)

	// Kill west's API server: west goes Stale. Its endpoint stays in EDS
	// (checked below), one priority behind east's (--demote-unhealthy-
	// members): calls go to east alone until west recovers.
	west.StopAPIServer()
	t.Cleanup(func() {
		_ = west.StartAPIServer()
		_ = west.WaitReady(ctx)
	})
	eventually(t, 60*time.Second, func() error {
		if c := h.clusters(t)["west"]; c.State != "Stale" {
			return fmt.Errorf("west is %s: %s", c.State, c.Message)
		}
		return nil
	})
	if c := h.clusters(t)["east"]; c.State != "Ready" {
		t.Errorf("east during west's outage: %+v", c)
	}
	xc.drain()
	eastInARow := 0
	xc.waitFor(t, 30*time.Second, "20 answers in a row from east while west is demoted", func(l clientLine) bool {
		if l.text == "ok east-a" {
			eastInARow++
		} else {
			eastInARow = 0
		}
		return eastInARow >= 20
	})
	if c := h.clusters(t)["west"]; !strings.Contains(c.Demoted, "Stale") {
		t.Errorf("west while Stale is not shown demoted: %+v", c)
	}
	if err := west.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := west.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		if c := h.clusters(t)["west"]; c.State != "Ready" {
			return fmt.Errorf("west is %s: %s", c.State, c.Message)
		}
		return nil
	})

	xc.drain()
	xc.waitFor(t, 30*time.Second, "an answer from recovered west", func(l clientLine) bool { return l.text == "ok west-a" })
	if n := xc.errs.Load() - errsBefore; n != 0 {
		t.Errorf("%d calls failed during rotation and outage; want 0", n)
	}
	for i, counts := range eds.snapshot() {
		if counts["west"] == 0 || counts["east"] == 0 {
			t.Errorf("EDS response %d lacked a member's endpoints: %v", i, counts)
		}
	}
	t.Logf("EDS responses observed: %d, none without west or east", len(eds.snapshot()))
}
