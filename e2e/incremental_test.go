package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

// A grpc-go client calling two services keeps calling both after one's
// endpoints change, now that SotW EDS responses carry only what changed.
// (grpc-go v1.85 builds one xDS client, hence one ADS stream, per channel
// target, and each of the hub's routes names one cluster: a grpc-go stream
// holds one ClusterLoadAssignment. One stream holding many is covered with
// raw ADS streams in hub/ and with Istio's adsc in TestAdsc*.)
func TestGRPCIncrementalEDSKeepsUntouchedService(t *testing.T) {
	e := localcluster.Require(t, env)
	ip := dataPlaneIP(t)
	ctx := testContext(t)
	home := e.Cluster("primary")
	homeClient := client(t, home)
	ns := "e2e-" + rand.String(6)
	for _, n := range []string{ns, "istio-system"} {
		if err := localcluster.EnsureNamespace(ctx, homeClient, n); err != nil {
			t.Fatal(err)
		}
	}
	a1, a2, b1 := startBackend(t, ip, "a-1"), startBackend(t, ip, "a-2"), startBackend(t, ip, "b-1")
	ep := func(b *backend) []localcluster.Backend {
		return []localcluster.Backend{{IP: b.addr.IP.String(), Port: int32(b.addr.Port)}}
	}
	const port = 7070
	if err := localcluster.ApplyService(ctx, homeClient, ns, "a", "grpc", port, ep(a1)); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, homeClient, ns, "b", "grpc", port, ep(b1)); err != nil {
		t.Fatal(err)
	}
	h := startHub(t, home, "--debounce-after", "100ms")
	target := fmt.Sprintf("xds:///a.%[1]s.svc.cluster.local:%[2]d,xds:///b.%[1]s.svc.cluster.local:%[2]d", ns, port)
	xc := startXDSClient(t, h.xdsAddr, target, "primary", ns)

	seen := map[string]bool{}
	xc.waitFor(t, 60*time.Second, "answers from a-1 and b-1", func(l clientLine) bool {
		if name, ok := strings.CutPrefix(l.text, "ok "); ok {
			seen[name] = true
		}
		return seen["a-1"] && seen["b-1"]
	})

	// a's endpoints change: the EDS response carries a only; b keeps answering.
	if err := localcluster.ApplyEndpoints(ctx, homeClient, ns, "a", "grpc", ep(a2)); err != nil {
		t.Fatal(err)
	}
	xc.waitFor(t, 30*time.Second, "an answer from a-2", func(l clientLine) bool { return l.text == "ok a-2" })
	xc.drain()
	errs := xc.errs.Load()
	requireOnly(t, xc, 40, "a-2", "b-1")
	seen = map[string]bool{}
	xc.waitFor(t, 30*time.Second, "answers from a-2 and b-1", func(l clientLine) bool {
		if name, ok := strings.CutPrefix(l.text, "ok "); ok {
			seen[name] = true
		}
		return seen["a-2"] && seen["b-1"]
	})
	if n := xc.errs.Load() - errs; n > 0 {
		t.Errorf("%d calls failed after the client followed the change", n)
	}
}
