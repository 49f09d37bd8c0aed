package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/localcluster"
)

// The demo's members are on two Istio networks (demoNetworks): primary and
// west on net-main, east on net-east. Each network's workloads run in a
// network namespace of their own; the two are joined by a veth pair whose
// two ends are the networks' east-west gateways (198.19.253.1 and .2, a
// /30): a workload of one network cannot reach the other's workload
// addresses, only its gateway, which passes Istio mTLS through by SNI
// and ALPN (a real Envoy: startDemoGateway). Each
// member's istio-system carries its network label and a gateway Service
// (as Istio's gen-eastwest-gateway.sh makes it, with the gateway's address
// as external IP), and each remote Secret confirms its member's network.

// demoNetworkOf is the network a member is on.
func demoNetworkOf(member string) demoNetwork {
	for _, dc := range demoClusters {
		if dc.name == member {
			for _, n := range demoNetworks {
				if n.name == dc.network {
					return n
				}
			}
		}
	}
	return demoNetwork{}
}

// newDemoNetworks creates the first network's namespace (newDemoNetns,
// with the veth pair to the demo's own) and every other network's,
// joined to the first by a veth pair between their gateway addresses;
// each carries its members' workload addresses. It returns them by
// network; on error everything created is removed again.
func newDemoNetworks(ctx context.Context) (_ map[string]*demoNetns, err error) {
	ips := map[string][]string{}
	for _, w := range demoWorkloads(true) {
		if w.ip != "" {
			nw := demoNetworkOf(w.member).name
			ips[nw] = append(ips[nw], w.ip)
		}
	}
	first := demoNetworks[0]
	mainNS, err := newDemoNetns(ctx, ips[first.name])
	if err != nil {
		return nil, err
	}
	out := map[string]*demoNetns{first.name: mainNS}
	defer func() {
		if err != nil {
			for _, n := range out {
				n.Close()
			}
		}
	}()
	for i, nw := range demoNetworks[1:] {
		n := &demoNetns{name: demoNetnsPrefix + strconv.Itoa(os.Getpid()) + "-" + nw.name, closed: make(chan struct{})}
		if err := ipCmd(ctx, "netns", "add", n.name); err != nil {
			return nil, err
		}
		out[nw.name] = n
		link := "peer" + strconv.Itoa(i) // in the first namespace
		steps := [][]string{
			{"-n", mainNS.name, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", n.name},
			{"-n", mainNS.name, "addr", "add", first.gatewayIP + "/30", "dev", link},
			{"-n", mainNS.name, "link", "set", link, "up"},
			{"-n", n.name, "link", "set", "lo", "up"},
			{"-n", n.name, "addr", "add", nw.gatewayIP + "/30", "dev", "eth0"},
			{"-n", n.name, "link", "set", "eth0", "up"},
		}
		for _, a := range ips[nw.name] {
			steps = append(steps, []string{"-n", n.name, "addr", "add", a + "/32", "dev", "lo"})
		}
		for _, args := range steps {
			if err := ipCmd(ctx, args...); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// Dial connects to addr from inside the namespace.
func (n *demoNetns) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// seedDemoNetwork labels a cluster's istio-system with its network,
// creates its network's east-west gateway Service there, and the pods of
// its echo backends, labelled as Istio's injection labels them
// (security.istio.io/tlsMode=istio: they speak Istio mTLS, so other
// networks reach them through the gateway; no kubelet runs them).
func seedDemoNetwork(ctx context.Context, c kubernetes.Interface, dc demoCluster) error {
	for _, b := range echoBackends(dc) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: b.Pod,
				Labels: map[string]string{"app": "echo", "security.istio.io/tlsMode": "istio"}},
			Spec: corev1.PodSpec{ServiceAccountName: "echo", NodeName: b.Node, AutomountServiceAccountToken: new(false),
				Containers: []corev1.Container{{Name: "echo", Image: "hub-demo.invalid/echo"}}},
		}
		if _, err := c.CoreV1().Pods(demoNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the pod of %s: %w", b.Pod, err)
		}
	}
	nw := demoNetworkOf(dc.name)
	if err := localcluster.EnsureNamespace(ctx, c, "istio-system"); err != nil {
		return err
	}
	ns, err := c.CoreV1().Namespaces().Get(ctx, "istio-system", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels["topology.istio.io/network"] = nw.name
	if _, err := c.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("labelling istio-system with its network: %w", err)
	}
	// The demo's gateways also admit proxyless gRPC's h2
	// (startDemoGateway), and their Services say so.
	gw := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istio-eastwestgateway",
			Labels:      map[string]string{"topology.istio.io/network": nw.name, "istio": "eastwestgateway"},
			Annotations: map[string]string{clusters.AnnotationProxylessALPN: "true"}},
		Spec: corev1.ServiceSpec{ExternalIPs: []string{nw.gatewayIP},
			Ports: []corev1.ServicePort{{Name: "tls", Port: demoGatewayPort, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := c.CoreV1().Services("istio-system").Create(ctx, gw, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the east-west gateway Service: %w", err)
	}
	return nil
}
