package clusters

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/wait"
)

var env *localcluster.Env

func TestMain(m *testing.M) {
	if os.Getenv("HUB_TEST_DEBUG") != "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}
	if os.Getenv(envProxyChild) != "" {
		os.Exit(m.Run()) // a child process of one test: no clusters
	}
	os.Exit(localcluster.RunTests(m, &env, "home", "member1", "member2"))
}

// recordingSink is a clusters.Sink that keeps the latest view per member.
type recordingSink struct {
	mu       sync.Mutex
	services map[string]map[ServiceKey]*Service
	removed  map[string]int
	empty    map[string]bool // a member's service was ever set without endpoints after having some
}

func newRecordingSink() *recordingSink {
	return &recordingSink{services: map[string]map[ServiceKey]*Service{}, removed: map[string]int{}, empty: map[string]bool{}}
}

func (s *recordingSink) ReplaceCluster(cluster string, services []*Service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[ServiceKey]*Service{}
	for _, svc := range services {
		key := ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
		s.noteEmpty(cluster, key, svc)
		m[key] = svc
	}
	s.services[cluster] = m
}

func (s *recordingSink) UpdateService(cluster string, key ServiceKey, svc *Service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.services[cluster] == nil {
		s.services[cluster] = map[ServiceKey]*Service{}
	}
	s.noteEmpty(cluster, key, svc)
	if svc == nil {
		delete(s.services[cluster], key)
	} else {
		s.services[cluster][key] = svc
	}
}

func (s *recordingSink) noteEmpty(cluster string, key ServiceKey, svc *Service) {
	if old := s.services[cluster][key]; old != nil && len(old.Endpoints) > 0 && (svc == nil || len(svc.Endpoints) == 0) {
		s.empty[cluster] = true
	}
}

func (s *recordingSink) removedCount(cluster string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removed[cluster]
}

func (s *recordingSink) emptied(cluster string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.empty[cluster]
}

func (s *recordingSink) RemoveCluster(cluster string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.services, cluster)
	s.removed[cluster]++
}

func (s *recordingSink) service(cluster string, key ServiceKey) *Service {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.services[cluster][key]
}

// startRegistry runs a Registry whose namespace is fresh for this test.
func startRegistry(t *testing.T, timeout time.Duration) (*Registry, *recordingSink, string) {
	t.Helper()
	sink := newRecordingSink()
	r, ns := startRegistryWith(t, func(c *Config) { c.SyncTimeout, c.Sink = timeout, sink })
	return r, sink, ns
}

func kube(t testing.TB, c *localcluster.Cluster) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// eventually waits for cond (see internal/wait).
func eventually(t *testing.T, timeout time.Duration, cond func() error) {
	t.Helper()
	wait.Until(t, timeout, cond)
}

func statusOf(r *Registry, id, secret string) (Status, bool) {
	for _, st := range r.Clusters() {
		if st.ID == id && st.Secret == secret {
			return st, true
		}
	}
	return Status{}, false
}

func wantState(r *Registry, id, secret string, state State, msg string) func() error {
	return func() error {
		st, ok := statusOf(r, id, secret)
		if !ok {
			return fmt.Errorf("%s from %q not listed; have %+v", id, secret, r.Clusters())
		}
		if st.State != state || !strings.Contains(st.Message, msg) {
			return fmt.Errorf("%s from %q is %s %q; want %s containing %q", id, secret, st.State, st.Message, state, msg)
		}
		return nil
	}
}

func TestRegistryMembership(t *testing.T) {
	r, sink, ns := startRegistry(t, 30*time.Second)
	ctx := context.Background()
	e := env
	home := kube(t, e.Cluster("home"))
	secrets := home.CoreV1().Secrets(ns)

	// Each member has a service in a namespace of its own.
	appNS := "app-" + rand.String(6)
	for i, name := range []string{"member1", "member2"} {
		c := kube(t, e.Cluster(name))
		if err := localcluster.EnsureNamespace(ctx, c, appNS); err != nil {
			t.Fatal(err)
		}
		ip := fmt.Sprintf("198.18.9.%d", i+1)
		if err := localcluster.ApplyService(ctx, c, appNS, "svc-"+name, "http", 80, []localcluster.Backend{{IP: ip, Port: 8080}}); err != nil {
			t.Fatal(err)
		}
	}

	s1 := localcluster.RemoteSecret(ns, "s1", map[string][]byte{
		"m1":   e.Cluster("member1").Kubeconfig(),
		"home": e.Cluster("member2").Kubeconfig(),
		"-bad": e.Cluster("member2").Kubeconfig(),
	})
	if _, err := secrets.Create(ctx, s1, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s1Ref := ns + "/s1"
	eventually(t, 30*time.Second, wantState(r, "m1", s1Ref, StateReady, ""))
	eventually(t, 5*time.Second, wantState(r, "home", s1Ref, StateInvalid, "home cluster's own ID"))
	eventually(t, 5*time.Second, wantState(r, "-bad", s1Ref, StateInvalid, "must match"))
	key1 := ServiceKey{Namespace: appNS, Name: "svc-member1"}
	eventually(t, 10*time.Second, func() error {
		if svc := sink.service("m1", key1); svc == nil || len(svc.Endpoints) != 1 || svc.Endpoints[0].Address != "198.18.9.1" {
			return fmt.Errorf("sink has %+v for m1", svc)
		}
		return nil
	})
	if st, _ := r.Cluster("m1"); st.Server != e.Cluster("member1").Server() || st.Services < 2 || st.Endpoints < 1 {
		t.Errorf("m1 status = %+v", st)
	}

	// A second Secret claiming m1 is a Conflict that names the owner.
	s2 := localcluster.RemoteSecret(ns, "s2", map[string][]byte{"m1": e.Cluster("member2").Kubeconfig()})
	if _, err := secrets.Create(ctx, s2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s2Ref := ns + "/s2"
	eventually(t, 10*time.Second, wantState(r, "m1", s2Ref, StateConflict, "already registered by secret "+s1Ref))

	// Re-applying s1 with the same kubeconfig is a no-op: the same client keeps running.
	r.mu.Lock()
	before := r.members["m1"].active
	r.mu.Unlock()
	cur, err := secrets.Get(ctx, "s1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Labels["touched"] = "yes"
	if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		got, err := r.secrets.Secrets(ns).Get("s1")
		if err != nil || got.Labels["touched"] != "yes" {
			return fmt.Errorf("update not seen yet")
		}
		if r.queue.Len() > 0 {
			return fmt.Errorf("queue not drained")
		}
		return nil
	})
	r.mu.Lock()
	after := r.members["m1"].active
	r.mu.Unlock()
	if before != after {
		t.Errorf("an unchanged kubeconfig restarted the member")
	}

	// Deleting the owner removes its member and lets s2 take over m1.
	if err := secrets.Delete(ctx, "s1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, wantState(r, "m1", s2Ref, StateReady, ""))
	key2 := ServiceKey{Namespace: appNS, Name: "svc-member2"}
	eventually(t, 10*time.Second, func() error {
		if sink.service("m1", key1) != nil || sink.service("m1", key2) == nil {
			return fmt.Errorf("m1 should now serve member2's services only")
		}
		return nil
	})
	if _, ok := statusOf(r, "home", s1Ref); ok {
		t.Errorf("keys of a deleted secret are still listed")
	}

	// Deleting the last Secret removes the member entirely.
	if err := secrets.Delete(ctx, "s2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		if _, ok := r.Cluster("m1"); ok {
			return fmt.Errorf("m1 still listed")
		}
		if sink.service("m1", key2) != nil {
			return fmt.Errorf("m1's services still in the sink")
		}
		if h := r.History("m1"); len(h) != 0 {
			return fmt.Errorf("removed member m1 still has %d history entries", len(h))
		}
		return nil
	})
	if h := r.History("-bad"); len(h) != 0 {
		t.Errorf("key -bad of a deleted secret still has %d history entries", len(h))
	}
}

func TestRegistryUnreachableMemberTimesOut(t *testing.T) {
	r, _, ns := startRegistry(t, 5*time.Second)
	ctx := context.Background()
	home := kube(t, env.Cluster("home"))
	// A kubeconfig whose server is a port nothing listens on.
	kc := strings.Replace(string(env.Cluster("member1").Kubeconfig()), env.Cluster("member1").Server(), "https://127.0.0.1:1", 1)
	s := localcluster.RemoteSecret(ns, "gone", map[string][]byte{"gone": []byte(kc)})
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 4*time.Second, wantState(r, "gone", ns+"/gone", StateUnreachable, "connection refused"))
	if ok, reason := r.Ready(); ok || !strings.Contains(reason, "gone") {
		t.Errorf("Ready() = %v, %q while a member is unreachable and not timed out", ok, reason)
	}
	eventually(t, 20*time.Second, wantState(r, "gone", ns+"/gone", StateTimedOut, "not synced within 5s; still trying (no longer blocks readiness): cannot list or watch: GET 127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused"))
	eventually(t, 5*time.Second, func() error {
		if ok, reason := r.Ready(); !ok {
			return fmt.Errorf("not ready: %s", reason)
		}
		return nil
	})
}

func sha(b []byte) [32]byte {
	kc, err := ParseKubeconfig(b)
	if err != nil {
		panic(err)
	}
	return kc.SHA256
}

// TestOlderSecretOwnsContestedID starts fresh registries over two Secrets
// that claim the same ID: whatever order they are reconciled in, the older
// one owns it and the newer one reports the conflict.
func TestOlderSecretOwnsContestedID(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := context.Background()
	ns := "hub-" + rand.String(6)
	home := kube(t, e.Cluster("home"))
	if err := localcluster.EnsureNamespace(ctx, home, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "zz-old", map[string][]byte{"dup": e.Cluster("member1").Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // creation timestamps have one-second resolution
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "aa-young", map[string][]byte{"dup": e.Cluster("member2").Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		sink := newRecordingSink()
		r, err := NewRegistry(Config{Home: e.Cluster("home").RESTConfig(), HomeID: "home", Namespace: ns, SyncTimeout: 30 * time.Second, Sink: sink})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error)
		go func() { done <- r.Run(runCtx) }()
		eventually(t, 30*time.Second, wantState(r, "dup", ns+"/zz-old", StateReady, ""))
		eventually(t, 10*time.Second, wantState(r, "dup", ns+"/aa-young", StateConflict, "already registered by secret "+ns+"/zz-old"))
		eventually(t, 30*time.Second, func() error {
			if st, _ := r.Cluster("dup"); st.Server != e.Cluster("member1").Server() || st.State != StateReady {
				return fmt.Errorf("dup is %s from %s; want Ready from the older secret's member1", st.State, st.Server)
			}
			return nil
		})
		cancel()
		<-done
	}
}

// Readiness waits until the remote Secrets listed at start have been read:
// the informer's handlers only queue them, and a hub that turned ready
// before creating their members would serve proxies a mesh without them
// (an empty first EDS response). Whenever Ready says yes, the members of
// a Secret that existed before the start are there.
func TestReadyWaitsForListedSecretsToBeRead(t *testing.T) {
	m1 := env.Cluster("member1")
	r, _ := startRegistryWith(t, func(c *Config) {
		c.SyncTimeout = time.Minute
		secret := localcluster.RemoteSecret(c.Namespace, "before-start", map[string][]byte{"m1": m1.Kubeconfig()})
		if _, err := kube(t, env.Cluster("home")).CoreV1().Secrets(c.Namespace).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if ok, _ := r.Ready(); ok {
			break
		}
		if time.Now().After(deadline) {
			_, reason := r.Ready()
			t.Fatalf("not ready within 60s: %s", reason)
		}
		time.Sleep(time.Millisecond)
	}
	for _, st := range r.Clusters() {
		if st.ID == "m1" {
			if st.State != StateReady {
				t.Errorf("m1 is %s when the registry turned ready", st.State)
			}
			return
		}
	}
	t.Fatal("the registry turned ready before the member of a Secret listed at start existed")
}

// An EndpointSlice relabelled to another Service leaves the Service it was
// of: both are rebuilt, not only the one it names now.
func TestSliceMovedToAnotherServiceLeavesTheOld(t *testing.T) {
	_, sink, ns := startRegistry(t, 30*time.Second)
	ctx := context.Background()
	member := kube(t, env.Cluster("member1"))
	appNS := "app-" + rand.String(6)
	if err := localcluster.EnsureNamespace(ctx, member, appNS); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"a", "b"} {
		if err := localcluster.ApplyService(ctx, member, appNS, name, "http", 80, []localcluster.Backend{{IP: fmt.Sprintf("198.18.7.%d", i+1), Port: 8080}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kube(t, env.Cluster("home")).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "s", map[string][]byte{"m1": env.Cluster("member1").Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	addresses := func(name string) []string {
		var out []string
		if svc := sink.service("m1", ServiceKey{Namespace: appNS, Name: name}); svc != nil {
			for _, e := range svc.Endpoints {
				out = append(out, e.Address)
			}
		}
		slices.Sort(out)
		return out
	}
	want := func(a, b []string) func() error {
		return func() error {
			if got := addresses("a"); !slices.Equal(got, a) {
				return fmt.Errorf("a has %v; want %v", got, a)
			}
			if got := addresses("b"); !slices.Equal(got, b) {
				return fmt.Errorf("b has %v; want %v", got, b)
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, want([]string{"198.18.7.1"}, []string{"198.18.7.2"}))
	slice, err := member.DiscoveryV1().EndpointSlices(appNS).Get(ctx, "a-hub", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice.Labels[discoveryv1.LabelServiceName] = "b"
	if _, err := member.DiscoveryV1().EndpointSlices(appNS).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, want(nil, []string{"198.18.7.1", "198.18.7.2"}))
}

// TestStoppingRegistryDropsQueuedSecrets: once the registry's context is
// cancelled, the remote Secrets still queued are dropped, not reconciled
// (with a cancelled context, which would build member clients only to
// stop them, or remove members, on the way out). This registry has nothing
// to reconcile with: reconciling would panic.
func TestStoppingRegistryDropsQueuedSecrets(t *testing.T) {
	r := &Registry{queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	r.queue.Add("hub/remote-west")
	r.queue.ShutDown()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if !r.processNext(ctx) {
		t.Fatal("the queued Secret was not handed out")
	}
	if r.processNext(ctx) {
		t.Fatal("the queue did not end")
	}
}
