package clusters

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodWorkload: the workload, canonical name and revision as istiod
// derives them from a pod (kube.GetWorkloadMetaFromPod,
// labels.CanonicalService), and nothing for a name that is not one.
func TestPodWorkload(t *testing.T) {
	yes := true
	owner := func(kind, name string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{Kind: "Other", Name: "not-the-controller"}, {Kind: kind, Name: name, Controller: &yes}}
	}
	for _, c := range []struct {
		name string
		pod  metav1.ObjectMeta
		want string
	}{
		{"a Deployment's pod, app and version labels", metav1.ObjectMeta{Namespace: "ns", Name: "echo-7d9f8-abcde", GenerateName: "echo-7d9f8-",
			OwnerReferences: owner("ReplicaSet", "echo-7d9f8"), Labels: map[string]string{"pod-template-hash": "7d9f8", "app": "echo", "version": "v2"}},
			"echo;ns;echo;v2"},
		{"canonical labels win over app and version", metav1.ObjectMeta{Namespace: "ns", Name: "echo-7d9f8-abcde", GenerateName: "echo-7d9f8-",
			OwnerReferences: owner("ReplicaSet", "echo-7d9f8"), Labels: map[string]string{"pod-template-hash": "7d9f8", "app": "x", "version": "y",
				LabelCanonicalName: "echo-svc", LabelCanonicalRevision: "r1", "app.kubernetes.io/name": "z"}},
			"echo;ns;echo-svc;r1"},
		{"no labels: the workload is the canonical name, latest is not sent", metav1.ObjectMeta{Namespace: "ns", Name: "echo-7d9f8-abcde", GenerateName: "echo-7d9f8-",
			OwnerReferences: owner("ReplicaSet", "echo-7d9f8"), Labels: map[string]string{"pod-template-hash": "7d9f8"}},
			"echo;ns;echo;"},
		{"version latest is not sent", metav1.ObjectMeta{Namespace: "ns", Name: "solo", Labels: map[string]string{"app.kubernetes.io/version": "latest"}},
			"solo;ns;solo;"},
		{"a bare pod", metav1.ObjectMeta{Namespace: "ns", Name: "solo"}, "solo;ns;solo;"},
		{"a named pod's owner is not read", metav1.ObjectMeta{Namespace: "ns", Name: "solo", OwnerReferences: owner("ReplicaSet", "rs")}, "solo;ns;solo;"},
		{"a StatefulSet", metav1.ObjectMeta{Namespace: "ns", Name: "db-0", GenerateName: "db-", OwnerReferences: owner("StatefulSet", "db")}, "db;ns;db;"},
		{"a CronJob's Job", metav1.ObjectMeta{Namespace: "ns", Name: "backup-28000000-x", GenerateName: "backup-28000000-", OwnerReferences: owner("Job", "backup-28000000")}, "backup;ns;backup;"},
		{"an Argo Rollout", metav1.ObjectMeta{Namespace: "ns", Name: "r-5c-x", GenerateName: "r-5c-", OwnerReferences: owner("ReplicaSet", "r-5c"),
			Labels: map[string]string{"rollouts-pod-template-hash": "5c"}}, "r;ns;r;"},
		{"the workload-name label", metav1.ObjectMeta{Namespace: "ns", Name: "echo-7d9f8-abcde", GenerateName: "echo-7d9f8-",
			OwnerReferences: owner("ReplicaSet", "echo-7d9f8"), Labels: map[string]string{"pod-template-hash": "7d9f8", LabelWorkloadName: "named"}},
			"named;ns;named;"},
		{"a ';' in a label (no real API server sends one)", metav1.ObjectMeta{Namespace: "ns", Name: "solo", Labels: map[string]string{"app": "a;b;c;d;e"}}, ""},
		{"a name too long", metav1.ObjectMeta{Namespace: "ns", Name: "solo", Labels: map[string]string{"app": strings.Repeat("a", 254)}}, ""},
	} {
		if got := podWorkload(&c.pod); got != c.want {
			t.Errorf("%s: %q; want %q", c.name, got, c.want)
		}
	}
}

// TestPersistedWorkloadIsValidated: a persisted view is input; a workload
// that could inject fields into istio.workload, name another namespace,
// run long or sit on an endpoint that is not a mesh pod's is refused.
func TestPersistedWorkloadIsValidated(t *testing.T) {
	view := func(e Endpoint) []*Service {
		e.Address, e.Port, e.ServicePort = "10.0.0.1", 8080, 80
		return []*Service{{Namespace: "ns", Name: "echo", Ports: []ServicePort{{Port: 80, Protocol: "TCP"}}, Endpoints: []Endpoint{e}}}
	}
	if err := validateView(view(Endpoint{MTLS: true, Workload: "echo;ns;echo;v1"}), time.Now(), 0); err != nil {
		t.Fatalf("a valid workload: %v", err)
	}
	for _, c := range []struct {
		name string
		e    Endpoint
		want string
	}{
		{"an injected field", Endpoint{MTLS: true, Workload: "echo;ns;echo;v1;other-cluster"}, "has 5 fields"},
		{"a ';' in place of a field", Endpoint{MTLS: true, Workload: "echo;ns;echo"}, "has 3 fields"},
		{"another namespace", Endpoint{MTLS: true, Workload: "echo;other;echo;v1"}, "not the service's"},
		{"a field too long", Endpoint{MTLS: true, Workload: strings.Repeat("a", 254) + ";ns;echo;v1"}, "longer than 253"},
		{"a control character", Endpoint{MTLS: true, Workload: "echo\n;ns;echo;v1"}, "field 1 has"},
		{"not a mesh pod", Endpoint{Workload: "echo;ns;echo;v1"}, "does not accept Istio mTLS"},
	} {
		err := validateView(view(c.e), time.Now(), 0)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error saying %q", c.name, err, c.want)
		}
	}
}

// TestStripMeshPodIsIdempotent: the informer may transform an object it
// already transformed; the workload stays.
func TestStripMeshPodIsIdempotent(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "solo",
		Labels: map[string]string{LabelTLSMode: TLSModeIstio, "app": "echo", "version": "v3"}},
		Spec: corev1.PodSpec{ServiceAccountName: "echo-sa", Containers: []corev1.Container{{Name: "app", Image: "x"}}}}
	once, _ := stripMeshPod(pod)
	twice, _ := stripMeshPod(once)
	if w, sa := workloadOf(twice), serviceAccountOf(twice); w != "solo;ns;echo;v3" || sa != "echo-sa" {
		t.Errorf("stripped twice: workload %q, service account %q; want solo;ns;echo;v3 and echo-sa", w, sa)
	}
	if c := once.(*corev1.Pod).Spec.Containers; c != nil {
		t.Errorf("the stripped pod keeps its containers %v", c)
	}
}
