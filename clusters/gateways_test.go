package clusters

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/hubmesh/hub/internal/localcluster"
)

func gatewayService(name, network string, mutate func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: name, Labels: map[string]string{LabelNetwork: network}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "tls", Port: DefaultGatewayPort, NodePort: 31443}}},
	}
	if mutate != nil {
		mutate(svc)
	}
	return svc
}

// TestDiscoverGateways: gateway Services as istiod reads them, accepted
// only for the member's own network, the Secret's gateways first.
func TestDiscoverGateways(t *testing.T) {
	lb := func(ip, host string) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip, Hostname: host}}
		}
	}
	nodes := []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.5"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n2"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.6"}, {Type: corev1.NodeExternalIP, Address: "192.0.2.6"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n3", Labels: map[string]string{"gw": "yes"}}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "192.0.2.7"}}}},
	}
	annotated, err := parseGatewayAnnotation(" 198.51.100.1, 198.51.100.2:443 ")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		network   string
		svcs      []*corev1.Service
		annotated []Gateway
		// unconfirmed: the Secret does not confirm the member's network.
		unconfirmed bool
		namespaces  []string // nil: SystemNamespace only
		want        []string // address:port/source
		refused     []string // substrings, in order
	}{
		{name: "load balancer IP", network: "net", svcs: []*corev1.Service{gatewayService("ew", "net", lb("203.0.113.7", ""))},
			want: []string{"203.0.113.7:15443/service istio-system/ew"}},
		{name: "external IPs", network: "net", svcs: []*corev1.Service{gatewayService("ew", "net", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.8", "127.0.0.1"} })},
			want: []string{"203.0.113.8:15443/service istio-system/ew"}},
		{name: "node port on selected nodes' external addresses", network: "net", svcs: []*corev1.Service{gatewayService("ew", "net", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Annotations = map[string]string{AnnotationNodeSelector: `{}`}
		})}, want: []string{"192.0.2.6:31443/service istio-system/ew", "192.0.2.7:31443/service istio-system/ew"}},
		{name: "node port selector", network: "net", svcs: []*corev1.Service{gatewayService("ew", "net", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Annotations = map[string]string{AnnotationNodeSelector: `{"gw":"yes"}`}
		})}, want: []string{"192.0.2.7:31443/service istio-system/ew"}},
		{name: "node port without selector (istiod ignores it too)", network: "net", svcs: []*corev1.Service{gatewayService("ew", "net", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })},
			refused: []string{"no address yet"}},
		{name: "gateway port label", network: "net", svcs: []*corev1.Service{gatewayService("ew", "net", func(s *corev1.Service) {
			s.Labels[LabelGatewayPort] = "15444"
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "alt", Port: 15444})
			s.Spec.ExternalIPs = []string{"203.0.113.9"}
		})}, want: []string{"203.0.113.9:15444/service istio-system/ew"}},
		{name: "no gateway port", network: "net", svcs: []*corev1.Service{gatewayService("ew", "net", func(s *corev1.Service) { s.Spec.Ports[0].Port = 80 })},
			refused: []string{"istio-system/ew: no port 15443"}},
		{name: "hostname", network: "net", svcs: []*corev1.Service{gatewayService("ew", "net", lb("", "ew.elb.example"))},
			refused: []string{`load balancer hostname "ew.elb.example" is not resolved`}},
		{name: "no address yet", network: "net", svcs: []*corev1.Service{gatewayService("ew", "net", nil)},
			refused: []string{"no address yet"}},
		{name: "another network", network: "net", svcs: []*corev1.Service{gatewayService("ew", "other", lb("203.0.113.7", ""))},
			refused: []string{`labelled for network "other", but the member is on network "net"`}},
		{name: "network not confirmed by the Secret", network: "net", unconfirmed: true, annotated: annotated,
			svcs:    []*corev1.Service{gatewayService("ew", "net", lb("203.0.113.7", ""))},
			refused: []string{`network "net" is not confirmed by the remote Secret`}},
		{name: "member without network", svcs: []*corev1.Service{gatewayService("ew", "net", lb("203.0.113.7", ""))}, annotated: annotated,
			refused: []string{"the member has no network"}},
		{name: "a tenant's labelled Service is refused", network: "net",
			svcs:    []*corev1.Service{inNamespace("tenant", gatewayService("ew", "net", lb("203.0.113.66", "")))},
			refused: []string{"service tenant/ew: namespace tenant may not hold gateways (only istio-system and the namespaces the remote Secret's annotation hub.federation/gateway-namespaces, or for the home cluster --home-gateway-namespaces, names)"}},
		{name: "a tenant's labelled Service is refused even without a network", svcs: []*corev1.Service{inNamespace("tenant", gatewayService("ew", "net", lb("203.0.113.66", "")))},
			refused: []string{"namespace tenant may not hold gateways"}},
		{name: "a namespace the Secret names", network: "net", namespaces: []string{"gateways", SystemNamespace},
			svcs: []*corev1.Service{inNamespace("gateways", gatewayService("ew", "net", lb("203.0.113.7", ""))), inNamespace("tenant", gatewayService("ew", "net", lb("203.0.113.66", "")))},
			want: []string{"203.0.113.7:15443/service gateways/ew"}, refused: []string{"namespace tenant may not hold gateways"}},
		{name: "tenants cannot push the operator's reasons out", network: "net", unconfirmed: true, svcs: append(manyTenantGateways(40), gatewayService("ew", "net", lb("203.0.113.7", ""))),
			refused: append(append([]string{`network "net" is not confirmed`}, slices.Repeat([]string{"may not hold gateways"}, maxGatewaysRefused-1)...), "… 9 more refused")},
		{name: "tenants cannot displace the gateway", network: "net", svcs: append(manyTenantGateways(40), gatewayService("ew", "net", lb("203.0.113.7", ""))),
			want: []string{"203.0.113.7:15443/service istio-system/ew"}, refused: append(slices.Repeat([]string{"may not hold gateways"}, maxGatewaysRefused), "… 8 more refused")},
		{name: "annotated first, duplicates once", network: "net", annotated: annotated,
			svcs: []*corev1.Service{gatewayService("ew", "net", lb("198.51.100.1", ""))},
			want: []string{"198.51.100.1:15443/secret annotation", "198.51.100.2:443/secret annotation"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			namespaces := tc.namespaces
			if namespaces == nil {
				namespaces = []string{SystemNamespace}
			}
			v := discoverGateways(gatewaySources{network: tc.network, confirmed: !tc.unconfirmed, namespaces: namespaces,
				services: tc.svcs, nodes: nodes, annotated: tc.annotated})
			var got []string
			for _, g := range v.gateways {
				got = append(got, g.String()+"/"+g.Source)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("gateways = %q; want %q", got, tc.want)
			}
			if len(v.refused) != len(tc.refused) {
				t.Fatalf("refused = %q; want %q", v.refused, tc.refused)
			}
			for i, r := range tc.refused {
				if !strings.Contains(v.refused[i], r) {
					t.Errorf("refused[%d] = %q; want it to contain %q", i, v.refused[i], r)
				}
			}
		})
	}
}

func TestParseGatewayAnnotation(t *testing.T) {
	for _, bad := range []string{"gw.example:15443", "198.51.100.1:0", "127.0.0.1", "198.51.100.1:99999", "[fe80::1]:15443", "1.2.3.4, x"} {
		if gws, err := parseGatewayAnnotation(bad); err == nil {
			t.Errorf("%q accepted: %v", bad, gws)
		} else if !strings.Contains(err.Error(), AnnotationGateways) {
			t.Errorf("%q: error %q does not name the annotation", bad, err)
		}
	}
	gws, err := parseGatewayAnnotation("[2001:db8::1]:15443,198.51.100.1")
	if err != nil || len(gws) != 2 || gws[0].String() != "[2001:db8::1]:15443" || gws[1].String() != "198.51.100.1:15443" {
		t.Errorf("parse = %v, %v", gws, err)
	}
}

// TestGatewaysAndMeshPodsFromARealMember: on a real API server, the
// member's gateway Service (load balancer status), the remote Secret's
// gateways, and its pods labelled for Istio mTLS reach the views and the
// status; a relabelled gateway is refused with its reason, a pod leaving
// the mesh turns its endpoint plaintext.
func TestGatewaysAndMeshPodsFromARealMember(t *testing.T) {
	r, sink, ns := startRegistry(t, 30*time.Second)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	cs := kube(t, m1)
	setNetwork(t, cs, "net-1")

	gw, err := cs.CoreV1().Services(SystemNamespace).Create(ctx, gatewayService("eastwest-"+rand.String(5), "net-1", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 0
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Services(SystemNamespace).Delete(context.Background(), gw.Name, metav1.DeleteOptions{})
	})
	gw.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.7"}}
	if gw, err = cs.CoreV1().Services(SystemNamespace).UpdateStatus(ctx, gw, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	app := "app-" + rand.String(6)
	if err := localcluster.EnsureNamespace(ctx, cs, app); err != nil {
		t.Fatal(err)
	}
	meshPod := createPod(t, cs, app, "meshed", map[string]string{LabelTLSMode: TLSModeIstio})
	if err := localcluster.ApplyService(ctx, cs, app, "web", "http", 80, []localcluster.Backend{
		{IP: "198.18.9.1", Port: 8080, Pod: meshPod.Name},
		{IP: "198.18.9.2", Port: 8080, Pod: "plain"},
	}); err != nil {
		t.Fatal(err)
	}
	secret := localcluster.RemoteSecret(ns, "members", map[string][]byte{"m1": m1.Kubeconfig()})
	secret.Annotations = map[string]string{AnnotationGateways: "198.51.100.1", AnnotationNetwork: "net-1"}
	if _, err := kube(t, env.Cluster("home")).CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	key := ServiceKey{Namespace: app, Name: "web"}
	view := func(wantGateways []string, wantMTLS map[string]bool) func() error {
		return func() error {
			svc := sink.service("m1", key)
			if svc == nil {
				return fmt.Errorf("no view of %s", key)
			}
			var gws []string
			for _, g := range svc.Gateways {
				gws = append(gws, g.String())
			}
			if svc.Network != "net-1" || !reflect.DeepEqual(gws, wantGateways) {
				return fmt.Errorf("view on network %q with gateways %q; want net-1 with %q", svc.Network, gws, wantGateways)
			}
			mtls := map[string]bool{}
			for _, e := range svc.Endpoints {
				mtls[e.Address] = e.MTLS
			}
			if !reflect.DeepEqual(mtls, wantMTLS) {
				return fmt.Errorf("endpoints' mTLS %v; want %v", mtls, wantMTLS)
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, view([]string{"198.51.100.1:15443", "203.0.113.7:15443"}, map[string]bool{"198.18.9.1": true, "198.18.9.2": false}))
	// The mesh pod's service account (the API server's default) is the
	// identity its endpoint presents.
	if sas := sink.service("m1", key).PodServiceAccounts; !reflect.DeepEqual(sas, []string{"default"}) {
		t.Errorf("the view's pod service accounts %v; want [default]", sas)
	}
	// The CA's token budgets know the account runs mesh pods of m1 (and
	// of no other member).
	if !r.RunsMeshAccount("m1", app, "default") || r.RunsMeshAccount("m1", app, "other") || r.RunsMeshAccount("m2", app, "default") {
		t.Errorf("RunsMeshAccount: m1 %s/default %v, m1 %s/other %v, m2 %s/default %v; want true, false, false", app,
			r.RunsMeshAccount("m1", app, "default"), app, r.RunsMeshAccount("m1", app, "other"), app, r.RunsMeshAccount("m2", app, "default"))
	}
	st, _ := statusOf(r, "m1", ns+"/members")
	if st.Network != "net-1" || len(st.Gateways) != 2 || st.Gateways[1].Source != "service istio-system/"+gw.Name || len(st.GatewaysRefused) != 0 {
		t.Errorf("status: network %q, gateways %+v, refused %q", st.Network, st.Gateways, st.GatewaysRefused)
	}
	if st.CrossNetworkWithheld < 1 {
		t.Errorf("status withholds %d endpoints across networks; want the plaintext one at least", st.CrossNetworkWithheld)
	}

	// The gateway claims another network: refused, with the reason shown.
	gw.Labels[LabelNetwork] = "net-2"
	if _, err := cs.CoreV1().Services(SystemNamespace).Update(ctx, gw, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, view([]string{"198.51.100.1:15443"}, map[string]bool{"198.18.9.1": true, "198.18.9.2": false}))
	eventually(t, 10*time.Second, func() error {
		st, _ := statusOf(r, "m1", ns+"/members")
		if len(st.GatewaysRefused) != 1 || !strings.Contains(st.GatewaysRefused[0], `labelled for network "net-2"`) {
			return fmt.Errorf("refused %q", st.GatewaysRefused)
		}
		return nil
	})

	// The pod leaves the mesh: its endpoint is plaintext.
	meshPod.Labels = nil
	if _, err := cs.CoreV1().Pods(app).Update(ctx, meshPod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, view([]string{"198.51.100.1:15443"}, map[string]bool{"198.18.9.1": false, "198.18.9.2": false}))
	if r.RunsMeshAccount("m1", app, "default") {
		t.Error("RunsMeshAccount still true once the account's only pod left the mesh")
	}
}

// setNetwork labels a member's system namespace with a network until the
// test ends.
func setNetwork(t *testing.T, cs kubernetes.Interface, network string) {
	t.Helper()
	ctx := context.Background()
	if err := localcluster.EnsureNamespace(ctx, cs, SystemNamespace); err != nil {
		t.Fatal(err)
	}
	label := func(v string) error {
		ns, err := cs.CoreV1().Namespaces().Get(ctx, SystemNamespace, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		if v == "" {
			delete(ns.Labels, LabelNetwork)
		} else {
			ns.Labels[LabelNetwork] = v
		}
		_, err = cs.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
		return err
	}
	if err := label(network); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := label(""); err != nil {
			t.Errorf("removing the network label: %v", err)
		}
	})
}

// createPod creates a pod (no kubelet runs it; it exists for its labels),
// and the namespace's default ServiceAccount the API server wants first.
func createPod(t *testing.T, cs kubernetes.Interface, ns, name string, labels map[string]string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: new(false),
			Containers:                   []corev1.Container{{Name: "app", Image: "example.invalid/app"}},
		},
	}
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// TestGatewayServicesWrittenIntoMembers: each member on a network gets, in
// its istio-system, a headless Service per other network carrying that
// network's gateways (what an unmodified istiod learns gateways from); the
// hub neither federates nor reads them back as the member's own gateways;
// a network that loses its gateways loses its Service.
func TestGatewayServicesWrittenIntoMembers(t *testing.T) {
	r, sink, ns := startRegistry(t, 30*time.Second)
	ctx := context.Background()
	m1, m2 := env.Cluster("member1"), env.Cluster("member2")
	cs1, cs2 := kube(t, m1), kube(t, m2)
	setNetwork(t, cs1, "net-1")
	setNetwork(t, cs2, "net-2")
	cleanupHubGateways := func(cs kubernetes.Interface) {
		t.Cleanup(func() {
			ctx := context.Background()
			list, _ := cs.CoreV1().Services(SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedByHub})
			for _, s := range list.Items {
				_ = cs.CoreV1().Services(SystemNamespace).Delete(ctx, s.Name, metav1.DeleteOptions{})
			}
		})
	}
	cleanupHubGateways(cs1)
	cleanupHubGateways(cs2)
	gw, err := cs1.CoreV1().Services(SystemNamespace).Create(ctx, gatewayService("eastwest-"+rand.String(5), "net-1", func(s *corev1.Service) {
		s.Spec.Ports[0].NodePort = 0
		s.Spec.ExternalIPs = []string{"203.0.113.21"}
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs1.CoreV1().Services(SystemNamespace).Delete(context.Background(), gw.Name, metav1.DeleteOptions{})
	})
	home := kube(t, env.Cluster("home"))
	s1 := localcluster.RemoteSecret(ns, "m1", map[string][]byte{"m1": m1.Kubeconfig()})
	s1.Annotations = map[string]string{AnnotationNetwork: "m1=net-1"}
	s2 := localcluster.RemoteSecret(ns, "m2", map[string][]byte{"m2": m2.Kubeconfig()})
	s2.Annotations = map[string]string{AnnotationGateways: "198.51.100.22:15443, 198.51.100.23:443", AnnotationNetwork: "net-2"}
	for _, s := range []*corev1.Secret{s1, s2} {
		if _, err := home.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	written := func(cs kubernetes.Interface, want map[string][]string) func() error {
		return func() error {
			list, err := cs.CoreV1().Services(SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedByHub})
			if err != nil {
				return err
			}
			got := map[string][]string{}
			for _, s := range list.Items {
				if s.Spec.ClusterIP != corev1.ClusterIPNone || len(s.Spec.Selector) != 0 {
					return fmt.Errorf("%s is not headless and selectorless: %+v", s.Name, s.Spec)
				}
				got[s.Name+" "+s.Labels[LabelNetwork]+" "+fmt.Sprint(s.Spec.Ports[0].Port)] = s.Spec.ExternalIPs
			}
			if !reflect.DeepEqual(got, want) {
				return fmt.Errorf("hub gateway Services %v; want %v", got, want)
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, written(cs1, map[string][]string{
		"hub-gateway-net-2-15443 net-2 15443": {"198.51.100.22"},
		"hub-gateway-net-2-443 net-2 443":     {"198.51.100.23"},
	}))
	eventually(t, 30*time.Second, written(cs2, map[string][]string{"hub-gateway-net-1-15443 net-1 15443": {"203.0.113.21"}}))
	eventually(t, 10*time.Second, func() error {
		for _, id := range []string{"m1", "m2"} {
			st, _ := statusOf(r, id, ns+"/"+id)
			if len(st.GatewayServices) == 0 || st.GatewayServicesError != "" || len(st.GatewaysRefused) != 0 || st.State != StateReady {
				return fmt.Errorf("%s: %s, written %q, error %q, refused %q", id, st.State, st.GatewayServices, st.GatewayServicesError, st.GatewaysRefused)
			}
		}
		return nil
	})
	if svc := sink.service("m1", ServiceKey{Namespace: SystemNamespace, Name: "hub-gateway-net-2-15443"}); svc != nil {
		t.Errorf("the hub federates its own gateway Service: %+v", svc)
	}

	// m1 loses its gateway: m2's Service for net-1 goes.
	if err := cs1.CoreV1().Services(SystemNamespace).Delete(ctx, gw.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, written(cs2, map[string][]string{}))
}

func TestConfirmedNetwork(t *testing.T) {
	for _, tc := range []struct{ v, id, want string }{
		{"net-east", "east", "net-east"}, {" net-east ", "west", "net-east"},
		{"west=net-west, east=net-east", "east", "net-east"}, {"west=net-west", "east", ""}, {"", "east", ""},
	} {
		if got := confirmedNetwork(tc.v, tc.id); got != tc.want {
			t.Errorf("confirmedNetwork(%q, %q) = %q; want %q", tc.v, tc.id, got, tc.want)
		}
	}
}

// TestRestoredGatewaysNeedTheSecretsConfirmation: a persisted view's
// gateways are served only while the remote Secret confirms its network
// (a view persisted before the confirmation changed brings none back); the
// home cluster's are its own.
func TestRestoredGatewaysNeedTheSecretsConfirmation(t *testing.T) {
	gws := []Gateway{{Address: "203.0.113.7", Port: 15443, Source: "service istio-system/ew"}}
	view := []*Service{{Namespace: "a", Name: "x", Network: "net-a", Gateways: gws}, {Namespace: "a", Name: "y", Network: "net-a"}}
	for _, tc := range []struct {
		secret, confirmed string
		kept              bool
	}{{"ns/s", "net-a", true}, {"ns/s", "net-b", false}, {"ns/s", "", false}, {"", "", true}} {
		n := &networkController{home: tc.secret == "", networkingState: networkingState{confirmed: tc.confirmed}}
		got := n.confirmedGateways(view)
		if kept := len(got[0].Gateways) > 0; kept != tc.kept {
			t.Errorf("secret %q confirming %q: gateways kept %v; want %v", tc.secret, tc.confirmed, kept, tc.kept)
		}
		if len(view[0].Gateways) == 0 || got[1] != view[1] {
			t.Error("confirmedGateways changed the view it was given, or copied a service without gateways")
		}
	}
}

// TestCrossNetworkWithheldCountsTheNetworksGateways: a member without a
// gateway of its own is reached through another member's gateway on its
// network, so only its plaintext endpoints are withheld then; without any
// gateway on its network, all of them; without a network, none.
func TestCrossNetworkWithheldCountsTheNetworksGateways(t *testing.T) {
	c := &networkController{}
	published := endpointCounts{all: 10, plaintext: 3} // 1 + 2 of two Services
	if got := c.crossNetworkWithheldLocked("", published); got != 0 {
		t.Errorf("no network: %d", got)
	}
	if got := c.crossNetworkWithheldLocked("net-x", published); got != 10 {
		t.Errorf("no gateway on the network: %d; want 10", got)
	}
	c.gw.setPeers(peerGateways{networks: map[string][]Gateway{"net-x": {{Address: "203.0.113.50", Port: 15443}}}})
	if got := c.crossNetworkWithheldLocked("net-x", published); got != 3 {
		t.Errorf("another member's gateway on the network: %d; want 3 (the plaintext ones)", got)
	}
	c.gw.setPeers(peerGateways{})
	c.gateways = gatewayView{gateways: []Gateway{{Address: "203.0.113.51", Port: 15443}}}
	if got := c.crossNetworkWithheldLocked("net-x", published); got != 3 {
		t.Errorf("own gateway: %d; want 3", got)
	}
}

// TestProxylessGateways: a gateway admits proxyless gRPC only when its
// Service (or, for the gateways a remote Secret names, the Secret) says
// so with "true"; a member whose network has gateways, none of them
// admitting proxyless gRPC, withholds all its endpoints from proxyless
// clients of other networks, and only the usual ones once one does.
func TestProxylessGateways(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  bool
	}{{"true", true}, {"", false}, {"yes", false}, {"false", false}} {
		svc := gatewayService("ew", "net", func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"203.0.113.8", "203.0.113.9"}
			if tc.value != "" {
				s.Annotations = map[string]string{AnnotationProxylessALPN: tc.value}
			}
		})
		// As the Service informer holds it.
		stripped, err := stripObject(svc)
		if err != nil {
			t.Fatal(err)
		}
		gws, problem := serviceGateways(stripped.(*corev1.Service), nil)
		if problem != "" || len(gws) != 2 {
			t.Fatalf("annotation %q: %v %q", tc.value, gws, problem)
		}
		for _, g := range gws {
			if g.Proxyless != tc.want {
				t.Errorf("annotation %q: %+v; want Proxyless %v", tc.value, g, tc.want)
			}
		}
	}

	c := &networkController{id: "m"}
	published := endpointCounts{all: 10, plaintext: 1}
	c.gateways = gatewayView{gateways: []Gateway{{Address: "203.0.113.51", Port: 15443}}}
	withheld := c.crossNetworkWithheldLocked("net-x", published)
	if got := c.proxylessWithheldLocked("net-x", 10, withheld); got != 10 {
		t.Errorf("no gateway admits proxyless gRPC: %d withheld; want 10", got)
	}
	c.gw.setPeers(peerGateways{networks: map[string][]Gateway{"net-x": {{Address: "203.0.113.50", Port: 15443, Proxyless: true}}}})
	if got := c.proxylessWithheldLocked("net-x", 10, withheld); got != 1 {
		t.Errorf("another member's gateway admits it: %d withheld; want 1 (the plaintext one)", got)
	}
	c.gw.setPeers(peerGateways{})
	c.gateways = gatewayView{}
	if got := c.proxylessWithheldLocked("net-x", 10, c.crossNetworkWithheldLocked("net-x", published)); got != 10 {
		t.Errorf("no gateway at all: %d withheld; want 10", got)
	}
	if got := c.proxylessWithheldLocked("", 10, 0); got != 0 {
		t.Errorf("no network: %d withheld", got)
	}

	// The Secret's word for the gateways it names.
	c = &networkController{id: "m", services: emptyServices, rebuild: func() {}, log: slog.New(slog.DiscardHandler),
		namespaces: corelisters.NewNamespaceLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}))}
	c.setSecretNetworking(secretNetworking{gateways: "198.51.100.1", network: "net-x", proxylessALPN: "true"})
	if len(c.annotated) != 1 || !c.annotated[0].Proxyless {
		t.Errorf("Secret with %s=true: %+v", AnnotationProxylessALPN, c.annotated)
	}
	c.setSecretNetworking(secretNetworking{gateways: "198.51.100.1", network: "net-x"})
	if len(c.annotated) != 1 || c.annotated[0].Proxyless {
		t.Errorf("Secret without %s: %+v", AnnotationProxylessALPN, c.annotated)
	}
}

func inNamespace(ns string, s *corev1.Service) *corev1.Service {
	s.Namespace = ns
	return s
}

// manyTenantGateways are n labelled gateway Services of tenants whose
// namespaces sort before istio-system.
func manyTenantGateways(n int) []*corev1.Service {
	var out []*corev1.Service
	for i := range n {
		out = append(out, inNamespace(fmt.Sprintf("aaa-%02d", i), gatewayService("ew", "net", func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("203.0.113.%d", 100+i)}}
		})))
	}
	return out
}

func TestParseGatewayNamespaces(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{"", []string{SystemNamespace}, ""},
		{" gateways , istio-system,ew ", []string{"ew", "gateways", SystemNamespace}, ""},
		{"gateways,Bad_NS", []string{SystemNamespace}, `"Bad_NS" is not a namespace name`},
		{strings.Repeat("ns,", 3) + "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q", []string{SystemNamespace}, "more than 16 namespaces"},
	} {
		got, err := parseGatewayNamespaces(tc.in)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: %v, want %v", tc.in, got, tc.want)
		}
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
		}
	}
}

// A persisted view's gateway from a namespace no longer allowed is not
// handed to other members while the member serves that view.
func TestInGatewayNamespaces(t *testing.T) {
	gws := []Gateway{
		{Address: "203.0.113.1", Port: 15443, Source: "secret annotation"},
		{Address: "203.0.113.2", Port: 15443, Source: "service istio-system/ew"},
		{Address: "203.0.113.3", Port: 15443, Source: "service aaa-tenant/ew"},
	}
	var got []string
	for _, g := range inGatewayNamespaces(gws, []string{SystemNamespace}) {
		got = append(got, g.Address)
	}
	if want := []string{"203.0.113.1", "203.0.113.2"}; !slices.Equal(got, want) {
		t.Errorf("kept %v, want %v", got, want)
	}
}
