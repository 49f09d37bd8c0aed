package clusters

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// networkController follows a member's Istio network and east-west
// gateways — from what its remote Secret says (setSecretNetworking), its
// system namespace's network label, its gateway Services and its nodes —
// and writes the other networks' gateways into the member (gw). When the
// member's network or gateways change it has every Service view rebuilt
// and tells the registry, which hands every member the new set.
type networkController struct {
	id   string
	home bool // the home cluster: its network needs no confirmation
	log  *slog.Logger
	// system is the informer of the member's system namespace alone (a
	// field selector: RBAC can grant exactly that namespace).
	system     informers.SharedInformerFactory
	namespaces corelisters.NamespaceLister
	services   corelisters.ServiceLister // over every watch
	nodes      corelisters.NodeLister
	// rebuild has every Service view of the member built again.
	rebuild func()
	// changed, if set, is told when the member's network or gateways
	// changed (the registry hands every member the new set).
	changed func()
	// refused, if set, is told each new reason a gateway was refused (the
	// registry records an Event on the remote Secret). Set before start.
	refused func(reason string)
	// gw writes the other networks' gateways into the member.
	gw gatewayWriter

	// refreshMu makes refresh one at a time, from reading its inputs to
	// storing what it made of them.
	refreshMu sync.Mutex
	mu        sync.Mutex
	networkingState
}

// networkingState is what a member's Secret, Services and persisted view
// say of its network and gateways; networkController.mu guards it.
type networkingState struct {
	// annotated and annotatedErr are the gateways the remote Secret names
	// (AnnotationGateways) and why it was refused; gateways is what
	// discoverGateways made of them and the member's gateway Services
	// (shared by every Service view: never modified, only replaced), and
	// gatewayServices the labelled Services it looked at.
	annotated    []Gateway
	annotatedErr []error
	confirmed    string // the network the Secret confirms (AnnotationNetwork)
	// gatewayNamespaces are where gateway Services may live
	// (AnnotationGatewayNamespaces and SystemNamespace), sorted.
	gatewayNamespaces []string
	gateways          gatewayView
	gatewayServices   map[ServiceKey]bool
	// restoredNetwork and restoredGateways are the network and gateways
	// of the persisted view the member serves until its system namespace
	// is listed (exportedGateways).
	restoredNetwork  string
	restoredGateways []Gateway
}

// networkInputs are what a networkController reads, and whom it tells.
type networkInputs struct {
	services corelisters.ServiceLister // the member's, over every watch
	nodes    corelisters.NodeLister
	// rebuild has every Service view of the member built again; changed
	// (may be nil) is told when its network or gateways changed.
	rebuild, changed func()
	// settled says whether membership has settled (nil: it has); isLeader
	// whether this replica writes into members (nil: it does). See
	// clusterDeps.
	settled, isLeader func() bool
}

// newNetworkController builds the informer of the member's system
// namespace and the writer of its peers' gateways. The namespace does not
// hold up the member's sync: until it is listed, or when it may not be
// read, the member has no network.
func newNetworkController(id string, home bool, client kubernetes.Interface, in networkInputs, log *slog.Logger) (*networkController, error) {
	n := &networkController{
		id: id, home: home, log: log,
		services: in.services, nodes: in.nodes, rebuild: in.rebuild, changed: in.changed,
		networkingState: networkingState{gatewayServices: map[ServiceKey]bool{}, gatewayNamespaces: []string{SystemNamespace}},
	}
	n.system = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "metadata.name=" + SystemNamespace
	}))
	nsInf := n.system.Core().V1().Namespaces()
	n.namespaces = nsInf.Lister()
	if _, err := nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.refresh(true) },
		UpdateFunc: n.networkChanged,
		DeleteFunc: func(any) { n.refresh(true) },
	}); err != nil {
		return nil, fmt.Errorf("adding event handler: %w", err)
	}
	systemSynced := nsInf.Informer().HasSynced
	n.gw = gatewayWriter{
		api: client.CoreV1().Services(SystemNamespace), services: in.services, network: n.network,
		ready:    func() bool { return (in.settled == nil || in.settled()) && systemSynced() },
		isLeader: in.isLeader, log: log, kick: make(chan struct{}, 1),
	}
	return n, nil
}

// SystemNamespace is the namespace whose topology.istio.io/network label
// names a member's Istio network, as istiod reads it.
const SystemNamespace = "istio-system"

// LabelNetwork is the label of a member's system namespace naming its
// Istio network.
const LabelNetwork = "topology.istio.io/network"

// network is the member's Istio network, "" until its system namespace is
// listed or when it has no label.
func (n *networkController) network() string {
	ns, err := n.namespaces.Get(SystemNamespace)
	if err != nil {
		return ""
	}
	return ns.Labels[LabelNetwork]
}

// networkChanged rebuilds every Service when the system namespace's
// network label changed (its other updates change nothing here).
func (n *networkController) networkChanged(old, cur any) {
	o, ok1 := old.(*corev1.Namespace)
	c, ok2 := cur.(*corev1.Namespace)
	if !ok1 || !ok2 || o.Labels[LabelNetwork] != c.Labels[LabelNetwork] {
		n.refresh(true)
	}
}

// setSecretNetworking records what the member's remote Secret says of its
// network: the gateways it names and the network it confirms, and works out
// the member's gateways again if they changed. The registry calls it before
// the member starts and whenever it reads the Secret.
func (n *networkController) setSecretNetworking(s secretNetworking) {
	gws, err := parseGatewayAnnotation(s.gateways)
	for i := range gws {
		gws[i].Proxyless = s.proxylessALPN == "true"
	}
	nss, nsErr := parseGatewayNamespaces(s.gatewayNamespaces)
	var errs []error
	for _, e := range []error{err, nsErr} {
		if e != nil {
			errs = append(errs, e)
		}
	}
	nw := confirmedNetwork(s.network, n.id)
	n.mu.Lock()
	same := slices.Equal(n.annotated, gws) && fmt.Sprint(n.annotatedErr) == fmt.Sprint(errs) && n.confirmed == nw && slices.Equal(n.gatewayNamespaces, nss)
	n.annotated, n.annotatedErr, n.confirmed, n.gatewayNamespaces = gws, errs, nw, nss
	n.mu.Unlock()
	if !same {
		n.refresh(false)
	}
}

// gatewayServiceChanged notes a Service event: a Service that is or was
// labelled with a network is (re)considered as a gateway.
func (n *networkController) gatewayServiceChanged(key ServiceKey, obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	labelled := false
	if svc, ok := obj.(*corev1.Service); ok && svc != nil && !isHubGatewayService(svc) {
		_, labelled = svc.Labels[LabelNetwork]
	}
	n.mu.Lock()
	was := n.gatewayServices[key]
	if labelled {
		n.gatewayServices[key] = true
	}
	n.mu.Unlock()
	if labelled || was {
		n.refresh(false)
	}
}

// refresh works out the member's gateways again from its Secret, gateway
// Services and nodes. When they changed, or when rebuild is set (the
// network changed), every Service view is rebuilt; it reports whether that
// happened.
func (n *networkController) refresh(rebuild bool) bool {
	n.refreshMu.Lock()
	defer n.refreshMu.Unlock()
	n.mu.Lock()
	keys := make([]ServiceKey, 0, len(n.gatewayServices))
	for k := range n.gatewayServices {
		keys = append(keys, k)
	}
	in := gatewaySources{namespaces: n.gatewayNamespaces, annotated: n.annotated, annotErr: n.annotatedErr}
	confirmed := n.confirmed
	n.mu.Unlock()
	var gone []ServiceKey
	in.services, gone = n.gatewayServicesOf(keys)
	if slices.ContainsFunc(in.services, func(s *corev1.Service) bool { return s.Spec.Type == corev1.ServiceTypeNodePort }) {
		in.nodes, _ = n.nodes.List(labels.Everything())
		slices.SortFunc(in.nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	}
	in.network = n.network()
	in.confirmed = n.home || confirmed == in.network
	view := discoverGateways(in)
	n.mu.Lock()
	for _, k := range gone {
		delete(n.gatewayServices, k)
	}
	changed := !slices.Equal(n.gateways.gateways, view.gateways) || n.gateways.network != view.network
	if changed {
		n.gateways.gateways, n.gateways.network = view.gateways, view.network
	}
	newlyRefused := slices.DeleteFunc(slices.Clone(view.refused), func(r string) bool { return slices.Contains(n.gateways.refused, r) })
	n.gateways.refused, n.gateways.refusedCount = view.refused, view.refusedCount
	n.mu.Unlock()
	for _, r := range newlyRefused {
		if strings.HasPrefix(r, "… ") { // the count of the rest
			continue
		}
		n.log.Warn("gateway refused", "cluster", n.id, "reason", r)
		if n.refused != nil {
			n.refused(r)
		}
	}
	if !changed && !rebuild {
		return false
	}
	n.rebuild()
	if n.changed != nil {
		n.changed()
	}
	n.gw.wake() // the member's own network may have changed: its Services follow
	return true
}

// gatewayServicesOf reads the Services of keys that are still labelled
// gateways, and the keys that are not (gone).
func (n *networkController) gatewayServicesOf(keys []ServiceKey) (svcs []*corev1.Service, gone []ServiceKey) {
	for _, k := range keys {
		svc, err := n.services.Services(k.Namespace).Get(k.Name)
		if err != nil {
			gone = append(gone, k)
			continue
		}
		if _, labelled := svc.Labels[LabelNetwork]; !labelled || isHubGatewayService(svc) {
			gone = append(gone, k)
			continue
		}
		svcs = append(svcs, svc)
	}
	return svcs, gone
}

// gatewaysOf are the member's gateways for a Service view on network (nil
// when they are for another: a refresh for the new network is under way).
func (n *networkController) gatewaysOf(network string) []Gateway {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gateways.network == network {
		return n.gateways.gateways
	}
	return nil
}

// exportedGateways is the member's network and gateways as the other
// members' istiods should know them: live once its informers synced, else
// as its persisted view had them if the Secret confirms that view's
// network; known is false when it has neither.
func (n *networkController) exportedGateways(informersSynced, servingPersisted bool) (network string, gateways []Gateway, known bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case informersSynced: // its gateway Services and system namespace are listed too
		return n.gateways.network, n.gateways.gateways, true
	case servingPersisted && (n.home || n.confirmed == n.restoredNetwork):
		return n.restoredNetwork, inGatewayNamespaces(n.restoredGateways, n.gatewayNamespaces), true
	case servingPersisted:
		return n.restoredNetwork, nil, true
	}
	return "", nil, false
}

// confirmedGateways returns a persisted view's services as the member may
// serve them now: without gateways unless its remote Secret confirms the
// view's network (the home cluster's is its own). A view persisted before
// the Secret's confirmation changed cannot bring back gateways it no
// longer allows.
func (n *networkController) confirmedGateways(services []*Service) []*Service {
	n.mu.Lock()
	confirmed := n.confirmed
	n.mu.Unlock()
	out := services
	for i, s := range services {
		if len(s.Gateways) == 0 || n.home || confirmed == s.Network {
			continue
		}
		if &out[0] == &services[0] {
			out = slices.Clone(services)
		}
		stripped := *s
		stripped.Gateways = nil
		out[i] = &stripped
	}
	return out
}

// servePersisted records the network and gateways of the persisted view the
// member serves until it syncs (their gateways already those the Secret
// confirms: confirmedGateways).
func (n *networkController) servePersisted(services []*Service) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range services {
		if s.Network != "" {
			n.restoredNetwork = s.Network
		}
		if len(s.Gateways) > 0 {
			n.restoredGateways = s.Gateways
		}
	}
}

// status fills in what a member's status says of its network, given the
// endpoints it published.
func (n *networkController) status(st *Status, published endpointCounts) {
	st.Network = n.network()
	st.GatewayServices, st.GatewayServicesError = n.gw.status()
	n.mu.Lock()
	defer n.mu.Unlock()
	st.CrossNetworkWithheld = n.crossNetworkWithheldLocked(st.Network, published)
	st.ProxylessWithheld = n.proxylessWithheldLocked(st.Network, published.all, st.CrossNetworkWithheld)
	st.Gateways = slices.Clone(n.gateways.gateways)
	st.GatewaysRefused, st.GatewaysRefusedCount = slices.Clone(n.gateways.refused), n.gateways.refusedCount
}

// proxylessWithheldLocked counts the member's endpoints that proxyless gRPC
// clients on other networks do not get (Status.ProxylessWithheld): those
// other proxies do not get, or all of them when its network has gateways
// but none admits proxyless gRPC (AnnotationProxylessALPN). n.mu must be
// held.
func (n *networkController) proxylessWithheldLocked(network string, endpoints, withheld int) int {
	if network == "" || withheld == endpoints {
		return withheld
	}
	for _, gws := range [][]Gateway{n.gateways.gateways, n.gw.peersOf(network)} {
		if slices.ContainsFunc(gws, func(g Gateway) bool { return g.Proxyless }) {
			return withheld
		}
	}
	return endpoints
}

// crossNetworkWithheldLocked counts the member's endpoints that proxies on
// other networks do not get (Status.CrossNetworkWithheld): none without a
// network; all of them when neither the member nor another member of its
// network has a gateway (the hub's xDS reaches a member through any
// gateway of its network); else those that do not accept Istio mTLS.
// n.mu must be held.
func (n *networkController) crossNetworkWithheldLocked(network string, published endpointCounts) int {
	switch {
	case network == "":
		return 0
	case len(n.gateways.gateways) == 0 && len(n.gw.peersOf(network)) == 0:
		return published.all
	}
	return published.plaintext
}
