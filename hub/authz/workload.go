package authz

import (
	"maps"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
	typev1beta1 "istio.io/api/type/v1beta1"
)

// Workload is the workload behind a proxyless gRPC server, as far as
// policies select it: its namespace and labels, and for the API its
// ServiceAccount and member.
type Workload struct {
	Namespace      string
	ServiceAccount string
	Member         string
	Labels         map[string]string
	// Verified says the namespace and ServiceAccount come from the
	// stream's verified identity (certificate or token); otherwise they
	// are what the node says (a plaintext stream, as istiod's port 15010
	// takes them).
	Verified bool
	// Claimed is the namespace the node claimed when it differs from its
	// verified identity's, which wins ("" otherwise).
	Claimed string
}

// Proven is what the hub verified about a stream, which a node's words
// cannot override.
type Proven struct {
	Namespace, ServiceAccount, Member string
}

// maxLabels bounds the labels read from a node (a pod has few; the node
// is the client's words).
const maxLabels = 64

// maxLabelBytes bounds a label's key and value each (Kubernetes allows
// 317 for a key, 63 for a value).
const maxLabelBytes = 320

// WorkloadOf is the workload of a node: node metadata NAMESPACE, LABELS,
// SERVICE_ACCOUNT and CLUSTER_ID, as istio-agent's bootstrap carries them,
// with what proven establishes in their place. A node that claims another
// namespace than its identity's is held to its identity's (and Claimed
// says what it claimed): a stream cannot take another namespace's
// policies.
func WorkloadOf(node *corev3.Node, proven Proven) Workload {
	md := node.GetMetadata().GetFields()
	w := Workload{
		Namespace:      md["NAMESPACE"].GetStringValue(),
		ServiceAccount: md["SERVICE_ACCOUNT"].GetStringValue(),
		Member:         md["CLUSTER_ID"].GetStringValue(),
	}
	if w.Namespace == "" {
		w.Namespace = namespaceOfNodeID(node.GetId())
	}
	if labels := md["LABELS"].GetStructValue().GetFields(); len(labels) > 0 {
		w.Labels = make(map[string]string, min(len(labels), maxLabels))
		for _, k := range slices.Sorted(maps.Keys(labels)) {
			_, ok := labels[k].GetKind().(*structpb.Value_StringValue)
			s := labels[k].GetStringValue()
			if !ok || len(k) > maxLabelBytes || len(s) > maxLabelBytes || len(w.Labels) == maxLabels {
				continue
			}
			w.Labels[k] = s
		}
	}
	if proven.Namespace != "" {
		if w.Namespace != proven.Namespace && w.Namespace != "" {
			w.Claimed = w.Namespace
		}
		w.Namespace, w.ServiceAccount, w.Verified = proven.Namespace, proven.ServiceAccount, true
	}
	if proven.Member != "" {
		w.Member = proven.Member
	}
	return w
}

// namespaceOfNodeID reads the namespace of an Istio node ID,
// "<type>~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>".
func namespaceOfNodeID(id string) string {
	parts := strings.Split(id, "~")
	if len(parts) != 4 {
		return ""
	}
	_, ns, ok := strings.Cut(parts[2], ".")
	if !ok {
		return ""
	}
	return ns
}

// selects reports whether a policy's workload selector selects w (no
// selector, or an empty one, selects every workload), as istiod's
// WorkloadPolicyMatcher.isSelected.
func (w Workload) selects(selector *typev1beta1.WorkloadSelector) bool {
	for k, v := range selector.GetMatchLabels() {
		if got, ok := w.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// LabelsKey is the workload's labels in one string, sorted (for keys).
func (w Workload) LabelsKey() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(w.Labels)) {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(w.Labels[k])
		b.WriteByte(0)
	}
	return b.String()
}
