package clusters

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// Member istiods learn other networks' gateways from the hub (docs/architecture.md
// §3.9). istiod takes no gateway from ServiceEntries (its ServiceEntry
// registry has none), but it takes one from any Service of its own cluster
// labelled topology.istio.io/network that listens on 15443 (or
// networking.istio.io/gatewayPort) and has externalIPs. So the hub writes,
// into istio-system of every member that is on a network, one such Service
// per other network and gateway port: headless (kube-proxy ignores it, so
// the externalIPs are never captured on the member's nodes), without a
// selector or endpoints, labelled app.kubernetes.io/managed-by=hub. An
// unmodified istiod then sends its sidecars' traffic for another network's
// federated endpoints (the ServiceEntries' endpoints carry their network
// and tlsMode) to that network's gateway, as for its own remote clusters.
// The member's credentials need create, update and delete on Services in
// istio-system (deploy/remote-member-rbac.yaml); without them the status
// says so and nothing else changes.

// gatewayServicePrefix starts the name of every Service the hub writes.
const gatewayServicePrefix = "hub-gateway-"

// LabelManagedBy (value ManagedByHub) marks the objects the hub writes
// into members.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByHub   = "hub"
)

// gatewaySettleRetry is how soon the writer looks again while membership
// has not settled.
const gatewaySettleRetry = 2 * time.Second

// gatewayResync is how often a member's written Services are checked
// again even when nothing changed (someone may have edited or deleted
// them; leadership may have moved), and how long a failed write waits.
const gatewayResync = time.Minute

// isHubGatewayService reports whether svc is one the hub wrote: it is no
// gateway of the member's own and no service of the member's to federate.
func isHubGatewayService(svc *corev1.Service) bool {
	return svc.Namespace == SystemNamespace && svc.Labels[LabelManagedBy] == ManagedByHub && strings.HasPrefix(svc.Name, gatewayServicePrefix)
}

// gatewayServiceName names the Service of a network's gateways on a port:
// hub-gateway-<network>-<port>, or a hash of the network when that is not
// a valid Service name.
func gatewayServiceName(network string, port int32) string {
	name := gatewayServicePrefix + network + "-" + strconv.Itoa(int(port))
	if len(k8svalidation.IsDNS1035Label(name)) == 0 && !strings.HasPrefix(network, "h-") {
		return name
	}
	// A name of its own kind ("h-", which no literal name above starts
	// with), so that no network can take another's.
	sum := sha256.Sum256([]byte(network))
	return gatewayServicePrefix + "h-" + hex.EncodeToString(sum[:16]) + "-" + strconv.Itoa(int(port))
}

// peerGateways are every network's gateways as the members export them.
// complete is false while some member's are not known yet (it has not
// synced and has no persisted view): its network is unknown too, so no
// written Service may be deleted on the strength of this set.
type peerGateways struct {
	networks map[string][]Gateway
	complete bool
}

// desiredGatewayServices are the Services a member on network own gets:
// for every other network, one per gateway port, with that network's
// gateway addresses (sorted, at most maxGateways).
func desiredGatewayServices(own string, peers map[string][]Gateway) map[string]*corev1.Service {
	out := map[string]*corev1.Service{}
	if own == "" {
		return out
	}
	for network, gws := range peers {
		if network == own || network == "" {
			continue
		}
		byPort := map[int32][]string{}
		for _, g := range gws {
			if !slices.Contains(byPort[g.Port], g.Address) {
				byPort[g.Port] = append(byPort[g.Port], g.Address)
			}
		}
		for port, ips := range byPort {
			slices.Sort(ips)
			if len(ips) > maxGateways {
				ips = ips[:maxGateways]
			}
			name := gatewayServiceName(network, port)
			lbls := map[string]string{LabelNetwork: network, LabelManagedBy: ManagedByHub}
			if port != DefaultGatewayPort {
				lbls[LabelGatewayPort] = strconv.Itoa(int(port))
			}
			out[name] = &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: name, Labels: lbls},
				Spec: corev1.ServiceSpec{
					ClusterIP:   corev1.ClusterIPNone,
					ExternalIPs: ips,
					Ports:       []corev1.ServicePort{{Name: "tls", Port: port, Protocol: corev1.ProtocolTCP}},
				},
			}
		}
	}
	return out
}

// sameGatewayService reports whether a written Service says what want
// says (labels others added are theirs to keep).
func sameGatewayService(have, want *corev1.Service) bool {
	for k, v := range want.Labels {
		if have.Labels[k] != v {
			return false
		}
	}
	_, port := have.Labels[LabelGatewayPort]
	_, wantPort := want.Labels[LabelGatewayPort]
	return port == wantPort && slices.Equal(have.Spec.ExternalIPs, want.Spec.ExternalIPs) &&
		len(have.Spec.Ports) == 1 && have.Spec.Ports[0].Port == want.Spec.Ports[0].Port
}

// gatewayWriter keeps a member's hub-gateway-* Services as
// desiredGatewayServices says (see above): run is its one goroutine, woken
// when the other networks' gateways or the member's own network change,
// and every gatewayResync. It is part of its member's networkController,
// whose status shows what it wrote; its lock is taken after the
// controller's, never before.
type gatewayWriter struct {
	api      typedcorev1.ServiceInterface // the member's Services in SystemNamespace
	services corelisters.ServiceLister    // as the member's informers hold them
	network  func() string                // the member's own ("" until known)
	// ready says whether the member's own network and every network's
	// gateways are known (membership settled): until then it writes
	// nothing.
	ready    func() bool
	isLeader func() bool // nil: this replica writes
	log      *slog.Logger
	kick     chan struct{}

	mu      sync.Mutex
	peers   peerGateways
	written []string // the Services it last found or made as wanted
	err     string   // its last round's error
}

// setPeers hands the writer every network's gateways.
func (w *gatewayWriter) setPeers(peers peerGateways) {
	w.mu.Lock()
	w.peers = peers
	w.mu.Unlock()
	w.wake()
}

// peersOf returns the gateways of the other members of network.
func (w *gatewayWriter) peersOf(network string) []Gateway {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peers.networks[network]
}

// wake makes the writer look again soon.
func (w *gatewayWriter) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// status is what the writer wrote and its last error.
func (w *gatewayWriter) status() (written []string, err string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.written), w.err
}

// inGatewayNamespaces keeps the gateways whose Service is in one of
// namespaces (sorted), and those the remote Secret names: a view persisted
// before the namespaces were narrowed may hold a tenant's.
func inGatewayNamespaces(gws []Gateway, namespaces []string) []Gateway {
	var out []Gateway
	for _, g := range gws {
		if ref, ok := strings.CutPrefix(g.Source, "service "); ok {
			ns, _, _ := strings.Cut(ref, "/")
			if _, allowed := slices.BinarySearch(namespaces, ns); !allowed {
				continue
			}
		}
		out = append(out, g)
	}
	return out
}

// run keeps the member's hub-gateway-* Services as desiredGatewayServices
// says, whenever it is woken and every gatewayResync, until ctx ends. Only
// the leader writes.
func (w *gatewayWriter) run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-t.C:
		}
		if !w.ready() {
			t.Reset(gatewaySettleRetry) // some networks' gateways, or its own network, are not known yet
			continue
		}
		if w.isLeader == nil || w.isLeader() {
			err := w.reconcile(ctx)
			w.mu.Lock()
			w.err = ""
			if err != nil {
				w.err = err.Error()
			}
			w.mu.Unlock()
			if err != nil && ctx.Err() == nil {
				w.log.Warn("writing gateway Services into the member", "error", err)
			}
		}
		t.Reset(gatewayResync)
	}
}

// reconcile creates, updates and deletes the member's
// hub-gateway-* Services. Its requests are optional for the member's
// state (optionalRequest): a member whose credentials may not write them
// stays Ready.
func (w *gatewayWriter) reconcile(ctx context.Context) error {
	ctx = optionalRequest(ctx)
	w.mu.Lock()
	peers := w.peers
	w.mu.Unlock()
	want := desiredGatewayServices(w.network(), peers.networks)
	existing, _ := w.services.Services(SystemNamespace).List(labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByHub}))
	api := w.api
	var errs []error
	var written []string
	for _, have := range existing {
		if !isHubGatewayService(have) {
			continue
		}
		w, ok := want[have.Name]
		switch {
		case !ok && !peers.complete:
			written = append(written, have.Name) // some member's network is not known yet: kept
		case !ok:
			if err := api.Delete(ctx, have.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting %s/%s: %w", SystemNamespace, have.Name, err))
			}
		case !sameGatewayService(have, w):
			cur, err := api.Get(ctx, have.Name, metav1.GetOptions{})
			if err == nil {
				if cur.Labels == nil {
					cur.Labels = map[string]string{}
				}
				delete(cur.Labels, LabelGatewayPort)
				maps.Copy(cur.Labels, w.Labels)
				cur.Spec.ExternalIPs, cur.Spec.Ports = w.Spec.ExternalIPs, w.Spec.Ports
				_, err = api.Update(ctx, cur, metav1.UpdateOptions{FieldManager: "hub"})
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("updating %s/%s: %w", SystemNamespace, have.Name, err))
				continue
			}
			written = append(written, have.Name)
		default:
			written = append(written, have.Name)
		}
		delete(want, have.Name)
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, err := api.Create(ctx, want[name], metav1.CreateOptions{FieldManager: "hub"}); err != nil {
			if apierrors.IsAlreadyExists(err) && w.hubOwns(name) {
				// Ours, written by an earlier round and not in the cache
				// yet: it is there (the status says so); the next round
				// checks its content.
				written = append(written, name)
				continue
			}
			errs = append(errs, fmt.Errorf("creating %s/%s: %w", SystemNamespace, name, err))
			continue
		}
		written = append(written, name)
	}
	slices.Sort(written)
	w.mu.Lock()
	w.written = written
	w.mu.Unlock()
	return errors.Join(errs...)
}

// optionalKey marks a request context as optional for the member's state.
type optionalKey struct{}

// optionalRequest marks ctx's requests as ones whose failure says nothing
// about the member's health (see observingTransport): writes the member's
// credentials may well not be allowed to make.
func optionalRequest(ctx context.Context) context.Context {
	return context.WithValue(ctx, optionalKey{}, true)
}

// hubOwns reports whether the member's Service istio-system/name, as the
// cache has it, is one the hub wrote; true when it is not cached yet (the
// next round decides).
func (w *gatewayWriter) hubOwns(name string) bool {
	svc, err := w.services.Services(SystemNamespace).Get(name)
	return err != nil || isHubGatewayService(svc)
}
