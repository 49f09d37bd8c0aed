package clusters

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
)

// homeNamespace creates a fresh namespace in the home cluster.
func homeNamespace(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	e := localcluster.Require(t, env)
	home := kube(t, e.Cluster("home"))
	ns := "hub-" + rand.String(6)
	if err := localcluster.EnsureNamespace(context.Background(), home, ns); err != nil {
		t.Fatal(err)
	}
	return home, ns
}

// sameServices compares two views as sets of services.
func sameServices(got, want []*Service) error {
	byKey := map[ServiceKey]*Service{}
	for _, s := range got {
		byKey[ServiceKey{Namespace: s.Namespace, Name: s.Name}] = s
	}
	if len(byKey) != len(want) {
		return fmt.Errorf("%d services; want %d", len(byKey), len(want))
	}
	for _, s := range want {
		if g := byKey[ServiceKey{Namespace: s.Namespace, Name: s.Name}]; !reflect.DeepEqual(g, s) {
			return fmt.Errorf("service %s/%s is %+v; want %+v", s.Namespace, s.Name, g, s)
		}
	}
	return nil
}

func mustEncode(t *testing.T, view []*Service) ([]byte, string) {
	t.Helper()
	data, sum, err := encodeView(view)
	if err != nil {
		t.Fatal(err)
	}
	return data, sum
}

func readBack(t *testing.T, s *viewStore, id string) []*Service {
	t.Helper()
	v, err := s.readOne(context.Background(), id)
	if err != nil {
		t.Fatalf("reading the view of %s: %v", id, err)
	}
	if v == nil {
		t.Fatalf("no persisted view of %s", id)
	}
	svcs, err := v.services()
	if err != nil {
		t.Fatal(err)
	}
	return svcs
}

// chunkVersions lists the versions of a member's chunks in the API server.
func chunkVersions(t *testing.T, home kubernetes.Interface, ns, id string) map[string]int {
	t.Helper()
	list, err := home.CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: viewLabel + "=" + memberKey(id) + "," + viewRoleLabel + "=" + viewRoleChunk})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, cm := range list.Items {
		out[cm.Labels[viewVersionLabel]]++
	}
	return out
}

func TestPersistedViewChunkedRoundTrip(t *testing.T) {
	home, ns := homeNamespace(t)
	ctx := context.Background()
	s := &viewStore{cms: home.CoreV1().ConfigMaps(ns), chunkSize: 4 << 10}

	a := syntheticView(200, 3000, 2)
	data, sum := mustEncode(t, a)
	res, err := s.write(ctx, testViewKey, "west", data, sum, "https://member.example", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if res.Skipped || res.Objects < 3 || res.Compressed >= res.Bytes {
		t.Fatalf("write = %+v; want several chunks of compressed data", res)
	}
	t.Logf("%d bytes of JSON, %d gzipped, in %d objects", res.Bytes, res.Compressed, res.Objects)
	if err := sameServices(readBack(t, s, "west"), a); err != nil {
		t.Fatalf("chunked round trip: %v", err)
	}
	list, err := home.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: viewLabel})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != res.Objects {
		t.Errorf("%d objects in the namespace; the write reported %d", len(list.Items), res.Objects)
	}
	for _, cm := range list.Items {
		if n := len(cm.BinaryData[viewKeyData]); n > s.chunkSize {
			t.Errorf("%s holds %d bytes; chunk size is %d", cm.Name, n, s.chunkSize)
		}
		if cm.Labels[viewClusterLabel] != "west" {
			t.Errorf("%s does not name its cluster: %v", cm.Name, cm.Labels)
		}
	}

	// The same content again is not written.
	if res, err := s.write(ctx, testViewKey, "west", data, sum, "https://member.example", time.Now()); err != nil || !res.Skipped {
		t.Fatalf("rewriting the same view: %+v, %v; want skipped", res, err)
	}

	// A new version replaces the old one, whose chunks are deleted.
	b := syntheticView(200, 3000, 3)
	data, sumB := mustEncode(t, b)
	if _, err := s.write(ctx, testViewKey, "west", data, sumB, "https://member.example", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := sameServices(readBack(t, s, "west"), b); err != nil {
		t.Fatalf("second version: %v", err)
	}
	if v := chunkVersions(t, home, ns, "west"); len(v) != 1 || v[sumB[:versionLen]] == 0 {
		t.Errorf("chunk versions %v; want only %s", v, sumB[:versionLen])
	}

	// A small view is inline in the manifest, and no chunk is left.
	c := syntheticView(2, 4, 4)
	data, sum = mustEncode(t, c)
	if res, err := s.write(ctx, testViewKey, "west", data, sum, "https://member.example", time.Now()); err != nil || res.Objects != 1 {
		t.Fatalf("small view: %+v, %v; want one object", res, err)
	}
	if err := sameServices(readBack(t, s, "west"), c); err != nil {
		t.Fatal(err)
	}
	if v := chunkVersions(t, home, ns, "west"); len(v) != 0 {
		t.Errorf("chunks %v left behind an inline view", v)
	}

	// IDs that sanitise alike keep separate views.
	for i, id := range []string{"a_b.x", "a-b.x"} {
		data, sum := mustEncode(t, syntheticView(1, i+1, uint64(i)))
		if _, err := s.write(ctx, testViewKey, id, data, sum, "https://member.example", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if x, y := readBack(t, s, "a_b.x"), readBack(t, s, "a-b.x"); len(x[0].Endpoints) != 1 || len(y[0].Endpoints) != 2 {
		t.Errorf("views of a_b.x and a-b.x mixed: %d and %d endpoints", len(x[0].Endpoints), len(y[0].Endpoints))
	}
	all, bad, err := s.readAll(ctx)
	if err != nil || len(bad) != 0 || len(all) != 3 {
		t.Errorf("readAll: %d views, %v, %v; want 3", len(all), bad, err)
	}
}

// TestPersistedViewTornWrite interrupts writes at each step: chunks of a new
// version without its manifest, a manifest switch whose old chunks were not
// deleted, a chunk lost. A reader never mixes versions and never returns a
// partial view, and the next complete write cleans up.
func TestPersistedViewTornWrite(t *testing.T) {
	home, ns := homeNamespace(t)
	ctx := context.Background()
	s := &viewStore{cms: home.CoreV1().ConfigMaps(ns), chunkSize: 2 << 10}
	a := syntheticView(100, 1500, 5)
	dataA, sumA := mustEncode(t, a)
	if _, err := s.write(ctx, testViewKey, "east", dataA, sumA, "https://member.example", time.Now()); err != nil {
		t.Fatal(err)
	}

	// New chunks written, the manifest never switched: the old view is read.
	b := syntheticView(100, 1500, 6)
	dataB, sumB := mustEncode(t, b)
	partsB := splitChunks(compress(dataB), s.chunkSize)
	if len(partsB) < 2 {
		t.Fatalf("view B fits in %d chunk; the test needs several", len(partsB))
	}
	for i, p := range partsB {
		if err := s.putChunk(ctx, "east", sumB[:versionLen], i, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := sameServices(readBack(t, s, "east"), a); err != nil {
		t.Fatalf("after a torn write: %v", err)
	}
	if v := chunkVersions(t, home, ns, "east"); len(v) != 2 {
		t.Fatalf("chunk versions %v; want the old and the torn one", v)
	}

	// The manifest switched, the old chunks were not deleted: the new view is read.
	if _, err := s.write(ctx, testViewKey, "east", dataB, sumB, "https://member.example", time.Now()); err != nil {
		t.Fatal(err)
	}
	for i, p := range splitChunks(compress(dataA), s.chunkSize) {
		if err := s.putChunk(ctx, "east", sumA[:versionLen], i, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := sameServices(readBack(t, s, "east"), b); err != nil {
		t.Fatalf("with stale chunks left over: %v", err)
	}

	// A chunk the manifest names is gone: the view is unreadable, not partial.
	if err := home.CoreV1().ConfigMaps(ns).Delete(ctx, chunkName("east", sumB[:versionLen], 1), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, err := s.readOne(ctx, "east"); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("read with a missing chunk = %v, %v; want an error naming it", v, err)
	}
	if views, bad, err := s.readAll(ctx); err != nil || len(bad) != 1 || views["east"] != nil {
		t.Fatalf("readAll with a missing chunk: %v, %v, %v", views, bad, err)
	}

	// Chunks whose bytes were altered fail the manifest's SHA-256.
	if _, err := s.write(ctx, testViewKey, "east", dataA, sumA, "https://member.example", time.Now()); err != nil {
		t.Fatal(err)
	}
	cm, err := home.CoreV1().ConfigMaps(ns).Get(ctx, chunkName("east", sumA[:versionLen], 0), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := splitChunks(compress(dataB), s.chunkSize)[0]
	cm.BinaryData[viewKeyData] = other
	if _, err := home.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, err := s.readOne(ctx, "east"); err == nil {
		if _, err := v.services(); err == nil {
			t.Fatalf("a view with a foreign chunk was accepted")
		}
	}

	// The next complete write repairs everything and leaves only its own chunks.
	c := syntheticView(100, 1500, 7)
	dataC, sumC := mustEncode(t, c)
	if _, err := s.write(ctx, testViewKey, "east", dataC, sumC, "https://member.example", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := sameServices(readBack(t, s, "east"), c); err != nil {
		t.Fatal(err)
	}
	if v := chunkVersions(t, home, ns, "east"); len(v) != 1 || v[sumC[:versionLen]] == 0 {
		t.Errorf("chunk versions %v after a complete write; want only %s", v, sumC[:versionLen])
	}
}

// persistRegistry runs a Registry over ns with a recording sink; tune
// adjusts its persister before it runs. stop ends it (also at cleanup).
func persistRegistry(t *testing.T, ns string, timeout time.Duration, isLeader func() bool, tune func(*viewPersister)) (*Registry, *recordingSink, func()) {
	t.Helper()
	sink := newRecordingSink()
	r, err := NewRegistry(Config{Home: env.Cluster("home").RESTConfig(), HomeID: "home", Namespace: ns,
		SyncTimeout: timeout, Sink: sink, IsLeader: isLeader})
	if err != nil {
		t.Fatal(err)
	}
	if tune != nil {
		tune(r.views)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("registry: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return r, sink, stop
}

// waitRounds waits until the persister has completed n more rounds.
func waitRounds(t *testing.T, p *viewPersister, n int64) {
	t.Helper()
	target := p.rounds.Load() + n + 1 // the round in progress may have started before
	eventually(t, 30*time.Second, func() error {
		if got := p.rounds.Load(); got < target {
			return fmt.Errorf("persister at round %d; waiting for %d", got, target)
		}
		return nil
	})
}

// persistedMatchesSink waits until the persisted view of id equals what the
// sink holds for it.
func persistedMatchesSink(t *testing.T, r *Registry, sink *recordingSink, id string) *storedView {
	t.Helper()
	var v *storedView
	eventually(t, 30*time.Second, func() error {
		sink.mu.Lock()
		var want []*Service
		for _, s := range sink.services[id] {
			want = append(want, s)
		}
		sink.mu.Unlock()
		var err error
		if v, err = r.views.store.readOne(context.Background(), id); err != nil || v == nil {
			return fmt.Errorf("persisted view of %s: %v, %v", id, v, err)
		}
		got, err := v.services()
		if err != nil {
			return err
		}
		return sameServices(got, want)
	})
	return v
}

// TestPersistLeaderThrottleRemoval: a replica that is not the leader writes
// nothing; the leader writes a member's view once it syncs, at most once
// per interval under churn, not at all while nothing changes, and deletes
// it when the member's key leaves the remote Secret.
func TestPersistLeaderThrottleRemoval(t *testing.T) {
	home, ns := homeNamespace(t)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	appNS := "app-" + rand.String(6)
	key := seedMember(t, m1, appNS, "198.18.6.1")
	var leading atomic.Bool
	const interval = 2 * time.Second
	r, sink, _ := persistRegistry(t, ns, 30*time.Second, leading.Load, func(p *viewPersister) {
		p.interval, p.tick = interval, 50*time.Millisecond
	})
	secret := localcluster.RemoteSecret(ns, "members", map[string][]byte{"m1": m1.Kubeconfig()})
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, wantState(r, "m1", ns+"/members", StateReady, ""))
	eventually(t, 10*time.Second, wantEndpoint(sink, "m1", key, "198.18.6.1"))

	// Not the leader: rounds pass, nothing is written.
	waitRounds(t, r.views, 5)
	cms := home.CoreV1().ConfigMaps(ns)
	if list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: viewLabel}); err != nil || len(list.Items) != 0 {
		t.Fatalf("a replica that is not the leader wrote %d objects (%v)", len(list.Items), err)
	}

	// The leader writes the synced view.
	leading.Store(true)
	v := persistedMatchesSink(t, r, sink, "m1")
	manifest, err := cms.Get(ctx, manifestName("m1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Churn: every write to the manifest is at least the interval after the
	// previous one, and the last one holds the final view.
	w, err := cms.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + manifestName("m1"), ResourceVersion: manifest.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var writes []time.Time
	var mu sync.Mutex
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Modified {
				continue
			}
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok {
				continue
			}
			if at, err := time.Parse(time.RFC3339Nano, cm.Data[viewKeyWrittenAt]); err == nil {
				mu.Lock()
				writes = append(writes, at)
				mu.Unlock()
			}
		}
	}()
	churnUntil := time.Now().Add(3 * interval)
	lastIP := ""
	for i := 0; time.Now().Before(churnUntil); i++ {
		lastIP = fmt.Sprintf("198.18.6.%d", 10+i%200)
		if err := localcluster.ApplyEndpoints(ctx, kube(t, m1), appNS, "web", "http", []localcluster.Backend{{IP: lastIP, Port: 8080}}); err != nil {
			t.Fatal(err)
		}
	}
	// The hub has seen the last write before the settled view is compared
	// with it: else a view of an earlier write matches, and the last one's
	// view, written an interval later, looks like an unchanged view
	// written again.
	eventually(t, 10*time.Second, wantEndpoint(sink, "m1", key, lastIP))
	persistedMatchesSink(t, r, sink, "m1")
	settled := r.views.store
	last, err := settled.readOne(ctx, "m1")
	if err != nil || last == nil {
		t.Fatal(err)
	}
	// Nothing changes any more: several intervals of rounds write nothing.
	waitRounds(t, r.views, int64(3*interval/r.views.tick))
	if again, err := settled.readOne(ctx, "m1"); err != nil || !again.WrittenAt.Equal(last.WrittenAt) {
		t.Errorf("an unchanged view was written again (%v → %v, %v)", last.WrittenAt, again.WrittenAt, err)
	}
	w.Stop()
	<-watched
	mu.Lock()
	if len(writes) == 0 {
		t.Errorf("no write during and after %s of churn", 3*interval)
	}
	prev := v.WrittenAt
	for _, at := range writes {
		if gap := at.Sub(prev); gap < interval {
			t.Errorf("two writes %s apart; the interval is %s", gap, interval)
		}
		prev = at
	}
	t.Logf("%d writes during %s of continuous churn (interval %s)", len(writes), 3*interval, interval)
	mu.Unlock()

	// The member's key leaves the Secret: its view is deleted.
	s, err := home.CoreV1().Secrets(ns).Get(ctx, "members", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(s.Data, "m1")
	s.Data["other"] = []byte("not: [a kubeconfig")
	if _, err := home.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: viewLabel})
		if err != nil || len(list.Items) != 0 {
			return fmt.Errorf("%d objects of removed views left (%v)", len(list.Items), err)
		}
		return nil
	})
}

// TestRestartServesPersistedViewAsStale: a registry persists a member's
// view and stops; the member's API server goes down; a new registry serves
// the member from the persisted view, Stale, without blocking readiness
// and without ever removing or emptying it; when the API server is back
// the live view replaces it and the member is Ready.
func TestRestartServesPersistedViewAsStale(t *testing.T) {
	home, ns := homeNamespace(t)
	ctx := context.Background()
	m2 := env.Cluster("member2")
	appNS := "app-" + rand.String(6)
	key := seedMember(t, m2, appNS, "198.18.5.1")
	secret := localcluster.RemoteSecret(ns, "members", map[string][]byte{"m2": m2.Kubeconfig()})
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fast := func(p *viewPersister) { p.tick = 50 * time.Millisecond }
	r1, sink1, stop1 := persistRegistry(t, ns, 30*time.Second, nil, fast)
	eventually(t, 30*time.Second, wantState(r1, "m2", ns+"/members", StateReady, ""))
	eventually(t, 10*time.Second, wantEndpoint(sink1, "m2", key, "198.18.5.1"))
	persisted := persistedMatchesSink(t, r1, sink1, "m2")
	stop1()

	m2.StopAPIServer()
	t.Cleanup(func() { // leave the shared cluster running for other tests
		_ = m2.StartAPIServer()
		_ = m2.WaitReady(context.Background())
	})
	r2, sink2, _ := persistRegistry(t, ns, 30*time.Second, nil, fast)
	eventually(t, 10*time.Second, wantEndpoint(sink2, "m2", key, "198.18.5.1"))
	msg := "serving the view persisted at " + persisted.WrittenAt.UTC().Format(time.RFC3339) + " until the member syncs"
	eventually(t, 30*time.Second, wantState(r2, "m2", ns+"/members", StateStale, msg))
	eventually(t, 30*time.Second, func() error {
		if ok, reason := r2.Ready(); !ok {
			return fmt.Errorf("not ready while serving an unreachable member's persisted view: %s", reason)
		}
		return nil
	})
	if st, _ := r2.Cluster("m2"); st.Services < 1 || st.Endpoints < 1 {
		t.Errorf("status %+v does not count the persisted view", st)
	}
	t.Logf("restored: %+v", func() Status { st, _ := r2.Cluster("m2"); return st }())
	// The restored view is not written back (it is not live).
	waitRounds(t, r2.views, 5)
	if again, err := r2.views.store.readOne(ctx, "m2"); err != nil || again == nil || !again.WrittenAt.Equal(persisted.WrittenAt) {
		t.Errorf("the restored view was rewritten: %v, %v", again, err)
	}

	// Changed while the hub could not see it, then back.
	spareCfg, stopSpare, err := m2.StartSpareAPIServer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spare, err := kubernetes.NewForConfig(spareCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyEndpoints(ctx, spare, appNS, "web", "http", []localcluster.Backend{{IP: "198.18.5.9", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	stopSpare()
	if err := m2.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := m2.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, wantState(r2, "m2", ns+"/members", StateReady, ""))
	eventually(t, 10*time.Second, wantEndpoint(sink2, "m2", key, "198.18.5.9"))
	if sink2.removedCount("m2") != 0 || sink2.emptied("m2") {
		t.Errorf("the member's services were removed or emptied on the way (removed %d, emptied %v)", sink2.removedCount("m2"), sink2.emptied("m2"))
	}
	// The live view is persisted in turn.
	persistedMatchesSink(t, r2, sink2, "m2")
}

// TestPersistedViewOfAnotherServerIsNotRestored: a member's key is pointed
// at another API server while the hub is down. The view persisted from the
// old server is not what the member is now, so it is not served (the
// member starts empty, as without persistence); it is restored only for the
// server it was read from.
func TestPersistedViewOfAnotherServerIsNotRestored(t *testing.T) {
	home, ns := homeNamespace(t)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	appNS := "app-" + rand.String(6)
	key := seedMember(t, m1, appNS, "198.18.6.1")
	secret := localcluster.RemoteSecret(ns, "members", map[string][]byte{"m": m1.Kubeconfig()})
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fast := func(p *viewPersister) { p.tick = 50 * time.Millisecond }
	r1, sink1, stop1 := persistRegistry(t, ns, 30*time.Second, nil, fast)
	eventually(t, 30*time.Second, wantState(r1, "m", ns+"/members", StateReady, ""))
	eventually(t, 10*time.Second, wantEndpoint(sink1, "m", key, "198.18.6.1"))
	persistedMatchesSink(t, r1, sink1, "m")
	stop1()

	// Another server (nothing listens there): the old view must not be served.
	moved := strings.Replace(string(m1.Kubeconfig()), m1.Server(), "https://127.0.0.1:1", 1)
	secret.Data = map[string][]byte{"m": []byte(moved)}
	if _, err := home.CoreV1().Secrets(ns).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r2, sink2, _ := persistRegistry(t, ns, 2*time.Second, nil, fast)
	eventually(t, 30*time.Second, wantState(r2, "m", ns+"/members", StateTimedOut, ""))
	if svc := sink2.service("m", key); svc != nil {
		t.Errorf("the view persisted from %s is served for a member now at https://127.0.0.1:1: %+v", m1.Server(), svc)
	}
}
