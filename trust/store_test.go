package trust

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"maps"
	"os"
	"strings"
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

func TestMain(m *testing.M) { os.Exit(localcluster.RunTests(m, &env, "home")) }

// TestCAPersistedOnce starts several replicas at once against one home
// cluster: all converge on one root, a restart keeps it, and plugging in a
// new CA keeps the old root in the bundle and raises the sequence.
func TestCAPersistedOnce(t *testing.T) {
	ctx := context.Background()
	cs, ns := homeNamespace(t)
	td := spiffeid.RequireTrustDomainFromString("example.org")
	replicas := make([]*Domains, 4)
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

// TestCorruptStoredCARefused: stored CA material that cannot be used makes
// Start fail with a *CorruptStateError that names the Secret and says what
// to do, and nothing is written: no new CA, the Secret untouched. Each
// case corrupts one part of a good hub-trust-state (or a plugged-in
// cacerts) in its own namespace.
func TestCorruptStoredCARefused(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(e.Cluster("home").RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("example.org")
	other, _ := NewSelfSignedCA(td, time.Hour)
	otherKey, _ := encodeKey(other.Key)
	garbageKey := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("not a key at all")})
	cases := []struct {
		name    string
		corrupt func(state map[string][]byte) (cacerts map[string][]byte)
		secret  string // the Secret named in the error
		what    string
	}{
		{"key garbage", func(s map[string][]byte) map[string][]byte { s["ca-key.pem"] = garbageKey; return nil }, StateSecret, "stored CA key"},
		{"key not PEM", func(s map[string][]byte) map[string][]byte { s["ca-key.pem"] = []byte("truncated"); return nil }, StateSecret, "stored CA key"},
		{"key missing", func(s map[string][]byte) map[string][]byte { delete(s, "ca-key.pem"); return nil }, StateSecret, "stored CA key"},
		{"key of another CA", func(s map[string][]byte) map[string][]byte { s["ca-key.pem"] = otherKey; return nil }, StateSecret, "stored CA key"},
		{"certificate garbage", func(s map[string][]byte) map[string][]byte {
			s["ca-cert.pem"] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("nope")})
			return nil
		}, StateSecret, "stored CA certificate"},
		{"certificate missing", func(s map[string][]byte) map[string][]byte { delete(s, "ca-cert.pem"); return nil }, StateSecret, "stored CA certificate"},
		{"roots garbage", func(s map[string][]byte) map[string][]byte {
			s["roots.pem"] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("nope")})
			return nil
		}, StateSecret, "stored roots"},
		{"sequence garbage", func(s map[string][]byte) map[string][]byte { s["sequence"] = []byte("seven"); return nil }, StateSecret, "stored bundle sequence"},
		{"cacerts key garbage", func(map[string][]byte) map[string][]byte {
			root := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: other.Cert.Raw})
			return map[string][]byte{"ca-cert.pem": root, "ca-key.pem": garbageKey, "root-cert.pem": root}
		}, PluggedCASecret, "plugged-in CA"},
		{"cacerts key of another CA", func(map[string][]byte) map[string][]byte {
			mine, _ := NewSelfSignedCA(td, time.Hour)
			root := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: mine.Cert.Raw})
			return map[string][]byte{"ca-cert.pem": root, "ca-key.pem": otherKey, "root-cert.pem": root}
		}, PluggedCASecret, "plugged-in CA"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := "trust-" + rand.String(6)
			if err := localcluster.EnsureNamespace(ctx, cs, ns); err != nil {
				t.Fatal(err)
			}
			secrets := cs.CoreV1().Secrets(ns)
			if err := New(Config{Client: cs, Namespace: ns, TrustDomain: td}).Start(ctx); err != nil {
				t.Fatal(err)
			}
			state, err := secrets.Get(ctx, StateSecret, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if cacerts := tc.corrupt(state.Data); cacerts != nil {
				if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: PluggedCASecret}, Data: cacerts}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			} else if _, err := secrets.Update(ctx, state, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			before, err := secrets.List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}

			f := New(Config{Client: cs, Namespace: ns, TrustDomain: td})
			err = f.Start(ctx)
			var corrupt *CorruptStateError
			if !errors.As(err, &corrupt) {
				t.Fatalf("Start = %v; want a *CorruptStateError", err)
			}
			msg := err.Error()
			wantPrefix := tc.what
			if !strings.HasPrefix(msg, wantPrefix) || !strings.Contains(msg, "in Secret "+ns+"/"+tc.secret+" is unreadable: ") {
				t.Errorf("error %q; want it to start with %q and name Secret %s/%s", msg, wantPrefix, ns, tc.secret)
			}
			if tc.secret == StateSecret && !strings.HasSuffix(msg, "; refusing to mint a new CA (delete the Secret to start over)") {
				t.Errorf("error %q does not say what the hub refuses and how to start over", msg)
			}
			if strings.Contains(msg, "-----BEGIN") || strings.Contains(msg, "not a key at all") || strings.Contains(msg, base64.StdEncoding.EncodeToString([]byte("not a key at all"))[:12]) {
				t.Errorf("error %q quotes stored key material", msg)
			}
			if _, err := f.LocalBundle(); err == nil {
				t.Error("a bundle is served after a refused start")
			}
			after, err := secrets.List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			versions := func(l *corev1.SecretList) map[string]string {
				out := map[string]string{}
				for _, s := range l.Items {
					out[s.Name] = s.ResourceVersion
				}
				return out
			}
			if b, a := versions(before), versions(after); !maps.Equal(a, b) {
				t.Errorf("Secrets changed by a refused start: before %v, after %v", b, a)
			}
		})
	}
}

// TestPluggedCAWithECParameters: an openssl-made cacerts key file that
// starts with an "EC PARAMETERS" block is read.
func TestPluggedCAWithECParameters(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	ca, _ := NewSelfSignedCA(td, time.Hour)
	der, err := x509.MarshalECPrivateKey(ca.Key.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	key := append(pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})...)
	root := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	got, roots, err := parsePlugged(td, map[string][]byte{"ca-cert.pem": root, "ca-key.pem": key, "root-cert.pem": root})
	if err != nil || !got.Cert.Equal(ca.Cert) || len(roots) != 1 {
		t.Fatalf("parsePlugged = %v, %d roots, %v", got, len(roots), err)
	}
}

// TestFollowerLoadsStoredCA: a replica that is not the leader loads the
// hub's stored CA even when the state's roots must change (here: a state
// with a CA but no roots or sequence yet), which only the leader writes.
// It used to fail with the "not found" of the absent cacerts Secret.
func TestFollowerLoadsStoredCA(t *testing.T) {
	ctx := context.Background()
	cs, ns := homeNamespace(t)
	td := spiffeid.RequireTrustDomainFromString("example.org")
	ca, err := NewSelfSignedCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := encodeKey(ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	secrets := cs.CoreV1().Secrets(ns)
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: StateSecret}, Data: map[string][]byte{
		"ca-cert.pem": encodeCerts([]*x509.Certificate{ca.Cert}), "ca-key.pem": keyPEM,
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := loadCA(ctx, secrets, ns, td, time.Now(), false)
	if err != nil {
		t.Fatalf("a follower could not load the stored CA: %v", err)
	}
	if !st.ca.Cert.Equal(ca.Cert) || st.sequence != 1 || len(st.roots) != 1 {
		t.Fatalf("loaded CA %v, sequence %d, %d roots; want the stored CA, sequence 1, its one root", st.ca.Cert.Subject, st.sequence, len(st.roots))
	}
	got, err := secrets.Get(ctx, StateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Data["roots.pem"]) != 0 || len(got.Data["sequence"]) != 0 {
		t.Error("a follower wrote the state; only the leader updates it")
	}
}
