package clusters

import (
	"context"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hubmesh/hub/internal/localcluster"
)

// TestDialGuardRefusesResolvedAddress registers a member by a DNS name
// that resolves into a denied range: the kubeconfig passes (no IP literal),
// every connection is refused after resolution.
func TestDialGuardRefusesResolvedAddress(t *testing.T) {
	policy := KubeconfigPolicy{DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}}
	r, _, ns := startRegistryWithPolicy(t, 4*time.Second, policy)
	m1 := env.Cluster("member1")
	port := m1.Server()[strings.LastIndex(m1.Server(), ":")+1:]
	kc := strings.Replace(string(m1.Kubeconfig()), m1.Server(), "https://localhost:"+port, 1)
	if _, err := kube(t, env.Cluster("home")).CoreV1().Secrets(ns).Create(context.Background(),
		localcluster.RemoteSecret(ns, "dns", map[string][]byte{"dns": []byte(kc)}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		st, ok := statusOf(r, "dns", ns+"/dns")
		want := "not synced within 4s; still trying (no longer blocks readiness): cannot list or watch: GET localhost:" + port + ": dial tcp "
		switch {
		case !ok:
			return fmt.Errorf("not listed")
		case st.State != StateTimedOut || !strings.HasPrefix(st.Message, want) ||
			!strings.Contains(st.Message, "refusing to connect to a member API server: address ") ||
			!strings.Contains(st.Message, "is in the denied range"):
			return fmt.Errorf("%s: %s", st.State, st.Message)
		}
		return nil
	})
}

// TestObjectCap gives two members a cap one of them exceeds: that one
// turns Invalid and publishes nothing, the other is unaffected.
func TestObjectCap(t *testing.T) {
	ctx := context.Background()
	m1, m2 := env.Cluster("member1"), env.Cluster("member2")
	small := countObjects(t, kube(t, m1))
	limit := small + 30
	big := kube(t, m2)
	ns := "cap-" + rand.String(6)
	if err := localcluster.EnsureNamespace(ctx, big, ns); err != nil {
		t.Fatal(err)
	}
	for n := countObjects(t, big); n <= limit+10; n++ {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("filler-%d", n)}, Type: corev1.SecretTypeOpaque}
		if _, err := big.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r, sink, hubNS := startRegistryWithPolicy(t, 20*time.Second, KubeconfigPolicy{MaxObjects: limit})
	if _, err := kube(t, env.Cluster("home")).CoreV1().Secrets(hubNS).Create(ctx,
		localcluster.RemoteSecret(hubNS, "members", map[string][]byte{"small": m1.Kubeconfig(), "big": m2.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, wantState(r, "big", hubNS+"/members", StateInvalid, fmt.Sprintf(
		"the member holds more than %d objects (Services, EndpointSlices, Nodes, Secrets and mesh pods; --member-max-objects); its informers are stopped and its services are not served", limit)))
	eventually(t, 30*time.Second, wantState(r, "small", hubNS+"/members", StateReady, ""))
	sink.mu.Lock()
	n := len(sink.services["big"])
	sink.mu.Unlock()
	if n != 0 {
		t.Errorf("the oversize member published %d services", n)
	}
}

// countObjects counts what a member's informers would hold.
func countObjects(t *testing.T, cs kubernetes.Interface) int {
	t.Helper()
	ctx := context.Background()
	svcs, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var sel []fields.Selector
	for _, typ := range ignoredSecretTypes {
		sel = append(sel, fields.OneTermNotEqualSelector("type", string(typ)))
	}
	secrets, err := cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(sel...).String()})
	if err != nil {
		t.Fatal(err)
	}
	return len(svcs.Items) + len(slices.Items) + len(nodes.Items) + len(secrets.Items)
}

// TestReadyzIsBounded probes a member whose /readyz answers too much,
// fails with a check list, or redirects; the redirect target is never
// contacted.
func TestReadyzIsBounded(t *testing.T) {
	var followed atomic.Int64
	target := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { followed.Add(1) }))
	defer target.Close()
	mode := atomic.Value{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch mode.Load() {
		case "huge":
			_, _ = w.Write([]byte(strings.Repeat("x", 1<<20)))
		case "failing":
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte("[+]ping ok\n[-]etcd failed: reason withheld\nreadyz check failed"))
		case "redirect":
			http.Redirect(w, req, target.URL+"/readyz", http.StatusFound)
		default:
			_, _ = w.Write([]byte("ok"))
		}
	}))
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	kc := &Kubeconfig{Config: &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}, Server: srv.URL}
	c, err := newCluster("probe", "", kc, WatchScope{}, clusterDeps{sink: newRecordingSink(), timeout: time.Minute, log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.api.conns.closeAll()
	for _, tc := range []struct{ mode, want string }{
		{"ok", ""},
		{"huge", "200 OK: the answer is larger than 65536 bytes"},
		{"failing", "failing checks: etcd"},
		{"redirect", "member API server answered 302 Found, a redirect to"},
	} {
		mode.Store(tc.mode)
		err := c.api.readyz(context.Background())
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v; want %q", tc.mode, err, tc.want)
		}
	}
	if n := followed.Load(); n != 0 {
		t.Errorf("the redirect target was contacted %d times", n)
	}
}
