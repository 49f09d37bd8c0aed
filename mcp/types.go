package mcp

import "strings"

// Istio config type URLs have the form <group>/<version>/<Kind>, e.g.
// networking.istio.io/v1/ServiceEntry, with group core for MeshConfig
// (core/v1alpha1/MeshConfig). istiod subscribes with the version it was
// built for (docs/architecture.md §3.7): every version of a kind gets the same
// resources, under the type URL it asked for.

// Kind names the kinds the generator fills; every other config kind is
// answered with an empty list.
const (
	groupNetworking  = "networking.istio.io"
	kindServiceEntry = "ServiceEntry"
)

// typeURLParts splits an Istio config type URL into group, version and
// kind, or reports that it is not one. The version must look like a
// Kubernetes API version (v1, v1alpha3, v1beta1) and the kind like a Go
// identifier starting with an upper-case letter; Envoy type URLs
// (type.googleapis.com/...) have a single slash and never match.
func typeURLParts(typeURL string) (group, version, kind string, ok bool) {
	group, rest, ok1 := strings.Cut(typeURL, "/")
	version, kind, ok2 := strings.Cut(rest, "/")
	if !ok1 || !ok2 || !validGroup(group) || !validVersion(version) || !validKind(kind) {
		return "", "", "", false
	}
	return group, version, kind, true
}

// IsConfigType reports whether typeURL is an Istio config type URL
// (<group>/<version>/<Kind>), which the generator answers.
func IsConfigType(typeURL string) bool {
	_, _, _, ok := typeURLParts(typeURL)
	return ok
}

// maxTypeURLPart bounds each part of an accepted type URL (Kubernetes
// bounds a group to a DNS subdomain, 253 bytes; kinds are far shorter).
const maxTypeURLPart = 253

func validGroup(g string) bool {
	if g == "" || len(g) > maxTypeURLPart {
		return false
	}
	for i := 0; i < len(g); i++ {
		c := g[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return false
		}
	}
	return g[0] != '.' && g[len(g)-1] != '.'
}

// validVersion accepts v<digits>[(alpha|beta)<digits>].
func validVersion(v string) bool {
	if len(v) < 2 || v[0] != 'v' {
		return false
	}
	rest := strings.TrimLeft(v[1:], "0123456789")
	if len(rest) == len(v)-1 { // no major version
		return false
	}
	for _, stage := range []string{"alpha", "beta"} {
		if tail, ok := strings.CutPrefix(rest, stage); ok {
			return tail != "" && strings.Trim(tail, "0123456789") == ""
		}
	}
	return rest == ""
}

func validKind(k string) bool {
	if k == "" || len(k) > maxTypeURLPart || k[0] < 'A' || k[0] > 'Z' {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// IstiodTypeCount is how many config types istiod subscribes to.
const IstiodTypeCount = 16

// IstiodTypes returns the type URLs istiod (1.24 and later) subscribes to
// on its config-source stream, in its order (docs/architecture.md §3.7): the shape the
// hub is tested and benchmarked against.
func IstiodTypes() [IstiodTypeCount]string { return istiodTypes }

var istiodTypes = [IstiodTypeCount]string{
	"core/v1alpha1/MeshConfig",
	"networking.istio.io/v1/DestinationRule",
	"networking.istio.io/v1alpha3/EnvoyFilter",
	"networking.istio.io/v1/Gateway",
	"networking.istio.io/v1beta1/ProxyConfig",
	"networking.istio.io/v1/ServiceEntry",
	"networking.istio.io/v1/Sidecar",
	"networking.istio.io/v1/VirtualService",
	"networking.istio.io/v1/WorkloadEntry",
	"networking.istio.io/v1/WorkloadGroup",
	"security.istio.io/v1/AuthorizationPolicy",
	"security.istio.io/v1/PeerAuthentication",
	"security.istio.io/v1/RequestAuthentication",
	"telemetry.istio.io/v1/Telemetry",
	"extensions.istio.io/v1alpha1/WasmPlugin",
	"extensions.istio.io/v1alpha1/TrafficExtension",
}
