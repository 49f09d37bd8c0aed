package clusters

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/hubmesh/hub/internal/expiry"
	"github.com/hubmesh/hub/internal/localcluster"
)

// adminTokenKubeconfig is a kubeconfig of c holding a cluster-admin
// TokenRequest token that expires after ttl, and that expiry.
func adminTokenKubeconfig(t *testing.T, c *localcluster.Cluster, ttl time.Duration) ([]byte, time.Time) {
	t.Helper()
	kc, exp, cleanup, err := c.AdminTokenKubeconfig(context.Background(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	return kc, exp
}

// kubeconfigToken is the bearer token of a kubeconfig's current user.
func kubeconfigToken(t *testing.T, kubeconfig []byte) string {
	t.Helper()
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo].Token
}

// kubeconfigCertExpiry is the notAfter of the client certificate of a
// kubeconfig's current user.
func kubeconfigCertExpiry(t *testing.T, kubeconfig []byte) time.Time {
	t.Helper()
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	na, ok := ClientCertificateExpiry(cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo].ClientCertificateData)
	if !ok {
		t.Fatal("kubeconfig has no client certificate")
	}
	return na
}

// TestCredentialExpiryOnRealMembers registers members on real API servers
// with TokenRequest tokens that expire in 3 days (inside the 7-day warning
// window) and in 30 days (outside), a 24-hour client certificate, and a
// JWT that expired an hour ago: the metric is each credential's expiry,
// the status grades it, and Warning Events on the remote Secret name the
// members inside the window (CredentialExpiring) and the expired one
// (CredentialExpired), never the one outside and never any credential.
func TestCredentialExpiryOnRealMembers(t *testing.T) {
	e := localcluster.Require(t, env)
	metrics := prometheus.NewRegistry()
	r, ns := startRegistryWith(t, func(c *Config) { c.Metrics, c.SyncTimeout = metrics, 30*time.Second })
	ctx := context.Background()
	home := kube(t, e.Cluster("home"))
	m1 := e.Cluster("member1")

	shortKC, shortExp := adminTokenKubeconfig(t, m1, 3*24*time.Hour)
	longKC, longExp := adminTokenKubeconfig(t, m1, 30*24*time.Hour)
	short, long := kubeconfigToken(t, shortKC), kubeconfigToken(t, longKC)
	certKC, err := e.Cluster("member2").NewCertKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	certExp := kubeconfigCertExpiry(t, certKC)
	pastExp := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	forged := jwt(jwtHeader, fmt.Sprintf(`{"exp":%d,"sub":"system:serviceaccount:x:y"}`, pastExp.Unix()))
	for name, got := range map[string]time.Time{"3-day token": shortExp, "30-day token": longExp} {
		if exp, ok, err := TokenExpiry(map[string]string{"3-day token": short, "30-day token": long}[name]); err != nil || !ok || !exp.Equal(got) {
			t.Fatalf("%s: exp claim %v (%v, %v); the API server says %v", name, exp, ok, err, got)
		}
	}

	secret := localcluster.RemoteSecret(ns, "s", map[string][]byte{
		"short":   shortKC,
		"long":    longKC,
		"cert":    certKC,
		"expired": m1.TokenKubeconfig(forged),
	})
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ref := ns + "/s"
	for _, id := range []string{"short", "long", "cert"} {
		eventually(t, 60*time.Second, wantState(r, id, ref, StateReady, ""))
	}

	// Status: each credential graded.
	for id, want := range map[string]CredentialExpiry{
		"short":   {Credential: CredentialToken, NotAfter: shortExp, Level: expiry.Expiring},
		"long":    {Credential: CredentialToken, NotAfter: longExp, Level: expiry.Valid},
		"cert":    {Credential: CredentialClientCertificate, NotAfter: certExp, Level: expiry.Expiring},
		"expired": {Credential: CredentialToken, NotAfter: pastExp, Level: expiry.Expired},
	} {
		st, ok := statusOf(r, id, ref)
		if !ok || len(st.Credentials) != 1 || st.Credentials[0] != want {
			t.Errorf("%s: credentials %+v; want %+v", id, st.Credentials, want)
		}
	}
	if st, _ := r.Cluster("home"); len(st.Credentials) != 0 {
		t.Errorf("home cluster credentials %+v; want none", st.Credentials)
	}

	// Metrics: the expiry of each credential, in Unix seconds.
	families, err := metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() == "hub_member_credential_expiry_timestamp_seconds" {
			for _, m := range f.GetMetric() {
				got[labelString(m)] = m.GetGauge().GetValue()
			}
		}
	}
	want := map[string]float64{
		`{cluster="short",credential="token"}`:             float64(shortExp.Unix()),
		`{cluster="long",credential="token"}`:              float64(longExp.Unix()),
		`{cluster="cert",credential="client_certificate"}`: float64(certExp.Unix()),
		`{cluster="expired",credential="token"}`:           float64(pastExp.Unix()),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("hub_member_credential_expiry_timestamp_seconds = %v; want %v", got, want)
	}

	// Events on the remote Secret: inside the window and expired, once each.
	var reasons map[string][]corev1.Event
	eventually(t, 30*time.Second, func() error {
		evs, err := home.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "s").String()})
		if err != nil {
			return err
		}
		reasons = map[string][]corev1.Event{}
		for _, ev := range evs.Items {
			reasons[ev.Reason] = append(reasons[ev.Reason], ev)
		}
		if len(reasons[ReasonCredentialExpiring]) != 2 || len(reasons[ReasonCredentialExpired]) != 1 {
			return fmt.Errorf("%d %s and %d %s Events; want 2 and 1", len(reasons[ReasonCredentialExpiring]), ReasonCredentialExpiring, len(reasons[ReasonCredentialExpired]), ReasonCredentialExpired)
		}
		return nil
	})
	expiring := map[string]string{}
	for _, ev := range reasons[ReasonCredentialExpiring] {
		id := strings.TrimSuffix(strings.Fields(ev.Message)[1], ":")
		expiring[id] = ev.Message
		if ev.Type != corev1.EventTypeWarning || ev.Count != 1 {
			t.Errorf("%s Event %+v", ReasonCredentialExpiring, ev)
		}
	}
	if !strings.Contains(expiring["short"], "bearer token") || !strings.Contains(expiring["short"], shortExp.Format(time.RFC3339)) || !strings.Contains(expiring["short"], "(in 2d)") {
		t.Errorf("Event for short: %q", expiring["short"])
	}
	if !strings.Contains(expiring["cert"], "client certificate") || !strings.Contains(expiring["cert"], certExp.Format(time.RFC3339)) {
		t.Errorf("Event for cert: %q", expiring["cert"])
	}
	if msg := reasons[ReasonCredentialExpired][0].Message; !strings.Contains(msg, "cluster expired:") || !strings.Contains(msg, "expired at "+pastExp.Format(time.RFC3339)) {
		t.Errorf("%s Event: %q", ReasonCredentialExpired, msg)
	}
	for reason, evs := range reasons {
		for _, ev := range evs {
			if strings.HasPrefix(reason, "Credential") && strings.Contains(ev.Message, "cluster long") {
				t.Errorf("Event for a credential outside the window: %q", ev.Message)
			}
			for _, secretPart := range []string{short[len(short)-16:], long[len(long)-16:], forged[:16], "BEGIN"} {
				if strings.Contains(ev.Message, secretPart) {
					t.Errorf("Event %q leaks credential material", ev.Message)
				}
			}
		}
	}
}

// TestExpiryWarnsOncePerCrossing: checks repeated on every resync warn
// once when a credential enters the window and once when it expires, again
// for a rotated credential, and only on the leader; a follower that becomes
// leader warns of what it never warned of.
func TestExpiryWarnsOncePerCrossing(t *testing.T) {
	rec := record.NewFakeRecorder(100)
	leader := false
	notAfter := time.Date(2030, 1, 10, 0, 0, 0, 0, time.UTC)
	ref := &corev1.ObjectReference{Kind: "Secret", Namespace: "ns", Name: "s"}
	m := &member{secret: "ns/s", ref: ref, active: &Cluster{api: &memberAPI{credentials: []CredentialExpiry{{Credential: CredentialToken, NotAfter: notAfter}}}}}
	r := &Registry{cfg: Config{IsLeader: func() bool { return leader }}, log: slog.New(slog.DiscardHandler), recorder: rec,
		members: map[string]*member{"m": m}}
	events := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	day := 24 * time.Hour
	r.checkExpiry(notAfter.Add(-3 * day)) // a follower: nothing
	if evs := events(); len(evs) != 0 {
		t.Fatalf("follower recorded %v", evs)
	}
	leader = true
	for range 3 { // every resync
		r.checkExpiry(notAfter.Add(-3 * day))
	}
	if evs := events(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+ReasonCredentialExpiring+" cluster m: the bearer token") || !strings.Contains(evs[0], "(in 3d)") {
		t.Fatalf("entering the window: %q", evs)
	}
	r.checkExpiry(notAfter.Add(-day))
	if evs := events(); len(evs) != 0 {
		t.Fatalf("still in the window: %q", evs)
	}
	r.checkExpiry(notAfter.Add(time.Minute))
	r.checkExpiry(notAfter.Add(time.Hour))
	if evs := events(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+ReasonCredentialExpired+" cluster m: the bearer token of its kubeconfig expired at 2030-01-10T00:00:00Z") {
		t.Fatalf("expiring: %q", evs)
	}
	// A new kubeconfig whose token is outside the window: nothing; then it
	// enters the window: one warning.
	r.mu.Lock()
	m.active = &Cluster{api: &memberAPI{credentials: []CredentialExpiry{{Credential: CredentialToken, NotAfter: notAfter.Add(30 * day)}}}}
	r.mu.Unlock()
	r.checkExpiry(notAfter.Add(time.Hour))
	if evs := events(); len(evs) != 0 {
		t.Fatalf("rotated, outside the window: %q", evs)
	}
	r.checkExpiry(notAfter.Add(25 * day))
	if evs := events(); len(evs) != 1 || !strings.Contains(evs[0], ReasonCredentialExpiring) {
		t.Fatalf("rotated credential entering the window: %q", evs)
	}
}
