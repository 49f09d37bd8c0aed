package localcluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Helpers that create the objects tests and the demo need. No controller
// manager runs on local clusters, so EndpointSlices are written directly.

// EnsureNamespace creates a namespace if it does not exist.
func EnsureNamespace(ctx context.Context, c kubernetes.Interface, name string) error {
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// Backend is one endpoint address of a sample service.
type Backend struct {
	IP   string
	Port int32
	Node string // optional node name, for locality
	// NotReady marks the endpoint not ready (and not serving).
	NotReady bool
	// Pod, if set, is the name of the pod the endpoint refers to
	// (targetRef), in the Service's namespace.
	Pod string
}

// ApplyService creates or replaces a headless Service with one named port
// and the EndpointSlice <name>-hub holding the given backends. The hub
// never uses cluster IPs.
func ApplyService(ctx context.Context, c kubernetes.Interface, namespace, name, portName string, port int32, backends []Backend) error {
	return applyService(ctx, c, namespace, name, portName, port, backends, corev1.ClusterIPNone)
}

// ApplyClusterIPService is ApplyService with a cluster IP the API server
// allocates (from 10.0.0.0/16): istiod gives a headless Service an
// ORIGINAL_DST cluster without EDS, a Service with a cluster IP an EDS one.
func ApplyClusterIPService(ctx context.Context, c kubernetes.Interface, namespace, name, portName string, port int32, backends []Backend) error {
	return applyService(ctx, c, namespace, name, portName, port, backends, "")
}

func applyService(ctx context.Context, c kubernetes.Interface, namespace, name, portName string, port int32, backends []Backend, clusterIP string) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.ServiceSpec{
			ClusterIP: clusterIP,
			Ports:     []corev1.ServicePort{{Name: portName, Port: port, Protocol: corev1.ProtocolTCP}},
		},
	}
	if _, err := c.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, err := c.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading service %s/%s: %w", namespace, name, err)
		}
		cur.Spec.Ports = svc.Spec.Ports
		if _, err := c.CoreV1().Services(namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating service %s/%s: %w", namespace, name, err)
		}
	} else if err != nil {
		return fmt.Errorf("creating service %s/%s: %w", namespace, name, err)
	}
	return ApplyEndpoints(ctx, c, namespace, name, portName, backends)
}

// ApplyEndpoints creates or replaces the EndpointSlice <name>-hub of a service.
func ApplyEndpoints(ctx context.Context, c kubernetes.Interface, namespace, name, portName string, backends []Backend) error {
	if len(backends) == 0 {
		return fmt.Errorf("service %s/%s: at least one backend is needed to know the target port", namespace, name)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name + "-hub", Namespace: namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "hub-localcluster"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(backends[0].Port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, b := range backends {
		if b.Port != backends[0].Port {
			return fmt.Errorf("service %s/%s: all backends of one slice share a port", namespace, name)
		}
		ep := discoveryv1.Endpoint{
			Addresses:  []string{b.IP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(!b.NotReady), Serving: ptr.To(!b.NotReady), Terminating: ptr.To(false)},
		}
		if b.Node != "" {
			ep.NodeName = ptr.To(b.Node)
		}
		if b.Pod != "" {
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: namespace, Name: b.Pod}
		}
		slice.Endpoints = append(slice.Endpoints, ep)
	}
	slices := c.DiscoveryV1().EndpointSlices(namespace)
	if _, err := slices.Create(ctx, slice, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, err := slices.Get(ctx, slice.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading endpointslice %s/%s: %w", namespace, slice.Name, err)
		}
		cur.Ports, cur.Endpoints = slice.Ports, slice.Endpoints
		if _, err := slices.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating endpointslice %s/%s: %w", namespace, slice.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("creating endpointslice %s/%s: %w", namespace, slice.Name, err)
	}
	return nil
}

// ApplyNode creates a Node with topology labels (no kubelet runs; the node
// exists only to give endpoints a locality).
func ApplyNode(ctx context.Context, c kubernetes.Interface, name, region, zone string) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"topology.kubernetes.io/region": region, "topology.kubernetes.io/zone": zone,
	}}}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	return nil
}

// RemoteSecret returns an Istio-style remote Secret registering clusters
// (cluster ID → kubeconfig).
func RemoteSecret(namespace, name string, kubeconfigs map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace,
			Labels: map[string]string{"istio/multiCluster": "true"},
		},
		Data: kubeconfigs,
	}
}
