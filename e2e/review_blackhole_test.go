package e2e

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/xdstest"
)

// sdsWatch is an SDS stream held open: it ACKs every response and keeps
// what it received.
type sdsWatch struct {
	mu        sync.Mutex
	responses []map[string]string // per response: name → certificate chain
}

func openSDS(t *testing.T, addr string, creds credentials.TransportCredentials, cluster, id string, names ...string) *sdsWatch {
	t.Helper()
	w := &sdsWatch{}
	first := &discoveryv3.DiscoveryRequest{Node: xdstest.Node(id, cluster), TypeUrl: resourcev3.SecretType, ResourceNames: names}
	xdstest.Answer(t, xdstest.Dial(t, addr, grpc.WithTransportCredentials(creds)), first, func(resp *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
		got := map[string]string{}
		for _, a := range resp.Resources {
			var s tlsv3.Secret
			if a.UnmarshalTo(&s) == nil {
				got[s.Name] = string(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
			}
		}
		w.mu.Lock()
		w.responses = append(w.responses, got)
		w.mu.Unlock()
		return xdstest.ACK(resp, names...)
	})
	return w
}

// answered is how many responses the stream got; last is the newest.
func (w *sdsWatch) answered() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.responses)
}

func (w *sdsWatch) last() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.responses) == 0 {
		return nil
	}
	return w.responses[len(w.responses)-1]
}

// TestBlackholedMemberDelaysNoPush (issue 13, deliverable 3): proxies of a
// member whose API server stops answering (SIGSTOP) ask for Secrets of
// another namespace, which needs a SubjectAccessReview in that member.
// While those reviews hang, Secret rotations and endpoint changes of
// another member still reach their proxies: every EDS update arrives while
// the review asked just before it is still pending (the proxy that needs it
// has not been answered). The same rounds run first with the member
// answering, for comparison; their latencies are logged side by side. When
// the member answers again, the waiting proxies get their Secrets.
func TestBlackholedMemberDelaysNoPush(t *testing.T) {
	t.Parallel()
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home := e.Cluster("primary")
	// Members of their own, so freezing one touches no other test.
	members, err := localcluster.Start(ctx, localcluster.Options{Names: []string{"bh-steady", "bh-black"}, BinDir: os.Getenv("HUB_K8S_BIN_DIR")})
	if err != nil {
		t.Fatalf("starting the member clusters: %v", err)
	}
	t.Cleanup(members.Stop)
	steady, black := members.Cluster("bh-steady"), members.Cluster("bh-black")
	t.Cleanup(func() { _ = black.ResumeAPIServer() }) // runs before Stop

	const app, other = "app", "other"
	tlsSecret := func(ns, cert string) *corev1.Secret {
		// Opaque: the API server would warn about a kubernetes.io/tls
		// Secret whose data is not PEM.
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gw-cert"}, Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"tls.crt": []byte(cert), "tls.key": []byte("KEY")}}
	}
	// In the black member, every service account of app may list Secrets
	// of other: a proxy of app gets other's gw-cert once its review says so.
	bc := client(t, black)
	for _, ns := range []string{app, other} {
		if err := localcluster.EnsureNamespace(ctx, bc, ns); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := bc.CoreV1().Secrets(other).Create(ctx, tlsSecret(other, "BLACK-CERT"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bc.RbacV1().Roles(other).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "secret-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bc.RbacV1().RoleBindings(other).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "app-reads"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "secret-reader"},
		Subjects: []rbacv1.Subject{{Kind: "Group", Name: "system:serviceaccounts:" + app}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The steady member has a service and a Secret that rotate.
	sc := client(t, steady)
	if err := localcluster.EnsureNamespace(ctx, sc, app); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.CoreV1().Secrets(app).Create(ctx, tlsSecret(app, "ROT-0"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	backends := func(n int) []localcluster.Backend {
		out := make([]localcluster.Backend, n)
		for i := range out {
			out[i] = localcluster.Backend{IP: fmt.Sprintf("10.77.0.%d", i+1), Port: 8080}
		}
		return out
	}
	if err := localcluster.ApplyService(ctx, sc, app, "echo", "grpc", 7070, backends(1)); err != nil {
		t.Fatal(err)
	}

	ns := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		steady.Name: steady.Kubeconfig(), black.Name: black.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("blackhole.test")
	// Reviews the frozen member holds never time out during the test: a
	// proxy that needs one is answered only once the member answers,
	// however long a round takes on this machine.
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0", "--access-review-timeout", "30m")
	eventually(t, 60*time.Second, func() error {
		cl := h.clusters(t)
		if cl[steady.Name].State != "Ready" || cl[black.Name].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})
	ca := hubCA(t, home, ns, td)
	workload := workloadCreds(t, ca, h.bundle(t, td))
	creds := func(sa, member string) credentials.TransportCredentials { return workload(app, sa, member) }
	tlsAddr := h.addrs["xds-tls"]

	// A proxy of the steady member follows its own rotating Secret; an EDS
	// client follows its endpoints.
	rotating := openSDS(t, tlsAddr, creds("gateway", steady.Name), steady.Name, "steady-gateway", "kubernetes://gw-cert")
	eventually(t, 60*time.Second, func() error {
		if got := rotating.last()["kubernetes://gw-cert"]; got != "ROT-0" {
			return fmt.Errorf("the steady proxy holds %q", got)
		}
		return nil
	})
	eds := watchEDS(t, h.xdsAddr, fmt.Sprintf("outbound|7070||echo.%s.svc.cluster.local", app))
	endpoints := func() int {
		s := eds.snapshot()
		if len(s) == 0 {
			return -1
		}
		return s[len(s)-1][steady.Name]
	}
	eventually(t, 60*time.Second, func() error {
		if n := endpoints(); n != 1 {
			return fmt.Errorf("the EDS client holds %d endpoints of %s", n, steady.Name)
		}
		return nil
	})

	// One round: a new proxy of the black member asks for other's Secret
	// (a review no one asked before), then the steady member's Secret
	// rotates and its endpoints change. It returns how long the endpoint
	// change took to reach the EDS client and whether the new proxy had
	// been answered by then.
	step := 0
	round := func(phase string) (*sdsWatch, time.Duration, bool) {
		step++
		waiting := openSDS(t, tlsAddr, creds(fmt.Sprintf("%s-%d", phase, step), black.Name), black.Name,
			fmt.Sprintf("black-%s-%d", phase, step), "kubernetes://"+other+"/gw-cert")
		rotation := fmt.Sprint("ROT-", step)
		if _, err := sc.CoreV1().Secrets(app).Update(ctx, tlsSecret(app, rotation), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := localcluster.ApplyEndpoints(ctx, sc, app, "echo", "grpc", backends(step+1)); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, func() error {
			if n := endpoints(); n != step+1 {
				return fmt.Errorf("%s round %d: the EDS client holds %d endpoints; want %d", phase, step, n, step+1)
			}
			return nil
		})
		took := time.Since(start)
		answered := waiting.answered() > 0
		eventually(t, 60*time.Second, func() error {
			if got := rotating.last()["kubernetes://gw-cert"]; got != rotation {
				return fmt.Errorf("%s round %d: the steady proxy holds %q; want %s", phase, step, got, rotation)
			}
			return nil
		})
		return waiting, took, answered
	}
	served := func(w *sdsWatch) error {
		if got := w.last()["kubernetes://"+other+"/gw-cert"]; got != "BLACK-CERT" {
			return fmt.Errorf("a proxy of the black member holds %q; want BLACK-CERT", got)
		}
		return nil
	}

	const rounds = 3
	var baseline, blackholed []time.Duration
	for range rounds {
		w, took, _ := round("base")
		baseline = append(baseline, took)
		eventually(t, 60*time.Second, func() error { return served(w) })
	}

	if err := black.PauseAPIServer(); err != nil {
		t.Fatal(err)
	}
	var waiting []*sdsWatch
	for range rounds {
		w, took, answered := round("blackholed")
		blackholed = append(blackholed, took)
		waiting = append(waiting, w)
		if answered {
			t.Errorf("round %d: the proxy whose access review the frozen member holds was answered before the endpoint change arrived (took %s); "+
				"its review cannot have completed (the member is frozen, the review's timeout is 30m)", step, took.Round(time.Millisecond))
		}
	}
	t.Logf("endpoint change → EDS client: member answering %v; member blackholed %v", baseline, blackholed)
	for _, w := range waiting {
		if got := w.last()["kubernetes://"+other+"/gw-cert"]; got != "" {
			t.Errorf("a proxy of the frozen member got other's Secret %q without a review", got)
		}
	}

	// The member answers again: the reviews are retried and the waiting
	// proxies get their Secret.
	if err := black.ResumeAPIServer(); err != nil {
		t.Fatal(err)
	}
	for _, w := range waiting {
		eventually(t, 90*time.Second, func() error { return served(w) })
	}
}
