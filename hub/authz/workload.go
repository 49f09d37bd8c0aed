package authz

import (
	"maps"
	"slices"
	"strconv"
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
	// Truncated says the node's labels were more than the hub reads
	// (MaxLabels, MaxLabelBytes, string values only): the policies that
	// select it cannot be known, so its servers fail closed (every request
	// denied, mTLS required; see Selection).
	Truncated bool
}

// Proven is what the hub verified about a stream, which a node's words
// cannot override: Verified says it proved a workload identity of ours,
// whose namespace and ServiceAccount then stand (even empty: an identity
// without /ns/<ns>/sa/<sa> selects no namespace's policies).
type Proven struct {
	Verified                          bool
	Namespace, ServiceAccount, Member string
}

// The labels read from a node (the client's words, kept for the stream's
// life): at most MaxLabels labels of MaxLabelBytes in all (a pod has a
// few dozen bytes each).
const (
	MaxLabels     = 128
	MaxLabelBytes = 8 << 10
)

// TrimLabels is a node's LABELS metadata cut to what WorkloadOf reads:
// the labels themselves when within bounds, else a marker that makes the
// workload Truncated.
func TrimLabels(v *structpb.Value) *structpb.Value {
	if _, ok := readLabels(v.GetStructValue().GetFields()); !ok {
		return structpb.NewStringValue("truncated")
	}
	return v
}

// readLabels reads label fields; false when they exceed the bounds or a
// value is not a string.
func readLabels(fields map[string]*structpb.Value) (map[string]string, bool) {
	if len(fields) > MaxLabels {
		return nil, false
	}
	out := make(map[string]string, len(fields))
	size := 0
	for k, v := range fields {
		s, ok := v.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return nil, false
		}
		if size += len(k) + len(s.StringValue); size > MaxLabelBytes {
			return nil, false
		}
		out[k] = s.StringValue
	}
	return out, true
}

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
	if v, ok := md["LABELS"]; ok {
		_, isStruct := v.GetKind().(*structpb.Value_StructValue)
		w.Labels, ok = readLabels(v.GetStructValue().GetFields())
		w.Truncated = !ok || !isStruct
	}
	if proven.Verified {
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

// LabelsKey is the workload's labels in one string, sorted, each key and
// value quoted (the node's words: no two label sets share a key).
func (w Workload) LabelsKey() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(w.Labels)) {
		b.WriteString(strconv.Quote(k))
		b.WriteByte('=')
		b.WriteString(strconv.Quote(w.Labels[k]))
		b.WriteByte(',')
	}
	return b.String()
}
