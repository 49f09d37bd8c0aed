package trust

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/hubmesh/hub/internal/expiry"
	"github.com/hubmesh/hub/internal/wait"
)

// intermediateUntil is an intermediate CA signed by root that expires at notAfter.
func intermediateUntil(t *testing.T, root *CA, notAfter time.Time) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "hub intermediate"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}, root.Cert, &key.PublicKey, root.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{TrustDomain: root.TrustDomain, Cert: cert, Key: key}
}

// gauges gathers the values of the named metric families, by label string.
func gauges(t *testing.T, reg *prometheus.Registry, names ...string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, n := range names {
			if f.GetName() != n {
				continue
			}
			for _, m := range f.GetMetric() {
				key := n
				for _, l := range m.GetLabel() {
					key += fmt.Sprintf("{%s=%q}", l.GetName(), l.GetValue())
				}
				out[key] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// eventsOn lists the Events of ns about the object named name, by reason.
func eventsOn(t *testing.T, cs kubernetes.Interface, ns, name string) map[string][]corev1.Event {
	t.Helper()
	list, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]corev1.Event{}
	for _, ev := range list.Items {
		out[ev.Reason] = append(out[ev.Reason], ev)
	}
	return out
}

// TestCAAndPeerBundleExpiry: with Istio's plugged-in CA (a root valid for
// a year, an intermediate that expires in three days) and a peer whose
// bundle's root expires in two, the metrics are the real certificates'
// notAfter and the peer's last refresh, the trust domains' status grades
// them against the 7-day window, and the leader records a Warning Event
// on the cacerts Secret (the intermediate: CAExpiring) and on the peer's
// ConfigMap (PeerBundleExpiring), once each, none for the root.
func TestCAAndPeerBundleExpiry(t *testing.T) {
	cs, ns := homeNamespace(t)
	ctx := context.Background()
	td := spiffeid.RequireTrustDomainFromString("local.example")
	root, err := NewSelfSignedCA(td, 365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	inter := intermediateUntil(t, root, time.Now().Add(3*24*time.Hour).Truncate(time.Second))
	keyPEM, err := encodeKey(inter.Key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: PluggedCASecret}, Data: map[string][]byte{
		"ca-cert.pem": encodeCerts([]*x509.Certificate{inter.Cert}), "ca-key.pem": keyPEM,
		"root-cert.pem":  encodeCerts([]*x509.Certificate{root.Cert}),
		"cert-chain.pem": encodeCerts([]*x509.Certificate{inter.Cert, root.Cert}),
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	peerTD := spiffeid.RequireTrustDomainFromString("peer.example")
	peer := newBundlePeer(t, peerTD)
	peerCA, err := NewSelfSignedCA(peerTD, 2*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	peer.serve(t, peerCA, 1)

	f := New(Config{Client: cs, Namespace: ns, TrustDomain: td})
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(f.Collector())
	runFederation(t, f)
	if _, err := f.ApplyPeer(ctx, peer.spec()); err != nil {
		t.Fatal(err)
	}
	waitReady(t, f, peerTD, peerCA)

	st, err := f.TrustDomain(peerTD.Name())
	if err != nil {
		t.Fatal(err)
	}
	got := gauges(t, metrics, "citadel_server_root_cert_expiry_timestamp", "citadel_server_cert_chain_expiry_timestamp",
		"hub_trust_peer_bundle_last_refresh_timestamp_seconds", "hub_trust_peer_bundle_expiry_timestamp_seconds")
	want := map[string]float64{
		"citadel_server_root_cert_expiry_timestamp":                                         float64(root.Cert.NotAfter.Unix()),
		"citadel_server_cert_chain_expiry_timestamp":                                        float64(inter.Cert.NotAfter.Unix()),
		`hub_trust_peer_bundle_last_refresh_timestamp_seconds{trust_domain="peer.example"}`: float64(st.LastSuccess.Unix()),
		`hub_trust_peer_bundle_expiry_timestamp_seconds{trust_domain="peer.example"}`:       float64(peerCA.Cert.NotAfter.Unix()),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("metrics %v; want %v", got, want)
	}

	local := f.TrustDomains()[0]
	if local.CA == nil || local.CA.Root.Level != expiry.Valid || !local.CA.Root.NotAfter.Equal(root.Cert.NotAfter) ||
		local.CA.Chain.Level != expiry.Expiring || !local.CA.Chain.NotAfter.Equal(inter.Cert.NotAfter) || local.CA.Secret != ns+"/"+PluggedCASecret {
		t.Errorf("our CA's expiry %+v", local.CA)
	}
	if st.BundleExpiry.Level != expiry.Expiring || !st.BundleExpiry.NotAfter.Equal(peerCA.Cert.NotAfter) {
		t.Errorf("peer bundle expiry %+v", st.BundleExpiry)
	}

	wait.Until(t, 30*time.Second, func() error {
		ca := eventsOn(t, cs, ns, PluggedCASecret)
		p := eventsOn(t, cs, ns, PeerConfigMapName(peerTD))
		if len(ca[ReasonCAExpiring]) != 1 || len(p[ReasonPeerBundleExpiring]) != 1 {
			return fmt.Errorf("Events on cacerts %v, on the peer's ConfigMap %v", ca, p)
		}
		return nil
	})
	caEv := eventsOn(t, cs, ns, PluggedCASecret)[ReasonCAExpiring][0]
	if caEv.Type != corev1.EventTypeWarning || caEv.Count != 1 || !strings.Contains(caEv.Message, "signing certificate chain") ||
		!strings.Contains(caEv.Message, `"CN=hub intermediate"`) || !strings.Contains(caEv.Message, "expires at "+inter.Cert.NotAfter.UTC().Format(time.RFC3339)) {
		t.Errorf("CA Event %+v", caEv)
	}
	peerEv := eventsOn(t, cs, ns, PeerConfigMapName(peerTD))[ReasonPeerBundleExpiring][0]
	if !strings.Contains(peerEv.Message, "trust domain peer.example") || !strings.Contains(peerEv.Message, "expires at "+peerCA.Cert.NotAfter.UTC().Format(time.RFC3339)) {
		t.Errorf("peer Event %+v", peerEv)
	}
}

// TestExpiredCAReportedAsExpired: a CA whose root and chain have expired
// is graded Expired, warned of once as CAExpired (not as expiring), and
// nothing panics; a follower warns of nothing.
func TestExpiredCAReportedAsExpired(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("local.example")
	ca, err := NewSelfSignedCA(td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leading := false
	f := New(Config{Namespace: "hub", TrustDomain: td, IsLeader: func() bool { return leading }})
	f.local = &caState{ca: ca, roots: []*x509.Certificate{ca.Cert}, current: 1, secret: StateSecret, sequence: 1}
	later := ca.Cert.NotAfter.Add(time.Hour)
	rec := record.NewFakeRecorder(10)
	f.checkExpiry(rec, later)
	if len(rec.Events) != 0 {
		t.Fatalf("a follower recorded %d Events", len(rec.Events))
	}
	leading = true
	for range 3 {
		f.checkExpiry(rec, later)
	}
	if len(rec.Events) != 2 { // root and chain: the same certificate here
		t.Fatalf("%d Events; want 2", len(rec.Events))
	}
	for range 2 {
		if ev := <-rec.Events; !strings.HasPrefix(ev, "Warning "+ReasonCAExpired+" trust domain local.example: our CA's") || !strings.Contains(ev, "expired at") || !strings.Contains(ev, "(1h ago)") {
			t.Errorf("Event %q", ev)
		}
	}
	got, ok := f.CAExpiry(later)
	if !ok || got.Root.Level != expiry.Expired || got.Chain.Level != expiry.Expired || got.Secret != "hub/"+StateSecret {
		t.Errorf("CAExpiry = %+v, %v", got, ok)
	}
}
