package mcp

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	networking "istio.io/api/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hubmesh/hub/clusters"
)

// Names and labels of the generated ServiceEntries (docs/architecture.md §3.7).
const (
	// NamePrefix starts the name of every generated ServiceEntry: Service
	// <ns>/<name> becomes ServiceEntry <ns>/hub-<name>. Operators keep the
	// prefix for the hub: with configSources [k8s://, xds://hub] istiod
	// keeps its own object when both sources have one of the same
	// namespace and name.
	NamePrefix = "hub-"
	// LabelManagedBy (value ManagedBy) marks every generated object.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "hub"
	// LabelCluster on each endpoint names the member it is in, as Istio
	// labels its own endpoints.
	LabelCluster = "topology.istio.io/cluster"
)

// serviceEntry is one federated Service as an Istio ServiceEntry.
type serviceEntry struct {
	namespace, name string
	labels          map[string]string
	spec            *networking.ServiceEntry
	// created is the oldest creation time of the Service among the members
	// it is built from (zero when none knows it): its create_time, so
	// that no object made later wins its host by age in istiod, and no
	// hub restart or replica changes it.
	created time.Time
}

// buildServiceEntry turns every member's view of one Service into a
// ServiceEntry for host <name>.<namespace>.svc.<domain>: MESH_INTERNAL,
// STATIC, the Service's ports (the union over the members, by number; the
// first member in ID order names a port), one endpoint per ready address
// of every member, in the member's Istio network (clusters.Service.Network,
// "" for none), labelled security.istio.io/tlsMode=istio when its pod is
// (clusters.Endpoint.MTLS). The views are those offered to the istiod of
// member audience: not kept home (clusters.Service.NotExported), and
// either offered to every member or, by hub.federation/export-to, to
// audience ("": to every member only); nil when none is left, or when the
// Service has no ports. Its subjectAltNames are the identities of those
// views' workloads in trustDomain (clusters.PeerIdentities, as istiod
// derives a Kubernetes Service's), so that a sidecar verifies whom it
// reaches, through a gateway too; none when some view names none (or
// trustDomain is ""): then any identity the mesh trusts may serve it.
func buildServiceEntry(members map[string]*clusters.Service, domain, trustDomain, audience string) *serviceEntry {
	ids := make([]string, 0, len(members))
	for id, svc := range members {
		if !svc.NotExported && (svc.ExportTo == nil || audience != "" && slices.Contains(svc.ExportTo, audience)) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	slices.Sort(ids)
	first := members[ids[0]]
	se := &networking.ServiceEntry{
		Hosts:      []string{first.Name + "." + first.Namespace + ".svc." + domain},
		Location:   networking.ServiceEntry_MESH_INTERNAL,
		Resolution: networking.ServiceEntry_STATIC,
	}
	if trustDomain != "" {
		offered := make(map[string]*clusters.Service, len(ids))
		for _, id := range ids {
			offered[id] = members[id]
		}
		if sans, known := clusters.PeerIdentities(trustDomain, offered); known {
			se.SubjectAltNames = sans
		}
	}
	portNames := map[int32]string{} // service port → SE port name
	se.Ports = entryPorts(members, ids, portNames)
	if len(se.Ports) == 0 {
		return nil // istiod refuses a ServiceEntry without ports
	}
	for _, id := range ids {
		se.Endpoints = append(se.Endpoints, memberEntries(id, members[id], portNames)...)
	}
	var created time.Time
	for _, id := range ids {
		if c := members[id].Created; !c.IsZero() && (created.IsZero() || c.Before(created)) {
			created = c
		}
	}
	return &serviceEntry{
		namespace: first.Namespace,
		name:      NamePrefix + first.Name,
		labels:    map[string]string{LabelManagedBy: ManagedBy},
		spec:      se,
		created:   created,
	}
}

// entryPorts are the ServiceEntry's ports, by number: the union over the
// members ids, named by the first that has each (a name Istio would refuse,
// or one taken, becomes port-<number>). It records each port's name in
// names.
func entryPorts(members map[string]*clusters.Service, ids []string, names map[int32]string) []*networking.ServicePort {
	var ports []*networking.ServicePort
	taken := map[string]bool{}
	for _, id := range ids {
		for _, p := range members[id].Ports {
			if _, ok := names[p.Port]; ok {
				continue
			}
			name := p.Name
			if name == "" || taken[name] || len(validation.IsDNS1123Label(name)) > 0 {
				name = fmt.Sprintf("port-%d", p.Port)
			}
			if taken[name] {
				continue // a user port is named port-<this number> for another number
			}
			taken[name] = true
			names[p.Port] = name
			ports = append(ports, &networking.ServicePort{Number: uint32(p.Port), Protocol: protocolOf(p), Name: name})
		}
	}
	slices.SortFunc(ports, func(a, b *networking.ServicePort) int { return int(a.Number) - int(b.Number) })
	return ports
}

// memberEntries are one member's ready endpoints of the ports named in
// ports, one WorkloadEntry per address, sorted by address.
func memberEntries(id string, svc *clusters.Service, ports map[int32]string) []*networking.WorkloadEntry {
	byAddr := map[string]*networking.WorkloadEntry{}
	for _, ep := range svc.Endpoints {
		name, ok := ports[ep.ServicePort]
		if !ok || ep.Health != clusters.Healthy {
			continue
		}
		we := byAddr[ep.Address]
		if we == nil {
			we = &networking.WorkloadEntry{
				Address:  ep.Address,
				Ports:    map[string]uint32{},
				Labels:   map[string]string{LabelCluster: id},
				Locality: locality(ep.Region, ep.Zone),
				Network:  svc.Network,
			}
			byAddr[ep.Address] = we
		}
		if ep.MTLS {
			// Istio's label for endpoints that accept its mTLS: istiod
			// then uses mTLS to them (auto mTLS) and reaches them
			// across networks through their network's gateway.
			we.Labels[clusters.LabelTLSMode] = clusters.TLSModeIstio
		}
		we.Ports[name] = uint32(ep.Port)
	}
	addrs := slices.Sorted(maps.Keys(byAddr))
	out := make([]*networking.WorkloadEntry, len(addrs))
	for i, a := range addrs {
		out[i] = byAddr[a]
	}
	return out
}

// locality is Istio's region/zone form of an endpoint's locality.
func locality(region, zone string) string {
	if zone == "" {
		return region
	}
	return region + "/" + zone
}

// protocolOf reads a Service port's protocol as Istio does
// (pkg/config/kube ConvertProtocol): UDP stays UDP; else the
// appProtocol, else the port name's prefix before the first '-'
// (grpc-web as a whole), names Istio's protocol; else TCP.
func protocolOf(p clusters.ServicePort) string {
	if p.Protocol == "UDP" {
		return "UDP"
	}
	if p.AppProtocol != "" {
		switch p.AppProtocol {
		case "kubernetes.io/h2c":
			return "HTTP2"
		case "kubernetes.io/ws":
			return "HTTP"
		case "kubernetes.io/wss":
			return "HTTPS"
		}
		if proto := namedProtocol(p.AppProtocol); proto != "" {
			return proto
		}
	}
	if proto := namedProtocol(p.Name); proto != "" {
		return proto
	}
	return "TCP"
}

// namedProtocol is the Istio protocol a port name or appProtocol names
// by its prefix, or "".
func namedProtocol(name string) string {
	const grpcWeb = "grpc-web"
	if len(name) >= len(grpcWeb) && strings.EqualFold(name[:len(grpcWeb)], grpcWeb) {
		return "GRPC-Web"
	}
	prefix, _, _ := strings.Cut(name, "-")
	switch strings.ToLower(prefix) {
	case "tcp":
		return "TCP"
	case "udp":
		return "UDP"
	case "grpc":
		return "GRPC"
	case "http":
		return "HTTP"
	case "http_proxy":
		return "HTTP_PROXY"
	case "http2":
		return "HTTP2"
	case "https":
		return "HTTPS"
	case "tls":
		return "TLS"
	case "mongo":
		return "Mongo"
	case "redis":
		return "Redis"
	case "mysql":
		return "MySQL"
	}
	return ""
}
