package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/hubmesh/hub/internal/localcluster"
)

// TestIstiodRealCluster proves the istiod harness on its own (no hub): a
// real istiod with configSources [k8s://] against a local cluster's API
// server becomes ready; Istio's adsc, as a sidecar of that istiod, receives
// the outbound cluster of a Kubernetes Service created afterwards; and a
// ServiceEntry created through the API server appears in istiod's
// /debug/configz and in the sidecar's CDS, and goes when it is deleted.
func TestIstiodRealCluster(t *testing.T) {
	istiodBin(t)
	adscBin(t) // skip (or fail in CI) before setting anything up
	e := localcluster.Require(t, env)
	c := e.Cluster("east")
	ctx := testContext(t)
	const ns = "istiod-harness"
	kc := client(t, c)
	if err := localcluster.EnsureNamespace(ctx, kc, ns); err != nil {
		t.Fatal(err)
	}

	p := startIstiod(t, c, istiodOptions{})
	rss, err := p.RSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("istiod ready %s after start (CRDs installed first); RSS %.0f MiB; xDS %s, http %s",
		p.StartToReady.Round(time.Millisecond), float64(rss)/(1<<20), p.XDSAddr, p.HTTPURL)

	// A Service created after istiod started reaches its sidecar's CDS.
	if err := localcluster.ApplyService(ctx, kc, ns, "echo", "http", 8080,
		[]localcluster.Backend{{IP: "198.18.0.21", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	sidecar := startAdsc(t, "istiod-sidecar", "--plaintext", "--addr", p.XDSAddr, "--watch", "cds", "--follow",
		"--node-id", fmt.Sprintf("sidecar~198.18.0.9~client.%s~%s.svc.cluster.local", ns, ns), "--cluster-id", c.Name)
	svcCluster := fmt.Sprintf("outbound|8080||echo.%s.svc.cluster.local", ns)
	sidecar.waitLine(t, 2*time.Minute, "CDS with "+svcCluster, func(l adscLine) bool {
		return l.Type == "cds" && slices.Contains(l.Clusters, svcCluster)
	})

	// A ServiceEntry written through the API server (the k8s:// source).
	dc, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	seGVR := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}
	se := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1",
		"kind":       "ServiceEntry",
		"metadata":   map[string]any{"name": "ext", "namespace": ns, "labels": map[string]any{"test": "istiod-harness"}},
		"spec": map[string]any{
			"hosts":      []any{"ext.example.test"},
			"location":   "MESH_EXTERNAL",
			"resolution": "DNS",
			"ports":      []any{map[string]any{"number": int64(443), "name": "tls", "protocol": "TLS"}},
		},
	}}
	if _, err := dc.Resource(seGVR).Namespace(ns).Create(ctx, se, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ServiceEntry: %v", err)
	}
	t.Cleanup(func() {
		_ = dc.Resource(seGVR).Namespace(ns).Delete(ctx, "ext", metav1.DeleteOptions{})
	})
	got := p.waitConfig(t, time.Minute, "ServiceEntry/"+ns+"/ext", false)
	if got.APIVersion != "networking.istio.io/v1" || got.Metadata.Labels["test"] != "istiod-harness" {
		t.Errorf("configz ServiceEntry: apiVersion %q labels %v, want networking.istio.io/v1 and test=istiod-harness",
			got.APIVersion, got.Metadata.Labels)
	}
	seCluster := "outbound|443||ext.example.test"
	sidecar.waitLine(t, time.Minute, "CDS with "+seCluster, func(l adscLine) bool {
		return l.Type == "cds" && slices.Contains(l.Clusters, seCluster)
	})

	mark := sidecar.mark()
	if err := dc.Resource(seGVR).Namespace(ns).Delete(ctx, "ext", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting ServiceEntry: %v", err)
	}
	p.waitConfig(t, time.Minute, "ServiceEntry/"+ns+"/ext", true)
	sidecar.waitLineAfter(t, mark, time.Minute, "CDS without "+seCluster, func(l adscLine) bool {
		return l.Type == "cds" && !slices.Contains(l.Clusters, seCluster) && slices.Contains(l.Clusters, svcCluster)
	})

	if rss, err = p.RSS(); err == nil {
		t.Logf("istiod RSS at the end: %.0f MiB", float64(rss)/(1<<20))
	}
}
