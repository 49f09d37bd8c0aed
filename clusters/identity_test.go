package clusters

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/hubmesh/hub/internal/localcluster"
)

// syncedEvents records SecretsSynced calls.
type syncedEvents struct {
	mu     sync.Mutex
	synced map[string]int
}

func (e *syncedEvents) SecretChanged(string, ServiceKey) {}
func (e *syncedEvents) SecretsSynced(cluster string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.synced[cluster]++
}
func (e *syncedEvents) count(cluster string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.synced[cluster]
}

// startScopedRegistry is startRegistry with SecretEvents recorded.
func startScopedRegistry(t *testing.T) (*Registry, *syncedEvents, string) {
	t.Helper()
	ev := &syncedEvents{synced: map[string]int{}}
	r, ns := startRegistryWith(t, func(c *Config) { c.SyncTimeout, c.SecretEvents = time.Minute, ev })
	return r, ev, ns
}

// startRegistryWith runs a Registry of the home cluster, its namespace
// fresh for this test, with a recording sink and what configure sets,
// until the test ends.
func startRegistryWith(t *testing.T, configure func(*Config)) (*Registry, string) {
	t.Helper()
	e := localcluster.Require(t, env)
	ns := "hub-" + rand.String(6)
	if err := localcluster.EnsureNamespace(context.Background(), kube(t, e.Cluster("home")), ns); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Home: e.Cluster("home").RESTConfig(), HomeID: "home", Namespace: ns, Sink: newRecordingSink()}
	configure(&cfg)
	r, err := NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("registry: %v", err)
		}
	})
	return r, ns
}

func wantScope(r *Registry, id string, check func(IdentityScope) error) func() error {
	return func() error {
		sc, err := r.IdentityScope(id)
		if err != nil {
			return err
		}
		return check(sc)
	}
}

// A member asserts identities only once it has synced, within what its
// remote Secret's annotations say; a change of the annotations applies at
// once and is announced (SDS re-evaluates its answers).
func TestIdentityScopeFollowsSyncAndAnnotations(t *testing.T) {
	r, ev, ns := startScopedRegistry(t)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	secrets := kube(t, env.Cluster("home")).CoreV1().Secrets(ns)

	// A member whose API server never answers has not synced.
	gone := strings.Replace(string(m1.Kubeconfig()), m1.Server(), "https://127.0.0.1:1", 1)
	goneSecret := localcluster.RemoteSecret(ns, "gone", map[string][]byte{"gone": []byte(gone)})
	goneSecret.Annotations = map[string]string{AnnotationAllowRootNamespaceIdentities: "true"}
	if _, err := secrets.Create(ctx, goneSecret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, wantScope(r, "gone", func(sc IdentityScope) error {
		if sc.Synced || sc.State != StateUnreachable || !sc.AllowRootNamespace {
			return fmt.Errorf("scope %+v; want not synced, Unreachable, root namespace allowed by its annotation", sc)
		}
		return nil
	}))

	s := localcluster.RemoteSecret(ns, "m1", map[string][]byte{"member1": m1.Kubeconfig()})
	if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, wantScope(r, "member1", func(sc IdentityScope) error {
		if !sc.Synced || sc.Home || sc.AllowRootNamespace || sc.Namespaces != nil {
			return fmt.Errorf("scope %+v; want synced, no root namespace, any namespace", sc)
		}
		return nil
	}))
	before := ev.count("member1")

	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        IdentityScope
	}{
		{"root and a list", map[string]string{AnnotationAllowRootNamespaceIdentities: "true", AnnotationIdentityNamespaces: " a, b,,"},
			IdentityScope{AllowRootNamespace: true, Namespaces: []string{"a", "b"}}},
		{"not exactly true", map[string]string{AnnotationAllowRootNamespaceIdentities: "yes"}, IdentityScope{}},
		{"an invalid list fails closed", map[string]string{AnnotationIdentityNamespaces: "a,B_C"},
			IdentityScope{Namespaces: []string{}, Invalid: `annotation hub.federation/identity-namespaces: "B_C" is not a namespace name`}},
		{"an empty list allows none", map[string]string{AnnotationIdentityNamespaces: ""}, IdentityScope{Namespaces: []string{}}},
	} {
		cur, err := secrets.Get(ctx, "m1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Annotations = tc.annotations
		if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, wantScope(r, "member1", func(sc IdentityScope) error {
			if sc.AllowRootNamespace != tc.want.AllowRootNamespace || (sc.Namespaces == nil) != (tc.want.Namespaces == nil) ||
				!slices.Equal(sc.Namespaces, tc.want.Namespaces) || !strings.HasPrefix(sc.Invalid, tc.want.Invalid) || (sc.Invalid == "") != (tc.want.Invalid == "") {
				return fmt.Errorf("%s: scope %+v; want %+v", tc.name, sc, tc.want)
			}
			return nil
		}))
	}
	// The scope is visible before SecretsSynced is called for its change:
	// wait for the last call.
	eventually(t, 10*time.Second, func() error {
		if after := ev.count("member1"); after < before+4 {
			return fmt.Errorf("SecretsSynced(member1) called %d times for 4 annotation changes", after-before)
		}
		return nil
	})

	if sc, err := r.IdentityScope("home"); err != nil || !sc.Home || !sc.AllowRootNamespace {
		t.Errorf("home: %+v, %v; want the home cluster, root namespace allowed", sc, err)
	}
	if _, err := r.IdentityScope("nobody"); !errors.Is(err, ErrUnknownCluster) {
		t.Errorf("an unknown cluster: %v; want ErrUnknownCluster", err)
	}
}

// A TokenReview answer counts only for the audience asked for (istio-ca):
// a real API server refuses a token of another audience, and an API
// server that authenticates a token without saying it is for istio-ca
// (one that ignores spec.audiences) proves nothing.
func TestReviewTokenChecksAudiences(t *testing.T) {
	r, _, ns := startScopedRegistry(t)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	secrets := kube(t, env.Cluster("home")).CoreV1().Secrets(ns)
	app := "aud-" + rand.String(5)
	mc := kube(t, m1)
	if err := localcluster.EnsureNamespace(ctx, mc, app); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.CoreV1().ServiceAccounts(app).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(aud string) string {
		tr, err := mc.CoreV1().ServiceAccounts(app).CreateToken(ctx, "sa", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{aud}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}

	// A member whose "API server" authenticates every token, for an
	// audience of its own choosing.
	var reviews sync.Map
	hostile := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !strings.HasSuffix(req.URL.Path, "/tokenreviews") {
			http.NotFound(w, req)
			return
		}
		body, _ := io.ReadAll(req.Body)
		obj, err := runtime.Decode(scheme.Codecs.UniversalDeserializer(), body) // client-go sends protobuf
		tr, ok := obj.(*authenticationv1.TokenReview)
		if err != nil || !ok {
			http.Error(w, fmt.Sprintf("not a TokenReview: %v", err), http.StatusBadRequest)
			return
		}
		reviews.Store(strings.Join(tr.Spec.Audiences, ","), true)
		tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"https://kubernetes.default.svc"},
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:istio-system:istiod", Groups: []string{"system:serviceaccounts"}}}
		tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(tr)
	}))
	t.Cleanup(hostile.Close)
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hostile.Certificate().Raw}))
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q, certificate-authority-data: %s}}]\n"+
		"users: [{name: u, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", hostile.URL, ca)
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{"member1": m1.Kubeconfig(), "hostile": []byte(kc)}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if !r.IsCluster("member1") || !r.IsCluster("hostile") {
			return errors.New("members not registered yet")
		}
		return nil
	})

	if ns, sa, err := r.ReviewToken(ctx, "member1", token(TokenAudience)); err != nil || ns != app || sa != "sa" {
		t.Errorf("an istio-ca token: %s/%s, %v; want %s/sa", ns, sa, err, app)
	}
	if _, _, err := r.ReviewToken(ctx, "member1", token("other")); !errors.Is(err, ErrTokenRejected) {
		t.Errorf("a token for audience other: %v; want ErrTokenRejected", err)
	}
	_, _, err := r.ReviewToken(ctx, "hostile", "anything")
	if !errors.Is(err, ErrTokenRejected) || !strings.Contains(err.Error(), `audiences ["https://kubernetes.default.svc"] do not include "istio-ca"`) {
		t.Errorf("an answer for another audience: %v; want ErrTokenRejected naming the audiences", err)
	}
	if _, ok := reviews.Load(TokenAudience); !ok {
		t.Error("the review did not ask for audience istio-ca")
	}
}

// A member served from its persisted view (after a restart) shows Stale
// but asserts no identity until it syncs in this process.
func TestRestoredMemberAssertsNothing(t *testing.T) {
	e := localcluster.Require(t, env)
	kc, err := KubeconfigPolicy{}.ParseKubeconfig(e.Cluster("member1").Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	c, err := newCluster("restored", "ns/members", kc, WatchScope{}, clusterDeps{sink: newRecordingSink(), timeout: time.Minute, log: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	c.servePersisted(time.Now(), nil)
	if synced, st := c.identitySynced(); synced || st != StateStale {
		t.Errorf("a member restored from its persisted view: synced %v, state %s; want not synced, Stale", synced, st)
	}
}
