package distribute

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/hubmesh/hub/internal/istiomod"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/wait"
)

var env *localcluster.Env

func TestMain(m *testing.M) {
	if os.Getenv("HUB_TEST_DEBUG") != "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}
	// "home" gets every Istio CRD, "partial" only some.
	os.Exit(localcluster.RunTests(m, &env, "home", "partial"))
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// istioCRDs reads Istio's CRDs from the Istio module e2e/interop builds
// istiod's client from (so they match the istiod the hub is tested with),
// by Kind.
func istioCRDs(t *testing.T) map[string]*unstructured.Unstructured {
	t.Helper()
	data, err := istiomod.CRDs()
	if err != nil {
		msg := fmt.Sprintf("reading the Istio CRDs: %v", err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg + " (skipping outside CI; in CI this fails)")
	}
	crds := map[string]*unstructured.Unstructured{}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatal(err)
		}
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		kind, _, _ := unstructured.NestedString(u.Object, "spec", "names", "kind")
		crds[kind] = u
	}
	return crds
}

// installCRDs creates the CRDs of the given kinds and waits until each is
// established.
func installCRDs(t *testing.T, dyn dynamic.Interface, kinds ...string) {
	t.Helper()
	all := istioCRDs(t)
	ctx := context.Background()
	for _, kind := range kinds {
		crd := all[kind]
		if crd == nil {
			t.Fatalf("no CRD for %s in Istio's crd-all.gen.yaml", kind)
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating CRD %s: %v", crd.GetName(), err)
		}
		wait.Until(t, time.Minute, func() error {
			got, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("CRD %s not established", crd.GetName())
		})
	}
}

var (
	paGVR = schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "peerauthentications"}
	drGVR = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}
)

const (
	paKind = "security.istio.io/v1/PeerAuthentication"
	drKind = "networking.istio.io/v1/DestinationRule"
)

func istioObject(gvr schema.GroupVersionResource, kind, ns, name string, distribute bool, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": kind,
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     spec,
	}}
	if distribute {
		u.SetLabels(map[string]string{Label: "true"})
	}
	return u
}

// changes counts OnChange calls per kind.
type changes struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *changes) on(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[kind]++
}

func (c *changes) count(kind string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[kind]
}

// runSource runs a Source on the cluster, distributing from namespaces,
// until the test ends.
func runSource(t *testing.T, c *localcluster.Cluster, log *slog.Logger, namespaces ...string) (*Source, *changes) {
	t.Helper()
	ch := &changes{n: map[string]int{}}
	return runSourceWith(t, c, Options{OnChange: ch.on, Log: log, Namespaces: namespaces}), ch
}

// runSourceWith runs a Source with opts (Rediscover 100 ms unless set) on
// the cluster until the test ends.
func runSourceWith(t *testing.T, c *localcluster.Cluster, opts Options) *Source {
	t.Helper()
	if opts.Rediscover == 0 {
		opts.Rediscover = 100 * time.Millisecond
	}
	s, err := New(c.RESTConfig(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s
}

// objectsOf returns a kind's objects in namespace ns by name once it is
// ready (other runs of the tests leave objects in other namespaces).
func objectsOf(s *Source, kind, ns string) (map[string]Object, error) {
	objs, ready := s.Objects(kind)
	if !ready {
		return nil, fmt.Errorf("%s not ready", kind)
	}
	m := map[string]Object{}
	for _, o := range objs {
		if o.Namespace == ns {
			m[o.Name] = o
		}
	}
	return m, nil
}

func clients(t *testing.T, c *localcluster.Cluster) (dynamic.Interface, kubernetes.Interface) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return dyn, kube
}

// rejections counts the DistributionRejected Events on an object.
func rejections(ctx context.Context, kube kubernetes.Interface, ns, name string) (int, error) {
	evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range evs.Items {
		if e.Reason == RejectedReason {
			n++
		}
	}
	return n, nil
}

var errNotYet = errors.New("not yet")

func mustGet(t *testing.T, r dynamic.ResourceInterface, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := r.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// testNamespace creates a namespace of its own for one run of a test.
func testNamespace(t *testing.T, kube kubernetes.Interface, prefix string) string {
	t.Helper()
	ns := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
	if err := localcluster.EnsureNamespace(context.Background(), kube, ns); err != nil {
		t.Fatal(err)
	}
	return ns
}
