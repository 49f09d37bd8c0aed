package clusters

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Istio's label on pods whose proxy (or proxyless agent) speaks Istio
// mTLS, set by sidecar injection; istiod reads endpoints' TLS mode from it.
const (
	LabelTLSMode = "security.istio.io/tlsMode"
	TLSModeIstio = "istio"
)

// meshPods knows which of a member's pods accept Istio mTLS, their
// workloads (podWorkload, istiod's telemetry names) and their service
// accounts (the identities their endpoints present): an informer on the
// pods labelled security.istio.io/tlsMode=istio, each kept as its key,
// workload and service account only (stripMeshPod), so its cost is the
// mesh's pods, not every pod. It is optional: a member whose credentials
// may not list pods has no endpoint marked MTLS (they are then not reached
// across networks), and its failures do not make the member Stale.
type meshPods struct {
	factory informers.SharedInformerFactory
	inf     cache.SharedIndexInformer
}

// meshPodsSyncWait is how long a member's first publish waits for its mesh
// pods to be listed.
const meshPodsSyncWait = 5 * time.Second

// podIndex indexes EndpointSlices by the pods their endpoints point to.
const podIndex = "pod"

// newMeshPods watches the mesh pods of one namespace ("": every namespace).
func newMeshPods(client kubernetes.Interface, namespace string) *meshPods {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelTLSMode + "=" + TLSModeIstio }))
	inf := factory.Core().V1().Pods().Informer()
	// Before the informer starts: it cannot fail.
	_ = inf.AddIndexers(cache.Indexers{accountIndex: func(obj any) ([]string, error) {
		if sa := serviceAccountOf(obj); sa != "" {
			if p, ok := obj.(metav1.Object); ok {
				return []string{p.GetNamespace() + "/" + sa}, nil
			}
		}
		return nil, nil
	}})
	return &meshPods{factory: factory, inf: inf}
}

// accountIndex indexes mesh pods by "<namespace>/<service account>".
const accountIndex = "account"

// runsAccount reports whether a mesh pod runs as namespace/serviceAccount.
func (m *meshPods) runsAccount(namespace, serviceAccount string) bool {
	keys, _ := m.inf.GetIndexer().IndexKeys(accountIndex, namespace+"/"+serviceAccount)
	return len(keys) > 0
}

// meshPod is what the hub knows of a pod that accepts Istio mTLS.
type meshPod struct {
	workload       string // podWorkload; "" if not a valid one
	serviceAccount string
}

// pod reports whether the pod namespace/name is labelled for Istio mTLS,
// and what the hub keeps of it.
func (m *meshPods) pod(namespace, name string) (meshPod, bool) {
	obj, ok, _ := m.inf.GetStore().GetByKey(namespace + "/" + name)
	return meshPod{workload: workloadOf(obj), serviceAccount: serviceAccountOf(obj)}, ok
}

// slicePods is the podIndex function: the namespace/name of every pod an
// EndpointSlice's endpoints refer to.
func slicePods(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	var keys []string
	for _, ep := range s.Endpoints {
		if ref := ep.TargetRef; ref != nil && ref.Kind == "Pod" {
			keys = append(keys, s.Namespace+"/"+ref.Name)
		}
	}
	return keys, nil
}

// watchMeshPods rebuilds, for one watch, the Services whose endpoints point to a pod when
// the pod enters or leaves the mesh (its label set or removed, or it is
// deleted) or its workload changes (its labels do); a pod's service
// account never changes, but a pod replaced under its name may have
// another.
func (b *watchBuilder) watchMeshPods(w *nsWatch) error {
	if err := w.sliceInf.AddIndexers(cache.Indexers{podIndex: slicePods}); err != nil {
		return fmt.Errorf("adding EndpointSlice pod index: %w", err)
	}
	onPod := func(obj any) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		slices, _ := w.sliceInf.GetIndexer().ByIndex(podIndex, key)
		for _, o := range slices {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok && s.Labels[discoveryv1.LabelServiceName] != "" {
				b.views.enqueue(ServiceKey{Namespace: s.Namespace, Name: s.Labels[discoveryv1.LabelServiceName]})
			}
		}
	}
	_, err := w.mesh.inf.AddEventHandler(b.objects.counting(w.counts, "MeshPod", cache.ResourceEventHandlerFuncs{
		AddFunc: onPod,
		UpdateFunc: func(old, cur any) {
			if workloadOf(old) != workloadOf(cur) || serviceAccountOf(old) != serviceAccountOf(cur) {
				onPod(cur)
			}
		},
		DeleteFunc: onPod,
	}))
	if err != nil {
		return fmt.Errorf("adding pod event handler: %w", err)
	}
	return nil
}

// stripPodRef keeps of an endpoint's target reference what the mesh-pod
// lookup needs: a pod's name.
func stripPodRef(ref *corev1.ObjectReference) *corev1.ObjectReference {
	if ref == nil || ref.Kind != "Pod" {
		return nil
	}
	return &corev1.ObjectReference{Kind: "Pod", Name: ref.Name}
}
