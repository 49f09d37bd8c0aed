package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hubmesh/hub/internal/localcluster"
)

// labelNetwork puts a member's istio-system namespace on an Istio network
// until the test ends.
func labelNetwork(t *testing.T, c *localcluster.Cluster, network string) {
	t.Helper()
	ctx := testContext(t)
	kc := client(t, c)
	if err := localcluster.EnsureNamespace(ctx, kc, "istio-system"); err != nil {
		t.Fatal(err)
	}
	set := func(v string) error {
		ns, err := kc.CoreV1().Namespaces().Get(context.Background(), "istio-system", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		if v == "" {
			delete(ns.Labels, "topology.istio.io/network")
		} else {
			ns.Labels["topology.istio.io/network"] = v
		}
		_, err = kc.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{})
		return err
	}
	if err := set(network); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = set("") })
}

// meshPods creates pods labelled security.istio.io/tlsMode=istio (as
// Istio's injection labels them; no kubelet runs them) for the backends
// that name one.
func meshPods(t *testing.T, kc kubernetes.Interface, ns string, backends []localcluster.Backend, plain ...string) {
	t.Helper()
	ctx := testContext(t)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
	if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, b := range backends {
		if b.Pod == "" || slices.Contains(plain, b.Pod) {
			continue
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: b.Pod, Labels: map[string]string{"security.istio.io/tlsMode": "istio"}},
			Spec: corev1.PodSpec{AutomountServiceAccountToken: new(false),
				Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}},
		}
		if _, err := kc.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestIstiodRoutesAcrossNetworksThroughGateways: west and east are on two
// Istio networks; east's east-west gateway is a labelled Service. An
// unmodified istiod in west, taking federation from the hub over MCP,
// sends its sidecar (Istio's adsc, on net-west) west's own endpoints
// directly and east's as east's gateway, weighted by the mTLS endpoints it
// stands for, with none of east's pod addresses (the plaintext one is left
// out): it learnt the gateway from the Service the hub wrote into west.
func TestIstiodRoutesAcrossNetworksThroughGateways(t *testing.T) {
	istiodBin(t)
	adscBin(t)
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ns := "net-" + rand.String(5)
	labelNetwork(t, west, "net-west")
	labelNetwork(t, east, "net-east")
	backends := map[*localcluster.Cluster][]localcluster.Backend{
		west: {{IP: "198.18.50.1", Port: 8080, Pod: "echo-w1"}},
		east: {{IP: "198.18.51.1", Port: 8080, Pod: "echo-e1"}, {IP: "198.18.51.2", Port: 8080, Pod: "echo-e2"}, {IP: "198.18.51.3", Port: 8080, Pod: "echo-plain"}},
	}
	for c, b := range backends {
		kc := client(t, c)
		if err := localcluster.EnsureNamespace(ctx, kc, ns); err != nil {
			t.Fatal(err)
		}
		meshPods(t, kc, ns, b, "echo-plain")
		if err := localcluster.ApplyClusterIPService(ctx, kc, ns, "echo", "http", 8080, b); err != nil {
			t.Fatal(err)
		}
	}
	// east's east-west gateway, as Istio's gen-eastwest-gateway.sh makes it
	// (here with an external IP that nothing ever dials).
	ec := client(t, east)
	gw := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istio-eastwestgateway-" + rand.String(4),
			Labels: map[string]string{"topology.istio.io/network": "net-east"}},
		Spec: corev1.ServiceSpec{ExternalIPs: []string{"198.19.60.7"},
			Ports: []corev1.ServicePort{{Name: "tls", Port: 15443, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := ec.CoreV1().Services("istio-system").Create(ctx, gw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ec.CoreV1().Services("istio-system").Delete(context.Background(), gw.Name, metav1.DeleteOptions{})
	})
	hubNS := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(hubNS).Create(ctx, localcluster.RemoteSecret(hubNS, "members", map[string][]byte{
		west.Name: west.Kubeconfig(), east.Name: east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := startHub(t, home, "--namespace", hubNS, "--trust-domain", "net.test", "--xds-addr", "", "--tls-dns-names", hubDNSName,
		"--xds-tls-addr", "127.0.0.1:0")
	const written = "hub-gateway-net-east-15443"
	eventually(t, 60*time.Second, func() error {
		cl := h.clusters(t)
		w, e := cl[west.Name], cl[east.Name]
		if w.State != "Ready" || e.State != "Ready" || e.Network != "net-east" || len(e.Gateways) != 1 || !slices.Contains(w.GatewayServices, written) {
			return fmt.Errorf("members: west %+v; east %+v", w, e)
		}
		return nil
	})
	if err := removeOnCleanup(t, client(t, west), written); err != nil {
		t.Fatal(err)
	}

	rootsPEM := hubRootsPEM(t, h, spiffeid.RequireTrustDomainFromString("net.test"))
	p := startIstiod(t, west, istiodOptions{ConfigSources: []istiodConfigSource{{Address: "k8s://"}, istiodTLSSource(h.addrs["xds-tls"], rootsPEM)}})
	p.waitConfig(t, 2*time.Minute, "ServiceEntry/"+ns+"/hub-echo", false)
	sidecar := startAdsc(t, "net-sidecar", "--plaintext", "--addr", p.XDSAddr, "--watch", "cds", "--follow", "--network", "net-west",
		"--node-id", fmt.Sprintf("sidecar~198.18.0.9~client.%s~%s.svc.cluster.local", ns, ns), "--cluster-id", west.Name)
	cluster := fmt.Sprintf("outbound|8080||echo.%s.svc.clusterset.local", ns)
	line := sidecar.waitLine(t, 2*time.Minute, cluster+" split for net-west", func(l adscLine) bool {
		return l.Type == "eds" && l.Cluster == cluster && slices.Equal(l.Endpoints, []string{"198.18.50.1:8080", "198.19.60.7:15443"})
	})
	if w := line.Weights["198.19.60.7:15443"]; w != 2 {
		t.Errorf("istiod's weight for east's gateway = %d; want 2 (east's two mTLS endpoints): %+v", w, line)
	}
	if !slices.Contains(line.MTLS, "198.19.60.7:15443") {
		t.Errorf("istiod's gateway endpoint lacks tlsMode istio: %+v", line)
	}
	t.Logf("istiod's EDS for %s on net-west: endpoints %v, weights %v, mTLS %v", cluster, line.Endpoints, line.Weights, line.MTLS)
}

// removeOnCleanup deletes a Service the hub wrote into istio-system when
// the test ends (after the hub stopped: the hub would write it again).
func removeOnCleanup(t *testing.T, kc kubernetes.Interface, name string) error {
	t.Helper()
	t.Cleanup(func() {
		_ = kc.CoreV1().Services("istio-system").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return nil
}
