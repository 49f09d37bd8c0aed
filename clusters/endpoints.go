package clusters

import (
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Node labels that give an endpoint its locality.
const (
	labelRegion = "topology.kubernetes.io/region"
	labelZone   = "topology.kubernetes.io/zone"
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

// slicesOfService names the EndpointSlice informers' index by the Service
// a slice belongs to (its kubernetes.io/service-name label): a Service is
// rebuilt from its own slices, not from a scan of its namespace's.
const slicesOfService = "service"

func sliceServiceKey(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return nil, nil
	}
	return []string{s.Namespace + "/" + name}, nil
}

// buildService turns a Service and its EndpointSlices into the hub's view.
// nodeLabels looks up a node's labels by name (nil when unknown); meshPod
// says whether a pod of the Service's namespace accepts Istio mTLS
// (Endpoint.MTLS; nil: none does) and its workload (Endpoint.Workload).
//
// A Service port maps to EndpointSlice ports by name (an unnamed Service port
// to the unnamed slice port). Ready endpoints are Healthy, serving but
// terminating ones Draining, and all others are left out (docs/architecture.md §3.5).
func buildService(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, nodeLabels func(string) map[string]string, meshPodOf func(namespace, name string) (meshPod, bool)) *Service {
	out := &Service{Namespace: svc.Namespace, Name: svc.Name, NotExported: svc.Labels[LabelExport] == "false"}
	if !svc.CreationTimestamp.IsZero() {
		out.Created = time.Unix(svc.CreationTimestamp.Unix(), 0).UTC()
	}
	out.KubernetesServiceAccounts = declaredServiceAccounts(svc.Annotations[AnnotationKubernetesServiceAccounts])
	out.CanonicalServiceAccounts = declaredServiceAccounts(svc.Annotations[AnnotationCanonicalServiceAccounts])
	for _, p := range svc.Spec.Ports {
		sp := ServicePort{Name: p.Name, Port: p.Port, Protocol: string(p.Protocol)}
		if p.AppProtocol != nil {
			sp.AppProtocol = *p.AppProtocol
		}
		out.Ports = append(out.Ports, sp)
	}
	accounts := map[string]bool{} // of the mesh pods behind the endpoints
	// Slices arrive in informer order; sort so identical inputs give identical views.
	sort.Slice(slices, func(i, j int) bool { return slices[i].Name < slices[j].Name })
	for _, slice := range slices {
		if slice.AddressType != discoveryv1.AddressTypeIPv4 && slice.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		for _, sp := range out.Ports {
			target, ok := slicePort(slice, sp.Name)
			if !ok {
				continue
			}
			for _, ep := range slice.Endpoints {
				health, ok := endpointHealth(ep.Conditions)
				if !ok {
					continue
				}
				var region, zone string
				if ep.NodeName != nil && nodeLabels != nil {
					labels := nodeLabels(*ep.NodeName)
					region, zone = labels[labelRegion], labels[labelZone]
				}
				if ep.Zone != nil && *ep.Zone != "" {
					zone = *ep.Zone
				}
				var pod meshPod
				var mtls bool
				if meshPodOf != nil && ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
					pod, mtls = meshPodOf(slice.Namespace, ep.TargetRef.Name)
				}
				if mtls && pod.serviceAccount != "" {
					accounts[pod.serviceAccount] = true
				}
				for _, addr := range ep.Addresses {
					out.Endpoints = append(out.Endpoints, Endpoint{
						Address: addr, Port: target, ServicePort: sp.Port,
						Health: health, Region: region, Zone: zone, MTLS: mtls, Workload: pod.workload,
					})
				}
			}
		}
	}
	if len(accounts) > MaxDeclaredServiceAccounts {
		out.TooManyPodServiceAccounts = true
	} else {
		for sa := range accounts {
			out.PodServiceAccounts = append(out.PodServiceAccounts, sa)
		}
		sort.Strings(out.PodServiceAccounts)
	}
	return out
}

func slicePort(slice *discoveryv1.EndpointSlice, name string) (int32, bool) {
	for _, p := range slice.Ports {
		pn := ""
		if p.Name != nil {
			pn = *p.Name
		}
		if pn == name && p.Port != nil {
			return *p.Port, true
		}
	}
	return 0, false
}

// endpointHealth follows the EndpointSlice API: a nil ready or serving
// condition means the endpoint is ready (serving).
func endpointHealth(c discoveryv1.EndpointConditions) (Health, bool) {
	terminating := c.Terminating != nil && *c.Terminating
	ready := c.Ready == nil || *c.Ready
	serving := c.Serving == nil || *c.Serving
	switch {
	case ready && !terminating:
		return Healthy, true
	case serving && terminating:
		return Draining, true
	case ready:
		return Healthy, true
	}
	return 0, false
}

// maxServiceAccountBytes bounds one declared identity (a SPIFFE ID of a
// namespace and a service account is well under it).
const maxServiceAccountBytes = 512

// maxDeclaredAnnotationBytes bounds a service-account annotation that can
// declare anything.
const maxDeclaredAnnotationBytes = MaxDeclaredServiceAccounts * (maxServiceAccountBytes + 1)

// declaredServiceAccounts reads one of Istio's service-account annotations:
// its comma-separated entries, trimmed, sorted, without duplicates. More
// than MaxDeclaredServiceAccounts entries, or one longer than
// maxServiceAccountBytes, declare nothing: a check against a truncated list
// would refuse endpoints the Service says are its own.
func declaredServiceAccounts(v string) []string {
	if strings.TrimSpace(v) == "" || len(v) > maxDeclaredAnnotationBytes {
		return nil
	}
	var out []string
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if len(e) > maxServiceAccountBytes || len(out) == MaxDeclaredServiceAccounts {
			return nil
		}
		out = append(out, e)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
