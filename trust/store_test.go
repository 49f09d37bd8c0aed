package trust

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
)

var env *localcluster.Env

func TestMain(m *testing.M) { localcluster.RunTests(m, &env, "home") }

// TestCAPersistedOnce starts several replicas at once against one home
// cluster: all converge on one root, a restart keeps it, and plugging in a
// new CA keeps the old root in the bundle and raises the sequence.
func TestCAPersistedOnce(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(e.Cluster("home").RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ns := "trust-" + rand.String(6)
	if err := localcluster.EnsureNamespace(ctx, cs, ns); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("example.org")
	replicas := make([]*Federation, 4)
	var wg sync.WaitGroup
	for i := range replicas {
		replicas[i] = New(Config{Client: cs, Namespace: ns, TrustDomain: td})
		wg.Go(func() {
			if err := replicas[i].Start(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	first, _ := replicas[0].LocalBundle()
	for i, r := range replicas {
		b, _ := r.LocalBundle()
		if !b.Equal(first) {
			t.Fatalf("replica %d has another bundle", i)
		}
	}
	if seq, _ := first.SequenceNumber(); seq != 1 || len(first.X509Authorities()) != 1 {
		t.Fatalf("first bundle: sequence %d, %d roots", seq, len(first.X509Authorities()))
	}
	restarted := New(Config{Client: cs, Namespace: ns, TrustDomain: td})
	if err := restarted.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := restarted.LocalBundle(); !b.Equal(first) {
		t.Fatal("a restart changed the root")
	}

	// Plug in a new CA (Istio's cacerts).
	ca, _ := NewSelfSignedCA(td, 24*time.Hour)
	keyDER, _ := x509.MarshalPKCS8PrivateKey(ca.Key)
	rootPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: PluggedCASecret}, Data: map[string][]byte{
		"ca-cert.pem": rootPEM, "ca-key.pem": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), "root-cert.pem": rootPEM,
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := restarted.Start(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ := restarted.LocalBundle()
	if seq, _ := b.SequenceNumber(); seq != 2 || !b.HasX509Authority(ca.Cert) || !b.HasX509Authority(first.X509Authorities()[0]) {
		t.Fatalf("after rotation: sequence %d, roots %d; want 2 with the new and the old root", seq, len(b.X509Authorities()))
	}
	svid, err := restarted.IssueSVID(spiffeid.RequireFromPath(td, "/ns/a/sa/b"), time.Hour)
	if err != nil || svid.Certificates[0].CheckSignatureFrom(ca.Cert) != nil {
		t.Fatalf("SVIDs must now be signed by the plugged-in CA: %v", err)
	}
}
