package clusters

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Cluster is one member cluster: a client, its informers, the endpoint
// controller that turns Services, EndpointSlices and Nodes into Service
// views for the Sink, and the lifecycle state machine
//
//	Pending → Syncing → Ready ⇄ Stale
//	            ↓ ↑
//	        Unreachable → TimedOut → Ready
//
// and Invalid from any of them when the member holds more objects than
// it may (overflow: its informers stop until its Secret changes).
//
// Create it with newCluster, start it with start, stop it with stop.
type Cluster struct {
	id      string
	secret  string
	server  string
	hash    [32]byte
	sink    Sink
	log     *slog.Logger
	timeout time.Duration
	// beforePublish runs once, after the first full sync and before the
	// first write to the Sink: the registry uses it to stop the member's
	// previous client (make-before-break). If it returns false the cluster
	// was superseded and publishes nothing.
	beforePublish func() bool

	// secretsSynced, if set, is called once the secret cache has synced, so
	// that SDS answers withheld while it was syncing go out.
	secretsSynced func()

	client     kubernetes.Interface
	httpClient *http.Client // client's, for requests outside client-go's decoders
	conns      *connTracker
	warnings   []string // from the kubeconfig, for status
	// credentials are when the kubeconfig's credentials expire; never
	// modified after newCluster.
	credentials []CredentialExpiry
	// objectCap caps the objects the informers hold.
	objectCap  objectCap
	secrets    *secretController
	meta       metadata.Interface
	dynamic    dynamic.Interface               // ServiceExport status
	factory    informers.SharedInformerFactory // Nodes
	nodeInf    cache.SharedIndexInformer
	services   corelisters.ServiceLister // over every watch (scopedServices)
	nodes      corelisters.NodeLister
	system     informers.SharedInformerFactory // the system namespace alone (network)
	namespaces corelisters.NamespaceLister
	synced     []cache.InformerSynced
	views      *serviceController // Services and EndpointSlices → Sink

	// counts are the objects the member-wide informers hold (Nodes,
	// Secrets), by kind; each watch counts its own.
	counts kindCounts

	// exportMode says which Services are exported (--export-mode);
	// exportPoll how often a member without ServiceExports is asked again.
	exportMode ExportMode
	exportPoll time.Duration

	// ns are the namespaces watched (what the member's Secret says to
	// watch, WatchScope), with their informers.
	ns namespaceWatches

	cancel context.CancelFunc
	done   chan struct{}

	// observeMu orders state changes and their observation (transition).
	observeMu sync.Mutex
	// gatewaysMu makes refreshGateways one at a time, from reading its
	// inputs to storing what it made of them.
	gatewaysMu sync.Mutex

	mu sync.Mutex
	// observe is told about every state change, outside the lock.
	observe func(st Status, from State)
	// health is where the member's client stands: its state, its last
	// sync and error, what it published.
	health memberHealth
	// networking is what the member's Secret, Services and persisted view
	// say of its network and gateways.
	networking networkingState
	// gatewaysChanged, if set, is told when the member's network or
	// gateways changed (the registry hands every member the new set).
	gatewaysChanged func()
	// gatewayRefused, if set, is told each new reason a gateway was
	// refused (the registry records an Event on the remote Secret).
	gatewayRefused func(reason string)
	// gw writes the other networks' gateways into the member.
	gw gatewayWriter
}

// memberHealth is where a member's client stands; Cluster.mu guards it.
type memberHealth struct {
	state        State
	message      string
	lastSync     time.Time
	syncDuration time.Duration
	everSynced   bool
	// informersSynced is set once the informers have synced, before the
	// first publish (and before a new kubeconfig's client is promoted):
	// from then on the member may assert identities (IdentityScope).
	informersSynced bool
	lastErr         string
	endpoints       map[ServiceKey]int
	// persistedAt is when the view it serves until its first sync was
	// persisted (zero: it was not restored; see persist.go).
	persistedAt time.Time
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
	cfg := rest.CopyConfig(kc.Config)
	cfg.UserAgent = "hub/" + id
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	cfg.Timeout = 0 // watches are long; per-request timeouts come from contexts
	// A Dial of our own keeps client-go from sharing its cached transport
	// with other clients, and lets stop close this member's connections.
	// For members it also refuses addresses the policy denies (dialGuard).
	conns := newConnTracker(kc.guard)
	cfg.Dial = conns.DialContext
	c := &Cluster{}
	// Redirects are refused below the authentication wrappers, so that a
	// member cannot send the hub's credentials for it anywhere else.
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &observingTransport{next: &noRedirectTransport{next: rt}, c: c}
	})
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building HTTP client for cluster %s: %w", id, err)
	}
	httpClient.CheckRedirect = refuseRedirect
	// The typed client speaks protobuf, as Kubernetes' own controllers do:
	// its informers list and watch whole objects (mesh pods among them)
	// that the hub strips at once, and protobuf is several times cheaper
	// to send and decode than JSON.
	typed := rest.CopyConfig(cfg)
	typed.ContentType = runtime.ContentTypeProtobuf
	typed.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	client, err := kubernetes.NewForConfigAndClient(typed, httpClient)
	if err != nil {
		return nil, fmt.Errorf("building client for cluster %s: %w", id, err)
	}
	*c = Cluster{
		id: id, secret: secret, server: kc.Server, hash: kc.SHA256, warnings: kc.Warnings, credentials: kc.Credentials,
		httpClient: httpClient, objectCap: objectCap{max: kc.maxObjects},
		sink: deps.sink, timeout: deps.timeout, log: deps.log.With("cluster", id),
		client: client, conns: conns,
		factory:    informers.NewSharedInformerFactory(client, 0),
		done:       make(chan struct{}),
		health:     memberHealth{state: StatePending, endpoints: map[ServiceKey]int{}},
		exportMode: deps.exportMode,
		exportPoll: cmp.Or(deps.exportPoll, serviceExportPoll),

		gatewaysChanged: deps.gatewaysChanged,
		networking: networkingState{
			plaintext: map[ServiceKey]int{}, gatewayServices: map[ServiceKey]bool{}, gatewayNamespaces: []string{SystemNamespace},
		},
	}
	if c.meta, c.dynamic, err = untypedClients(cfg, httpClient); err != nil {
		return nil, fmt.Errorf("cluster %s: %w", id, err)
	}
	c.counts = newKindCounts("Node", "Secret")
	if err := c.watchSecrets(deps.secretEvents); err != nil {
		return nil, err
	}
	systemSynced, err := c.watchSystemNamespace()
	if err != nil {
		return nil, err
	}
	c.services = scopedServices{c}
	c.views = newServiceController(c)
	c.gw = gatewayWriter{
		api: client.CoreV1().Services(SystemNamespace), services: c.services, network: c.network,
		ready:    func() bool { return (deps.settled == nil || deps.settled()) && systemSynced() },
		isLeader: deps.isLeader, log: c.log, kick: make(chan struct{}, 1),
	}
	c.ns = namespaceWatches{newWatch: c.newNSWatch, retired: c.retire, replaced: c.views.enqueueWatch, log: c.log}
	if err := c.ns.watchScope(scope, client); err != nil {
		return nil, err
	}
	nodesSynced, err := c.watchNodes()
	if err != nil {
		return nil, err
	}
	c.synced = append(c.synced, nodesSynced, c.ns.synced)
	return c, nil
}

// untypedClients are the member's metadata client (the ServiceExport
// informers) and dynamic client (ServiceExport status), over its HTTP
// client.
func untypedClients(cfg *rest.Config, httpClient *http.Client) (metadata.Interface, dynamic.Interface, error) {
	mc, err := metadata.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, nil, fmt.Errorf("building metadata client: %w", err)
	}
	dc, err := dynamic.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, nil, fmt.Errorf("building dynamic client: %w", err)
	}
	return mc, dc, nil
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
	if c.secrets, err = newSecretController(c.client, onSecret); err != nil {
		return err
	}
	// The secret controller's informer has its handler; this one counts.
	if _, err := c.secrets.inf.AddEventHandler(c.counting(c.counts, "Secret", cache.ResourceEventHandlerFuncs{})); err != nil {
		return fmt.Errorf("adding object counter: %w", err)
	}
	return nil
}

// watchSystemNamespace builds the informer of the member's Istio network,
// from its system namespace alone (a field selector: RBAC can grant
// exactly that namespace). It does not hold up the sync: until it is
// listed, or when it may not be read, the member has no network.
func (c *Cluster) watchSystemNamespace() (cache.InformerSynced, error) {
	c.system = informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "metadata.name=" + SystemNamespace
	}))
	nsInf := c.system.Core().V1().Namespaces()
	c.namespaces = nsInf.Lister()
	if _, err := nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.refreshGateways(true) },
		UpdateFunc: func(old, cur any) { c.networkChanged(old, cur) },
		DeleteFunc: func(any) { c.refreshGateways(true) },
	}); err != nil {
		return nil, fmt.Errorf("adding event handler: %w", err)
	}
	return nsInf.Informer().HasSynced, nil
}

// watchNodes builds the member's Node informer: a node port gateway's
// address may move with its nodes, and endpoints take their locality from
// them.
func (c *Cluster) watchNodes() (cache.InformerSynced, error) {
	nodeInf := c.factory.Core().V1().Nodes()
	c.nodeInf, c.nodes = nodeInf.Informer(), nodeInf.Lister()
	if err := c.nodeInf.SetTransform(stripObject); err != nil {
		return nil, fmt.Errorf("setting informer transform: %w", err)
	}
	onNode := func(any) {
		if !c.refreshGateways(false) { // a node port gateway's address may have moved
			c.views.enqueueAll()
		}
	}
	reg, err := c.nodeInf.AddEventHandler(c.counting(c.counts, "Node", cache.ResourceEventHandlerFuncs{
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
	return c.hash == kc.SHA256 && c.ns.scope.equal(scope)
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
	c.factory.Shutdown()
	c.system.Shutdown()
	c.ns.stop()
	c.secrets.factory.Shutdown()
	c.conns.closeAll()
}

func (c *Cluster) run(ctx context.Context) {
	defer close(c.done)
	c.factory.Start(ctx.Done())
	c.system.Start(ctx.Done())
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
	wg.Go(func() { c.probeHealth(ctx) })
	c.transition(func() {
		c.health.state, c.health.message = StateSyncing, "waiting for Services, EndpointSlices and Nodes to sync"
	})
	started := time.Now()
	if !c.waitForSync(ctx, &wg) {
		return
	}
	ready := func() {
		took := time.Since(started)
		c.transition(func() {
			if c.health.state != StateInvalid {
				c.health.state, c.health.message, c.health.lastSync, c.health.syncDuration, c.health.everSynced = StateReady, "", time.Now(), took, true
			}
		})
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
	c.mu.Lock()
	notify := c.gatewaysChanged
	c.mu.Unlock()
	if notify != nil {
		notify() // its gateways count for the others from now on (exportedGateways)
	}
	wg.Go(func() { c.gw.run(ctx) })
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
// EndpointSlices and Nodes (the member is TimedOut after c.timeout, and
// still waited for; false: stopped first), then, a little, the optional
// ones. The ServiceExport watch, if the member serves them, starts in wg.
func (c *Cluster) waitForSync(ctx context.Context, wg *sync.WaitGroup) bool {
	timer := time.AfterFunc(c.timeout, c.syncTimedOut)
	defer timer.Stop()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return false
	}
	timer.Stop()
	// The mesh pods are optional (the member's credentials may not list
	// pods): wait for them a little, so that the first view already marks
	// the mTLS endpoints, but never hold the member up for them.
	meshCtx, cancelMesh := context.WithTimeout(ctx, meshPodsSyncWait)
	exportsServed := c.exportMode == ExportServiceExport && c.watchServiceExportsWhenServed(ctx, meshCtx, wg)
	for _, w := range c.ns.list() {
		cache.WaitForCacheSync(meshCtx.Done(), w.optionalSynced(exportsServed)...)
	}
	cancelMesh()
	c.mu.Lock()
	c.health.informersSynced = true
	c.mu.Unlock()
	return true
}

// Health probing: informers only notice an API server that stopped
// answering; one whose storage (etcd) hangs keeps its watches open and
// silent. Every healthProbeInterval the member's /readyz (which includes its
// etcd check, and which every authenticated client may read) is asked.
const (
	healthProbeInterval = 10 * time.Second
	healthProbeTimeout  = 5 * time.Second
)

// probeHealth reports a failing or hanging /readyz as a failed request
// (Stale, keeping the member's data) until ctx ends; a passing one goes
// through the observing transport like any other success.
func (c *Cluster) probeHealth(ctx context.Context) {
	ticker := time.NewTicker(healthProbeInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		pctx, cancel := context.WithTimeout(ctx, healthProbeTimeout)
		err := c.readyz(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			c.requestFailed(fmt.Errorf("health check GET /readyz failed: %w", err))
		}
	}
}

// maxReadyzBody bounds what the hub reads of a member's /readyz answer.
const maxReadyzBody = 64 << 10

// readyz asks the member's /readyz through the member's HTTP client (its
// credentials, dial guard and redirect refusal) and reads at most
// maxReadyzBody bytes of the answer. A failing answer is reported by the
// checks it lists (e.g. "etcd"), or by its status when it lists none.
func (c *Cluster) readyz(ctx context.Context) error {
	u := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").URL()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := c.httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReadyzBody+1))
	switch {
	case err != nil:
		return fmt.Errorf("%s: reading the answer: %w", resp.Status, err)
	case len(body) > maxReadyzBody:
		return fmt.Errorf("%s: the answer is larger than %d bytes", resp.Status, maxReadyzBody)
	case resp.StatusCode != http.StatusOK:
		if checks := failedChecks(string(body)); len(checks) > 0 {
			return fmt.Errorf("failing checks: %s", strings.Join(checks, ", "))
		}
		return errors.New(resp.Status)
	}
	return nil
}

// failedCheck matches a failing check in kube-apiserver's /readyz body.
var failedCheck = regexp.MustCompile(`\[-\]([a-zA-Z0-9/_.-]{1,100}) failed`)

// failedChecks names the checks a /readyz body lists as failed (at most 20).
func failedChecks(body string) []string {
	var checks []string
	for _, m := range failedCheck.FindAllStringSubmatch(body, 20) {
		checks = append(checks, m[1])
	}
	return checks
}

// transition applies a change to the cluster's state under its lock and
// tells the observer if the state changed.
func (c *Cluster) transition(change func()) {
	// One change at a time through to the observer, so that the last state
	// it is told is the cluster's (the index demotes members by it).
	c.observeMu.Lock()
	defer c.observeMu.Unlock()
	c.mu.Lock()
	from, _ := c.shownLocked()
	change()
	to, _ := c.shownLocked()
	observe := c.observe
	c.mu.Unlock()
	if from != to && observe != nil {
		observe(c.status(), from)
	}
}

// setObserver replaces the state-change hook.
func (c *Cluster) setObserver(fn func(Status, State)) {
	c.mu.Lock()
	c.observe = fn
	c.mu.Unlock()
}

func (c *Cluster) syncTimedOut() {
	c.transition(func() {
		if c.health.state == StateSyncing || c.health.state == StateUnreachable {
			c.health.state, c.health.message = StateTimedOut, c.timedOutMessage()
		}
	})
}

func (c *Cluster) timedOutMessage() string {
	msg := fmt.Sprintf("not synced within %s; still trying (no longer blocks readiness)", c.timeout)
	if c.health.lastErr != "" {
		msg += ": cannot list or watch: " + c.health.lastErr
	}
	return msg
}

// requestFailed is called when a request to the member's API server fails.
// A member that was synced goes Stale and keeps serving what it had; one
// that never synced is Unreachable. The next successful request brings it
// back.
func (c *Cluster) requestFailed(err error) {
	c.transition(func() {
		c.health.lastErr = err.Error()
		switch c.health.state {
		case StateReady, StateStale:
			c.health.state = StateStale
			c.health.message = "API server unreachable or watch failing; serving the last known endpoints: " + c.health.lastErr
		case StatePending, StateSyncing, StateUnreachable:
			c.health.state = StateUnreachable
			c.health.message = "cannot list or watch: " + c.health.lastErr
		case StateTimedOut:
			c.health.message = c.timedOutMessage()
		}
	})
}

// observingTransport reports the outcome of every request a member's client
// makes, so that the state follows what the informers actually experience:
// client-go's reflectors retry refused connections forever without calling
// their watch error handler, so that handler alone never sees an outage.
type observingTransport struct {
	next http.RoundTripper
	c    *Cluster
}

func (t *observingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	switch {
	case strings.HasSuffix(req.URL.Path, "/secrets"), strings.HasSuffix(req.URL.Path, "/pods"), req.Context().Value(optionalKey{}) != nil:
		// The secret controller, the mesh-pod lookup and the gateway
		// Services written into the member are optional (its credentials
		// may not read Secrets or pods, nor write Services); their failures
		// do not make the member Stale.
	case req.Context().Err() != nil:
		// Cancelled by us (stopping, or a watch ending): says nothing about the server.
	case err != nil:
		t.c.requestFailed(fmt.Errorf("%s %s: %w", req.Method, req.URL.Host, err))
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		t.c.requestFailed(fmt.Errorf("%s %s%s: %s", req.Method, req.URL.Host, req.URL.Path, resp.Status))
	case resp.StatusCode < 300:
		t.c.requestSucceeded()
	}
	return resp, err
}

func (t *observingTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// noRedirectTransport turns a redirect from a member's API server into an
// error: client-go's http.Client would follow it, and the authentication
// wrappers above this transport would add the member's credentials to the
// request sent to wherever the redirect points.
type noRedirectTransport struct{ next http.RoundTripper }

func (t *noRedirectTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode < 300 || resp.StatusCode > 399 || resp.StatusCode == http.StatusNotModified {
		return resp, err
	}
	resp.Body.Close()
	where := "elsewhere"
	if loc, err := url.Parse(resp.Header.Get("Location")); err == nil && loc.Host != "" {
		where = qn(loc.Host)
	}
	return nil, fmt.Errorf("member API server answered %s, a redirect to %s; redirects are not followed", resp.Status, where)
}

func (t *noRedirectTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// refuseRedirect is the member http.Client's CheckRedirect; the transport
// already refuses redirects, this keeps a changed transport from following.
func refuseRedirect(*http.Request, []*http.Request) error {
	return errors.New("redirects from member API servers are not followed")
}

// requestSucceeded brings a Stale member back to Ready (and an Unreachable
// one back to Syncing) once its API server answers again.
func (c *Cluster) requestSucceeded() {
	c.mu.Lock()
	healthy := c.health.state != StateStale && c.health.state != StateUnreachable
	c.mu.Unlock()
	if healthy {
		return
	}
	c.transition(func() {
		switch c.health.state {
		case StateStale:
			c.health.state, c.health.message, c.health.lastErr = StateReady, "", ""
		case StateUnreachable:
			c.health.state, c.health.message = StateSyncing, "API server reachable again; waiting for informers to sync"
		}
	})
}

// SystemNamespace is the namespace whose topology.istio.io/network label
// names a member's Istio network, as istiod reads it.
const SystemNamespace = "istio-system"

// LabelNetwork is the label of a member's system namespace naming its
// Istio network.
const LabelNetwork = "topology.istio.io/network"

// network is the member's Istio network, "" until its system namespace is
// listed or when it has no label.
func (c *Cluster) network() string {
	ns, err := c.namespaces.Get(SystemNamespace)
	if err != nil {
		return ""
	}
	return ns.Labels[LabelNetwork]
}

// networkChanged rebuilds every Service when the system namespace's
// network label changed (its other updates change nothing here).
func (c *Cluster) networkChanged(old, cur any) {
	o, ok1 := old.(*corev1.Namespace)
	n, ok2 := cur.(*corev1.Namespace)
	if !ok1 || !ok2 || o.Labels[LabelNetwork] != n.Labels[LabelNetwork] {
		c.refreshGateways(true)
	}
}

// status reports the cluster's current status.
func (c *Cluster) status() Status {
	st := c.statusLocked()
	st.WatchedNamespaces, st.WatchRefused = c.ns.namespaces()
	st.Objects = c.objectCounts()
	return st
}

func (c *Cluster) statusLocked() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{
		ID: c.id, Secret: c.secret, Server: c.server,
		Services: len(c.health.endpoints), LastSyncTime: c.health.lastSync, SyncDuration: c.health.syncDuration,
		Warnings: slices.Clone(c.warnings), Credentials: slices.Clone(c.credentials),
	}
	if c.hash != ([32]byte{}) {
		st.KubeconfigSHA256 = hex.EncodeToString(c.hash[:])
	}
	st.State, st.Message = c.shownLocked()
	for _, n := range c.health.endpoints {
		st.Endpoints += n
	}
	st.Network = c.network()
	st.CrossNetworkWithheld = c.crossNetworkWithheldLocked(st.Network, st.Endpoints)
	st.ProxylessWithheld = c.proxylessWithheldLocked(st.Network, st.Endpoints, st.CrossNetworkWithheld)
	st.Gateways = slices.Clone(c.networking.gateways.gateways)
	st.GatewaysRefused, st.GatewaysRefusedCount = slices.Clone(c.networking.gateways.refused), c.networking.gateways.refusedCount
	st.GatewayServices, st.GatewayServicesError = c.gw.status()
	st.WatchScope = c.ns.scope
	return st
}

// objectCounts reports how many objects the member's informers hold, by
// kind, over every watched namespace.
func (c *Cluster) objectCounts() map[string]int {
	out := map[string]int{}
	for kind, n := range c.counts {
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
