package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/internal/istiod"
	"github.com/hubmesh/hub/internal/istiomod"
	"github.com/hubmesh/hub/internal/localcluster"
)

// peerIstiod is --peer istiod: a real istiod (pilot-discovery, the binary
// the e2e tests run, $HUB_ISTIOD_BIN or --istiod-bin) serves the same
// clusters to the same client shapes instead of the hub, so that a
// figure of the hub's has istiod's beside it, measured the same way. It
// reads the members as istiod multicluster does: the home cluster is its
// own, each member comes from a remote Secret (istio/multiCluster=true) in
// istio-system holding the member's kubeconfig, the one the hub reads.
const peerIstiod = "istiod"

// istiodBin is --istiod-bin, else $HUB_ISTIOD_BIN.
func (c Config) istiodBin() string {
	if c.IstiodBin != "" {
		return c.IstiodBin
	}
	return os.Getenv(istiomod.IstiodBinEnv)
}

// istiodNamespace is istiod's own namespace in the home cluster.
const istiodNamespace = "istio-system"

// startIstiodPeer installs the Istio CRDs in the home cluster, gives istiod
// the members' remote Secret and starts it (GODEBUG=gctrace=1, as the hub,
// for its live heap) in dir; the returned process stands where the hub
// would.
func startIstiodPeer(ctx context.Context, cfg Config, home *localcluster.Cluster, kubeconfigs map[string][]byte, dir string) (*hubProcess, error) {
	bin := cfg.istiodBin()
	if bin == "" {
		return nil, errors.New("--peer istiod needs pilot-discovery: --istiod-bin or $" + istiomod.IstiodBinEnv + " (build it with e2e/interop/build-istiod.sh; `make test` does)")
	}
	if err := istiod.InstallCRDs(ctx, home.RESTConfig()); err != nil {
		return nil, err
	}
	homeClient, err := kubernetes.NewForConfig(home.RESTConfig())
	if err != nil {
		return nil, err
	}
	if err := localcluster.EnsureNamespace(ctx, homeClient, istiodNamespace); err != nil {
		return nil, err
	}
	if _, err := homeClient.CoreV1().Secrets(istiodNamespace).Create(ctx, localcluster.RemoteSecret(istiodNamespace, "hubbench-members", kubeconfigs), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating istiod's remote secret: %w", err)
	}
	p, err := istiod.Start(ctx, istiod.Options{
		Bin: bin, Dir: dir, Kubeconfig: home.Kubeconfig(), ClusterID: homeID, SystemNamespace: istiodNamespace,
		Env: withGCTrace(istiodPeerEnv(cfg)),
	})
	if err != nil {
		return nil, err
	}
	return &hubProcess{
		peer: p, logPath: p.LogPath, adminURL: p.HTTPURL, xdsAddr: p.XDSAddr,
		http: &http.Client{Timeout: 30 * time.Second},
	}, nil
}

// waitIstiodSynced waits until istiod's endpoint index holds every service
// with all its endpoints from every member (/debug/endpointShardz).
func waitIstiodSynced(ctx context.Context, h *hubProcess, cfg Config, l *layout) error {
	want := map[string]int{} // hostname → endpoints, all members
	for _, s := range l.services {
		for k := range s.members {
			want[s.host()] += len(s.backend[k])
		}
	}
	return waitServer(ctx, h, cfg, "istiod", func() (string, error) { return istiodSyncProblem(ctx, h, want) })
}

// istiodSyncProblem says what istiod's endpoint index lacks, or "".
func istiodSyncProblem(ctx context.Context, h *hubProcess, want map[string]int) (string, error) {
	body, err := h.get(ctx, "/debug/endpointShardz")
	if err != nil {
		return "", err
	}
	// hostname → namespace → {Shards: shard → endpoints}
	var shardz map[string]map[string]struct {
		Shards map[string][]json.RawMessage
	}
	if err := json.Unmarshal(body, &shardz); err != nil {
		return "", fmt.Errorf("decoding istiod's /debug/endpointShardz: %w", err)
	}
	lacking, first := 0, ""
	for host, n := range want {
		got := 0
		for _, ns := range shardz[host] {
			for _, eps := range ns.Shards {
				got += len(eps)
			}
		}
		if got != n {
			lacking++
			if first == "" {
				first = fmt.Sprintf("%s has %d of %d endpoints", host, got, n)
			}
		}
	}
	if lacking > 0 {
		return fmt.Sprintf("%d of %d services lack endpoints (e.g. %s)", lacking, len(want), first), nil
	}
	return "", nil
}

// peerDir is where the peer's files go.
func peerDir(work string) string { return filepath.Join(work, "istiod-run") }

// applyFailoverRule installs Istio's CRDs in the home cluster and
// distributes (from the root namespace, istio-system) a DestinationRule
// with outlier detection for every service: Istio's locality failover.
func applyFailoverRule(ctx context.Context, home *localcluster.Cluster) error {
	if err := istiod.InstallCRDs(ctx, home.RESTConfig()); err != nil {
		return err
	}
	homeClient, err := kubernetes.NewForConfig(home.RESTConfig())
	if err != nil {
		return err
	}
	if err := localcluster.EnsureNamespace(ctx, homeClient, "istio-system"); err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(home.RESTConfig())
	if err != nil {
		return err
	}
	rule := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
		"metadata": map[string]any{"name": "hubbench-failover", "namespace": "istio-system", "labels": map[string]any{distribute.Label: "true"}},
		"spec": map[string]any{"host": "*.svc.cluster.local", "trafficPolicy": map[string]any{
			"outlierDetection": map[string]any{"consecutive5xxErrors": int64(3), "interval": "5s", "baseEjectionTime": "30s"},
		}},
	}}
	gvr := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}
	if _, err := dc.Resource(gvr).Namespace("istio-system").Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the failover DestinationRule: %w", err)
	}
	return nil
}
