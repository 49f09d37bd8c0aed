package clusters

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

// syncRecorder records, for every SecretsSynced of a member, which of the
// member's clients was active when it was told (TLSSecret reads that one).
type syncRecorder struct {
	r  *Registry
	mu sync.Mutex
	// active are the kubeconfig hashes of the active client at each
	// SecretsSynced, by member.
	active map[string][][32]byte
}

func (s *syncRecorder) SecretChanged(string, ServiceKey) {}

func (s *syncRecorder) SecretsSynced(cluster string) {
	s.r.mu.Lock()
	var h [32]byte
	if m := s.r.members[cluster]; m != nil {
		h = m.active.api.hash
	}
	s.r.mu.Unlock()
	s.mu.Lock()
	s.active[cluster] = append(s.active[cluster], h)
	s.mu.Unlock()
}

func (s *syncRecorder) toldWhileActive(cluster string, h [32]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.active[cluster] {
		if a == h {
			return true
		}
	}
	return false
}

// TestRotationReportsSecretsOfTheNewClient: when a member switches to a new
// kubeconfig, its Secrets are read from the new client from then on, so
// SDS must be told to evaluate them again once the new client is active.
// (The new client's Secret cache may sync before the switch, while the old
// client, whose cache may be stale — its credentials were rotated away —
// still answers TLSSecret.)
func TestRotationReportsSecretsOfTheNewClient(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := context.Background()
	ns := "hub-" + rand.String(6)
	home := kube(t, e.Cluster("home"))
	if err := localcluster.EnsureNamespace(ctx, home, ns); err != nil {
		t.Fatal(err)
	}
	rec := &syncRecorder{active: map[string][][32]byte{}}
	r, err := NewRegistry(Config{Home: e.Cluster("home").RESTConfig(), HomeID: "home", Namespace: ns, SyncTimeout: 30 * time.Second, Sink: newRecordingSink(), SecretEvents: rec})
	if err != nil {
		t.Fatal(err)
	}
	rec.r = r
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- r.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	m1 := e.Cluster("member1")
	secrets := home.CoreV1().Secrets(ns)
	if _, err := secrets.Create(ctx, localcluster.RemoteSecret(ns, "s", map[string][]byte{"m1": m1.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, wantState(r, "m1", ns+"/s", StateReady, ""))
	activeHash := func() [32]byte {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.members["m1"].active.api.hash
	}
	before := activeHash()
	eventually(t, 30*time.Second, func() error {
		if !rec.toldWhileActive("m1", before) {
			return fmt.Errorf("no SecretsSynced for the first client")
		}
		return nil
	})

	fresh, err := m1.NewCertKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	cur, err := secrets.Get(ctx, "s", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Data["m1"] = fresh
	if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if activeHash() == before {
			return fmt.Errorf("still on the old kubeconfig")
		}
		return nil
	})
	eventually(t, 10*time.Second, func() error {
		if !rec.toldWhileActive("m1", activeHash()) {
			return fmt.Errorf("SecretsSynced was never reported while the new client was active: SDS keeps what the old client served")
		}
		return nil
	})
}
