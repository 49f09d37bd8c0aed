package distribute

import (
	"context"
	"fmt"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// watcher is the dynamic informer of one kind in one served version.
type watcher struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// stop stops the informer and waits for its goroutines.
func (w *watcher) stop() {
	w.cancel()
	<-w.done
}

// startWatch starts an informer on the labelled objects of a kind in every
// namespace. Its events only apply while it is the kind's current watcher.
func (s *Source) startWatch(parent context.Context, k kindInfo, gvr schema.GroupVersionResource) *watcher {
	ctx, cancel := context.WithCancel(parent)
	w := &watcher{cancel: cancel, done: make(chan struct{})}
	inf := dynamicinformer.NewFilteredDynamicInformer(s.dyn, gvr, metav1.NamespaceAll, 0, cache.Indexers{},
		func(o *metav1.ListOptions) { o.LabelSelector = Label + "=true" }).Informer()
	// Errors only arise on an informer already started.
	_ = inf.SetTransform(func(obj any) (any, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			u.SetManagedFields(nil)
		}
		return obj, nil
	})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		s.watchFailed(w, k, gvr, err)
	})
	reg, _ := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.apply(ctx, w, k, obj) },
		UpdateFunc: func(_, obj any) { s.apply(ctx, w, k, obj) },
		DeleteFunc: func(obj any) { s.remove(w, k, obj) },
	})
	go func() {
		defer close(w.done)
		var wg sync.WaitGroup
		wg.Go(func() { inf.RunWithContext(ctx) })
		if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			s.synced(w, k)
		}
		wg.Wait()
	}()
	return w
}

// current reports whether w is still k's watcher; s.mu must be held.
func (s *Source) current(w *watcher, k kindInfo) (*kindState, bool) {
	st := s.states[k.name()]
	return st, st.w == w
}

// synced marks k ready once its informer's initial list was handled.
func (s *Source) synced(w *watcher, k kindInfo) {
	s.mu.Lock()
	st, ok := s.current(w, k)
	if ok {
		st.ready, st.message = true, ""
	}
	s.mu.Unlock()
	if ok {
		s.notify(k.name())
	}
}

// watchFailed keeps the latest error of a kind's watch in its status,
// logging it when it changes (the informer retries with backoff).
func (s *Source) watchFailed(w *watcher, k kindInfo, gvr schema.GroupVersionResource, err error) {
	msg := fmt.Sprintf("watching %s: %v", gvr.String(), err)
	s.mu.Lock()
	st, ok := s.current(w, k)
	changed := ok && st.message != msg
	if ok {
		st.message = msg
	}
	s.mu.Unlock()
	if changed {
		s.log.Warn("watch of a distributed kind failed; retrying", "kind", k.name(), "err", err)
	}
}

func key(namespace, name string) string { return namespace + "/" + name }

// apply converts an added or updated object and stores it, or, when its
// spec does not convert, leaves it out and reports it once per generation.
func (s *Source) apply(ctx context.Context, w *watcher, k kindInfo, obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	o, err := convert(k, u)
	id := key(u.GetNamespace(), u.GetName())
	s.mu.Lock()
	st, cur := s.current(w, k)
	if !cur {
		s.mu.Unlock()
		return
	}
	prev, had := st.objects[id]
	var changed, report bool
	if err != nil {
		delete(st.objects, id)
		changed = had
		r := rejection{uid: u.GetUID(), generation: u.GetGeneration(), reported: true}
		report = st.rejected[id] != r && s.mayWrite()
		r.reported = report || st.rejected[id] == r
		st.rejected[id] = r
	} else {
		delete(st.rejected, id)
		if !had || prev.Version != o.Version {
			st.objects[id] = o
			changed = true
		}
	}
	ready := st.ready
	s.mu.Unlock()
	if report {
		s.reject(ctx, k, u, err)
	}
	if changed && ready {
		s.notify(k.name())
	}
}

// remove drops an object that was deleted or lost the label.
func (s *Source) remove(w *watcher, k kindInfo, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	id := key(u.GetNamespace(), u.GetName())
	s.mu.Lock()
	st, cur := s.current(w, k)
	var changed bool
	if cur {
		_, changed = st.objects[id]
		delete(st.objects, id)
		delete(st.rejected, id)
	}
	ready := cur && st.ready
	s.mu.Unlock()
	if changed && ready {
		s.notify(k.name())
	}
}
