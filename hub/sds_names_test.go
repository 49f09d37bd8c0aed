package hub

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/hubmesh/hub/clusters"
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
	c := dialADS(t, s.secure, s.workload(t, s.ca, "a", "west"))
	c.send(t, sdsRequest("a-proxy", "west", names...))
	got := c.secretsOf(t, names)
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
