package distribute

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	// The spec protos of every kind in the table below, registered in
	// protoregistry.GlobalTypes.
	_ "istio.io/api/extensions/v1alpha1"
	_ "istio.io/api/networking/v1alpha3"
	_ "istio.io/api/networking/v1beta1"
	_ "istio.io/api/security/v1beta1"
	_ "istio.io/api/telemetry/v1alpha1"
)

// kindInfo is one Istio config kind as istiod names it (its canonical
// group/version/Kind, the type URL it subscribes to over MCP), the resource
// that serves it, and the proto its spec converts to.
type kindInfo struct {
	group, version, kind string
	resource             string // plural, as in the CRD
	proto                protoreflect.FullName
}

// name is the kind as istiod names it: group/version/Kind.
func (k kindInfo) name() string { return k.group + "/" + k.version + "/" + k.kind }

// kinds is every Istio config kind istiod takes from an MCP config source,
// from Istio's pkg/config/schema/metadata.yaml (the module in e2e/interop):
// canonical version, plural, spec proto. The proto packages keep their
// original versions (networking v1alpha3, security v1beta1, ...). It is a
// table rather than an import of istio.io/istio's schema collections, which
// would pull istiod's dependencies into the hub binary.
var kinds = []kindInfo{
	{"networking.istio.io", "v1", "DestinationRule", "destinationrules", "istio.networking.v1alpha3.DestinationRule"},
	{"networking.istio.io", "v1", "Gateway", "gateways", "istio.networking.v1alpha3.Gateway"},
	{"networking.istio.io", "v1", "ServiceEntry", "serviceentries", "istio.networking.v1alpha3.ServiceEntry"},
	{"networking.istio.io", "v1", "Sidecar", "sidecars", "istio.networking.v1alpha3.Sidecar"},
	{"networking.istio.io", "v1", "VirtualService", "virtualservices", "istio.networking.v1alpha3.VirtualService"},
	{"networking.istio.io", "v1", "WorkloadEntry", "workloadentries", "istio.networking.v1alpha3.WorkloadEntry"},
	{"networking.istio.io", "v1", "WorkloadGroup", "workloadgroups", "istio.networking.v1alpha3.WorkloadGroup"},
	{"networking.istio.io", "v1alpha3", "EnvoyFilter", "envoyfilters", "istio.networking.v1alpha3.EnvoyFilter"},
	{"networking.istio.io", "v1beta1", "ProxyConfig", "proxyconfigs", "istio.networking.v1beta1.ProxyConfig"},
	{"security.istio.io", "v1", "AuthorizationPolicy", "authorizationpolicies", "istio.security.v1beta1.AuthorizationPolicy"},
	{"security.istio.io", "v1", "PeerAuthentication", "peerauthentications", "istio.security.v1beta1.PeerAuthentication"},
	{"security.istio.io", "v1", "RequestAuthentication", "requestauthentications", "istio.security.v1beta1.RequestAuthentication"},
	{"telemetry.istio.io", "v1", "Telemetry", "telemetries", "istio.telemetry.v1alpha1.Telemetry"},
	{"extensions.istio.io", "v1alpha1", "WasmPlugin", "wasmplugins", "istio.extensions.v1alpha1.WasmPlugin"},
	{"extensions.istio.io", "v1alpha1", "TrafficExtension", "trafficextensions", "istio.extensions.v1alpha1.TrafficExtension"},
}

// groups are the API groups whose kinds are looked up through discovery.
var groups = map[string]bool{
	"networking.istio.io": true,
	"security.istio.io":   true,
	"telemetry.istio.io":  true,
	"extensions.istio.io": true,
}

// Kinds returns every kind the Source can distribute, as istiod names them
// (group/version/Kind, e.g. "security.istio.io/v1/PeerAuthentication"),
// sorted.
func Kinds() []string {
	out := make([]string, 0, len(kinds))
	for _, k := range kinds {
		out = append(out, k.name())
	}
	sort.Strings(out)
	return out
}

// CanonicalKind maps a type URL istiod subscribes to, in any version of its
// group (pre-1.24 istiods ask for networking.istio.io/v1alpha3/...), to the
// kind name the Source uses; ok is false for a kind it does not know.
func CanonicalKind(typeURL string) (kind string, ok bool) {
	k, ok := lookupTypeURL(typeURL)
	if !ok {
		return "", false
	}
	return k.name(), true
}

// ProtoName returns the full name of the spec proto of a kind (as istiod
// names it, any version), e.g. "istio.security.v1beta1.PeerAuthentication":
// the body of an MCP resource is an Any of type.googleapis.com/<ProtoName>.
func ProtoName(kind string) (string, bool) {
	k, ok := lookupTypeURL(kind)
	if !ok {
		return "", false
	}
	return string(k.proto), true
}

func lookupTypeURL(typeURL string) (kindInfo, bool) {
	parts := strings.Split(typeURL, "/")
	if len(parts) != 3 {
		return kindInfo{}, false
	}
	return lookup(parts[0], parts[2])
}

// lookup finds a kind by group and Kind, whatever the version.
func lookup(group, kind string) (kindInfo, bool) {
	for _, k := range kinds {
		if k.group == group && k.kind == kind {
			return k, true
		}
	}
	return kindInfo{}, false
}

// newSpec returns an empty spec message of the kind.
func (k kindInfo) newSpec() (protoreflect.ProtoMessage, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(k.proto)
	if err != nil {
		return nil, fmt.Errorf("spec proto %s of %s: %w", k.proto, k.name(), err)
	}
	return mt.New().Interface(), nil
}
