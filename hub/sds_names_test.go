package hub

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/sds"
	"github.com/hubmesh/hub/internal/xdstest"
)

// listerSecrets looks Secrets up as clusters' secret controller does: with
// client-go's Secret lister over an informer-style indexer.
type listerSecrets struct{ lister corelisters.SecretLister }

func newListerSecrets(t *testing.T, secrets ...*corev1.Secret) listerSecrets {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, s := range secrets {
		if err := idx.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	return listerSecrets{corelisters.NewSecretLister(idx)}
}

func (l listerSecrets) TLSSecret(_ string, key clusters.ServiceKey) (*clusters.TLSSecret, error) {
	s, err := l.lister.Secrets(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: %s", clusters.ErrSecretNotFound, key)
	}
	if err != nil {
		return nil, err
	}
	return &clusters.TLSSecret{Cert: s.Data["tls.crt"], Key: s.Data["tls.key"], CA: s.Data["ca.crt"]}, nil
}

// TestSDSNamesCannotEscapeTheirNamespace asks, as a workload allowed to
// list Secrets everywhere, for names whose namespace part is empty or whose
// name part holds a slash: a lister asked for namespace "" takes the name
// as a whole namespace/name key, which must not reach the hub's own
// namespace or CA material.
func TestSDSNamesCannotEscapeTheirNamespace(t *testing.T) {
	allowAll := AuthorizerFunc(func(context.Context, string, string, string, string) (bool, error) { return true, nil })
	secret := func(ns, name string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Data: map[string][]byte{"tls.crt": []byte("CERT"), "tls.key": []byte("KEY"), "ca.crt": []byte("CA")}}
	}
	src := newListerSecrets(t, secret("hub-system", "gw"), secret("istio-system", "cacerts"),
		secret("istio-system", "istio-ca-secret"), secret("a", "gw"), secret("b", "gw"))
	s := startSecureHub(t, Options{Namespace: "hub-system", Authorizer: allowAll, Secrets: src})
	forbidden := []string{
		"kubernetes:///hub-system/gw", "kubernetes:///hub-system/gw-cacert",
		"kubernetes:///istio-system/cacerts", "kubernetes:///istio-system/cacerts-cacert",
		"kubernetes:///istio-system/istio-ca-secret", "kubernetes://a/../hub-system/gw",
		"/hub-system/gw", "kubernetes://b/gw/", "kubernetes://", "kubernetes:///", "kubernetes://b/",
	}
	names := append([]string{"kubernetes://gw", "kubernetes://b/gw"}, forbidden...)
	c := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west")))
	c.Send(t, sdsRequest("a-proxy", "west", names...))
	got := secretsOf(t, c, names)
	for _, name := range forbidden {
		if got[name] != nil {
			t.Errorf("served %s", name)
		}
	}
	for _, name := range []string{"kubernetes://gw", "kubernetes://b/gw"} {
		if got[name] == nil {
			t.Errorf("%s was not served: %v", name, keys(got))
		}
	}
}

// TestSDSOtherNamespacesAreBounded: one subscription naming Secrets of 100
// other namespaces makes the hub ask the member about at most
// sds.MaxOtherNamespaces of them (each is an access review); the names beyond
// are withheld, the others served.
func TestSDSOtherNamespacesAreBounded(t *testing.T) {
	var mu sync.Mutex
	asked := map[string]bool{}
	allowAll := AuthorizerFunc(func(_ context.Context, _, _, _, ns string) (bool, error) {
		mu.Lock()
		asked[ns] = true
		mu.Unlock()
		return true, nil
	})
	var secrets []*corev1.Secret
	var names []string
	for i := range 100 {
		ns := fmt.Sprintf("ns-%03d", i)
		secrets = append(secrets, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gw"},
			Data: map[string][]byte{"tls.crt": []byte("CERT"), "tls.key": []byte("KEY")}})
		names = append(names, "kubernetes://"+ns+"/gw")
	}
	s := startSecureHub(t, Options{Authorizer: allowAll, Secrets: newListerSecrets(t, secrets...)})
	c := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west")))
	c.Send(t, sdsRequest("many", "west", names...))
	got := secretsOf(t, c, names)
	mu.Lock()
	n := len(asked)
	mu.Unlock()
	if n != sds.MaxOtherNamespaces || len(got) != sds.MaxOtherNamespaces {
		t.Errorf("asked about %d namespaces and served %d Secrets; want %d of each", n, len(got), sds.MaxOtherNamespaces)
	}
}

// TestSDSCACertNames: kubernetes://<name>-cacert serves, as istiod does, the
// CA of a Secret named <name>-cacert when there is one (Istio's separate CA
// Secret for gateway mTLS), else the ca.crt of <name>.
func TestSDSCACertNames(t *testing.T) {
	secret := func(name, ca string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name},
			Data: map[string][]byte{"tls.crt": []byte("CERT"), "tls.key": []byte("KEY"), "ca.crt": []byte(ca)}}
	}
	src := newListerSecrets(t, secret("gw", "GW-CA"), secret("gw-cacert", "SEPARATE-CA"), secret("solo", "SOLO-CA"))
	s := startSecureHub(t, Options{Secrets: src})
	names := []string{"kubernetes://gw-cacert", "kubernetes://solo-cacert"}
	c := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west")))
	c.Send(t, sdsRequest("ca", "west", names...))
	got := secretsOf(t, c, names)
	for name, want := range map[string]string{"kubernetes://gw-cacert": "SEPARATE-CA", "kubernetes://solo-cacert": "SOLO-CA"} {
		if ca := string(got[name].GetValidationContext().GetTrustedCa().GetInlineBytes()); ca != want {
			t.Errorf("%s: CA %q; want %q", name, ca, want)
		}
	}
}
