package clusters

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// namespaceWatches are the namespaces of a member its Cluster watches (its
// WatchScope), one nsWatch each: every namespace, the namespaces named, or
// those a label selector selects (a Namespace informer adds and removes
// them, at most maxWatchNamespaces); the system namespace is watched for
// gateways in every case. A watch that must become (or stop being)
// federated is replaced make-before-break. It is part of its Cluster: a
// watchBuilder builds the watches (newWatch) with the handlers of the
// member's controllers, and the endpoint controller rebuilds the Services
// they hold.
type namespaceWatches struct {
	scope WatchScope
	// newWatch builds a namespace's informers with the member's handlers.
	newWatch func(namespace string, federated bool) (*nsWatch, error)
	// retired is told a watch stopped: its Services are rebuilt (from
	// whichever watch holds their namespace now) and its objects no longer
	// count against the member's cap.
	retired func(w *nsWatch)
	// replaced is told a watch replaced another: its Services are rebuilt.
	replaced func(w *nsWatch)
	log      *slog.Logger

	mu            sync.RWMutex
	watches       map[string]*nsWatch // by namespace ("" for every namespace)
	wantFederated map[string]bool     // a replaced watch's wanted state (replaceLocked)
	runCtx        context.Context     // the Cluster's run context once it started
	exports       bool                // the ServiceExport informers run (startExports)
	limit         int                 // how many namespaces a selector may add (0: no bound)
	refused       int                 // namespaces a selector selected beyond limit
	// selectedFactory and selected are the Namespace informer of a selector
	// scope (nil otherwise).
	selectedFactory informers.SharedInformerFactory
	selected        cache.ResourceEventHandlerRegistration
	// replacing tracks the goroutines that swap in a replaced watch once
	// it synced; stop waits for them.
	replacing sync.WaitGroup
}

// watchScope sets up the watches of scope (see namespaceWatches), before
// the Cluster runs.
func (n *namespaceWatches) watchScope(scope WatchScope, client kubernetes.Interface) error {
	n.watches, n.wantFederated = map[string]*nsWatch{}, map[string]bool{}
	n.scope = scope
	switch {
	case scope.All():
		return n.add("", true)
	case scope.Namespaces != nil:
		for _, ns := range scope.Namespaces {
			if err := n.add(ns, true); err != nil {
				return err
			}
		}
	default:
		n.limit = maxWatchNamespaces + 1 // and the system namespace
		n.selectedFactory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = scope.Selector
		}))
		inf := n.selectedFactory.Core().V1().Namespaces().Informer()
		onAdd := func(obj any) {
			if ns, ok := obj.(metav1.Object); ok {
				if err := n.add(ns.GetName(), true); err != nil {
					n.log.Warn("selected namespace not watched", "namespace", ns.GetName(), "error", err)
				}
			}
		}
		onDelete := func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if ns, ok := obj.(metav1.Object); ok {
				n.remove(ns.GetName())
			}
		}
		// A namespace whose labels stop matching is deleted from a
		// label-selected watch: the informer tells onDelete.
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onAdd, DeleteFunc: onDelete})
		if err != nil {
			return fmt.Errorf("adding event handler: %w", err)
		}
		n.selected = reg
	}
	if _, ok := n.watches[SystemNamespace]; !ok {
		return n.add(SystemNamespace, false)
	}
	return nil
}

// add starts watching a namespace (a no-op when it is watched), at once
// when the Cluster runs, else when it starts.
func (n *namespaceWatches) add(namespace string, federated bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.wantFederated[namespace] = federated
	if w, ok := n.watches[namespace]; ok {
		if w.federated != federated {
			return n.replaceLocked(w, federated)
		}
		return nil
	}
	if n.limit > 0 && len(n.watches) >= n.limit {
		n.refused++
		return fmt.Errorf("not watching namespace %s: the member already watches %d namespaces", namespace, len(n.watches))
	}
	w, err := n.newWatch(namespace, federated)
	if err != nil {
		return err
	}
	n.watches[namespace] = w
	if n.runCtx != nil {
		w.start(n.runCtx, n.exports)
	}
	return nil
}

// remove stops watching a namespace (the system namespace stays watched
// for gateways, its Services no longer federated); its Services are
// rebuilt, and are then gone.
func (n *namespaceWatches) remove(namespace string) {
	n.mu.Lock()
	w, ok := n.watches[namespace]
	if !ok {
		n.mu.Unlock()
		return
	}
	if namespace == SystemNamespace {
		n.wantFederated[namespace] = false
		if w.federated {
			if err := n.replaceLocked(w, false); err != nil {
				n.log.Warn("system namespace watch not narrowed", "error", err)
			}
		}
		n.mu.Unlock()
		return
	}
	delete(n.watches, namespace)
	delete(n.wantFederated, namespace)
	n.mu.Unlock()
	n.retired(w)
}

// replaceLocked replaces a namespace's watch by one that is (or is not)
// federated, make-before-break: while the Cluster runs, the old one
// answers until the new one has synced (the system namespace's gateway
// Services never disappear in between). n.mu is held.
func (n *namespaceWatches) replaceLocked(old *nsWatch, federated bool) error {
	w, err := n.newWatch(old.namespace, federated)
	if err != nil {
		return err
	}
	if n.runCtx == nil {
		n.watches[old.namespace] = w
		return nil
	}
	ctx := n.runCtx
	w.start(ctx, n.exports)
	n.replacing.Go(func() {
		if !cache.WaitForCacheSync(ctx.Done(), w.hasSynced) {
			w.stop()
			return
		}
		n.mu.Lock()
		// Not when replaced meanwhile, nor when what is wanted changed
		// back (the old watch is what is wanted then).
		current := n.watches[old.namespace] == old && n.wantFederated[old.namespace] == federated
		if current {
			n.watches[old.namespace] = w
		}
		n.mu.Unlock()
		if !current {
			w.stop()
			return
		}
		n.retired(old)
		n.replaced(w)
	})
	return nil
}

// of is the watch holding a namespace's objects, nil when none does.
func (n *namespaceWatches) of(namespace string) *nsWatch {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if w, ok := n.watches[""]; ok {
		return w
	}
	return n.watches[namespace]
}

// list is every current watch.
func (n *namespaceWatches) list() []*nsWatch {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := make([]*nsWatch, 0, len(n.watches))
	for _, w := range n.watches {
		out = append(out, w)
	}
	return out
}

// startExports starts every watch's ServiceExport informer, and those of
// watches added later, and returns whether those started synced.
func (n *namespaceWatches) startExports() []cache.InformerSynced {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.exports = true
	var synced []cache.InformerSynced
	for _, w := range n.watches {
		w.startExports()
		if w.exports != nil {
			synced = append(synced, w.exports.inf.HasSynced)
		}
	}
	return synced
}

// namespaces lists the namespaces watched, sorted (nil: every namespace),
// and how many selected namespaces were refused for the bound.
func (n *namespaceWatches) namespaces() ([]string, int) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if _, all := n.watches[""]; all {
		return nil, 0
	}
	out := make([]string, 0, len(n.watches))
	for ns := range n.watches {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out, n.refused
}

// synced reports whether the namespaces to watch are known (a selector's
// namespaces listed) and every watch has synced.
func (n *namespaceWatches) synced() bool {
	if n.selected != nil && !n.selected.HasSynced() {
		return false
	}
	for _, w := range n.list() {
		if !w.hasSynced() {
			return false
		}
	}
	return true
}

// federates reports whether a namespace's Services are the member's
// services (in its WatchScope).
func (n *namespaceWatches) federates(namespace string) bool {
	w := n.of(namespace)
	return w != nil && w.federated
}

// start starts every watch registered so far; later ones start as they
// are added.
func (n *namespaceWatches) start(ctx context.Context) {
	n.mu.Lock()
	n.runCtx = ctx
	for _, w := range n.watches {
		w.start(ctx, n.exports)
	}
	n.mu.Unlock()
	if n.selectedFactory != nil {
		n.selectedFactory.Start(ctx.Done())
	}
}

// stop stops every watch and waits for them (and for replacements under
// way, which end with the Cluster's context).
func (n *namespaceWatches) stop() {
	n.replacing.Wait()
	if n.selectedFactory != nil {
		n.selectedFactory.Shutdown()
	}
	for _, w := range n.list() {
		w.stop()
	}
}
