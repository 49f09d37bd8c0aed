package distribute

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	securityv1beta1 "istio.io/api/security/v1beta1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Every kind maps to a registered istio.io/api proto of the same name, and
// type URLs of any version of its group map back to the canonical kind.
func TestKindProtoMapping(t *testing.T) {
	if got := len(Kinds()); got != 15 {
		t.Errorf("Kinds() has %d kinds, want the 15 istiod subscribes to", got)
	}
	for _, k := range kinds {
		m, err := k.newSpec()
		if err != nil {
			t.Errorf("%s: %v", k.name(), err)
			continue
		}
		if got := m.ProtoReflect().Descriptor().FullName(); got != k.proto || got.Name() != protoNameOf(k.kind) {
			t.Errorf("%s: spec proto %s, want %s", k.name(), got, k.proto)
		}
	}
	for typeURL, want := range map[string]string{
		"security.istio.io/v1/PeerAuthentication":         "security.istio.io/v1/PeerAuthentication",
		"security.istio.io/v1beta1/PeerAuthentication":    "security.istio.io/v1/PeerAuthentication",
		"networking.istio.io/v1alpha3/VirtualService":     "networking.istio.io/v1/VirtualService",
		"networking.istio.io/v1alpha3/EnvoyFilter":        "networking.istio.io/v1alpha3/EnvoyFilter",
		"telemetry.istio.io/v1alpha1/Telemetry":           "telemetry.istio.io/v1/Telemetry",
		"extensions.istio.io/v1alpha1/WasmPlugin":         "extensions.istio.io/v1alpha1/WasmPlugin",
		"core/v1alpha1/MeshConfig":                        "",
		"networking.istio.io/v1/NoSuchKind":               "",
		"type.googleapis.com/istio.mcp.v1alpha1.Resource": "",
	} {
		got, ok := CanonicalKind(typeURL)
		if got != want || ok != (want != "") {
			t.Errorf("CanonicalKind(%q) = %q, %v; want %q", typeURL, got, ok, want)
		}
	}
	if p, _ := ProtoName("security.istio.io/v1/PeerAuthentication"); p != "istio.security.v1beta1.PeerAuthentication" {
		t.Errorf("ProtoName(PeerAuthentication) = %q", p)
	}
}

func protoNameOf(kind string) protoreflect.Name { return protoreflect.Name(kind) }

// The spec converts into the proto; unknown fields are refused; the
// version follows the content, not the object's identity or map order.
func TestConvertAndVersion(t *testing.T) {
	k, _ := lookup("security.istio.io", "PeerAuthentication")
	obj := func(mode any, labels map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
			"metadata": map[string]any{"namespace": "istio-system", "name": "default", "labels": labels},
			"spec":     map[string]any{"mtls": map[string]any{"mode": mode}},
		}}
	}
	labels := map[string]any{Label: "true", "a": "1", "b": "2"}
	o, err := convert(k, obj("STRICT", labels))
	if err != nil {
		t.Fatal(err)
	}
	want := &securityv1beta1.PeerAuthentication{Mtls: &securityv1beta1.PeerAuthentication_MutualTLS{Mode: securityv1beta1.PeerAuthentication_MutualTLS_STRICT}}
	if !proto.Equal(o.Spec, want) || o.Kind != "security.istio.io/v1/PeerAuthentication" || o.Namespace != "istio-system" {
		t.Fatalf("converted %+v", o)
	}
	same, _ := convert(k, obj("STRICT", map[string]any{"b": "2", "a": "1", Label: "true"}))
	other, _ := convert(k, obj("PERMISSIVE", labels))
	relabelled, _ := convert(k, obj("STRICT", map[string]any{Label: "true", "a": "1"}))
	if same.Version != o.Version {
		t.Error("same content, different version")
	}
	if other.Version == o.Version || relabelled.Version == o.Version {
		t.Error("different content, same version")
	}
	if _, err := convert(k, obj("BOGUS", labels)); err == nil {
		t.Error("an unknown enum value converted")
	}
	bad := obj("STRICT", labels)
	bad.Object["spec"].(map[string]any)["unknownField"] = true
	if _, err := convert(k, bad); err == nil {
		t.Error("an unknown field converted")
	}
}
