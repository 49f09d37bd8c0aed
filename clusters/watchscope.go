package clusters

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
)

// Remote Secret annotations that scope what the hub watches in the
// Secret's members (docs/features.md "Scoped watching"). At most one of
// them may be set; without either the hub watches every namespace.
const (
	// AnnotationWatchNamespaces is a comma-separated list of namespace
	// names: the hub watches Services and EndpointSlices (and mesh pods) in
	// those namespaces only, one informer per namespace and kind.
	AnnotationWatchNamespaces = "hub.federation/watch-namespaces"
	// AnnotationWatchNamespaceSelector is a label selector (Kubernetes
	// syntax, e.g. "mesh=on,team in (a,b)") over the member's namespaces:
	// the hub watches the namespaces it selects, following namespaces as
	// they come, go and change labels (it needs list and watch on
	// namespaces).
	AnnotationWatchNamespaceSelector = "hub.federation/watch-namespace-selector"
)

// maxWatchNamespaces bounds the names AnnotationWatchNamespaces may list,
// and the namespaces a selector may make the hub watch in one member (each
// costs a watch per kind on the member's API server).
const maxWatchNamespaces = 256

// WatchScope is what the hub watches in a member: every namespace (the
// zero value), the namespaces named, or those a label selector selects.
// The system namespace's Services are always watched too, for the
// member's east-west gateways, but federated only when in scope.
type WatchScope struct {
	// Namespaces, if not nil, are the namespaces watched, sorted.
	Namespaces []string
	// Selector, if not empty, selects the namespaces watched (canonical
	// form, labels.Selector.String).
	Selector string
}

// All reports whether the scope is every namespace.
func (s WatchScope) All() bool { return s.Namespaces == nil && s.Selector == "" }

// String describes the scope for status and logs.
func (s WatchScope) String() string {
	switch {
	case s.Namespaces != nil:
		return "namespaces " + strings.Join(s.Namespaces, ",")
	case s.Selector != "":
		return "namespaces selected by " + s.Selector
	}
	return "all namespaces"
}

func (s WatchScope) equal(o WatchScope) bool {
	return slices.Equal(s.Namespaces, o.Namespaces) && (s.Namespaces == nil) == (o.Namespaces == nil) && s.Selector == o.Selector
}

// readWatchScope reads a remote Secret's watch annotations. An error says
// precisely what is wrong; the registry then keeps a running member as it
// is and starts no new one (a member never runs wider than its Secret says).
func readWatchScope(annotations map[string]string) (WatchScope, error) {
	list, hasList := annotations[AnnotationWatchNamespaces]
	sel, hasSel := annotations[AnnotationWatchNamespaceSelector]
	switch {
	case hasList && hasSel:
		return WatchScope{}, fmt.Errorf("remote Secret sets both %s and %s: set one", AnnotationWatchNamespaces, AnnotationWatchNamespaceSelector)
	case hasList:
		names := []string{}
		for _, ns := range strings.Split(list, ",") {
			ns = strings.TrimSpace(ns)
			if ns == "" {
				continue
			}
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return WatchScope{}, fmt.Errorf("annotation %s: %q is not a namespace name: %s", AnnotationWatchNamespaces, truncateName(ns), errs[0])
			}
			names = append(names, ns)
		}
		slices.Sort(names)
		names = slices.Compact(names)
		switch {
		case len(names) == 0:
			return WatchScope{}, fmt.Errorf("annotation %s names no namespace (remove it to watch every namespace)", AnnotationWatchNamespaces)
		case len(names) > maxWatchNamespaces:
			return WatchScope{}, fmt.Errorf("annotation %s names %d namespaces, more than %d; use %s", AnnotationWatchNamespaces, len(names), maxWatchNamespaces, AnnotationWatchNamespaceSelector)
		}
		return WatchScope{Namespaces: names}, nil
	case hasSel:
		s, err := labels.Parse(sel)
		if err != nil {
			return WatchScope{}, fmt.Errorf("annotation %s: %w", AnnotationWatchNamespaceSelector, err)
		}
		if s.Empty() {
			return WatchScope{}, fmt.Errorf("annotation %s selects every namespace (remove it to watch every namespace)", AnnotationWatchNamespaceSelector)
		}
		return WatchScope{Selector: s.String()}, nil
	}
	return WatchScope{}, nil
}

// nsWatch is the informers of one watched namespace ("" for every
// namespace): Services, EndpointSlices and mesh pods, started and stopped
// together. Federated says whether its Services are the member's services
// (false for the system namespace watched for gateways only).
type nsWatch struct {
	namespace string
	federated bool
	factory   informers.SharedInformerFactory
	mesh      *meshPods
	svcInf    cache.SharedIndexInformer
	sliceInf  cache.SharedIndexInformer
	services  corelisters.ServiceLister
	synced    []cache.InformerSynced
	exports   *serviceExports    // export mode serviceexport only
	counts    kindCounts         // objects held, by kind
	ctx       context.Context    // nil until started
	cancel    context.CancelFunc // nil until started
}

// watchBuilder builds a member's namespace watches with its handlers: a
// Service change goes to the endpoint and network controllers, an
// EndpointSlice, mesh pod or ServiceExport change to the endpoint
// controller, and every object is counted against the member's cap.
type watchBuilder struct {
	client  kubernetes.Interface
	meta    metadata.Interface // ServiceExports (names only)
	objects *objectCap
	views   *serviceController
	net     *networkController
	exports bool // export mode serviceexport: ServiceExports are watched
}

// build builds (but does not start) the informers of one namespace. A
// watch that is not federated (the system namespace outside the scope,
// watched for gateway Services) has a Service informer only.
func (b *watchBuilder) build(namespace string, federated bool) (*nsWatch, error) {
	w := &nsWatch{namespace: namespace, federated: federated, counts: newKindCounts("Service", "EndpointSlice", "MeshPod", "ServiceExport")}
	var opts []informers.SharedInformerOption
	if namespace != "" {
		opts = append(opts, informers.WithNamespace(namespace))
	}
	w.factory = informers.NewSharedInformerFactoryWithOptions(b.client, 0, opts...)
	svc := w.factory.Core().V1().Services()
	w.svcInf, w.services = svc.Informer(), svc.Lister()
	if err := w.svcInf.SetTransform(stripObject); err != nil {
		return nil, fmt.Errorf("setting informer transform: %w", err)
	}
	handlers := []struct {
		kind string
		inf  cache.SharedIndexInformer
		fn   func(any)
		// both: an update is told with the object before it too (a slice
		// that moved to another Service leaves the old one).
		both bool
	}{{"Service", w.svcInf, b.onService, false}}
	if federated {
		slice := w.factory.Discovery().V1().EndpointSlices()
		w.sliceInf = slice.Informer()
		if err := w.sliceInf.SetTransform(stripObject); err != nil {
			return nil, fmt.Errorf("setting informer transform: %w", err)
		}
		if err := w.sliceInf.AddIndexers(cache.Indexers{slicesOfService: sliceServiceKey}); err != nil {
			return nil, fmt.Errorf("adding the EndpointSlice index: %w", err)
		}
		handlers = append(handlers, struct {
			kind string
			inf  cache.SharedIndexInformer
			fn   func(any)
			both bool
		}{"EndpointSlice", w.sliceInf, b.views.onSlice, true})
		w.mesh = newMeshPods(b.client, namespace)
		if err := w.mesh.inf.SetTransform(stripMeshPod); err != nil {
			return nil, fmt.Errorf("setting informer transform: %w", err)
		}
		if err := b.watchMeshPods(w); err != nil {
			return nil, err
		}
		if b.exports {
			if err := b.watchServiceExports(w); err != nil {
				return nil, err
			}
		}
	}
	for _, h := range handlers {
		fn, both := h.fn, h.both
		reg, err := h.inf.AddEventHandler(b.objects.counting(w.counts, h.kind, cache.ResourceEventHandlerFuncs{
			AddFunc: fn,
			UpdateFunc: func(old, obj any) {
				if both {
					fn(old) // the queue takes a key once
				}
				fn(obj)
			},
			DeleteFunc: fn,
		}))
		if err != nil {
			return nil, fmt.Errorf("adding event handler: %w", err)
		}
		w.synced = append(w.synced, reg.HasSynced)
	}
	return w, nil
}

// onService rebuilds a Service, and reconsiders it as a gateway.
func (b *watchBuilder) onService(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		b.views.enqueue(ServiceKey{Namespace: ns, Name: name})
		b.net.gatewayServiceChanged(ServiceKey{Namespace: ns, Name: name}, obj)
	}
}

// optionalSynced are the watch's informers that a first publish waits
// for only a little (meshPodsSyncWait): mesh pods, and ServiceExports if
// the member serves them (exports: else their informer cannot list).
func (w *nsWatch) optionalSynced(exports bool) []cache.InformerSynced {
	var out []cache.InformerSynced
	if w.mesh != nil {
		out = append(out, w.mesh.inf.HasSynced)
	}
	if w.exports != nil && exports {
		out = append(out, w.exports.inf.HasSynced)
	}
	return out
}

// start runs the watch's informers until ctx ends or stop; its
// ServiceExport informer only with exports (see startExports).
func (w *nsWatch) start(ctx context.Context, exports bool) {
	w.ctx, w.cancel = context.WithCancel(ctx)
	w.factory.Start(w.ctx.Done())
	if w.mesh != nil {
		w.mesh.factory.Start(w.ctx.Done())
	}
	if exports {
		w.startExports()
	}
}

// startExports starts the watch's ServiceExport informer (a no-op when it
// has none or it runs), once started.
func (w *nsWatch) startExports() {
	if w.exports != nil && w.ctx != nil {
		w.exports.factory.Start(w.ctx.Done())
	}
}

// stop stops the watch's informers and waits for them.
func (w *nsWatch) stop() {
	if w.cancel != nil {
		w.cancel()
	}
	w.factory.Shutdown()
	if w.mesh != nil {
		w.mesh.factory.Shutdown()
	}
	if w.exports != nil {
		w.exports.factory.Shutdown()
	}
}

// hasSynced reports whether the watch's Services and EndpointSlices are
// listed (mesh pods are optional, see meshPods).
func (w *nsWatch) hasSynced() bool {
	for _, s := range w.synced {
		if !s() {
			return false
		}
	}
	return true
}

// retire stops a watch that is no longer watched and rebuilds its
// Services from whatever watch holds their namespace now (none: gone).
func (b *watchBuilder) retire(w *nsWatch) {
	keys := w.svcInf.GetStore().ListKeys()
	w.stop()
	b.objects.held.Add(-w.counts.total())
	for _, k := range keys {
		ns, name, _ := cache.SplitMetaNamespaceKey(k)
		b.views.enqueue(ServiceKey{Namespace: ns, Name: name})
	}
}

// emptyServices answers for a namespace the member does not watch.
var emptyServices = corelisters.NewServiceLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}))

// scopedServices is the member's Services over every watch.
type scopedServices struct{ ns *namespaceWatches }

func (s scopedServices) List(sel labels.Selector) ([]*corev1.Service, error) {
	var out []*corev1.Service
	for _, w := range s.ns.list() {
		l, err := w.services.List(sel)
		if err != nil {
			return nil, err
		}
		out = append(out, l...)
	}
	return out, nil
}

func (s scopedServices) Services(namespace string) corelisters.ServiceNamespaceLister {
	if w := s.ns.of(namespace); w != nil {
		return w.services.Services(namespace)
	}
	return emptyServices.Services(namespace)
}

// runsMeshAccount reports whether a mesh pod of the member runs as
// namespace/serviceAccount (false when its namespace is not watched).
func (n *namespaceWatches) runsMeshAccount(namespace, serviceAccount string) bool {
	w := n.of(namespace)
	return w != nil && w.mesh != nil && w.mesh.runsAccount(namespace, serviceAccount)
}

// meshPod reports whether pod namespace/name is labelled for Istio mTLS,
// and its workload (podWorkload) and service account.
func (n *namespaceWatches) meshPod(namespace, name string) (meshPod, bool) {
	w := n.of(namespace)
	if w == nil || w.mesh == nil {
		return meshPod{}, false
	}
	return w.mesh.pod(namespace, name)
}
