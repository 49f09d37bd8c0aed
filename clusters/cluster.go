package clusters

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Cluster is one client of a member cluster: its API (memberAPI), its
// health and lifecycle state (memberHealth), its informers, and the
// controllers built on them — the endpoint controller that turns
// Services, EndpointSlices and Nodes into Service views for the Sink
// (serviceController), the network controller (its network and gateways),
// the secret controller (SDS) and the namespace watches (WatchScope).
//
// Create it with newCluster, start it with start, stop it with stop.
type Cluster struct {
	id     string
	secret string // the remote Secret naming it ("": the home cluster)
	sink   Sink
	log    *slog.Logger
	// beforePublish runs once, after the first full sync and before the
	// first write to the Sink: the registry uses it to stop the member's
	// previous client (make-before-break). If it returns false the cluster
	// was superseded and publishes nothing.
	beforePublish func() bool
	// secretsSynced, if set, is called once the secret cache has synced, so
	// that SDS answers withheld while it was syncing go out.
	secretsSynced func()

	api     *memberAPI
	health  *memberHealth
	objects *objectCap // caps the objects the informers hold
	secrets *secretController
	nodes   nodeWatch
	// ns are the namespaces watched (what the member's Secret says to
	// watch, WatchScope), with their informers.
	ns       namespaceWatches
	services corelisters.ServiceLister // over every watch (scopedServices)
	net      *networkController
	views    *serviceController // Services and EndpointSlices → Sink
	exports  exportSettings
	synced   []cache.InformerSynced

	cancel context.CancelFunc
	done   chan struct{}
}

// exportSettings say which Services are exported (--export-mode) and how
// often a member without ServiceExports is asked again.
type exportSettings struct {
	mode ExportMode
	poll time.Duration
}

// nodeWatch is the member's Node informer: a node port gateway's address
// may move with its nodes, and endpoints take their locality from them.
type nodeWatch struct {
	factory informers.SharedInformerFactory
	lister  corelisters.NodeLister
}

// clusterDeps are what every Cluster of a registry shares.
type clusterDeps struct {
	sink    Sink
	timeout time.Duration
	log     *slog.Logger
	// secretEvents is told when the member's Secrets change (may be nil).
	secretEvents SecretEvents
	// isLeader says whether this replica writes into members (nil: it does).
	isLeader func() bool
	// settled says whether membership has settled (every member synced,
	// timed out or restored; nil: it has): until then the gateways of some
	// networks are not known yet, and no member's gateway writer writes.
	settled func() bool
	// gatewaysChanged is told when a member's network or gateways changed
	// (the registry hands every member the new set; may be nil).
	gatewaysChanged func()
	// exportMode says which Services are exported ("": ExportAll);
	// exportPoll how often a member without ServiceExports is asked
	// again (0: serviceExportPoll).
	exportMode ExportMode
	exportPoll time.Duration
}

func newCluster(id, secret string, kc *Kubeconfig, scope WatchScope, deps clusterDeps) (*Cluster, error) {
	c := &Cluster{
		id: id, secret: secret, sink: deps.sink, log: deps.log.With("cluster", id),
		health:  newMemberHealth(deps.timeout),
		objects: &objectCap{max: kc.maxObjects, counts: newKindCounts("Node", "Secret")},
		exports: exportSettings{mode: deps.exportMode, poll: cmp.Or(deps.exportPoll, serviceExportPoll)},
		done:    make(chan struct{}),
	}
	c.objects.overflow = c.overflow
	var err error
	if c.api, err = newMemberAPI(id, kc, c.health); err != nil {
		return nil, err
	}
	if err := c.watchSecrets(deps.secretEvents); err != nil {
		return nil, err
	}
	c.services = scopedServices{&c.ns}
	nodesSynced, err := c.watchNodes()
	if err != nil {
		return nil, err
	}
	in := networkInputs{
		services: c.services, nodes: c.nodes.lister,
		rebuild: func() { c.views.enqueueAll() }, // the endpoint controller, built next
		changed: deps.gatewaysChanged, settled: deps.settled, isLeader: deps.isLeader,
	}
	if c.net, err = newNetworkController(id, secret == "", c.api.client, in, c.log); err != nil {
		return nil, err
	}
	c.views = newServiceController(id, c.sink, c.log, viewInputs{
		services: c.services, ns: &c.ns, nodes: c.nodes.lister, net: c.net, health: c.health, exportMode: c.exports.mode,
	})
	b := &watchBuilder{client: c.api.client, meta: c.api.meta, objects: c.objects, views: c.views, net: c.net, exports: c.exports.mode == ExportServiceExport}
	c.ns = namespaceWatches{newWatch: b.build, retired: b.retire, replaced: c.views.enqueueWatch, log: c.log}
	if err := c.ns.watchScope(scope, c.api.client); err != nil {
		return nil, err
	}
	c.synced = append(c.synced, nodesSynced, c.ns.synced)
	return c, nil
}

// watchSecrets builds the member's Secret cache (for SDS), which tells
// events of its Secrets' changes and of its sync (nil: nobody).
func (c *Cluster) watchSecrets(events SecretEvents) error {
	var onSecret func(ServiceKey)
	if events != nil {
		onSecret = func(key ServiceKey) { events.SecretChanged(c.id, key) }
		c.secretsSynced = func() { events.SecretsSynced(c.id) }
	}
	var err error
	if c.secrets, err = newSecretController(c.api.client, onSecret); err != nil {
		return err
	}
	// The secret controller's informer has its handler; this one counts.
	if _, err := c.secrets.inf.AddEventHandler(c.objects.counting(c.objects.counts, "Secret", cache.ResourceEventHandlerFuncs{})); err != nil {
		return fmt.Errorf("adding object counter: %w", err)
	}
	return nil
}

// watchNodes builds the member's Node informer.
func (c *Cluster) watchNodes() (cache.InformerSynced, error) {
	c.nodes.factory = informers.NewSharedInformerFactory(c.api.client, 0)
	nodes := c.nodes.factory.Core().V1().Nodes()
	inf := nodes.Informer()
	c.nodes.lister = nodes.Lister()
	if err := inf.SetTransform(stripObject); err != nil {
		return nil, fmt.Errorf("setting informer transform: %w", err)
	}
	onNode := func(any) {
		if !c.net.refresh(false) { // a node port gateway's address may have moved
			c.views.enqueueAll()
		}
	}
	reg, err := inf.AddEventHandler(c.objects.counting(c.objects.counts, "Node", cache.ResourceEventHandlerFuncs{
		AddFunc:    onNode,
		UpdateFunc: func(_, obj any) { onNode(obj) },
		DeleteFunc: onNode,
	}))
	if err != nil {
		return nil, fmt.Errorf("adding event handler: %w", err)
	}
	return reg.HasSynced, nil
}

// runs reports whether the cluster is the client of this kubeconfig
// (same bytes) and watch scope.
func (c *Cluster) runs(kc *Kubeconfig, scope WatchScope) bool {
	return c.api.hash == kc.SHA256 && c.ns.scope.equal(scope)
}

// start runs the cluster until stop is called.
func (c *Cluster) start(ctx context.Context) {
	ctx, c.cancel = context.WithCancel(ctx)
	go c.run(ctx)
}

// stop stops every goroutine and informer of the cluster, waits for them and
// closes its connections. It does not touch the Sink: the caller decides
// whether the member's services go (RemoveCluster) or stay for a successor.
func (c *Cluster) stop() {
	c.cancel()
	c.views.stop()
	<-c.done
	c.nodes.factory.Shutdown()
	c.net.system.Shutdown()
	c.ns.stop()
	c.secrets.factory.Shutdown()
	c.api.conns.closeAll()
}

func (c *Cluster) run(ctx context.Context) {
	defer close(c.done)
	c.nodes.factory.Start(ctx.Done())
	c.net.system.Start(ctx.Done())
	c.ns.start(ctx)
	c.secrets.factory.Start(ctx.Done())
	var wg sync.WaitGroup
	defer wg.Wait()
	if c.secretsSynced != nil {
		wg.Go(func() {
			if cache.WaitForCacheSync(ctx.Done(), c.secrets.synced) {
				c.secretsSynced()
			}
		})
	}
	wg.Go(func() { c.api.probeHealth(ctx) })
	c.health.syncing()
	started := time.Now()
	if !c.waitForSync(ctx, &wg) {
		return
	}
	ready := func() {
		took := time.Since(started)
		c.health.synced(took)
		c.log.Info("cluster synced", "duration", took.Round(time.Millisecond).String())
	}
	if c.beforePublish != nil {
		// A new kubeconfig's client is Ready as itself before it becomes the
		// member's active client: the member, shown as its active client, is
		// never seen Syncing because its credentials rotated.
		ready()
		promoted := c.beforePublish()
		if !promoted || ctx.Err() != nil {
			if promoted {
				// Stopped right after it replaced its predecessor: if by its
				// object cap, the predecessor's views go too.
				c.withdrawIfOverflowed()
			}
			return // superseded, or stopped while swapping: publish nothing
		}
	} else if ctx.Err() != nil {
		return
	}
	c.views.publishAll()
	if c.net.changed != nil {
		c.net.changed() // its gateways count for the others from now on (exportedGateways)
	}
	wg.Go(func() { c.net.gw.run(ctx) })
	defer c.withdrawIfOverflowed()
	if c.beforePublish == nil {
		ready()
	}
	if c.secretsSynced != nil {
		// The member may assert identities from now on (IdentityScope):
		// SDS answers withheld until it synced go out.
		c.secretsSynced()
	}
	c.views.run()
}

// waitForSync waits for the member's informers: its Services,
// EndpointSlices and Nodes (the member is TimedOut after its health's
// timeout, and still waited for; false: stopped first), then, a little,
// the optional ones. The ServiceExport watch, if the member serves them,
// starts in wg.
func (c *Cluster) waitForSync(ctx context.Context, wg *sync.WaitGroup) bool {
	timer := time.AfterFunc(c.health.timeout, c.health.syncTimedOut)
	defer timer.Stop()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return false
	}
	timer.Stop()
	// The mesh pods are optional (the member's credentials may not list
	// pods): wait for them a little, so that the first view already marks
	// the mTLS endpoints, but never hold the member up for them.
	meshCtx, cancelMesh := context.WithTimeout(ctx, meshPodsSyncWait)
	exportsServed := c.exports.mode == ExportServiceExport && c.watchServiceExportsWhenServed(ctx, meshCtx, wg)
	for _, w := range c.ns.list() {
		cache.WaitForCacheSync(meshCtx.Done(), w.optionalSynced(exportsServed)...)
	}
	cancelMesh()
	c.health.setInformersSynced()
	return true
}

// setObserver replaces the state-change hook.
func (c *Cluster) setObserver(fn func(Status, State)) {
	if fn == nil {
		c.health.setObserver(nil)
		return
	}
	c.health.setObserver(func(from State) { fn(c.status(), from) })
}

// servePersisted marks a member that has not started yet as serving a view
// persisted at at (a state change to Stale, observed like any other); the
// view's gateways are already those the Secret confirms (confirmedGateways).
func (c *Cluster) servePersisted(at time.Time, services []*Service) {
	c.net.servePersisted(services) // before the observer is told
	c.health.servePersisted(at, services)
}

// status reports the cluster's current status.
func (c *Cluster) status() Status {
	h := c.health.view()
	st := Status{
		ID: c.id, Secret: c.secret, Server: c.api.server, State: h.state, Message: h.message,
		Services: h.services, Endpoints: h.endpoints.all, LastSyncTime: h.lastSync, SyncDuration: h.syncDuration,
		Warnings: slices.Clone(c.api.warnings), Credentials: slices.Clone(c.api.credentials),
		WatchScope: c.ns.scope,
	}
	if c.api.hash != ([32]byte{}) {
		st.KubeconfigSHA256 = hex.EncodeToString(c.api.hash[:])
	}
	c.net.status(&st, h.endpoints)
	st.WatchedNamespaces, st.WatchRefused = c.ns.namespaces()
	st.Objects = c.objectCounts()
	return st
}

// objectCounts reports how many objects the member's informers hold, by
// kind, over every watched namespace.
func (c *Cluster) objectCounts() map[string]int {
	out := map[string]int{}
	for kind, n := range c.objects.counts {
		out[kind] = int(n.Load())
	}
	for _, w := range c.ns.list() {
		for kind, n := range w.counts {
			if kind == "ServiceExport" && w.exports == nil {
				continue // not watched in this export mode
			}
			out[kind] += int(n.Load())
		}
	}
	return out
}

// stripObject drops what the hub never reads from informer objects, to keep
// memory per member small: managed fields, annotations (but a Service's
// export-to (AnnotationExportTo) and service-account ones, see Service.KubernetesServiceAccounts, and a gateway
// Service's node selector) and status everywhere (but a gateway Service's
// load balancer ingress), all of a Node
// but its name, labels and IP addresses, and an EndpointSlice's target
// references but pods' names.
func stripObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Node:
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: o.Name, Labels: o.Labels, ResourceVersion: o.ResourceVersion, UID: o.UID,
		}}
		for _, a := range o.Status.Addresses { // node port gateways' addresses
			if a.Type == corev1.NodeExternalIP || a.Type == corev1.NodeInternalIP {
				n.Status.Addresses = append(n.Status.Addresses, a)
			}
		}
		return n, nil
	case *corev1.Service:
		var kept map[string]string
		_, gateway := o.Labels[LabelNetwork]
		keep := []string{AnnotationKubernetesServiceAccounts, AnnotationCanonicalServiceAccounts, AnnotationExportTo}
		if gateway {
			keep = append(keep, AnnotationNodeSelector, AnnotationProxylessALPN)
		}
		for _, k := range keep {
			if v, ok := o.Annotations[k]; ok && len(v) <= maxDeclaredAnnotationBytes { // longer ones declare nothing
				if kept == nil {
					kept = map[string]string{}
				}
				kept[k] = v
			}
		}
		o.ManagedFields, o.Annotations = nil, kept
		if gateway {
			o.Status = corev1.ServiceStatus{LoadBalancer: o.Status.LoadBalancer}
		} else {
			o.Status = corev1.ServiceStatus{}
		}
		o.Spec.Selector = nil
	case *discoveryv1.EndpointSlice:
		o.ManagedFields, o.Annotations = nil, nil
		for i := range o.Endpoints {
			o.Endpoints[i].TargetRef, o.Endpoints[i].Hints, o.Endpoints[i].DeprecatedTopology = stripPodRef(o.Endpoints[i].TargetRef), nil, nil
		}
	case metav1.Object:
		o.SetManagedFields(nil)
		o.SetAnnotations(nil)
	}
	return obj, nil
}

// stripToName keeps of a metadata informer's object its namespace, name
// and what the informer needs (resource version, UID).
func stripToName(obj any) (any, error) {
	if o, ok := obj.(*metav1.PartialObjectMetadata); ok {
		return &metav1.PartialObjectMetadata{TypeMeta: o.TypeMeta, ObjectMeta: metav1.ObjectMeta{
			Namespace: o.Namespace, Name: o.Name, ResourceVersion: o.ResourceVersion, UID: o.UID,
		}}, nil
	}
	return obj, nil
}
