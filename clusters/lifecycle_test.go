package clusters

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
)

// seedMember creates namespace ns in a member with one service "web" served
// by ip, and returns its key.
func seedMember(t *testing.T, c *localcluster.Cluster, ns, ip string) ServiceKey {
	t.Helper()
	ctx := context.Background()
	cs := kube(t, c)
	if err := localcluster.EnsureNamespace(ctx, cs, ns); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, cs, ns, "web", "http", 80, []localcluster.Backend{{IP: ip, Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	return ServiceKey{Namespace: ns, Name: "web"}
}

func wantEndpoint(sink *recordingSink, cluster string, key ServiceKey, ip string) func() error {
	return func() error {
		svc := sink.service(cluster, key)
		if svc == nil || len(svc.Endpoints) != 1 || svc.Endpoints[0].Address != ip {
			return fmt.Errorf("sink has %+v for %s; want endpoint %s", svc, cluster, ip)
		}
		return nil
	}
}

func TestMemberGoesStaleAndRecovers(t *testing.T) {
	r, sink, ns := startRegistry(t, 30*time.Second)
	ctx := context.Background()
	m1, m2 := env.Cluster("member1"), env.Cluster("member2")
	appNS := "app-" + rand.String(6)
	key := seedMember(t, m1, appNS, "198.18.7.1")
	seedMember(t, m2, appNS, "198.18.7.2")
	secret := localcluster.RemoteSecret(ns, "members", map[string][]byte{"m1": m1.Kubeconfig(), "m2": m2.Kubeconfig()})
	if _, err := kube(t, env.Cluster("home")).CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ref := ns + "/members"
	eventually(t, 30*time.Second, wantState(r, "m1", ref, StateReady, ""))
	eventually(t, 30*time.Second, wantState(r, "m2", ref, StateReady, ""))
	eventually(t, 10*time.Second, wantEndpoint(sink, "m1", key, "198.18.7.1"))

	// Kill m1's API server: m1 goes Stale and keeps its endpoints; m2 is untouched.
	m1.StopAPIServer()
	t.Cleanup(func() { // leave the shared cluster running for other tests
		_ = m1.StartAPIServer()
		_ = m1.WaitReady(context.Background())
	})
	eventually(t, 60*time.Second, wantState(r, "m1", ref, StateStale, "serving the last known endpoints"))
	if err := wantEndpoint(sink, "m1", key, "198.18.7.1")(); err != nil {
		t.Fatalf("stale member lost its endpoints: %v", err)
	}
	if err := wantState(r, "m2", ref, StateReady, "")(); err != nil {
		t.Fatal(err)
	}
	if ok, reason := r.Ready(); !ok {
		t.Errorf("a stale member must not make the hub unready: %s", reason)
	}

	// Change m1 while the hub cannot see it (through a second API server of
	// the same cluster), then bring m1's API server back.
	spareCfg, stopSpare, err := m1.StartSpareAPIServer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spare, err := kubernetes.NewForConfig(spareCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyEndpoints(ctx, spare, appNS, "web", "http", []localcluster.Backend{{IP: "198.18.7.9", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	stopSpare()
	if err := wantEndpoint(sink, "m1", key, "198.18.7.1")(); err != nil {
		t.Fatalf("endpoints changed while the member was unreachable: %v", err)
	}
	if err := m1.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := m1.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, wantState(r, "m1", ref, StateReady, ""))
	eventually(t, 60*time.Second, wantEndpoint(sink, "m1", key, "198.18.7.9"))
	if sink.removedCount("m1") != 0 {
		t.Errorf("the member's services were removed during the outage")
	}
}

func TestRotationIsMakeBeforeBreak(t *testing.T) {
	r, sink, ns := startRegistry(t, 3*time.Second)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	appNS := "app-" + rand.String(6)
	key := seedMember(t, m1, appNS, "198.18.6.1")
	secrets := kube(t, env.Cluster("home")).CoreV1().Secrets(ns)
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "s", map[string][]byte{"m1": m1.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ref := ns + "/s"
	eventually(t, 30*time.Second, wantState(r, "m1", ref, StateReady, ""))
	eventually(t, 10*time.Second, wantEndpoint(sink, "m1", key, "198.18.6.1"))
	rotate := func(kc []byte) {
		t.Helper()
		cur, err := secrets.Get(ctx, "s", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Data["m1"] = kc
		if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	activeHash := func() [32]byte {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.members["m1"].active.api.hash
	}

	// A new kubeconfig whose server is unreachable never replaces the working one.
	broken := []byte(strings.Replace(string(m1.Kubeconfig()), m1.Server(), "https://127.0.0.1:1", 1))
	before := activeHash()
	rotate(broken)
	eventually(t, 30*time.Second, wantState(r, "m1", ref, StateReady, "new kubeconfig TimedOut"))
	if activeHash() != before {
		t.Fatal("an unusable kubeconfig replaced the working client")
	}
	if err := wantEndpoint(sink, "m1", key, "198.18.6.1")(); err != nil {
		t.Fatal(err)
	}

	// Fresh credentials: the new client syncs, then replaces the old one.
	fresh, err := m1.NewCertKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	rotate(fresh)
	eventually(t, 30*time.Second, func() error {
		if activeHash() == before {
			return fmt.Errorf("still on the old kubeconfig")
		}
		return wantState(r, "m1", ref, StateReady, "")()
	})
	r.mu.Lock()
	next := r.members["m1"].next
	r.mu.Unlock()
	if next != nil {
		t.Errorf("the broken candidate is still running after the fresh one won")
	}
	if err := wantEndpoint(sink, "m1", key, "198.18.6.1")(); err != nil {
		t.Fatal(err)
	}
	if sink.removedCount("m1") != 0 || sink.emptied("m1") {
		t.Errorf("rotation removed or emptied the member's services")
	}
	// The candidates' own changes (TimedOut, Syncing → Ready) are not the
	// member's: it became Ready once, at registration, and never timed out.
	for state, want := range map[State]float64{StateReady: 1, StateTimedOut: 0} {
		var m dto.Metric
		if err := r.transitions.WithLabelValues("m1", string(state)).Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetCounter().GetValue(); got != want {
			t.Errorf("hub_cluster_state_transitions_total{cluster=m1,to=%s} = %v after two rotations; want %v", state, got, want)
		}
	}

	// The new client is live: it follows changes.
	if err := localcluster.ApplyEndpoints(ctx, kube(t, m1), appNS, "web", "http", []localcluster.Backend{{IP: "198.18.6.2", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, wantEndpoint(sink, "m1", key, "198.18.6.2"))
}

func TestEventsAndMetrics(t *testing.T) {
	metrics := prometheus.NewRegistry()
	e := localcluster.Require(t, env)
	ns := "hub-" + rand.String(6)
	home := kube(t, e.Cluster("home"))
	ctx := context.Background()
	if err := localcluster.EnsureNamespace(ctx, home, ns); err != nil {
		t.Fatal(err)
	}
	sink := newRecordingSink()
	r, err := NewRegistry(Config{Home: e.Cluster("home").RESTConfig(), HomeID: "home", Namespace: ns, SyncTimeout: 30 * time.Second, Sink: sink, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- r.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	secret := localcluster.RemoteSecret(ns, "s", map[string][]byte{"m1": e.Cluster("member1").Kubeconfig(), "broken": []byte("nope: [")})
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, wantState(r, "m1", ns+"/s", StateReady, ""))
	eventually(t, 30*time.Second, wantState(r, "home", "", StateReady, "")) // the home cluster syncs on its own

	eventually(t, 30*time.Second, func() error {
		evs, err := home.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "s").String()})
		if err != nil {
			return err
		}
		reasons := map[string]string{}
		for _, ev := range evs.Items {
			reasons[ev.Reason] = ev.Message
		}
		if !strings.Contains(reasons["ClusterReady"], "m1") || !strings.Contains(reasons["ClusterInvalid"], "broken") {
			return fmt.Errorf("events on the secret: %v", reasons)
		}
		for _, msg := range reasons {
			if strings.Contains(msg, "BEGIN") || strings.Contains(msg, "token") {
				return fmt.Errorf("event leaks credential material: %q", msg)
			}
		}
		return nil
	})

	families, err := metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got[f.GetName()+labelString(m)] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	for name, want := range map[string]float64{
		`hub_cluster_state{cluster="m1",secret="` + ns + `/s",state="Ready"}`:       1,
		`hub_cluster_state{cluster="m1",secret="` + ns + `/s",state="Stale"}`:       0,
		`hub_cluster_state{cluster="broken",secret="` + ns + `/s",state="Invalid"}`: 1,
		`hub_cluster_state{cluster="home",secret="",state="Ready"}`:                 1,
		`hub_cluster_state_transitions_total{cluster="m1",to="Ready"}`:              1,
		`hub_cluster_informer_objects{cluster="m1",kind="EndpointSlice"}`:           -1, // present
		`hub_cluster_sync_duration_seconds{cluster="m1"}`:                           -1,
	} {
		v, ok := got[name]
		if !ok {
			t.Errorf("metric %s missing", name)
		} else if want >= 0 && v != want {
			t.Errorf("metric %s = %v; want %v", name, v, want)
		}
	}
}

func labelString(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TestNoGoroutineLeaks adds, rotates and removes a member 50 times and checks
// that every goroutine it started is gone.
func TestNoGoroutineLeaks(t *testing.T) {
	r, _, ns := startRegistry(t, 30*time.Second)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	secrets := kube(t, env.Cluster("home")).CoreV1().Secrets(ns)
	eventually(t, 30*time.Second, func() error {
		if ok, reason := r.Ready(); !ok {
			return fmt.Errorf("%s", reason)
		}
		return nil
	})
	settle := func() int {
		runtime.GC()
		time.Sleep(200 * time.Millisecond) // let exiting goroutines finish; the count is re-checked below
		return runtime.NumGoroutine()
	}
	baseline := settle()
	for i := range 50 {
		if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "cycle", map[string][]byte{"m1": m1.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, wantState(r, "m1", ns+"/cycle", StateReady, ""))
		fresh, err := m1.NewCertKubeconfig()
		if err != nil {
			t.Fatal(err)
		}
		cur, err := secrets.Get(ctx, "cycle", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Data["m1"] = fresh
		if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 { // sometimes remove mid-rotation, sometimes after it completed
			eventually(t, 30*time.Second, func() error {
				r.mu.Lock()
				defer r.mu.Unlock()
				if m := r.members["m1"]; m == nil || m.next != nil || m.active.api.hash != sha(fresh) {
					return fmt.Errorf("rotation not finished")
				}
				return nil
			})
		}
		if err := secrets.Delete(ctx, "cycle", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, func() error {
			if _, ok := r.Cluster("m1"); ok {
				return fmt.Errorf("m1 still registered")
			}
			return nil
		})
	}
	var after int
	defer func() {
		if t.Failed() {
			buf := make([]byte, 1<<20)
			t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
		}
	}()
	eventually(t, 30*time.Second, func() error {
		after = settle()
		if after > baseline+5 {
			return fmt.Errorf("goroutines: %d before 50 cycles, %d after", baseline, after)
		}
		return nil
	})
	t.Logf("goroutines: %d before 50 add/rotate/remove cycles, %d after", baseline, after)
}

// TestRotationRecoversStaleMember: a member whose API server went away is
// Stale; new credentials for a server that answers (a second API server of
// the same cluster) make it Ready, and that swap is the member's own change:
// counted in hub_cluster_state_transitions_total and in its history.
func TestRotationRecoversStaleMember(t *testing.T) {
	r, _, ns := startRegistry(t, 30*time.Second)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	seedMember(t, m1, "app-"+rand.String(6), "198.18.8.1")
	secrets := kube(t, env.Cluster("home")).CoreV1().Secrets(ns)
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "s", map[string][]byte{"m1": m1.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ref := ns + "/s"
	eventually(t, 30*time.Second, wantState(r, "m1", ref, StateReady, ""))

	m1.StopAPIServer()
	t.Cleanup(func() { // leave the shared cluster running for other tests
		_ = m1.StartAPIServer()
		_ = m1.WaitReady(context.Background())
	})
	eventually(t, 60*time.Second, wantState(r, "m1", ref, StateStale, ""))
	spareCfg, stopSpare, err := m1.StartSpareAPIServer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopSpare)
	cur, err := secrets.Get(ctx, "s", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Data["m1"] = []byte(strings.Replace(string(m1.Kubeconfig()), m1.Server(), spareCfg.Host, 1))
	if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, wantState(r, "m1", ref, StateReady, ""))
	// The API shows the promoted client's Ready as soon as it is active;
	// the swap is recorded just after (promote), so wait for the record.
	eventually(t, 30*time.Second, func() error {
		h := r.History("m1")
		if last := h[len(h)-1]; last.From != StateStale || last.To != StateReady {
			return fmt.Errorf("the member's last change is %s → %s; want Stale → Ready (the rotation)", last.From, last.To)
		}
		return nil
	})

	var m dto.Metric
	if err := r.transitions.WithLabelValues("m1", string(StateReady)).Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 2 {
		t.Errorf("hub_cluster_state_transitions_total{cluster=m1,to=Ready} = %v; want 2 (registered, recovered by rotation)", got)
	}
}
