package clusters

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

func TestSecretController(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := context.Background()
	ns := "hub-" + rand.String(6)
	home := kube(t, e.Cluster("home"))
	if err := localcluster.EnsureNamespace(ctx, home, ns); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	changed := map[string]int{}
	r, err := NewRegistry(Config{
		Home: e.Cluster("home").RESTConfig(), HomeID: "home", Namespace: ns, SyncTimeout: 30 * time.Second, Sink: newRecordingSink(),
		SecretEvents: secretEventsFunc(func(cluster string, key ServiceKey) {
			mu.Lock()
			changed[cluster+"/"+key.String()]++
			mu.Unlock()
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- r.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	m1, m2 := e.Cluster("member1"), e.Cluster("member2")
	appNS := "app-" + rand.String(6)
	m1c := kube(t, m1)
	if err := localcluster.EnsureNamespace(ctx, m1c, appNS); err != nil {
		t.Fatal(err)
	}
	tlsSecret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "gw-cert", Namespace: appNS},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"tls.crt": []byte("CERT-1"), "tls.key": []byte("KEY-1"), "ca.crt": []byte("CA-1")},
	}
	generic := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "generic", Namespace: appNS},
		Data:       map[string][]byte{"cert": []byte("GCERT"), "key": []byte("GKEY"), "cacert": []byte("GCA"), "password": []byte("hunter2")},
	}
	for _, s := range []*corev1.Secret{tlsSecret, generic} {
		if _, err := m1c.CoreV1().Secrets(appNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// member2 is registered with a service account that may read endpoints
	// but not Secrets: it still federates, and its secrets are "not synced".
	limited := limitedKubeconfig(t, m2)
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "s", map[string][]byte{"m1": m1.Kubeconfig(), "m2": limited}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, wantState(r, "m1", ns+"/s", StateReady, ""))
	eventually(t, 30*time.Second, wantState(r, "m2", ns+"/s", StateReady, ""))

	tlsKey := ServiceKey{Namespace: appNS, Name: "gw-cert"}
	eventually(t, 10*time.Second, func() error {
		got, err := r.TLSSecret("m1", tlsKey)
		if err != nil {
			return err
		}
		if string(got.Cert) != "CERT-1" || string(got.Key) != "KEY-1" || string(got.CA) != "CA-1" {
			return fmt.Errorf("got %q %q %q", got.Cert, got.Key, got.CA)
		}
		return nil
	})
	got, err := r.TLSSecret("m1", ServiceKey{Namespace: appNS, Name: "generic"})
	if err != nil || string(got.Cert) != "GCERT" || string(got.Key) != "GKEY" || string(got.CA) != "GCA" {
		t.Errorf("generic secret = %+v, %v", got, err)
	}
	// Only TLS keys are cached.
	r.mu.Lock()
	c := r.members["m1"].active
	r.mu.Unlock()
	cached, _ := c.secrets.lister.Secrets(appNS).Get("generic")
	if _, ok := cached.Data["password"]; ok || len(cached.Annotations) > 0 {
		t.Errorf("the cache holds more than TLS keys: %v", cached.Data)
	}

	if _, err := r.TLSSecret("m1", ServiceKey{Namespace: appNS, Name: "nope"}); !errors.Is(err, ErrSecretNotFound) {
		t.Errorf("missing secret: %v", err)
	}
	if _, err := r.TLSSecret("m2", tlsKey); !errors.Is(err, ErrSecretsNotSynced) {
		t.Errorf("member without secret access: %v; want ErrSecretsNotSynced", err)
	}
	if _, err := r.TLSSecret("nowhere", tlsKey); !errors.Is(err, ErrUnknownCluster) {
		t.Errorf("unknown cluster: %v", err)
	}

	// An update is noticed and served.
	tlsSecret.Data["tls.crt"] = []byte("CERT-2")
	if _, err := m1c.CoreV1().Secrets(appNS).Update(ctx, tlsSecret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		mu.Lock()
		n := changed["m1/"+tlsKey.String()]
		mu.Unlock()
		got, err := r.TLSSecret("m1", tlsKey)
		if err != nil || string(got.Cert) != "CERT-2" || n < 2 {
			return fmt.Errorf("after update: %v %v, %d notifications", got, err, n)
		}
		return nil
	})
}

// limitedKubeconfig creates a service account in c that may read Services,
// EndpointSlices and Nodes but not Secrets, and returns a kubeconfig with a
// token for it.
func limitedKubeconfig(t *testing.T, c *localcluster.Cluster) []byte {
	t.Helper()
	ctx := context.Background()
	cs := kube(t, c)
	name := "hub-reader-" + rand.String(5)
	if err := localcluster.EnsureNamespace(ctx, cs, "hub-system"); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts("hub-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: "hub-system"}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := cs.CoreV1().ServiceAccounts("hub-system").CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrInt64(3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c.TokenKubeconfig(tok.Status.Token)
}

func ptrInt64(v int64) *int64 { return &v }

// secretEventsFunc counts a Secret cache's sync as a change of the zero key.
type secretEventsFunc func(cluster string, key ServiceKey)

func (f secretEventsFunc) SecretChanged(cluster string, key ServiceKey) { f(cluster, key) }
func (f secretEventsFunc) SecretsSynced(cluster string)                 { f(cluster, ServiceKey{}) }
