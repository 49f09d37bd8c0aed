package clusters

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
)

func TestReadWatchScope(t *testing.T) {
	for _, tc := range []struct {
		ann     map[string]string
		want    WatchScope
		wantErr string
	}{
		{ann: nil, want: WatchScope{}},
		{ann: map[string]string{AnnotationWatchNamespaces: " b, a,,b "}, want: WatchScope{Namespaces: []string{"a", "b"}}},
		{ann: map[string]string{AnnotationWatchNamespaces: ""}, wantErr: "names no namespace"},
		{ann: map[string]string{AnnotationWatchNamespaces: "a,B_ad"}, wantErr: `"B_ad" is not a namespace name`},
		{ann: map[string]string{AnnotationWatchNamespaces: strings.Repeat("n,", 300) + "x"}, want: WatchScope{Namespaces: []string{"n", "x"}}},
		{ann: map[string]string{AnnotationWatchNamespaceSelector: "team in (a, b),mesh"}, want: WatchScope{Selector: "mesh,team in (a,b)"}},
		{ann: map[string]string{AnnotationWatchNamespaceSelector: "team in (a"}, wantErr: AnnotationWatchNamespaceSelector},
		{ann: map[string]string{AnnotationWatchNamespaceSelector: ""}, wantErr: "selects every namespace"},
		{ann: map[string]string{AnnotationWatchNamespaceSelector: "a=b", AnnotationWatchNamespaces: "a"}, wantErr: "set one"},
	} {
		got, err := readWatchScope(tc.ann)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("readWatchScope(%v) error = %v, want %q", tc.ann, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("readWatchScope(%v): %v", tc.ann, err)
		case !got.equal(tc.want):
			t.Errorf("readWatchScope(%v) = %+v, want %+v", tc.ann, got, tc.want)
		}
	}
	many := make([]string, maxWatchNamespaces+1)
	for i := range many {
		many[i] = fmt.Sprintf("ns-%d", i)
	}
	if _, err := readWatchScope(map[string]string{AnnotationWatchNamespaces: strings.Join(many, ",")}); err == nil || !strings.Contains(err.Error(), "more than 256") {
		t.Errorf("%d namespaces: error = %v", len(many), err)
	}
}

// TestScopedWatching registers a member whose remote Secret names the
// namespaces to watch, then a label selector, on a real API server: only
// the scoped namespaces' Services are federated, the informers hold only
// their objects (and istio-system's, for gateways), the selector follows
// namespaces as their labels change, a scope change swaps the client
// make-before-break, and a malformed annotation is refused with the
// previous scope kept.
func TestScopedWatching(t *testing.T) {
	r, sink, ns := startRegistry(t, 30*time.Second)
	ctx := context.Background()
	member := kube(t, env.Cluster("member1"))
	home := kube(t, env.Cluster("home"))
	suffix := rand.String(5)
	a, b, c := "scope-a-"+suffix, "scope-b-"+suffix, "scope-c-"+suffix
	for i, n := range []string{a, b, c} {
		if err := localcluster.EnsureNamespace(ctx, member, n); err != nil {
			t.Fatal(err)
		}
		if err := localcluster.ApplyService(ctx, member, n, "web", "http", 80, []localcluster.Backend{{IP: fmt.Sprintf("198.18.30.%d", i+1), Port: 8080}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = member.CoreV1().Namespaces().Delete(context.Background(), n, metav1.DeleteOptions{}) })
	}
	federated := func(want ...string) func() error {
		return func() error {
			var have []string
			for _, n := range []string{a, b, c} {
				if sink.service("scoped", ServiceKey{Namespace: n, Name: "web"}) != nil {
					have = append(have, n)
				}
			}
			if !slices.Equal(have, want) {
				return fmt.Errorf("federated web in %v, want %v", have, want)
			}
			for key := range sink.servicesOf("scoped") {
				if key.Namespace != a && key.Namespace != b && key.Namespace != c {
					return fmt.Errorf("federated %v, outside the scope", key)
				}
			}
			return nil
		}
	}

	secret := localcluster.RemoteSecret(ns, "scoped", map[string][]byte{"scoped": env.Cluster("member1").Kubeconfig()})
	secret.Annotations = map[string]string{AnnotationWatchNamespaces: b + "," + a}
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ref := ns + "/scoped"
	eventually(t, 30*time.Second, wantState(r, "scoped", ref, StateReady, ""))
	eventually(t, 10*time.Second, federated(a, b))
	st, _ := r.Cluster("scoped")
	if want := []string{a, b, SystemNamespace}; !slices.Equal(st.WatchedNamespaces, sortedCopy(want)) {
		t.Errorf("watched namespaces = %v, want %v", st.WatchedNamespaces, sortedCopy(want))
	}
	// The informers hold the scoped namespaces' Services (and istio-system's),
	// not the member's others: the default namespace's kubernetes Service is
	// not among them.
	r.mu.Lock()
	active := r.members["scoped"].active
	r.mu.Unlock()
	held, _ := active.services.List(labels.Everything())
	for _, s := range held {
		if s.Namespace != a && s.Namespace != b && s.Namespace != SystemNamespace {
			t.Errorf("informers hold %s/%s, outside the scope", s.Namespace, s.Name)
		}
	}
	if st.Objects["Service"] != len(held) || st.WatchScope.String() != "namespaces "+a+","+b {
		t.Errorf("status objects %v, scope %q; informers hold %d Services", st.Objects, st.WatchScope, len(held))
	}

	// A selector: namespaces labelled team=<suffix>. Only c is, at first.
	label := func(n string, on bool) {
		t.Helper()
		nsObj, err := member.CoreV1().Namespaces().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if nsObj.Labels == nil {
			nsObj.Labels = map[string]string{}
		}
		if on {
			nsObj.Labels["team"] = suffix
		} else {
			delete(nsObj.Labels, "team")
		}
		if _, err := member.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	label(c, true)
	setAnnotations(t, home, ns, "scoped", map[string]string{AnnotationWatchNamespaceSelector: "team=" + suffix})
	eventually(t, 30*time.Second, federated(c))
	eventually(t, 10*time.Second, wantState(r, "scoped", ref, StateReady, ""))
	if st, _ := r.Cluster("scoped"); st.WatchScope.Selector != "team="+suffix {
		t.Errorf("scope = %+v", st.WatchScope)
	}
	label(a, true)
	eventually(t, 20*time.Second, federated(a, c))
	label(c, false)
	eventually(t, 20*time.Second, federated(a))
	eventually(t, 10*time.Second, func() error {
		st, _ := r.Cluster("scoped")
		if want := sortedCopy([]string{a, SystemNamespace}); !slices.Equal(st.WatchedNamespaces, want) {
			return fmt.Errorf("watched %v, want %v", st.WatchedNamespaces, want)
		}
		return nil
	})

	// istio-system is watched for gateways (Services only) whatever the
	// scope; selected, its Services are federated too (the watch is
	// replaced, make-before-break), unselected they go again.
	if err := localcluster.EnsureNamespace(ctx, member, SystemNamespace); err != nil {
		t.Fatal(err)
	}
	probe := ServiceKey{Namespace: SystemNamespace, Name: "scope-probe-" + suffix}
	if err := localcluster.ApplyService(ctx, member, probe.Namespace, probe.Name, "http", 80, []localcluster.Backend{{IP: "198.18.30.9", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = member.CoreV1().Services(SystemNamespace).Delete(context.Background(), probe.Name, metav1.DeleteOptions{})
	})
	probed := func(want bool) func() error {
		return func() error {
			got := sink.service("scoped", probe)
			if (got != nil) != want || want && len(got.Endpoints) != 1 {
				return fmt.Errorf("istio-system's probe federated: %+v, want %v (with its endpoint)", got, want)
			}
			return nil
		}
	}
	if err := probed(false)(); err != nil {
		t.Error(err)
	}
	label(SystemNamespace, true)
	t.Cleanup(func() { label(SystemNamespace, false) })
	eventually(t, 20*time.Second, probed(true))
	label(SystemNamespace, false)
	eventually(t, 20*time.Second, probed(false))

	// Both annotations: refused, the running scope kept and the reason shown.
	r.mu.Lock()
	before := r.members["scoped"].active
	r.mu.Unlock()
	setAnnotations(t, home, ns, "scoped", map[string]string{AnnotationWatchNamespaceSelector: "team=" + suffix, AnnotationWatchNamespaces: a})
	eventually(t, 10*time.Second, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		m := r.members["scoped"]
		if !strings.Contains(m.rejected, "set one") || m.active != before {
			return fmt.Errorf("rejected %q, client replaced %v", m.rejected, m.active != before)
		}
		return nil
	})
	if err := federated(a)(); err != nil {
		t.Error(err)
	}

	// A new Secret with a malformed scope runs no member at all.
	bad := localcluster.RemoteSecret(ns, "bad-scope", map[string][]byte{"bad-scope": env.Cluster("member1").Kubeconfig()})
	bad.Annotations = map[string]string{AnnotationWatchNamespaces: "Not_A_Namespace"}
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, wantState(r, "bad-scope", ns+"/bad-scope", StateInvalid, "is not a namespace name"))
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// setAnnotations replaces a Secret's annotations.
func setAnnotations(t *testing.T, c kubernetes.Interface, ns, name string, ann map[string]string) {
	t.Helper()
	s, err := c.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Annotations = ann
	if _, err := c.CoreV1().Secrets(ns).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// servicesOf is a copy of a member's services in the sink.
func (s *recordingSink) servicesOf(cluster string) map[ServiceKey]*Service {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.services[cluster])
}
