package distribute

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
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

// failsClosed are the kinds (Kind) whose unreadable objects Rules hands
// out with a nil Spec: the policies the hub's own xDS enforces, and so
// must fail closed on when it cannot read one.
var failsClosed = map[string]bool{"AuthorizationPolicy": true, "PeerAuthentication": true}

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
// spec does not convert or it may not be distributed (Source.authorize),
// leaves it out and reports it once per generation.
func (s *Source) apply(ctx context.Context, w *watcher, k kindInfo, obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	o, err := convert(k, u)
	reason := ReasonSpec
	if err == nil {
		reason, err = s.authorize(o)
	}
	id := key(u.GetNamespace(), u.GetName())
	s.mu.Lock()
	st, cur := s.current(w, k)
	if !cur {
		s.mu.Unlock()
		return
	}
	var changed, report bool
	if err != nil {
		r := rejection{uid: u.GetUID(), generation: u.GetGeneration(), reason: reason, message: statusMessage(reason, err)}
		switch {
		case reason == ReasonHost:
			r.object = &o // checked again when the federated hosts change
		case reason == ReasonSpec && failsClosed[k.kind] && slices.Contains(s.opts.Namespaces, u.GetNamespace()):
			// Unreadable, where it would count: the hub's own xDS must
			// know it is there (Rules), to fail closed on it.
			r.object = &Object{Kind: k.name(), Namespace: u.GetNamespace(), Name: u.GetName(),
				Version: fmt.Sprintf("unreadable/%s/%d", u.GetUID(), u.GetGeneration()), ref: refOf(u), generation: u.GetGeneration()}
		}
		changed, report = s.rejectLocked(st, id, r)
	} else {
		changed = s.acceptLocked(st, id, o)
	}
	ready := st.ready
	s.mu.Unlock()
	if report {
		s.reject(ctx, k.name(), refOf(u), u.GetGeneration(), reason, err)
	}
	if changed && ready {
		s.notify(k.name())
	}
}

// acceptLocked stores o as distributed and reports whether what is
// distributed changed; s.mu must be held.
func (s *Source) acceptLocked(st *kindState, id string, o Object) bool {
	delete(st.rejected, id)
	if prev, had := st.objects[id]; had && prev.Version == o.Version {
		return false
	}
	st.objects[id] = o
	return true
}

// rejectLocked leaves an object out and reports whether what is
// distributed, or what Rules returns, changed and whether this rejection
// is to be recorded as an Event (once per uid, generation and reason, and
// only by a replica that may write); s.mu must be held.
func (s *Source) rejectLocked(st *kindState, id string, r rejection) (changed, report bool) {
	_, changed = st.objects[id]
	delete(st.objects, id)
	prev, seen := st.rejected[id]
	if prev.object != nil || r.object != nil {
		changed = changed || prev.object == nil || r.object == nil || prev.object.Version != r.object.Version
	}
	r.reported = seen && prev.sameAs(r) && prev.reported
	report = !r.reported && s.mayWrite()
	r.reported = r.reported || report
	st.rejected[id] = r
	return changed, report
}

// statusMessage is what Status says of a rejection: why, but never a
// conversion error, which may quote the spec (it is in the object's Event,
// readable by those who can read the object).
func statusMessage(reason string, err error) string {
	if reason == ReasonSpec {
		return "its spec does not convert to its kind's proto; the error is in a " + RejectedReason + " Event on the object"
	}
	return err.Error()
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
		changed = changed || st.rejected[id].object != nil // it was among Rules
		delete(st.objects, id)
		delete(st.rejected, id)
	}
	ready := cur && st.ready
	s.mu.Unlock()
	if changed && ready {
		s.notify(k.name())
	}
}

// recheckHosts checks again every object whose hosts were checked against
// the federated Services, which change: one now naming a federated host is
// left out and reported; one that was left out for that alone and no
// longer does is distributed again.
func (s *Source) recheckHosts(ctx context.Context) {
	type report struct {
		kind string
		ref  corev1.ObjectReference
		gen  int64
		err  error
	}
	var reports []report
	var changedKinds []string
	s.mu.Lock()
	for name, st := range s.states {
		changed := false
		for id, o := range st.objects {
			if !namesHosts(o.Spec) {
				continue
			}
			if err := s.checkHosts(o); err != nil {
				r := rejection{uid: o.ref.UID, generation: o.generation, reason: ReasonHost, message: err.Error(), object: &o}
				ch, rep := s.rejectLocked(st, id, r)
				changed = changed || ch
				if rep {
					reports = append(reports, report{name, o.ref, o.generation, err})
				}
			}
		}
		for id, r := range st.rejected {
			if r.reason == ReasonHost && r.object != nil && s.opts.Hosts.check(r.object.Namespace, r.object.Spec) == nil {
				changed = s.acceptLocked(st, id, *r.object) || changed
			}
		}
		if changed && st.ready {
			changedKinds = append(changedKinds, name)
		}
	}
	s.mu.Unlock()
	for _, r := range reports {
		s.reject(ctx, r.kind, r.ref, r.gen, ReasonHost, r.err)
	}
	for _, k := range changedKinds {
		s.notify(k)
	}
}
