package clusters

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Gateway is one east-west gateway of a member: an address on which
// proxies of other networks reach the member's workloads, Istio mTLS
// passed through by SNI (Istio's AUTO_PASSTHROUGH on port 15443).
type Gateway struct {
	Address string // an IP address
	Port    int32
	// Source says where the hub found it: "service <namespace>/<name>" or
	// "secret annotation".
	Source string
	// Proxyless says it admits proxyless gRPC (AnnotationProxylessALPN):
	// only then do proxyless clients of other networks get it.
	Proxyless bool
}

// String is the gateway's address and port.
func (g Gateway) String() string {
	return netip.AddrPortFrom(netip.MustParseAddr(g.Address), uint16(g.Port)).String()
}

// Istio's names for east-west gateways (pilot/pkg/serviceregistry/kube/
// controller/network.go).
const (
	// DefaultGatewayPort is the port of a gateway Service that passes
	// Istio mTLS through by SNI.
	DefaultGatewayPort = 15443
	// LabelGatewayPort on a gateway Service names another port.
	LabelGatewayPort = "networking.istio.io/gatewayPort"
	// AnnotationNodeSelector on a NodePort gateway Service selects the
	// nodes whose external IPs carry its node port (a JSON object of
	// labels; {} for every node), as istiod reads it.
	AnnotationNodeSelector = "traffic.istio.io/nodeSelector"
)

// AnnotationGateways on a remote Secret names east-west gateways of its
// members that the members' own Services do not describe (e.g. behind a
// load balancer the member's API cannot show): a comma-separated list of
// IP:port (port 15443 when omitted). They belong to each member's own
// network and come before the discovered ones.
const AnnotationGateways = "hub.federation/gateways"

// AnnotationNetwork on a remote Secret confirms its members' Istio network:
// "net-east" for every member of the Secret, or "west=net-west,east=net-east"
// per member. A member's gateways are used (in the hub's EDS, and written
// into other members for their istiods) only when its network label is
// confirmed this way: anyone who can label the member's istio-system could
// otherwise join another network and stand in as its way in. The home
// cluster's network needs no confirmation (it is the operator's own).
const AnnotationNetwork = "hub.federation/network"

// AnnotationGatewayNamespaces on a remote Secret names the namespaces,
// besides SystemNamespace (Istio's convention), whose Services may be its
// members' east-west gateways: a comma-separated list of namespace names.
// A Service labelled with a network anywhere else is refused, whatever it
// says: any tenant of a member can label a Service, and a gateway is the
// way into the member's network for every other network.
const AnnotationGatewayNamespaces = "hub.federation/gateway-namespaces"

// AnnotationProxylessALPN ("true") on an east-west gateway Service, or on a
// remote Secret for the gateways its AnnotationGateways names, says the
// gateway admits proxyless gRPC: its AUTO_PASSTHROUGH chains also match
// grpc-go's ALPN h2, which istiod's do not (they match Istio's mTLS ALPNs
// only) unless deploy/eastwest-proxyless-alpn.yaml is applied to it.
// Proxyless clients of other networks get only such gateways: through any
// other their connections would be closed. It is the gateway owner's word
// about their own gateway, so a member's Service may say it: it steers only
// proxyless traffic into their own (confirmed) network, for the members of
// that network without a gateway that admits it too (a network's gateway
// reaches every member on it).
const AnnotationProxylessALPN = "hub.federation/proxyless-alpn"

// maxGatewayNamespaces bounds AnnotationGatewayNamespaces.
const maxGatewayNamespaces = 16

// ReasonGatewayRefused is the reason of the Event on a remote Secret when
// one of its member's Services is refused as a gateway.
const ReasonGatewayRefused = "GatewayRefused"

// parseGatewayNamespaces reads AnnotationGatewayNamespaces: the namespaces
// where gateway Services may live, SystemNamespace always among them. A
// name that is not a namespace's refuses the whole annotation (only
// SystemNamespace is then allowed).
func parseGatewayNamespaces(v string) ([]string, error) {
	out := []string{SystemNamespace}
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(e); len(errs) > 0 {
			return []string{SystemNamespace}, fmt.Errorf("annotation %s: %s is not a namespace name: %s", AnnotationGatewayNamespaces, quote(e), errs[0])
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
		if len(out) > maxGatewayNamespaces+1 {
			return []string{SystemNamespace}, fmt.Errorf("annotation %s: more than %d namespaces", AnnotationGatewayNamespaces, maxGatewayNamespaces)
		}
	}
	slices.Sort(out)
	return out, nil
}

// confirmedNetwork reads AnnotationNetwork for member id ("" when it names
// none for it).
func confirmedNetwork(v, id string) string {
	v = strings.TrimSpace(v)
	if !strings.Contains(v, "=") {
		return v
	}
	for e := range strings.SplitSeq(v, ",") {
		if k, nw, ok := strings.Cut(strings.TrimSpace(e), "="); ok && strings.TrimSpace(k) == id {
			return strings.TrimSpace(nw)
		}
	}
	return ""
}

// maxGateways bounds the gateways of one member (from its Services and its
// Secret together): beyond it the rest are refused.
const maxGateways = 16

// maxGatewaySource bounds Gateway.Source in a persisted view.
const maxGatewaySource = 256

// maxGatewaysRefused bounds the reasons a gatewayView keeps: any tenant can
// label Services, and each would otherwise add one to the status.
const maxGatewaysRefused = 32

// gatewayView is what a member's gateway Services and its Secret say:
// the accepted gateways and, for those refused, why.
type gatewayView struct {
	network  string // the member's network they are for
	gateways []Gateway
	refused  []string // at most maxGatewaysRefused, then a count of the rest
	// refusedCount is how many were refused in all.
	refusedCount int
}

// refuse records why a gateway (or all of them) was refused.
func (v *gatewayView) refuse(why string) {
	v.refusedCount++
	switch {
	case len(v.refused) < maxGatewaysRefused:
		v.refused = append(v.refused, why)
	case len(v.refused) == maxGatewaysRefused:
		v.refused = append(v.refused, "") // the count of the rest, set by discoverGateways
	}
}

// gatewaySources is what discoverGateways works a member's gateways out
// from.
type gatewaySources struct {
	network string
	// confirmed says whether the member's network is confirmed
	// (AnnotationNetwork): if not, no gateway is accepted.
	confirmed bool
	// namespaces are where gateway Services may live
	// (parseGatewayNamespaces), sorted.
	namespaces []string
	services   []*corev1.Service // labelled with LabelNetwork
	nodes      []*corev1.Node    // for NodePort gateways
	// annotated are the Secret's gateways (AnnotationGateways), accepted
	// first; annotErr is why that annotation or AnnotationGatewayNamespaces
	// was refused.
	annotated []Gateway
	annotErr  []error
}

// parseGatewayAnnotation reads AnnotationGateways: IP or IP:port entries.
// Any entry that is not one refuses the whole annotation (it fails closed:
// a typo must not silently route to a subset).
func parseGatewayAnnotation(v string) ([]Gateway, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var out []Gateway
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		var g Gateway
		if ap, err := netip.ParseAddrPort(e); err == nil {
			g = Gateway{Address: ap.Addr().String(), Port: int32(ap.Port())}
		} else if a, err := netip.ParseAddr(e); err == nil {
			g = Gateway{Address: a.String(), Port: DefaultGatewayPort}
		} else {
			return nil, fmt.Errorf("annotation %s: %s is not IP or IP:port", AnnotationGateways, quote(e))
		}
		if err := gatewayAddress(g); err != nil {
			return nil, fmt.Errorf("annotation %s: %w", AnnotationGateways, err)
		}
		g.Source = "secret annotation"
		if len(out) == maxGateways {
			return nil, fmt.Errorf("annotation %s: more than %d gateways", AnnotationGateways, maxGateways)
		}
		out = append(out, g)
	}
	return out, nil
}

// gatewayAddress checks a gateway as validateService checks endpoints: an
// IP address (no zone) that is not unspecified, loopback or link-local,
// and a port in range.
func gatewayAddress(g Gateway) error {
	if err := endpointAddress(g.Address); err != nil {
		return fmt.Errorf("gateway %w", err)
	}
	return portNumber("gateway port", g.Port)
}

// discoverGateways finds a member's east-west gateways as istiod does: its
// Services labelled topology.istio.io/network that listen on 15443 (or
// LabelGatewayPort), addressed by LoadBalancer ingress IPs, externalIPs,
// or, for a NodePort Service annotated with AnnotationNodeSelector, the
// node port on the external IPs of the nodes it selects. Unlike istiod it
// takes them only from SystemNamespace and the namespaces the remote
// Secret names (AnnotationGatewayNamespaces), so that no tenant's Service
// becomes a gateway nor displaces one, and only for the member's own,
// confirmed network: a member cannot make itself the way into another
// network (a label is not an authorisation).
func discoverGateways(in gatewaySources) (v gatewayView) {
	v = gatewayView{network: in.network} // named: the deferred calls below finish it
	for _, err := range in.annotErr {
		v.refuse(err.Error())
	}
	svcs := slices.Clone(in.services)
	slices.SortFunc(svcs, func(a, b *corev1.Service) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	allowed := svcs[:0]
	var refusedNS []string
	for _, svc := range svcs {
		if _, ok := slices.BinarySearch(in.namespaces, svc.Namespace); ok {
			allowed = append(allowed, svc)
			continue
		}
		refusedNS = append(refusedNS, fmt.Sprintf("service %s/%s: namespace %s may not hold gateways (only %s and the namespaces the remote Secret's annotation %s, or for the home cluster --home-gateway-namespaces, names)",
			svc.Namespace, svc.Name, svc.Namespace, SystemNamespace, AnnotationGatewayNamespaces))
	}
	defer v.countRest()
	defer func() { // after the operator's own reasons, which tenants cannot push out of the list
		for _, r := range refusedNS {
			v.refuse(r)
		}
	}()
	switch {
	case in.network == "":
		if len(in.annotated) > 0 || len(allowed) > 0 {
			v.refuse(fmt.Sprintf("the member has no network (label namespace %s with %s): its gateways are not used", SystemNamespace, LabelNetwork))
		}
		return v
	case !in.confirmed:
		if len(in.annotated) > 0 || len(allowed) > 0 {
			v.refuse(fmt.Sprintf("network %s is not confirmed by the remote Secret (annotation %s): the member's gateways are not used; a member's own label cannot make it a way into a network", quote(in.network), AnnotationNetwork))
		}
		return v
	}
	seen := map[Gateway]bool{}
	add := func(g Gateway) {
		key := Gateway{Address: g.Address, Port: g.Port}
		if seen[key] {
			return
		}
		if len(v.gateways) == maxGateways {
			v.refuse(fmt.Sprintf("%s: more than %d gateways; %s:%d left out", g.Source, maxGateways, g.Address, g.Port))
			return
		}
		seen[key] = true
		v.gateways = append(v.gateways, g)
	}
	for _, g := range in.annotated {
		add(g)
	}
	for _, svc := range allowed {
		source := "service " + svc.Namespace + "/" + svc.Name
		if nw := svc.Labels[LabelNetwork]; nw != in.network {
			v.refuse(fmt.Sprintf("%s: labelled for network %s, but the member is on network %s", source, quote(nw), quote(in.network)))
			continue
		}
		gws, problem := serviceGateways(svc, in.nodes)
		if problem != "" {
			v.refuse(source + ": " + problem)
		}
		for _, g := range gws {
			g.Source = source
			add(g)
		}
	}
	return v
}

// countRest ends the refused list with how many reasons it left out.
func (v *gatewayView) countRest() {
	if n := len(v.refused); n > maxGatewaysRefused {
		v.refused[n-1] = fmt.Sprintf("… %d more refused", v.refusedCount-maxGatewaysRefused)
	}
}

// serviceGateways lists the gateways one labelled Service offers, or says
// why it offers none.
func serviceGateways(svc *corev1.Service, nodes []*corev1.Node) (out []Gateway, problem string) {
	port := int32(DefaultGatewayPort)
	if s, ok := svc.Labels[LabelGatewayPort]; ok {
		p, err := strconv.ParseInt(s, 10, 32)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Sprintf("label %s=%s is not a port", LabelGatewayPort, quote(s))
		}
		port = int32(p)
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		return nil, fmt.Sprintf("no port %d", port)
	}
	var hostnames []string
	addIP := func(ip string, p int32) {
		g := Gateway{Address: ip, Port: p}
		if a, err := netip.ParseAddr(ip); err == nil {
			g.Address = a.String()
		}
		if gatewayAddress(g) == nil {
			out = append(out, g)
		}
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		switch {
		case ing.IP != "":
			addIP(ing.IP, port)
		case ing.Hostname != "":
			hostnames = append(hostnames, ing.Hostname)
		}
	}
	for _, ip := range svc.Spec.ExternalIPs {
		addIP(ip, port)
	}
	defer func() { // every address of the Service, whichever way it was found
		if svc.Annotations[AnnotationProxylessALPN] == "true" {
			for i := range out {
				out[i].Proxyless = true
			}
		}
	}()
	if sel, ok := svc.Annotations[AnnotationNodeSelector]; ok && len(out) == 0 && svc.Spec.Type == corev1.ServiceTypeNodePort && sp.NodePort != 0 {
		var match map[string]string
		if err := json.Unmarshal([]byte(sel), &match); err != nil {
			return nil, fmt.Sprintf("annotation %s is not a JSON object of labels: %v", AnnotationNodeSelector, err)
		}
		for _, n := range nodes {
			if !labels.SelectorFromSet(match).Matches(labels.Set(n.Labels)) {
				continue
			}
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeExternalIP {
					addIP(a.Address, sp.NodePort)
				}
			}
		}
	}
	if len(out) == 0 {
		if len(hostnames) > 0 {
			return nil, fmt.Sprintf("load balancer hostname %s is not resolved by the hub; name the gateway's IP in the remote Secret's %s annotation", quote(hostnames[0]), AnnotationGateways)
		}
		return nil, "no address yet (no load balancer ingress IP, externalIPs, or node port on selected nodes' external IPs)"
	}
	return out, ""
}

// secretNetworking is what a remote Secret says of its members' network:
// its AnnotationGateways, AnnotationNetwork, AnnotationGatewayNamespaces and
// AnnotationProxylessALPN, as written.
type secretNetworking struct{ gateways, network, gatewayNamespaces, proxylessALPN string }
