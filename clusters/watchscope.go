package clusters

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
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
	slices    discoverylisters.EndpointSliceLister
	synced    []cache.InformerSynced
	exports   *serviceExports    // export mode serviceexport only
	counts    kindCounts         // objects held, by kind
	ctx       context.Context    // nil until started
	cancel    context.CancelFunc // nil until started
}

// newNSWatch builds (but does not start) the informers of one namespace,
// with the cluster's handlers and object counter. A watch that is not
// federated (the system namespace outside the scope, watched for gateway
// Services) has a Service informer only.
func (c *Cluster) newNSWatch(namespace string, federated bool) (*nsWatch, error) {
	w := &nsWatch{namespace: namespace, federated: federated, counts: newKindCounts("Service", "EndpointSlice", "MeshPod", "ServiceExport")}
	var opts []informers.SharedInformerOption
	if namespace != "" {
		opts = append(opts, informers.WithNamespace(namespace))
	}
	w.factory = informers.NewSharedInformerFactoryWithOptions(c.client, 0, opts...)
	svc := w.factory.Core().V1().Services()
	w.svcInf, w.services = svc.Informer(), svc.Lister()
	if err := w.svcInf.SetTransform(stripObject); err != nil {
		return nil, fmt.Errorf("setting informer transform: %w", err)
	}
	handlers := []struct {
		kind string
		inf  cache.SharedIndexInformer
		fn   func(any)
	}{{"Service", w.svcInf, c.onService}}
	if federated {
		slice := w.factory.Discovery().V1().EndpointSlices()
		w.sliceInf, w.slices = slice.Informer(), slice.Lister()
		if err := w.sliceInf.SetTransform(stripObject); err != nil {
			return nil, fmt.Errorf("setting informer transform: %w", err)
		}
		handlers = append(handlers, struct {
			kind string
			inf  cache.SharedIndexInformer
			fn   func(any)
		}{"EndpointSlice", w.sliceInf, c.onSlice})
		w.mesh = newMeshPods(c.client, namespace)
		if err := w.mesh.inf.SetTransform(stripMeshPod); err != nil {
			return nil, fmt.Errorf("setting informer transform: %w", err)
		}
		if err := c.watchMeshPods(w); err != nil {
			return nil, err
		}
		if c.exportMode == ExportServiceExport {
			if err := c.watchServiceExports(w); err != nil {
				return nil, err
			}
		}
	}
	for _, h := range handlers {
		fn := h.fn
		reg, err := h.inf.AddEventHandler(c.counting(w.counts, h.kind, cache.ResourceEventHandlerFuncs{
			AddFunc:    fn,
			UpdateFunc: func(_, obj any) { fn(obj) },
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
func (c *Cluster) onService(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		c.queue.Add(ServiceKey{Namespace: ns, Name: name})
		c.gatewayServiceChanged(ServiceKey{Namespace: ns, Name: name}, obj)
	}
}

// onSlice rebuilds the Service of an EndpointSlice.
func (c *Cluster) onSlice(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok && s.Labels[discoveryv1.LabelServiceName] != "" {
		c.queue.Add(ServiceKey{Namespace: s.Namespace, Name: s.Labels[discoveryv1.LabelServiceName]})
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

// addWatch starts watching a namespace (a no-op when it is watched),
// at once when the cluster runs, else when it starts.
func (c *Cluster) addWatch(namespace string, federated bool) error {
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	c.wantFederated[namespace] = federated
	if w, ok := c.watches[namespace]; ok {
		if w.federated != federated {
			return c.replaceWatchLocked(w, federated)
		}
		return nil
	}
	if c.watchLimit > 0 && len(c.watches) >= c.watchLimit {
		c.watchRefused++
		return fmt.Errorf("not watching namespace %s: the member already watches %d namespaces", namespace, len(c.watches))
	}
	w, err := c.newNSWatch(namespace, federated)
	if err != nil {
		return err
	}
	c.watches[namespace] = w
	if c.runCtx != nil {
		w.start(c.runCtx, c.exportsOn.Load())
	}
	return nil
}

// removeWatch stops watching a namespace (the system namespace stays
// watched for gateways, its Services no longer federated) and rebuilds its
// Services, which are then gone.
func (c *Cluster) removeWatch(namespace string) {
	c.watchMu.Lock()
	w, ok := c.watches[namespace]
	if !ok {
		c.watchMu.Unlock()
		return
	}
	if namespace == SystemNamespace {
		c.wantFederated[namespace] = false
		if w.federated {
			if err := c.replaceWatchLocked(w, false); err != nil {
				c.log.Warn("system namespace watch not narrowed", "error", err)
			}
		}
		c.watchMu.Unlock()
		return
	}
	delete(c.watches, namespace)
	delete(c.wantFederated, namespace)
	c.watchMu.Unlock()
	c.retire(w)
}

// retire stops a watch that is no longer in the map and rebuilds its
// Services from whatever watch holds their namespace now (none: gone).
func (c *Cluster) retire(w *nsWatch) {
	keys := w.svcInf.GetStore().ListKeys()
	w.stop()
	c.objects.Add(-w.counts.total())
	for _, k := range keys {
		ns, name, _ := cache.SplitMetaNamespaceKey(k)
		c.queue.Add(ServiceKey{Namespace: ns, Name: name})
	}
}

// replaceWatchLocked replaces a namespace's watch by one that is (or is
// not) federated, make-before-break: while the cluster runs, the old one
// answers until the new one has synced (the system namespace's gateway
// Services never disappear in between). watchMu is held.
func (c *Cluster) replaceWatchLocked(old *nsWatch, federated bool) error {
	w, err := c.newNSWatch(old.namespace, federated)
	if err != nil {
		return err
	}
	if c.runCtx == nil {
		c.watches[old.namespace] = w
		return nil
	}
	ctx := c.runCtx
	w.start(ctx, c.exportsOn.Load())
	c.replacing.Go(func() {
		if !cache.WaitForCacheSync(ctx.Done(), w.hasSynced) {
			w.stop()
			return
		}
		c.watchMu.Lock()
		// Not when replaced meanwhile, nor when what is wanted changed
		// back (the old watch is what is wanted then).
		current := c.watches[old.namespace] == old && c.wantFederated[old.namespace] == federated
		if current {
			c.watches[old.namespace] = w
		}
		c.watchMu.Unlock()
		if !current {
			w.stop()
			return
		}
		c.retire(old)
		c.enqueueWatch(w)
	})
	return nil
}

// enqueueWatch rebuilds every Service of a watch.
func (c *Cluster) enqueueWatch(w *nsWatch) {
	for _, k := range w.svcInf.GetStore().ListKeys() {
		ns, name, _ := cache.SplitMetaNamespaceKey(k)
		c.queue.Add(ServiceKey{Namespace: ns, Name: name})
	}
}

// watchOf is the watch holding a namespace's objects, nil when none does.
func (c *Cluster) watchOf(namespace string) *nsWatch {
	c.watchMu.RLock()
	defer c.watchMu.RUnlock()
	if w, ok := c.watches[""]; ok {
		return w
	}
	return c.watches[namespace]
}

// watchList is every current watch.
func (c *Cluster) watchList() []*nsWatch {
	c.watchMu.RLock()
	defer c.watchMu.RUnlock()
	out := make([]*nsWatch, 0, len(c.watches))
	for _, w := range c.watches {
		out = append(out, w)
	}
	return out
}

// watchedNamespaces lists the namespaces watched, sorted (nil: every
// namespace), and how many selected namespaces were refused for the bound.
func (c *Cluster) watchedNamespaces() ([]string, int) {
	c.watchMu.RLock()
	defer c.watchMu.RUnlock()
	if _, all := c.watches[""]; all {
		return nil, 0
	}
	out := make([]string, 0, len(c.watches))
	for ns := range c.watches {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out, c.watchRefused
}

// watchesSynced reports whether the namespaces to watch are known (a
// selector's namespaces listed) and every watch has synced.
func (c *Cluster) watchesSynced() bool {
	if c.selected != nil && !c.selected.HasSynced() {
		return false
	}
	for _, w := range c.watchList() {
		if !w.hasSynced() {
			return false
		}
	}
	return true
}

// federates reports whether a namespace's Services are the member's
// services (in its WatchScope).
func (c *Cluster) federates(namespace string) bool {
	w := c.watchOf(namespace)
	return w != nil && w.federated
}

// watchNamespaces sets up the watches of the cluster's scope: one for
// every namespace, one per namespace named, or those a selector selects
// (a Namespace informer adds and removes them); the system namespace is
// watched for gateways in every case.
func (c *Cluster) watchNamespaces(scope WatchScope) error {
	c.watches, c.wantFederated = map[string]*nsWatch{}, map[string]bool{}
	c.scope = scope
	switch {
	case scope.All():
		return c.addWatch("", true)
	case scope.Namespaces != nil:
		for _, ns := range scope.Namespaces {
			if err := c.addWatch(ns, true); err != nil {
				return err
			}
		}
	default:
		c.watchLimit = maxWatchNamespaces + 1 // and the system namespace
		c.selectedFactory = informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = scope.Selector
		}))
		inf := c.selectedFactory.Core().V1().Namespaces().Informer()
		onAdd := func(obj any) {
			if ns, ok := obj.(metav1.Object); ok {
				if err := c.addWatch(ns.GetName(), true); err != nil {
					c.log.Warn("selected namespace not watched", "namespace", ns.GetName(), "error", err)
				}
			}
		}
		onDelete := func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if ns, ok := obj.(metav1.Object); ok {
				c.removeWatch(ns.GetName())
			}
		}
		// A namespace whose labels stop matching is deleted from a
		// label-selected watch: the informer tells onDelete.
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onAdd, DeleteFunc: onDelete})
		if err != nil {
			return fmt.Errorf("adding event handler: %w", err)
		}
		c.selected = reg
	}
	if _, ok := c.watches[SystemNamespace]; !ok {
		return c.addWatch(SystemNamespace, false)
	}
	return nil
}

// startWatches starts every watch registered so far; later ones start as
// they are added.
func (c *Cluster) startWatches(ctx context.Context) {
	c.watchMu.Lock()
	c.runCtx = ctx
	for _, w := range c.watches {
		w.start(ctx, c.exportsOn.Load())
	}
	c.watchMu.Unlock()
	if c.selectedFactory != nil {
		c.selectedFactory.Start(ctx.Done())
	}
}

// stopWatches stops every watch and waits for them (and for replacements
// under way, which end with the cluster's context).
func (c *Cluster) stopWatches() {
	c.replacing.Wait()
	if c.selectedFactory != nil {
		c.selectedFactory.Shutdown()
	}
	for _, w := range c.watchList() {
		w.stop()
	}
}

// emptyServices answers for a namespace the member does not watch.
var emptyServices = corelisters.NewServiceLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}))

// scopedServices is the member's Services over every watch.
type scopedServices struct{ c *Cluster }

func (s scopedServices) List(sel labels.Selector) ([]*corev1.Service, error) {
	var out []*corev1.Service
	for _, w := range s.c.watchList() {
		l, err := w.services.List(sel)
		if err != nil {
			return nil, err
		}
		out = append(out, l...)
	}
	return out, nil
}

func (s scopedServices) Services(namespace string) corelisters.ServiceNamespaceLister {
	if w := s.c.watchOf(namespace); w != nil {
		return w.services.Services(namespace)
	}
	return emptyServices.Services(namespace)
}

// endpointSlices lists the EndpointSlices of one Service.
func (c *Cluster) endpointSlices(svc *corev1.Service) []*discoveryv1.EndpointSlice {
	w := c.watchOf(svc.Namespace)
	if w == nil || w.slices == nil {
		return nil
	}
	out, _ := w.slices.EndpointSlices(svc.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}))
	return out
}

// runsMeshAccount reports whether a mesh pod of the member runs as
// namespace/serviceAccount (false when its namespace is not watched).
func (c *Cluster) runsMeshAccount(namespace, serviceAccount string) bool {
	w := c.watchOf(namespace)
	return w != nil && w.mesh != nil && w.mesh.runsAccount(namespace, serviceAccount)
}

// meshPod reports whether pod namespace/name is labelled for Istio mTLS,
// and its workload (podWorkload) and service account.
func (c *Cluster) meshPod(namespace, name string) (meshPod, bool) {
	w := c.watchOf(namespace)
	if w == nil || w.mesh == nil {
		return meshPod{}, false
	}
	return w.mesh.pod(namespace, name)
}
