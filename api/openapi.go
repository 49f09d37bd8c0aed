package api

import (
	"net/http"
)

type obj = map[string]any

func ref(name string) obj { return obj{"$ref": "#/components/schemas/" + name} }

func jsonContent(schema obj) obj {
	return obj{"application/json": obj{"schema": schema}}
}

func listOf(name string) obj {
	return obj{"type": "object", "required": []string{"items"}, "properties": obj{"items": obj{"type": "array", "items": ref(name)}}}
}

var problemResponse = obj{"description": "error", "content": obj{"application/problem+json": obj{"schema": ref("Problem")}}}

func op(summary string, ok obj, params ...obj) obj {
	o := obj{
		"summary":   summary,
		"security":  []obj{{"bearer": []string{}}},
		"responses": obj{"401": problemResponse, "403": problemResponse, "default": problemResponse},
	}
	for code, r := range ok {
		o["responses"].(obj)[code] = r
	}
	if len(params) > 0 {
		o["parameters"] = params
	}
	return o
}

func pathParam(name, desc string) obj {
	return obj{"name": name, "in": "path", "required": true, "description": desc, "schema": obj{"type": "string"}}
}

func str() obj     { return obj{"type": "string"} }
func integer() obj { return obj{"type": "integer"} }
func timeStr() obj { return obj{"type": "string", "format": "date-time", "nullable": true} }

func expiryState() obj {
	return obj{"type": "string", "enum": []string{"valid", "expiring", "expired"}, "description": "expiring: within --expiry-warning"}
}

func badgeStr() obj {
	return obj{"type": "string", "description": "the dashboard's badge: \"expires in 3d\" (or 5h, 12m), \"expired\""}
}

func certExpiry(desc string) obj {
	return obj{"type": "object", "description": desc, "properties": obj{
		"subject": str(), "notAfter": obj{"type": "string", "format": "date-time"}, "state": expiryState(), "badge": badgeStr(),
	}}
}

// openAPI documents every /api/v1 route; a test checks it against the router.
var openAPI = obj{
	"openapi": "3.0.3",
	"info":    obj{"title": "hub API", "version": "v1", "description": "Federation hub: member clusters, federated services and connected proxies."},
	"paths": obj{
		"/api/v1/clusters": obj{
			"get": op("List member clusters", obj{"200": obj{"description": "members", "content": jsonContent(listOf("Cluster"))}}),
			"post": func() obj {
				o := op("Register or update a member (writes its remote Secret)", obj{
					"200": obj{"description": "updated", "content": jsonContent(ref("Cluster"))},
					"201": obj{"description": "created", "content": jsonContent(ref("Cluster"))},
				})
				o["requestBody"] = obj{"required": true, "content": jsonContent(ref("RegisterRequest"))}
				return o
			}(),
		},
		"/api/v1/clusters/{id}": obj{
			"get":    op("Get one member cluster", obj{"200": obj{"description": "member", "content": jsonContent(ref("Cluster"))}}, pathParam("id", "cluster ID")),
			"delete": op("Remove a member (its key or its Secret); idempotent", obj{"204": obj{"description": "removed or already gone"}}, pathParam("id", "cluster ID")),
		},
		"/api/v1/services": obj{
			"get": op("List federated services", obj{"200": obj{"description": "services", "content": jsonContent(listOf("Service"))}},
				obj{"name": "member", "in": "query", "required": false, "description": "a member cluster ID: each service then says whether that member's proxies are routed to it and why not (routed, withheld)", "schema": obj{"type": "string"}}),
		},
		"/api/v1/proxies": obj{
			"get": op("List connected xDS streams with per-type ACK/NACK state", obj{"200": obj{"description": "proxies", "content": jsonContent(listOf("Proxy"))}}),
		},
		"/api/v1/proxies/refused": obj{
			"get": op("The most recent xDS streams the hub ended because of what their clients sent (node over the limits, credential refused, ...), newest first, with the gRPC status each client got", obj{"200": obj{"description": "refused streams", "content": jsonContent(listOf("RefusedStream"))}}),
		},
		"/api/v1/proxies/{id}/config": obj{
			"get": op("What a proxy currently holds (secrets redacted)", obj{"200": obj{"description": "config", "content": jsonContent(ref("ProxyConfig"))}}, pathParam("id", "node ID, URL-escaped")),
		},
		"/api/v1/trustdomains": obj{
			"get": op("List our trust domain and every federated one, with bundle status", obj{"200": obj{"description": "trust domains", "content": jsonContent(listOf("TrustDomain"))}}),
		},
		"/api/v1/trustdomains/{td}": obj{
			"get": op("One trust domain", obj{"200": obj{"description": "trust domain", "content": jsonContent(ref("TrustDomain"))}}, pathParam("td", "trust domain name")),
			"put": func() obj {
				o := op("Create or update a federation relationship (writes its ConfigMap)", obj{
					"200": obj{"description": "updated", "content": jsonContent(ref("TrustDomain"))},
					"201": obj{"description": "created", "content": jsonContent(ref("TrustDomain"))},
				}, pathParam("td", "trust domain name"))
				o["requestBody"] = obj{"required": true, "content": jsonContent(ref("PeerRequest"))}
				return o
			}(),
			"delete": op("Remove a federation relationship; idempotent", obj{"204": obj{"description": "removed or already gone"}}, pathParam("td", "trust domain name")),
		},
		"/api/v1/trustdomains/{td}/refresh": obj{
			"post": op("Fetch the peer's bundle now", obj{"200": obj{"description": "trust domain", "content": jsonContent(ref("TrustDomain"))}}, pathParam("td", "trust domain name")),
		},
		"/api/v1/trustdomains/{td}/bundle": obj{
			"get": op("The trust domain's SPIFFE bundle document (ours, or a peer's last accepted one)", obj{"200": obj{"description": "SPIFFE bundle (JWKS)", "content": jsonContent(obj{"type": "object"})}}, pathParam("td", "trust domain name")),
		},
		"/api/v1/distribution": obj{
			"get": op("Istio objects distributed from the home cluster to member istiods: kinds watched, kinds missing (no CRD), and the objects refused, each with its reason (NamespaceNotAllowed: not in --distribute-namespaces; HostNotAllowed: names a host the hub owns; InvalidSpec: does not convert) and a message", obj{"200": obj{"description": "distribution status", "content": jsonContent(obj{"type": "object"})}}),
		},
		"/api/v1/certificates": obj{
			"get": op("Workload certificates issued by the hub's CA (Istio CA API on the mTLS xDS port) per member and namespace, and requests refused per reason, since this replica started", obj{"200": obj{"description": "CA status", "content": jsonContent(ref("Certificates"))}}),
		},
		"/api/v1/openapi.json": obj{
			"get": op("This document", obj{"200": obj{"description": "OpenAPI 3 document", "content": jsonContent(obj{"type": "object"})}}),
		},
	},
	"components": obj{
		"securitySchemes": obj{"bearer": obj{"type": "http", "scheme": "bearer", "description": "Kubernetes token (TokenReview + SubjectAccessReview on secrets in the hub namespace) or a static token from --api-token-file"}},
		"schemas": obj{
			"Problem": obj{"type": "object", "properties": obj{"type": str(), "title": str(), "status": integer(), "detail": str()}},
			"Cluster": obj{"type": "object", "required": []string{"id", "secret", "state", "message", "server", "services", "endpoints", "lastSyncTime"}, "properties": obj{
				"id": str(), "secret": obj{"type": "string", "description": "namespace/name of the remote Secret; empty for the home cluster"},
				"state":   obj{"type": "string", "enum": []string{"Pending", "Syncing", "Ready", "Stale", "Unreachable", "TimedOut", "Invalid", "Conflict"}},
				"message": str(), "server": str(), "services": integer(), "endpoints": integer(), "lastSyncTime": timeStr(),
				"kubeconfigSHA256": obj{"type": "string", "description": "SHA-256 (hex) of the kubeconfig the member's active client runs (absent for the home cluster): after writing a remote Secret, the hub uses it once this matches (hub register --rotate waits for it)"},
				"warnings":         obj{"type": "array", "items": str(), "description": "accepted but risky kubeconfig settings, e.g. insecure-skip-tls-verify"},
				"credentials": obj{"type": "array", "description": "when the inline credentials of the member's kubeconfig expire: a bearer token's JWT exp claim (read, not verified), a client certificate's notAfter; absent: none with a known expiry (an opaque token, files, exec plugins)", "items": obj{"type": "object", "required": []string{"credential"}, "properties": obj{
					"credential": obj{"type": "string", "enum": []string{"token", "client_certificate"}},
					"notAfter":   obj{"type": "string", "format": "date-time", "description": "absent when error says why it could not be read"},
					"state":      expiryState(), "badge": badgeStr(),
					"error": obj{"type": "string", "description": "why a token that is a JWT has no readable exp"},
				}}},
				"network": obj{"type": "string", "description": "the member's Istio network (topology.istio.io/network on istio-system)"},
				"gateways": obj{"type": "array", "description": "east-west gateways into the member's network: its Services labelled with the network on port 15443 (or networking.istio.io/gatewayPort), and the remote Secret's hub.federation/gateways", "items": obj{"type": "object", "properties": obj{
					"address": str(), "port": integer(), "source": obj{"type": "string", "description": "service <namespace>/<name>, or secret annotation"},
					"proxyless": obj{"type": "boolean", "description": "it admits proxyless gRPC (h2; annotation hub.federation/proxyless-alpn=true, after deploy/eastwest-proxyless-alpn.yaml): only such gateways reach proxyless clients of other networks"},
				}}},
				"gatewaysRefused":      obj{"type": "array", "items": str(), "description": "why gateways were not accepted (another network's label, no address, a hostname, a malformed annotation)"},
				"crossNetworkWithheld": obj{"type": "integer", "description": "endpoints proxies on other networks do not get: all of them when no member of its network has a gateway, else those that are not Istio mTLS"},
				"proxylessWithheld":    obj{"type": "integer", "description": "endpoints proxyless gRPC clients on other networks do not get: crossNetworkWithheld, or all of them when no gateway of its network admits proxyless gRPC (gateways[].proxyless)"},
				"gatewayServices":      obj{"type": "array", "items": str(), "description": "Services the hub wrote into the member's istio-system so that its istiod knows the other networks' gateways"},
				"gatewayServicesError": obj{"type": "string", "description": "why the last write of those Services failed (absent: it did not)"},
				"demoted":              obj{"type": "string", "description": "why the member's endpoints are served one priority behind the healthy members' (absent: they are not)"},
				"watchScope":           obj{"type": "string", "description": "what the hub watches in the member: all namespaces, the namespaces of the remote Secret's hub.federation/watch-namespaces, or those its hub.federation/watch-namespace-selector selects"},
				"watchedNamespaces":    obj{"type": "array", "items": str(), "description": "the namespaces watched now (absent: every namespace); istio-system is always watched for gateways, its Services federated only when in scope"},
				"watchRefused":         obj{"type": "integer", "description": "selected namespaces not watched: past the bound of 256 per member"},
				"objects":              obj{"type": "object", "additionalProperties": integer(), "description": "objects the member's informers hold, by kind (Service, EndpointSlice, MeshPod, Node, Secret, ServiceExport)"},
				"exchange": obj{"type": "object", "description": "GET /api/v1/clusters/{id} only: services the member offers every other member (exported), some (exportedToSome, hub.federation/export-to), none (notExported); services its proxies get from other members' views (imported), of which it has none itself (importedOnly)", "properties": obj{
					"exported": integer(), "exportedToSome": integer(), "notExported": integer(), "imported": integer(), "importedOnly": integer(),
				}},
				"serviceExports": obj{"type": "array", "description": "with --export-mode=serviceexport: the member's ServiceExports, the conditions the hub works out (Valid: the Service exists; Conflict: a port's protocol differs from another exporting member's) and whether it wrote them into their status", "items": obj{"type": "object", "properties": obj{
					"namespace": str(), "name": str(), "written": obj{"type": "boolean"}, "writeError": str(),
					"conditions": obj{"type": "array", "items": obj{"type": "object", "properties": obj{"type": str(), "status": str(), "reason": str(), "message": str()}}},
				}}},
			}},
			"RegisterRequest": obj{"type": "object", "additionalProperties": false, "required": []string{"id", "kubeconfig"}, "properties": obj{
				"id": str(), "kubeconfig": obj{"type": "string", "description": "kubeconfig YAML with inline credentials"},
			}},
			"TrustDomain": obj{"type": "object", "properties": obj{
				"trustDomain": str(), "local": obj{"type": "boolean"}, "bundleEndpointURL": str(),
				"profile": obj{"type": "string", "enum": []string{"https_web", "https_spiffe", ""}}, "endpointSPIFFEID": str(),
				"state":   obj{"type": "string", "enum": []string{"Pending", "Ready", "Stale", "Error"}},
				"message": str(), "lastRefresh": timeStr(), "nextRefresh": timeStr(),
				"sequence": obj{"type": "integer", "nullable": true}, "refreshHint": obj{"type": "integer", "nullable": true, "description": "seconds"},
				"x509Authorities": obj{"type": "array", "items": obj{"type": "object", "properties": obj{"subject": str(), "notAfter": timeStr(), "sha256": str()}}},
				"jwtAuthorities":  obj{"type": "array", "items": obj{"type": "object", "properties": obj{"keyID": str()}}},
				"bundleExpiry":    certExpiry("peers: the first X.509 authority of the bundle to expire (absent while there is none)"),
				"ca": obj{"type": "object", "description": "our trust domain: when our CA expires", "properties": obj{
					"root":   certExpiry("the first of the CA's current roots to expire (roots kept after a rotation are not counted)"),
					"chain":  certExpiry("the first of the CA's signing certificate and intermediates to expire (a self-signed CA: its root)"),
					"secret": obj{"type": "string", "description": "namespace/name of the Secret holding the CA (cacerts or hub-trust-state)"},
				}},
			}},
			"PeerRequest": obj{"type": "object", "additionalProperties": false, "required": []string{"bundleEndpointURL", "profile"}, "properties": obj{
				"bundleEndpointURL": str(), "profile": obj{"type": "string", "enum": []string{"https_web", "https_spiffe"}},
				"endpointSPIFFEID": str(), "bundle": obj{"type": "string", "description": "https_spiffe bootstrap: the peer's SPIFFE bundle JSON"},
				"caBundle": obj{"type": "string", "description": "PEM roots for an https_web endpoint not served from a public root"},
			}},
			"Certificates": obj{"type": "object", "required": []string{"defaultTTLSeconds", "maxTTLSeconds", "issued", "failures"}, "properties": obj{
				"defaultTTLSeconds": obj{"type": "integer", "description": "lifetime of a certificate whose request asks for none"},
				"maxTTLSeconds":     obj{"type": "integer", "description": "--max-workload-cert-ttl: longer requests are refused with InvalidArgument"},
				"issued": obj{"type": "array", "description": "per member and namespace, sorted (member and namespace \"*\" count the pairs beyond 10000)", "items": obj{"type": "object", "properties": obj{
					"member": str(), "namespace": str(), "issued": obj{"type": "integer", "description": "certificates issued since this replica started"},
					"valid":      obj{"type": "integer", "description": "identities whose latest certificate has not expired (of the 50000 most recently issued to)"},
					"nextExpiry": obj{"type": "string", "format": "date-time", "nullable": true, "description": "soonest expiry among those latest certificates: when the first of these workloads loses its identity unless it renews"},
				}}},
				"failures": obj{"type": "array", "description": "per reason, every reason listed", "items": obj{"type": "object", "properties": obj{
					"reason": obj{"type": "string", "enum": []string{"no_credentials", "token_rejected", "review_unavailable", "certificate_rejected", "cluster_mismatch", "not_member",
						"rate_limited", "overloaded", "member_not_synced", "member_unknown", "hub_namespace", "root_namespace", "namespace_not_allowed", "invalid_csr", "invalid_ttl", "signing_failed"}},
					"total": integer(), "lastHour": integer(), "last": timeStr(),
					"lastMessage": obj{"type": "string", "description": "what the latest refused caller was told (never a token or a CSR)"},
				}}},
			}},
			"Port": obj{"type": "object", "properties": obj{"name": str(), "port": integer(), "protocol": str(), "appProtocol": str()}},
			"Service": obj{"type": "object", "properties": obj{
				"hostname": str(), "namespace": str(), "name": str(),
				"ports":     obj{"type": "array", "items": ref("Port")},
				"endpoints": obj{"type": "object", "additionalProperties": integer(), "description": "member cluster ID → endpoints"},
				"exports": obj{"type": "object", "description": "member cluster ID → its export, for the members whose view is not offered to every other member (absent: all are); its own member's proxies always get it, member istiods only views offered to every member", "additionalProperties": obj{"type": "object", "properties": obj{
					"exported": obj{"type": "boolean"}, "exportTo": obj{"type": "array", "items": str(), "description": "hub.federation/export-to: the only other members offered it"}, "reason": str(),
				}}},
				"routed":   obj{"type": "boolean", "description": "with ?member=<id>: whether that member's proxies get the service from the hub"},
				"withheld": obj{"type": "object", "additionalProperties": str(), "description": "with ?member=<id>: member → why its view of the service is not served to that member's proxies"},
			}},
			"TypeStatus": obj{"type": "object", "properties": obj{
				"type": str(), "typeUrl": str(), "sentVersion": str(), "sentNonce": str(), "sentAt": timeStr(), "resources": integer(), "sends": integer(),
				"ackedVersion": str(), "ackedAt": timeStr(), "nackedVersion": str(), "nackError": str(), "nackedAt": timeStr(), "nacks": integer(),
			}},
			"Proxy": obj{"type": "object", "properties": obj{
				"id": str(), "stream": integer(), "cluster": str(), "namespace": str(), "address": str(), "identity": str(), "warning": str(), "unserved": integer(), "connectedAt": timeStr(),
				"types": obj{"type": "array", "items": ref("TypeStatus")},
			}},
			"RefusedStream": obj{"type": "object", "properties": obj{
				"at": timeStr(), "id": str(), "address": str(), "identity": str(), "code": str(), "message": str(),
			}},
			"ProxyConfig": obj{"type": "object", "properties": obj{
				"proxy":     ref("Proxy"),
				"resources": obj{"type": "object", "additionalProperties": obj{"type": "array", "items": obj{"type": "object"}}},
			}},
		},
	},
}

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, openAPI) }
