package clusters

import (
	"time"

	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Node labels that give an endpoint its locality.
const (
	labelRegion = "topology.kubernetes.io/region"
	labelZone   = "topology.kubernetes.io/zone"
)

// buildService turns a Service and its EndpointSlices into the hub's view.
// nodeLabels looks up a node's labels by name (nil when unknown); meshPod
// says whether a pod of the Service's namespace accepts Istio mTLS
// (Endpoint.MTLS; nil: none does) and its workload (Endpoint.Workload).
//
// A Service port maps to EndpointSlice ports by name (an unnamed Service port
// to the unnamed slice port). Ready endpoints are Healthy, serving but
// terminating ones Draining, and all others are left out (docs/architecture.md §3.5).
func buildService(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, nodeLabels func(string) map[string]string, meshPodOf func(namespace, name string) (meshPod, bool)) *Service {
	out := &Service{Namespace: svc.Namespace, Name: svc.Name, NotExported: svc.Labels[LabelExport] == "false"}
	if !svc.CreationTimestamp.IsZero() {
		out.Created = time.Unix(svc.CreationTimestamp.Unix(), 0).UTC()
	}
	out.KubernetesServiceAccounts = declaredServiceAccounts(svc.Annotations[AnnotationKubernetesServiceAccounts])
	out.CanonicalServiceAccounts = declaredServiceAccounts(svc.Annotations[AnnotationCanonicalServiceAccounts])
	for _, p := range svc.Spec.Ports {
		sp := ServicePort{Name: p.Name, Port: p.Port, Protocol: string(p.Protocol)}
		if p.AppProtocol != nil {
			sp.AppProtocol = *p.AppProtocol
		}
		out.Ports = append(out.Ports, sp)
	}
	accounts := map[string]bool{} // of the mesh pods behind the endpoints
	// Slices arrive in informer order; sort so identical inputs give identical views.
	sort.Slice(slices, func(i, j int) bool { return slices[i].Name < slices[j].Name })
	for _, slice := range slices {
		if slice.AddressType != discoveryv1.AddressTypeIPv4 && slice.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		for _, sp := range out.Ports {
			target, ok := slicePort(slice, sp.Name)
			if !ok {
				continue
			}
			for _, ep := range slice.Endpoints {
				health, ok := endpointHealth(ep.Conditions)
				if !ok {
					continue
				}
				var region, zone string
				if ep.NodeName != nil && nodeLabels != nil {
					labels := nodeLabels(*ep.NodeName)
					region, zone = labels[labelRegion], labels[labelZone]
				}
				if ep.Zone != nil && *ep.Zone != "" {
					zone = *ep.Zone
				}
				var pod meshPod
				var mtls bool
				if meshPodOf != nil && ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
					pod, mtls = meshPodOf(slice.Namespace, ep.TargetRef.Name)
				}
				if mtls && pod.serviceAccount != "" {
					accounts[pod.serviceAccount] = true
				}
				for _, addr := range ep.Addresses {
					out.Endpoints = append(out.Endpoints, Endpoint{
						Address: addr, Port: target, ServicePort: sp.Port,
						Health: health, Region: region, Zone: zone, MTLS: mtls, Workload: pod.workload,
					})
				}
			}
		}
	}
	if len(accounts) > MaxDeclaredServiceAccounts {
		out.TooManyPodServiceAccounts = true
	} else {
		for sa := range accounts {
			out.PodServiceAccounts = append(out.PodServiceAccounts, sa)
		}
		sort.Strings(out.PodServiceAccounts)
	}
	return out
}

func slicePort(slice *discoveryv1.EndpointSlice, name string) (int32, bool) {
	for _, p := range slice.Ports {
		pn := ""
		if p.Name != nil {
			pn = *p.Name
		}
		if pn == name && p.Port != nil {
			return *p.Port, true
		}
	}
	return 0, false
}

// endpointHealth follows the EndpointSlice API: a nil ready or serving
// condition means the endpoint is ready (serving).
func endpointHealth(c discoveryv1.EndpointConditions) (Health, bool) {
	terminating := c.Terminating != nil && *c.Terminating
	ready := c.Ready == nil || *c.Ready
	serving := c.Serving == nil || *c.Serving
	switch {
	case ready && !terminating:
		return Healthy, true
	case serving && terminating:
		return Draining, true
	case ready:
		return Healthy, true
	}
	return 0, false
}

// maxServiceAccountBytes bounds one declared identity (a SPIFFE ID of a
// namespace and a service account is well under it).
const maxServiceAccountBytes = 512

// maxDeclaredAnnotationBytes bounds a service-account annotation that can
// declare anything.
const maxDeclaredAnnotationBytes = MaxDeclaredServiceAccounts * (maxServiceAccountBytes + 1)

// declaredServiceAccounts reads one of Istio's service-account annotations:
// its comma-separated entries, trimmed, sorted, without duplicates. More
// than MaxDeclaredServiceAccounts entries, or one longer than
// maxServiceAccountBytes, declare nothing: a check against a truncated list
// would refuse endpoints the Service says are its own.
func declaredServiceAccounts(v string) []string {
	if strings.TrimSpace(v) == "" || len(v) > maxDeclaredAnnotationBytes {
		return nil
	}
	var out []string
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if len(e) > maxServiceAccountBytes || len(out) == MaxDeclaredServiceAccounts {
			return nil
		}
		out = append(out, e)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
