package distribute

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"sort"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Object is one distributed Istio object, converted. It is immutable: the
// Source replaces an Object when it changes, callers must not modify one
// (nor its maps or Spec).
type Object struct {
	// Kind is the kind as istiod names it (group/version/Kind), e.g.
	// "security.istio.io/v1/PeerAuthentication", whatever version the home
	// cluster serves.
	Kind              string
	Namespace, Name   string
	Labels            map[string]string
	Annotations       map[string]string
	CreationTimestamp time.Time
	// Spec is the istio.io/api proto of the kind, e.g.
	// *securityv1beta1.PeerAuthentication.
	Spec proto.Message
	// Version is a content hash of Spec, Labels and Annotations: it
	// changes exactly when one of them does (istiod updates an object only
	// when its version changes).
	Version string

	ref        corev1.ObjectReference // for Events
	generation int64
}

// convert turns an object of the home cluster into an Object: its spec is
// decoded with protojson into the kind's proto, unknown fields rejected.
func convert(k kindInfo, u *unstructured.Unstructured) (Object, error) {
	spec, err := k.newSpec()
	if err != nil {
		return Object{}, err
	}
	if raw, ok := u.Object["spec"]; ok && raw != nil {
		js, err := json.Marshal(raw)
		if err != nil {
			return Object{}, fmt.Errorf("encoding spec as JSON: %w", err)
		}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, spec); err != nil {
			return Object{}, fmt.Errorf("spec is not a valid %s: %w", k.proto, err)
		}
	}
	o := Object{
		Kind:              k.name(),
		Namespace:         u.GetNamespace(),
		Name:              u.GetName(),
		Labels:            u.GetLabels(),
		Annotations:       u.GetAnnotations(),
		CreationTimestamp: u.GetCreationTimestamp().Time,
		Spec:              spec,
		ref:               refOf(u),
		generation:        u.GetGeneration(),
	}
	o.Version, err = contentVersion(spec, o.Labels, o.Annotations)
	if err != nil {
		return Object{}, err
	}
	return o, nil
}

// contentVersion hashes the spec's deterministic wire form, then the labels
// and annotations in key order, each field length-prefixed so that no two
// different contents share an encoding.
func contentVersion(spec proto.Message, labels, annotations map[string]string) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("encoding spec: %w", err)
	}
	h := sha256.New()
	writeField(h, b)
	writeMap(h, labels)
	writeMap(h, annotations)
	return hex.EncodeToString(h.Sum(nil)[:16]), nil
}

func writeMap(h hash.Hash, m map[string]string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	writeField(h, binary.AppendUvarint(nil, uint64(len(keys))))
	for _, k := range keys {
		writeField(h, []byte(k))
		writeField(h, []byte(m[k]))
	}
}

func writeField(h hash.Hash, b []byte) {
	h.Write(binary.AppendUvarint(nil, uint64(len(b))))
	h.Write(b)
}
