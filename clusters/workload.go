package clusters

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Istio's labels that name a pod's workload and its canonical service, as
// istiod reads them for telemetry (Istio's pkg/kube/labels and
// kube.GetWorkloadMetaFromPod).
const (
	LabelWorkloadName      = "service.istio.io/workload-name"
	LabelCanonicalName     = "service.istio.io/canonical-name"
	LabelCanonicalRevision = "service.istio.io/canonical-revision"
)

// The labels a canonical service name and revision are read from, first
// present wins (istiod's order).
var (
	canonicalNameLabels     = []string{LabelCanonicalName, "app.kubernetes.io/name", "app"}
	canonicalRevisionLabels = []string{LabelCanonicalRevision, "app.kubernetes.io/version", "version"}
)

// cronJobName is a Job's name made by a CronJob: <cronjob>-<8 to 10 digits>.
var cronJobName = regexp.MustCompile(`(.+)-\d{8,10}$`)

// maxWorkloadPart bounds each field of Endpoint.Workload (a DNS subdomain,
// the longest name any of them is taken from).
const maxWorkloadPart = 253

// podWorkload is what istiod's endpoint metadata istio.workload says of a
// pod, without its last field (the member, which hub/xdsgen appends):
// "<workload>;<namespace>;<canonical-name>;<canonical-revision>", where
//   - workload is the label service.istio.io/workload-name, else the pod's
//     controller heuristically (a ReplicaSet's Deployment without its
//     pod-template-hash, an Argo Rollout's, an OpenShift DeploymentConfig, a
//     CronJob's Job without its timestamp), else the pod's name; the
//     controller is read only for a pod whose name was generated,
//   - canonical-name is the first of service.istio.io/canonical-name,
//     app.kubernetes.io/name, app present, else workload,
//   - canonical-revision the first of service.istio.io/canonical-revision,
//     app.kubernetes.io/version, version present, empty for "latest" or none.
//
// It is "" when a field would not be a valid name (see validWorkloadPart):
// no real API server returns one, and a ';' must never reach the string.
func podWorkload(m *metav1.ObjectMeta) string {
	name := m.Name
	if m.GenerateName != "" {
		for _, ref := range m.OwnerReferences {
			if ref.Controller == nil || !*ref.Controller {
				continue
			}
			name = ref.Name
			hash, rollout := m.Labels["pod-template-hash"], m.Labels["rollouts-pod-template-hash"]
			switch {
			case ref.Kind == "ReplicaSet" && hash != "" && strings.HasSuffix(ref.Name, hash):
				name = strings.TrimSuffix(ref.Name, "-"+hash)
			case ref.Kind == "ReplicaSet" && rollout != "" && strings.HasSuffix(ref.Name, rollout):
				name = strings.TrimSuffix(ref.Name, "-"+rollout)
			case ref.Kind == "ReplicationController" && m.Labels["deploymentconfig"] != "":
				name = m.Labels["deploymentconfig"]
			case ref.Kind == "Job":
				if sub := cronJobName.FindStringSubmatch(ref.Name); len(sub) == 2 {
					name = sub[1]
				}
			}
			break
		}
		if name == "" {
			name = m.Name
		}
	}
	if wn, ok := m.Labels[LabelWorkloadName]; ok {
		name = wn
	}
	canonical, ok := firstLabel(m.Labels, canonicalNameLabels)
	if !ok {
		canonical = name
	}
	revision, _ := firstLabel(m.Labels, canonicalRevisionLabels)
	if revision == "latest" {
		revision = "" // istiod does not send the default
	}
	for _, part := range []string{name, m.Namespace, canonical, revision} {
		if validWorkloadPart(part) != nil {
			return ""
		}
	}
	return name + ";" + m.Namespace + ";" + canonical + ";" + revision
}

func firstLabel(labels map[string]string, keys []string) (string, bool) {
	for _, k := range keys {
		if v, ok := labels[k]; ok {
			return v, true
		}
	}
	return "", false
}

// validWorkloadPart accepts one field of a workload: at most
// maxWorkloadPart bytes of what label values and DNS names are made of
// (letters, digits, '-', '_', '.'; so never the separator ';').
func validWorkloadPart(s string) error {
	if len(s) > maxWorkloadPart {
		return fmt.Errorf("is longer than %d bytes", maxWorkloadPart)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("has %q at byte %d (letters, digits, '-', '_' and '.' only)", c, i)
		}
	}
	return nil
}

// validateWorkload checks an endpoint's Workload against its Service's
// namespace (a persisted view is input): empty, or four valid fields, the
// second the namespace, and only on an endpoint that accepts Istio mTLS
// (only mesh pods' workloads are known).
func validateWorkload(e Endpoint, namespace string) error {
	if e.Workload == "" {
		return nil
	}
	if !e.MTLS {
		return errors.New("a workload on an endpoint that does not accept Istio mTLS")
	}
	parts := strings.Split(e.Workload, ";")
	if len(parts) != 4 {
		return fmt.Errorf("workload %s has %d fields; want 4 (workload;namespace;canonical name;canonical revision)", quote(e.Workload), len(parts))
	}
	if parts[1] != namespace {
		return fmt.Errorf("workload %s is of namespace %s, not the service's", quote(e.Workload), quote(parts[1]))
	}
	for i, p := range parts {
		if err := validWorkloadPart(p); err != nil {
			return fmt.Errorf("workload field %d %w", i+1, err)
		}
	}
	return nil
}

// cachedWorkload is the annotation under which the mesh-pod informer's
// cache keeps a pod's workload (stripMeshPod), so that every endpoint of
// the pod shares one string; it exists in that cache only.
const cachedWorkload = "hub.internal/workload"

// stripMeshPod keeps of a mesh pod what the hub reads: its key, its
// service account (the identity its mTLS endpoints present, as istiod
// derives it) and its workload (podWorkload) as the annotation
// cachedWorkload. An object without labels is one it stripped already (the
// informer may hand it an object twice; a mesh pod always has the label it
// is selected by): kept.
func stripMeshPod(obj any) (any, error) {
	o, ok := obj.(*corev1.Pod)
	if !ok || o.Labels == nil {
		return obj, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Namespace: o.Namespace, Name: o.Name, ResourceVersion: o.ResourceVersion, UID: o.UID,
	}, Spec: corev1.PodSpec{ServiceAccountName: o.Spec.ServiceAccountName}}
	if w := podWorkload(&o.ObjectMeta); w != "" {
		out.Annotations = map[string]string{cachedWorkload: w}
	}
	return out, nil
}

// workloadOf is a cached mesh pod's workload ("" if unknown).
func workloadOf(obj any) string {
	if o, ok := obj.(*corev1.Pod); ok {
		return o.Annotations[cachedWorkload]
	}
	return ""
}

// serviceAccountOf is a cached mesh pod's service account ("" if unknown;
// the API server sets "default" when a pod names none).
func serviceAccountOf(obj any) string {
	if o, ok := obj.(*corev1.Pod); ok {
		return o.Spec.ServiceAccountName
	}
	return ""
}
