package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/xdstest"
)

// TestWorkloadMetadataMatchesIstiod: for the same mesh pod (a Deployment's,
// labelled as Istio's injector labels it: tlsMode istio, app, version) and
// EndpointSlice in one member, the hub's EDS endpoint carries the same
// istio.workload and envoy.transport_socket_match metadata as a real
// istiod's of that member (cluster ID = the member's ID), field by field.
func TestWorkloadMetadataMatchesIstiod(t *testing.T) {
	istiodBin(t) // skip (or fail in CI) before setting anything up
	e := localcluster.Require(t, env)
	home, east := e.Cluster("primary"), e.Cluster("east")
	ctx := testContext(t)
	kc := client(t, east)
	app := "wl-" + rand.String(5)
	if err := localcluster.EnsureNamespace(ctx, kc, app); err != nil {
		t.Fatal(err)
	}

	// A Deployment's pod, as the ReplicaSet controller and Istio's
	// injector make it (no kubelet runs: its status is written here).
	const podIP, port = "198.18.40.7", int32(8080)
	pod := meshPod(t, kc, app, podIP)
	if err := localcluster.ApplyClusterIPService(ctx, kc, app, "echo", "http", port,
		[]localcluster.Backend{{IP: podIP, Port: port, Pod: pod.Name}}); err != nil {
		t.Fatal(err)
	}
	edsCluster := fmt.Sprintf("outbound|%d||echo.%s.svc.cluster.local", port, app)

	p := startIstiod(t, east, istiodOptions{}) // --clusterID east
	ns := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"east": east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := startHub(t, home, "--namespace", ns)

	// A sidecar of the same member asks each for the cluster's endpoints.
	node := func() *corev3.Node {
		meta, _ := structpb.NewStruct(map[string]any{"CLUSTER_ID": east.Name, "NAMESPACE": app, "ISTIO_VERSION": "1.31.0"})
		return &corev3.Node{Id: fmt.Sprintf("sidecar~198.18.40.9~client.%s~%s.svc.cluster.local", app, app), Metadata: meta}
	}
	fromIstiod := endpointMetadataOf(t, "istiod", p.XDSAddr, node(), edsCluster, podIP)
	fromHub := endpointMetadataOf(t, "the hub", h.xdsAddr, node(), edsCluster, podIP)

	want := fmt.Sprintf("echo;%s;echo;v1;%s", app, east.Name) // Deployment echo; its app and version labels; the member
	if got := fromIstiod["istio"].GetFields()["workload"].GetStringValue(); got != want {
		t.Errorf("istiod's istio.workload is %q; want %q (the test's premise)", got, want)
	}
	for _, key := range []string{"istio", "envoy.transport_socket_match"} {
		ours, theirs := fromHub[key].GetFields(), fromIstiod[key].GetFields()
		if len(theirs) == 0 {
			t.Errorf("istiod's endpoint has no %s metadata (the test's premise): %v", key, fromIstiod)
		}
		for field, v := range theirs {
			if o, ok := ours[field]; !ok || o.GetStringValue() != v.GetStringValue() {
				t.Errorf("%s.%s: the hub has %q, istiod %q", key, field, o.GetStringValue(), v.GetStringValue())
			}
		}
		for field, o := range ours {
			if _, ok := theirs[field]; !ok {
				t.Errorf("%s.%s: the hub has %q, istiod nothing", key, field, o.GetStringValue())
			}
		}
	}
	t.Logf("%s endpoint %s: istiod istio=%v tlsMatch=%v; hub istio=%v tlsMatch=%v", edsCluster, podIP,
		fromIstiod["istio"].AsMap(), fromIstiod["envoy.transport_socket_match"].AsMap(),
		fromHub["istio"].AsMap(), fromHub["envoy.transport_socket_match"].AsMap())

	// A label change reaches the hub's metadata: the canonical revision.
	pod.Labels["service.istio.io/canonical-revision"] = "v1-canary"
	if _, err := kc.CoreV1().Pods(app).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantCanary := fmt.Sprintf("echo;%s;echo;v1-canary;%s", app, east.Name)
	eventually(t, 30*time.Second, func() error {
		got := endpointMetadataOf(t, "the hub", h.xdsAddr, node(), edsCluster, podIP)["istio"].GetFields()["workload"].GetStringValue()
		if got != wantCanary {
			return fmt.Errorf("the hub's istio.workload is %q; want %q", got, wantCanary)
		}
		return nil
	})
}

// meshPod creates a running, ready pod of Deployment echo (ReplicaSet
// echo-6b7c9d) labelled as Istio's injector labels it, with podIP.
func meshPod(t *testing.T, kc kubernetes.Interface, ns, podIP string) *corev1.Pod {
	t.Helper()
	ctx := testContext(t)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
	if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	controller := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "echo-6b7c9d-x7k2p", GenerateName: "echo-6b7c9d-",
			Labels: map[string]string{"app": "echo", "version": "v1", "pod-template-hash": "6b7c9d", "security.istio.io/tlsMode": "istio"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "echo-6b7c9d",
				UID: types.UID("00000000-0000-0000-0000-" + rand.String(12)), Controller: &controller}}},
		Spec: corev1.PodSpec{AutomountServiceAccountToken: new(false), Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}},
	}
	pod, err := kc.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: podIP, PodIPs: []corev1.PodIP{{IP: podIP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if pod, err = kc.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pod
}

// endpointMetadataOf asks an xDS server (plaintext) as node for cluster's
// endpoints over SotW ADS (CDS first, as a sidecar does) until the endpoint
// address appears, and returns its filter metadata.
func endpointMetadataOf(t *testing.T, server, addr string, node *corev3.Node, cluster, address string) map[string]*structpb.Struct {
	t.Helper()
	ctx, cancel := context.WithTimeout(testContext(t), 90*time.Second)
	defer cancel()
	st := xdstest.OpenSotW(t, ctx, xdstest.Dial(t, addr))
	st.Send(t, &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType})
	var last string
	for {
		r, err := st.NextWithin(t, 90*time.Second)
		if err != nil {
			t.Fatalf("%s: no endpoint %s in %s (last EDS: %s): %v", server, address, cluster, last, err)
		}
		if r.TypeUrl == resourcev3.EndpointType {
			st.Send(t, xdstest.ACK(r, cluster))
		} else {
			st.Send(t, xdstest.ACK(r))
		}
		switch r.TypeUrl {
		case resourcev3.ClusterType:
			st.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{cluster}})
		case resourcev3.EndpointType:
			for _, a := range r.Resources {
				var cla endpointv3.ClusterLoadAssignment
				if err := a.UnmarshalTo(&cla); err != nil {
					t.Fatalf("%s: EDS: %v", server, err)
				}
				if cla.ClusterName != cluster {
					continue
				}
				last = protojson.Format(&cla)
				for _, l := range cla.Endpoints {
					for _, ep := range l.LbEndpoints {
						if ep.GetEndpoint().GetAddress().GetSocketAddress().GetAddress() == address {
							return ep.GetMetadata().GetFilterMetadata()
						}
					}
				}
			}
		}
	}
}
