package clusters

import (
	"log/slog"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// serviceController is a member's endpoint controller: the path from its
// Services and EndpointSlices to the Sink. A change of a Service, of one of
// its EndpointSlices, or of anything its view is built from (the member's
// nodes, network, gateways, mesh pods, ServiceExports) queues the Service.
// Its Cluster's run has it hand the Sink the member's whole view once
// (publishAll), then run rebuilds each queued Service (build) and hands it
// over, one at a time, until stop; after stop nothing more reaches the
// Sink: what a stopped client still had queued is dropped, and its caller
// decides what the Sink keeps (a successor's whole view, or none). Views
// are built from the member's informers (viewInputs); what was handed
// over is recorded in the member's health (its status counts it).
type serviceController struct {
	id   string
	sink Sink
	log  *slog.Logger
	viewInputs
	queue   workqueue.TypedRateLimitingInterface[ServiceKey]
	stopped atomic.Bool
}

// viewInputs are what a member's Service views are built from, and what
// records what was handed over.
type viewInputs struct {
	// services are the member's Services over every watch (scopedServices
	// of ns; its own field so that a test can hand an empty lister).
	services   corelisters.ServiceLister
	ns         *namespaceWatches // EndpointSlices, mesh pods, ServiceExports
	nodes      corelisters.NodeLister
	net        *networkController // network and gateways
	health     *memberHealth      // records what was handed over
	exportMode ExportMode
}

func newServiceController(id string, sink Sink, log *slog.Logger, in viewInputs) *serviceController {
	return &serviceController{id: id, sink: sink, log: log, viewInputs: in,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[ServiceKey]())}
}

// run rebuilds and hands over every queued Service until stop; what is
// still queued then is dropped.
func (sc *serviceController) run() {
	for sc.processNext() {
	}
}

// stop makes run hand nothing more to the Sink and end (once the Service
// it may be handing over is handed over).
func (sc *serviceController) stop() {
	sc.stopped.Store(true)
	sc.queue.ShutDown() // Get still hands out what is queued: processNext drops it
}

// enqueue queues one Service to be rebuilt.
func (sc *serviceController) enqueue(key ServiceKey) { sc.queue.Add(key) }

// enqueueAll queues every Service of the member.
func (sc *serviceController) enqueueAll() {
	svcs, _ := sc.services.List(labels.Everything())
	for _, s := range svcs {
		sc.queue.Add(ServiceKey{Namespace: s.Namespace, Name: s.Name})
	}
}

// enqueueWatch queues every Service of a watch.
func (sc *serviceController) enqueueWatch(w *nsWatch) {
	for _, k := range w.svcInf.GetStore().ListKeys() {
		ns, name, _ := cache.SplitMetaNamespaceKey(k)
		sc.queue.Add(ServiceKey{Namespace: ns, Name: name})
	}
}

// onSlice queues the Service of an EndpointSlice.
func (sc *serviceController) onSlice(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok && s.Labels[discoveryv1.LabelServiceName] != "" {
		sc.queue.Add(ServiceKey{Namespace: s.Namespace, Name: s.Labels[discoveryv1.LabelServiceName]})
	}
}

// publishAll hands the member's complete view to the Sink in one call.
func (sc *serviceController) publishAll() {
	svcs, _ := sc.services.List(labels.Everything())
	views := make([]*Service, 0, len(svcs))
	for _, svc := range svcs {
		if isHubGatewayService(svc) || !sc.ns.federates(svc.Namespace) {
			continue
		}
		views = append(views, sc.build(svc))
	}
	sc.sink.ReplaceCluster(sc.id, views)
	sc.health.publishedAll(views)
}

// processNext rebuilds the next queued Service and hands it to the Sink
// (nil: it is gone, or not federated); after stop it drops it. False once
// the queue is shut down and empty.
func (sc *serviceController) processNext() bool {
	key, quit := sc.queue.Get()
	if quit {
		return false
	}
	defer sc.queue.Done(key)
	if sc.stopped.Load() {
		return true
	}
	svc, err := sc.services.Services(key.Namespace).Get(key.Name)
	var view *Service
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		sc.log.Error("reading service from cache", "service", key, "error", err)
		sc.queue.AddRateLimited(key)
		return true
	case isHubGatewayService(svc): // the hub's own, not the member's
	case !sc.ns.federates(svc.Namespace): // watched for gateways only
	default:
		view = sc.build(svc)
	}
	sc.sink.UpdateService(sc.id, key, view)
	sc.health.publishedOne(key, view)
	sc.queue.Forget(key)
	return true
}

// build makes a Service's view from its EndpointSlices, its nodes'
// localities, its mesh pods, the member's network and gateways, and
// whether it is exported.
func (sc *serviceController) build(svc *corev1.Service) *Service {
	out := buildService(svc, sc.endpointSlices(svc), func(name string) map[string]string {
		if n, err := sc.nodes.Get(name); err == nil {
			return n.Labels
		}
		return nil
	}, sc.ns.meshPod)
	out.Network = sc.net.network()
	exported, listed := sc.ns.serviceExported(svc.Namespace, svc.Name)
	out.NotExported, out.ExportTo, out.ExportReason = exportOf(svc, sc.exportMode, exported, listed)
	out.Gateways = sc.net.gatewaysOf(out.Network)
	return out
}

// endpointSlices lists the EndpointSlices of one Service (an informer
// index by Service, slicesOfService).
func (sc *serviceController) endpointSlices(svc *corev1.Service) []*discoveryv1.EndpointSlice {
	w := sc.ns.of(svc.Namespace)
	if w == nil || w.sliceInf == nil {
		return nil
	}
	objs, _ := w.sliceInf.GetIndexer().ByIndex(slicesOfService, svc.Namespace+"/"+svc.Name) // the index exists
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, s)
		}
	}
	return out
}
