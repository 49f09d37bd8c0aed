package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
)

// TestFederatedEDS is the walking skeleton end to end: a remote Secret
// registers two members, a grpc-go xds:/// client reaches backends in both
// through the hub, follows an EndpointSlice change, and loses a member's
// backends when its key leaves the Secret. A malformed kubeconfig in a third
// key is reported as Invalid without disturbing the others.
func TestFederatedEDS(t *testing.T) {
	e := localcluster.Require(t, env)
	ip := dataPlaneIP(t)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	homeClient, westClient, eastClient := client(t, home), client(t, west), client(t, east)

	ns := "e2e-" + rand.String(6)
	for _, c := range []*localcluster.Cluster{home, west, east} {
		if err := localcluster.EnsureNamespace(ctx, client(t, c), ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := localcluster.EnsureNamespace(ctx, homeClient, "istio-system"); err != nil {
		t.Fatal(err)
	}
	west1, west2, east1 := startBackend(t, ip, "west-1"), startBackend(t, ip, "west-2"), startBackend(t, ip, "east-1")
	ep := func(b *backend) []localcluster.Backend {
		return []localcluster.Backend{{IP: b.addr.IP.String(), Port: int32(b.addr.Port)}}
	}
	const port = 7070
	if err := localcluster.ApplyService(ctx, westClient, ns, "echo", "grpc", port, ep(west1)); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, eastClient, ns, "echo", "grpc", port, ep(east1)); err != nil {
		t.Fatal(err)
	}

	secretName := "remote-" + ns
	secret := localcluster.RemoteSecret("istio-system", secretName, map[string][]byte{
		"west": west.Kubeconfig(),
		"east": east.Kubeconfig(),
		"bad":  []byte("apiVersion: v1\nkind: Config\nclusters: [this is: not a kubeconfig"),
	})
	if _, err := homeClient.CoreV1().Secrets("istio-system").Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := homeClient.CoreV1().Secrets("istio-system").Delete(ctx, secretName, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting remote secret: %v", err)
		}
	})

	h := startHub(t, home, "--debounce-after", "100ms")

	// Both members Ready with the right counts: every Service the member
	// has (other tests add theirs to the shared clusters), echo's endpoint.
	services := func(c kubernetes.Interface) int {
		list, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}
	eventually(t, 30*time.Second, func() error {
		cl := h.clusters(t)
		for id, cs := range map[string]kubernetes.Interface{"west": westClient, "east": eastClient} {
			c, ok := cl[id]
			switch {
			case !ok:
				return fmt.Errorf("cluster %s not listed", id)
			case c.State != "Ready":
				return fmt.Errorf("cluster %s is %s: %s", id, c.State, c.Message)
			case c.Services != services(cs) || c.Endpoints < 1:
				return fmt.Errorf("cluster %s has %d services, %d endpoints; want %d, at least 1", id, c.Services, c.Endpoints, services(cs))
			case c.Secret != "istio-system/"+secretName:
				return fmt.Errorf("cluster %s secret = %q", id, c.Secret)
			case c.Server != map[string]string{"west": west.Server(), "east": east.Server()}[id]:
				return fmt.Errorf("cluster %s server = %q", id, c.Server)
			case c.LastSyncTime == nil:
				return fmt.Errorf("cluster %s has no lastSyncTime", id)
			}
		}
		if bad := cl["bad"]; bad.State != "Invalid" || !strings.Contains(bad.Message, "kubeconfig does not parse") {
			return fmt.Errorf("bad cluster = %+v; want state Invalid with a parse error", bad)
		}
		if home := cl["primary"]; home.State != "Ready" || home.Secret != "" {
			return fmt.Errorf("home cluster = %+v; want Ready with no secret", home)
		}
		return nil
	})

	target := fmt.Sprintf("xds:///echo.%s.svc.cluster.local:%d", ns, port)
	xc := startXDSClient(t, h.xdsAddr, target, "west", ns)

	// The client reaches backends in both members.
	seen := map[string]bool{}
	xc.waitFor(t, 60*time.Second, "answers from west-1 and east-1", func(l clientLine) bool {
		if name, ok := strings.CutPrefix(l.text, "ok "); ok {
			seen[name] = true
		}
		return seen["west-1"] && seen["east-1"]
	})

	// An EndpointSlice change in west is followed: west-2 replaces west-1.
	xc.drain()
	written := time.Now()
	if err := localcluster.ApplyEndpoints(ctx, westClient, ns, "echo", "grpc", ep(west2)); err != nil {
		t.Fatal(err)
	}
	first := xc.waitFor(t, 30*time.Second, "an answer from west-2", func(l clientLine) bool { return l.text == "ok west-2" })
	t.Logf("EndpointSlice write → client follows it: %s (debounce-after 100ms, leading edge)", first.at.Sub(written).Round(time.Millisecond))
	requireOnly(t, xc, 40, "west-2", "east-1")

	// Removing east's key from the Secret withdraws east's endpoints.
	cur, err := homeClient.CoreV1().Secrets("istio-system").Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(cur.Data, "east")
	if _, err := homeClient.CoreV1().Secrets("istio-system").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if _, ok := h.clusters(t)["east"]; ok {
			return fmt.Errorf("east still listed")
		}
		return nil
	})
	xc.drain()
	xc.waitFor(t, 30*time.Second, "20 answers in a row from west-2 only", func() func(clientLine) bool {
		run := 0
		return func(l clientLine) bool {
			if l.text == "ok west-2" {
				run++
			} else {
				run = 0
			}
			return run >= 20
		}
	}())
	requireOnly(t, xc, 40, "west-2")
	if west := h.clusters(t)["west"]; west.State != "Ready" {
		t.Errorf("west after east's removal = %+v; want Ready", west)
	}
}

// requireOnly reads n successful answers and fails if any came from a
// backend not in allowed.
func requireOnly(t *testing.T, xc *xdsClient, n int, allowed ...string) {
	t.Helper()
	ok := map[string]bool{}
	for _, a := range allowed {
		ok[a] = true
	}
	count := 0
	xc.waitFor(t, 30*time.Second, fmt.Sprintf("%d answers", n), func(l clientLine) bool {
		name, isOK := strings.CutPrefix(l.text, "ok ")
		if !isOK {
			return false
		}
		if !ok[name] {
			t.Fatalf("answer from %s; only %v should answer now", name, allowed)
		}
		count++
		return count >= n
	})
}
