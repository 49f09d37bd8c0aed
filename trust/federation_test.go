package trust

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/wait"
)

// homeNamespace returns a client of the test API server and a fresh namespace.
func homeNamespace(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	e := localcluster.Require(t, env)
	cs, err := kubernetes.NewForConfig(e.Cluster("home").RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ns := "trust-" + rand.String(6)
	if err := localcluster.EnsureNamespace(context.Background(), cs, ns); err != nil {
		t.Fatal(err)
	}
	return cs, ns
}

// bundlePeer is a peer's https_web bundle endpoint whose bundle can be
// replaced while it runs.
type bundlePeer struct {
	td     spiffeid.TrustDomain
	url    string
	caPEM  string // the endpoint's serving CA, for PeerSpec.CABundle
	bundle atomic.Pointer[[]byte]
	roots  atomic.Pointer[CA]
}

func newBundlePeer(t *testing.T, td spiffeid.TrustDomain) *bundlePeer {
	t.Helper()
	p := &bundlePeer{td: td}
	p.serve(t, mustCA(t, td), 1)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(*p.bundle.Load())
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	p.caPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	return p
}

// serve makes the endpoint serve ca's root with sequence seq.
func (p *bundlePeer) serve(t *testing.T, ca *CA, seq uint64) {
	data := bundleJSON(t, ca, seq)
	p.roots.Store(ca)
	p.bundle.Store(&data)
}

func (p *bundlePeer) spec() PeerSpec {
	return PeerSpec{TrustDomain: p.td.Name(), BundleEndpointURL: p.url, Profile: ProfileHTTPSWeb, CABundle: p.caPEM}
}

// runFederation starts f (CA and watches) until the test ends.
func runFederation(t *testing.T, f *Domains) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitReady waits until f has fetched ca's root for td from its endpoint.
func waitReady(t *testing.T, f *Domains, td spiffeid.TrustDomain, ca *CA) {
	t.Helper()
	wait.Until(t, 30*time.Second, func() error {
		st, err := f.TrustDomain(td.Name())
		if err != nil {
			return err
		}
		if st.State != StateReady || st.Bundle == nil || !st.Bundle.HasX509Authority(ca.Cert) {
			return fmt.Errorf("%s is %s (%s)", td.Name(), st.State, st.Message)
		}
		return nil
	})
}

// storedBundle is the accepted bundle persisted in a ConfigMap (nil if none).
func storedBundle(t *testing.T, cm *corev1.ConfigMap, td spiffeid.TrustDomain) *spiffebundle.Bundle {
	t.Helper()
	data, ok := cm.Data[keyAccepted]
	if !ok {
		return nil
	}
	b, err := spiffebundle.Parse(td, []byte(data))
	if err != nil {
		t.Fatalf("ConfigMap %s holds an unreadable accepted bundle: %v", cm.Name, err)
	}
	return b
}

func getConfigMap(t *testing.T, cs kubernetes.Interface, ns, name string) *corev1.ConfigMap {
	t.Helper()
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestPeerBundlePersistedOnLeadershipGain: a replica that is not the leader
// when a peer's bundle is accepted does not write it; when it gains
// leadership it persists it, re-reading the ConfigMap when another writer
// updated it in between (a real 409 from the API server), and a second gain
// writes nothing. As the leader it persists the peer's next rotation itself.
func TestPeerBundlePersistedOnLeadershipGain(t *testing.T) {
	cs, ns := homeNamespace(t)
	ctx := context.Background()
	peerTD := spiffeid.RequireTrustDomainFromString("peer.example")
	peer := newBundlePeer(t, peerTD)

	// The federation's client: when armed, the first ConfigMap update it
	// sends is preceded by another writer's update of the same object, so
	// the API server answers 409 Conflict to it.
	var armed atomic.Bool
	var interfered atomic.Int32
	cfg := rest.CopyConfig(localcluster.Require(t, env).Cluster("home").RESTConfig())
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/configmaps/") && armed.CompareAndSwap(true, false) {
				name := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
				cm, err := cs.CoreV1().ConfigMaps(ns).Get(r.Context(), name, metav1.GetOptions{})
				if err == nil {
					if cm.Annotations == nil {
						cm.Annotations = map[string]string{}
					}
					cm.Annotations["example.com/edited-by"] = "someone-else"
					if _, err = cs.CoreV1().ConfigMaps(ns).Update(r.Context(), cm, metav1.UpdateOptions{}); err == nil {
						interfered.Add(1)
					}
				}
				if err != nil {
					t.Errorf("interfering update of %s: %v", name, err)
				}
			}
			return rt.RoundTrip(r)
		})
	}
	fedClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var leading atomic.Bool
	f := New(Config{Client: fedClient, Namespace: ns, TrustDomain: spiffeid.RequireTrustDomainFromString("local.example"), IsLeader: leading.Load})
	runFederation(t, f)
	if _, err := f.ApplyPeer(ctx, peer.spec()); err != nil {
		t.Fatal(err)
	}
	cmName := PeerConfigMapName(peerTD)
	waitReady(t, f, peerTD, peer.roots.Load())
	if b := storedBundle(t, getConfigMap(t, cs, ns, cmName), peerTD); b != nil {
		t.Fatal("a follower persisted the peer's bundle")
	}

	armed.Store(true)
	leading.Store(true)
	f.LeadershipGained(ctx)
	cm := getConfigMap(t, cs, ns, cmName)
	if interfered.Load() != 1 {
		t.Fatalf("the conflicting update was made %d times; want 1", interfered.Load())
	}
	if b := storedBundle(t, cm, peerTD); b == nil || !b.HasX509Authority(peer.roots.Load().Cert) {
		t.Fatal("leadership gained, but the peer's accepted bundle is not persisted")
	}
	if cm.Annotations["example.com/edited-by"] != "someone-else" {
		t.Fatal("the write after the conflict lost the other writer's change")
	}

	// Nothing differs now: a second gain writes nothing.
	f.LeadershipGained(ctx)
	if again := getConfigMap(t, cs, ns, cmName); again.ResourceVersion != cm.ResourceVersion {
		t.Fatalf("an unchanged bundle was written again (resourceVersion %s → %s)", cm.ResourceVersion, again.ResourceVersion)
	}

	// As the leader, the peer loop persists a rotation itself.
	rotated := mustCA(t, peerTD)
	peer.serve(t, rotated, 2)
	f.Refresh(peerTD.Name())
	wait.Until(t, 30*time.Second, func() error {
		b := storedBundle(t, getConfigMap(t, cs, ns, cmName), peerTD)
		if b == nil || !b.HasX509Authority(rotated.Cert) {
			return fmt.Errorf("the rotated bundle is not persisted yet")
		}
		if seq, _ := b.SequenceNumber(); seq != 2 {
			return fmt.Errorf("persisted sequence %d; want 2", seq)
		}
		return nil
	})

	// The peer's bundle metrics follow the rotation: its expiry is the
	// rotated root's, its last refresh the fetch that brought it.
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(f.Collector())
	// (A refresh between reading the status and the metrics is retried.)
	wait.Until(t, 10*time.Second, func() error {
		st, err := f.TrustDomain(peerTD.Name())
		if err != nil {
			return err
		}
		got := gauges(t, metrics, "hub_trust_peer_bundle_expiry_timestamp_seconds", "hub_trust_peer_bundle_last_refresh_timestamp_seconds")
		if got[`hub_trust_peer_bundle_expiry_timestamp_seconds{trust_domain="peer.example"}`] != float64(rotated.Cert.NotAfter.Unix()) ||
			got[`hub_trust_peer_bundle_last_refresh_timestamp_seconds{trust_domain="peer.example"}`] != float64(st.LastSuccess.Unix()) || st.LastSuccess.IsZero() {
			return fmt.Errorf("peer bundle metrics %v; want expiry %d, last refresh %d", got, rotated.Cert.NotAfter.Unix(), st.LastSuccess.Unix())
		}
		return nil
	})
}

// TestPeerConfigMapNames: trust domains that differ only where a
// Kubernetes name cannot hold their characters get distinct, valid names.
func TestPeerConfigMapNames(t *testing.T) {
	seen := map[string]string{}
	for _, td := range []string{"a_b.x", "a-b.x", "a.b.x", "ab.x", "a__b.x", "x", "0", "a-.b_", "_", "-", strings.Repeat("long-name_", 25) + "x"} {
		name := PeerConfigMapName(spiffeid.RequireTrustDomainFromString(td))
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("%s → %q: %v", td, name, errs)
		}
		if len(name) > 63 {
			t.Errorf("%s → %q: longer than 63 characters", td, name)
		}
		if other, ok := seen[name]; ok {
			t.Errorf("%s and %s share the name %q", td, other, name)
		}
		seen[name] = td
	}
	if got := PeerConfigMapName(spiffeid.RequireTrustDomainFromString("a_b.x")); !strings.HasPrefix(got, "hub-peer-a-b-x-") {
		t.Errorf("a_b.x → %q; want the readable prefix hub-peer-a-b-x-", got)
	}
}

// TestPeersWithCollidingLegacyNames: a_b.x and a-b.x, which earlier
// versions both stored as ConfigMap "hub-peer-a-b.x", are federated at
// once, a_b.x from such an existing ConfigMap. Each keeps its own spec,
// roots and persisted bundle; updating and deleting one leaves the other.
func TestPeersWithCollidingLegacyNames(t *testing.T) {
	cs, ns := homeNamespace(t)
	ctx := context.Background()
	underscore, dash := spiffeid.RequireTrustDomainFromString("a_b.x"), spiffeid.RequireTrustDomainFromString("a-b.x")
	pu, pd := newBundlePeer(t, underscore), newBundlePeer(t, dash)

	// A relationship written by an earlier version, under its old name.
	const legacy = "hub-peer-a-b.x"
	spec := pu.spec()
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: legacy, Labels: map[string]string{PeerLabel: "true"}},
		Data: map[string]string{keyTrustDomain: spec.TrustDomain, keyURL: spec.BundleEndpointURL,
			keyProfile: string(spec.Profile), keyCABundle: spec.CABundle},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := New(Config{Client: cs, Namespace: ns, TrustDomain: spiffeid.RequireTrustDomainFromString("local.example")})
	runFederation(t, f)
	waitReady(t, f, underscore, pu.roots.Load())

	// Under the old naming this PUT would have overwritten a_b.x's ConfigMap.
	if created, err := f.ApplyPeer(ctx, pd.spec()); err != nil || !created {
		t.Fatalf("ApplyPeer(a-b.x) = %v, %v; want created", created, err)
	}
	waitReady(t, f, dash, pd.roots.Load())
	waitReady(t, f, underscore, pu.roots.Load())
	for _, c := range []struct {
		name string
		td   spiffeid.TrustDomain
		p    *bundlePeer
	}{{legacy, underscore, pu}, {PeerConfigMapName(dash), dash, pd}} {
		wait.Until(t, 30*time.Second, func() error {
			cm := getConfigMap(t, cs, ns, c.name)
			if cm.Data[keyTrustDomain] != c.td.Name() || cm.Data[keyURL] != c.p.url {
				return fmt.Errorf("ConfigMap %s declares %s at %s; want %s at %s", c.name, cm.Data[keyTrustDomain], cm.Data[keyURL], c.td.Name(), c.p.url)
			}
			if b := storedBundle(t, cm, c.td); b == nil || !b.HasX509Authority(c.p.roots.Load().Cert) {
				return fmt.Errorf("ConfigMap %s does not hold %s's accepted bundle", c.name, c.td.Name())
			}
			return nil
		})
	}
	if cm := getConfigMap(t, cs, ns, PeerConfigMapName(dash)); cm.Annotations[TrustDomainAnnotation] != "a-b.x" {
		t.Errorf("new ConfigMap annotations %v; want %s=a-b.x", cm.Annotations, TrustDomainAnnotation)
	}

	// A PUT of a_b.x updates its existing ConfigMap in place, keeping the
	// accepted bundle; no second ConfigMap appears for it.
	moved := newBundlePeer(t, underscore)
	if created, err := f.ApplyPeer(ctx, moved.spec()); err != nil || created {
		t.Fatalf("ApplyPeer(a_b.x) = %v, %v; want an update", created, err)
	}
	list, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, cm := range list.Items {
		if cm.Labels[PeerLabel] == "true" {
			names = append(names, cm.Name)
		}
	}
	if len(names) != 2 {
		t.Fatalf("federation ConfigMaps %v; want the legacy one and a-b.x's", names)
	}
	if cm := getConfigMap(t, cs, ns, legacy); cm.Data[keyURL] != moved.url || storedBundle(t, cm, underscore) == nil {
		t.Fatalf("a_b.x's ConfigMap after the update: url %s, accepted bundle kept %v", cm.Data[keyURL], storedBundle(t, cm, underscore) != nil)
	}
	waitReady(t, f, underscore, moved.roots.Load())

	// Deleting a_b.x leaves a-b.x federated.
	if err := f.DeletePeer(ctx, "a_b.x"); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 30*time.Second, func() error {
		if _, err := f.TrustDomain("a_b.x"); err == nil {
			return fmt.Errorf("a_b.x still federated")
		}
		return nil
	})
	waitReady(t, f, dash, pd.roots.Load())
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, PeerConfigMapName(dash), metav1.GetOptions{}); err != nil {
		t.Fatalf("a-b.x's ConfigMap after deleting a_b.x: %v", err)
	}
}

// TestLeadershipGainedWithManyPeers runs LeadershipGained concurrently with
// the peers' own loops (for the race detector) and checks that every peer
// ends up persisted.
func TestLeadershipGainedWithManyPeers(t *testing.T) {
	cs, ns := homeNamespace(t)
	ctx := context.Background()
	var leading atomic.Bool
	f := New(Config{Client: cs, Namespace: ns, TrustDomain: spiffeid.RequireTrustDomainFromString("local.example"), IsLeader: leading.Load})
	runFederation(t, f)
	var peers []*bundlePeer
	for i := range 5 {
		p := newBundlePeer(t, spiffeid.RequireTrustDomainFromString(fmt.Sprintf("peer-%d.example", i)))
		peers = append(peers, p)
		if _, err := f.ApplyPeer(ctx, p.spec()); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range peers {
		waitReady(t, f, p.td, p.roots.Load())
	}
	leading.Store(true)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { f.LeadershipGained(ctx) })
	}
	for _, p := range peers {
		f.Refresh(p.td.Name())
	}
	wg.Wait()
	for _, p := range peers {
		if b := storedBundle(t, getConfigMap(t, cs, ns, PeerConfigMapName(p.td)), p.td); b == nil || !b.HasX509Authority(p.roots.Load().Cert) {
			t.Errorf("%s: accepted bundle not persisted", p.td.Name())
		}
	}
}
