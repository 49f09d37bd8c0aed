package clusters

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Cluster is one member cluster: a client, its informers, and the endpoint
// controller that turns Services, EndpointSlices and Nodes into Service views
// for the Sink. Create it with newCluster, start it with start, stop it with stop.
type Cluster struct {
	id      string
	secret  string
	server  string
	hash    [32]byte
	sink    Sink
	log     *slog.Logger
	timeout time.Duration

	factory  informers.SharedInformerFactory
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	nodes    corelisters.NodeLister
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[ServiceKey]

	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	state     State
	message   string
	lastSync  time.Time
	endpoints map[ServiceKey]int
}

func newCluster(id, secret string, cfg *rest.Config, server string, hash [32]byte, sink Sink, timeout time.Duration, log *slog.Logger) (*Cluster, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "hub/" + id
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building client for cluster %s: %w", id, err)
	}
	c := &Cluster{
		id: id, secret: secret, server: server, hash: hash, sink: sink, timeout: timeout,
		log:       log.With("cluster", id),
		factory:   informers.NewSharedInformerFactory(client, 0),
		queue:     workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[ServiceKey]()),
		done:      make(chan struct{}),
		state:     StatePending,
		endpoints: map[ServiceKey]int{},
	}
	svcInf := c.factory.Core().V1().Services()
	sliceInf := c.factory.Discovery().V1().EndpointSlices()
	nodeInf := c.factory.Core().V1().Nodes()
	for _, inf := range []cache.SharedIndexInformer{svcInf.Informer(), sliceInf.Informer(), nodeInf.Informer()} {
		if err := inf.SetTransform(stripObject); err != nil {
			return nil, fmt.Errorf("setting informer transform: %w", err)
		}
	}
	c.services, c.slices, c.nodes = svcInf.Lister(), sliceInf.Lister(), nodeInf.Lister()

	onService := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			ns, name, _ := cache.SplitMetaNamespaceKey(key)
			c.queue.Add(ServiceKey{Namespace: ns, Name: name})
		}
	}
	onSlice := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if s, ok := obj.(*discoveryv1.EndpointSlice); ok && s.Labels[discoveryv1.LabelServiceName] != "" {
			c.queue.Add(ServiceKey{Namespace: s.Namespace, Name: s.Labels[discoveryv1.LabelServiceName]})
		}
	}
	onNode := func(any) { c.enqueueAll() }
	handlers := []struct {
		inf cache.SharedIndexInformer
		fn  func(any)
	}{{svcInf.Informer(), onService}, {sliceInf.Informer(), onSlice}, {nodeInf.Informer(), onNode}}
	for _, h := range handlers {
		fn := h.fn
		reg, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    fn,
			UpdateFunc: func(_, obj any) { fn(obj) },
			DeleteFunc: fn,
		})
		if err != nil {
			return nil, fmt.Errorf("adding event handler: %w", err)
		}
		c.synced = append(c.synced, reg.HasSynced)
	}
	return c, nil
}

// start runs the cluster until stop is called.
func (c *Cluster) start(ctx context.Context) {
	ctx, c.cancel = context.WithCancel(ctx)
	go c.run(ctx)
}

// stop stops every goroutine and informer of the cluster and waits for them.
// It does not touch the Sink: the caller decides whether the member's
// services go (RemoveCluster) or are replaced by a successor.
func (c *Cluster) stop() {
	c.cancel()
	c.queue.ShutDown()
	<-c.done
	c.factory.Shutdown()
}

func (c *Cluster) run(ctx context.Context) {
	defer close(c.done)
	c.factory.Start(ctx.Done())
	c.setState(StateSyncing, "waiting for Services, EndpointSlices and Nodes to sync")
	started := time.Now()
	timer := time.AfterFunc(c.timeout, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.state == StateSyncing {
			c.state = StateTimedOut
			c.message = fmt.Sprintf("not synced within %s; still trying (no longer blocks readiness)", c.timeout)
			c.log.Warn("cluster sync timed out", "timeout", c.timeout)
		}
	})
	defer timer.Stop()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	c.publishAll()
	c.mu.Lock()
	c.state, c.message, c.lastSync = StateReady, "", time.Now()
	c.mu.Unlock()
	c.log.Info("cluster synced", "duration", time.Since(started).Round(time.Millisecond).String())
	for c.processNext() {
	}
}

// publishAll hands the member's complete view to the Sink in one call.
func (c *Cluster) publishAll() {
	svcs, _ := c.services.List(labels.Everything())
	views := make([]*Service, 0, len(svcs))
	counts := make(map[ServiceKey]int, len(svcs))
	for _, svc := range svcs {
		v := c.build(svc)
		views = append(views, v)
		counts[ServiceKey{Namespace: svc.Namespace, Name: svc.Name}] = len(v.Endpoints)
	}
	c.sink.ReplaceCluster(c.id, views)
	c.mu.Lock()
	c.endpoints = counts
	c.mu.Unlock()
}

func (c *Cluster) processNext() bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	svc, err := c.services.Services(key.Namespace).Get(key.Name)
	var view *Service
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		c.log.Error("reading service from cache", "service", key, "error", err)
		c.queue.AddRateLimited(key)
		return true
	default:
		view = c.build(svc)
	}
	c.sink.UpdateService(c.id, key, view)
	c.mu.Lock()
	if view == nil {
		delete(c.endpoints, key)
	} else {
		c.endpoints[key] = len(view.Endpoints)
	}
	c.lastSync = time.Now()
	c.mu.Unlock()
	c.queue.Forget(key)
	return true
}

func (c *Cluster) build(svc *corev1.Service) *Service {
	slices, _ := c.slices.EndpointSlices(svc.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}))
	return buildService(svc, slices, func(name string) map[string]string {
		if n, err := c.nodes.Get(name); err == nil {
			return n.Labels
		}
		return nil
	})
}

func (c *Cluster) enqueueAll() {
	svcs, _ := c.services.List(labels.Everything())
	for _, s := range svcs {
		c.queue.Add(ServiceKey{Namespace: s.Namespace, Name: s.Name})
	}
}

func (c *Cluster) setState(s State, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state, c.message = s, msg
}

// status reports the cluster's current status.
func (c *Cluster) status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{
		ID: c.id, Secret: c.secret, State: c.state, Message: c.message, Server: c.server,
		Services: len(c.endpoints), LastSyncTime: c.lastSync,
	}
	for _, n := range c.endpoints {
		st.Endpoints += n
	}
	return st
}

// stripObject drops what the hub never reads from informer objects, to keep
// memory per member small: managed fields and annotations everywhere, and all
// of a Node but its name and labels.
func stripObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Node:
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: o.Name, Labels: o.Labels, ResourceVersion: o.ResourceVersion, UID: o.UID,
		}}, nil
	case metav1.Object:
		o.SetManagedFields(nil)
		o.SetAnnotations(nil)
	}
	return obj, nil
}
