package clusters

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/validate/content"
)

// maxCreatedSkew is how far past now a Service's creation time may lie: a
// member's clock may run ahead of the hub's, but not by more.
const maxCreatedSkew = 24 * time.Hour

// validateView checks a member's view as a whole: every Service as
// validateService does, no Service twice, and at most maxServices Services
// (0: no bound), the member's object cap (--member-max-objects), which
// bounds what its live informers may hold.
func validateView(services []*Service, now time.Time, maxServices int) error {
	if maxServices > 0 && len(services) > maxServices {
		return fmt.Errorf("%d services; the member's object cap is %d", len(services), maxServices)
	}
	seen := make(map[ServiceKey]bool, len(services))
	for _, s := range services {
		if s == nil {
			return errors.New("a null service")
		}
		key := ServiceKey{Namespace: s.Namespace, Name: s.Name}
		if seen[key] {
			return fmt.Errorf("service %s appears twice", quote(key.String()))
		}
		seen[key] = true
		if err := validateService(s, now); err != nil {
			return fmt.Errorf("service %s/%s: %w", quote(s.Namespace), quote(s.Name), err)
		}
	}
	return nil
}

// validateService checks one Service of a member's view against the rules
// a member's API server enforces on the objects buildService reads, so that
// anything that reaches the Sink from elsewhere (a persisted view) is a view
// the live path could have built: DNS-1123 label namespace, name and port
// names; ports 1-65535, unique by name and by number and protocol, TCP, UDP
// or SCTP; appProtocol a qualified name; endpoints with a valid IP address
// that an EndpointSlice accepts (not unspecified, loopback, link-local or
// link-local multicast), a target port in range, a service port the Service
// has and a known health; locality and network valid label values;
// gateways as discoverGateways accepts them (only with a network); declared
// service accounts as declaredServiceAccounts leaves them (at most
// MaxDeclaredServiceAccounts, each at most maxServiceAccountBytes, sorted,
// unique, no commas or spaces); a creation time not before the epoch nor
// more than maxCreatedSkew after now.
// maxExportReason bounds Service.ExportReason.
const maxExportReason = 1024

// validateExport checks a view's export fields as exportOf makes them:
// member IDs, sorted and unique, at most maxExportTo; a bounded reason.
func validateExport(s *Service) error {
	if len(s.ExportTo) > maxExportTo {
		return fmt.Errorf("exported to %d members; at most %d", len(s.ExportTo), maxExportTo)
	}
	for i, id := range s.ExportTo {
		if err := ValidateClusterID(id); err != nil {
			return fmt.Errorf("export-to: %w", err)
		}
		if i > 0 && s.ExportTo[i-1] >= id {
			return errors.New("export-to members are not sorted and unique")
		}
	}
	if len(s.ExportReason) > maxExportReason {
		return fmt.Errorf("export reason is longer than %d bytes", maxExportReason)
	}
	return nil
}

func validateService(s *Service, now time.Time) error {
	if err := dns1123Label("namespace", s.Namespace); err != nil {
		return err
	}
	if err := dns1123Label("name", s.Name); err != nil {
		return err
	}
	if !s.Created.IsZero() && (s.Created.Unix() < 0 || s.Created.After(now.Add(maxCreatedSkew))) {
		return fmt.Errorf("creation time %s is before 1970 or in the future", s.Created.UTC().Format(time.RFC3339))
	}
	if err := labelValue("network", s.Network); err != nil {
		return err
	}
	if len(s.Gateways) > 0 && s.Network == "" {
		return errors.New("gateways without a network")
	}
	if len(s.Gateways) > maxGateways {
		return fmt.Errorf("%d gateways; at most %d", len(s.Gateways), maxGateways)
	}
	for _, g := range s.Gateways {
		if err := gatewayAddress(g); err != nil {
			return err
		}
		if len(g.Source) > maxGatewaySource {
			return fmt.Errorf("gateway source is longer than %d bytes", maxGatewaySource)
		}
	}
	ports, err := validatePorts(s.Ports)
	if err != nil {
		return err
	}
	for i, e := range s.Endpoints {
		if err := validateEndpoint(e, ports); err != nil {
			return fmt.Errorf("endpoint %d: %w", i, err)
		}
		if err := validateWorkload(e, s.Namespace); err != nil {
			return fmt.Errorf("endpoint %d: %w", i, err)
		}
	}
	if err := validateExport(s); err != nil {
		return err
	}
	if err := validateDeclared("kubernetes service accounts", s.KubernetesServiceAccounts); err != nil {
		return err
	}
	if err := validateDeclared("pod service accounts", s.PodServiceAccounts); err != nil {
		return err
	}
	for _, sa := range s.PodServiceAccounts { // they become SPIFFE IDs' last segment
		if msgs := content.IsDNS1123Subdomain(sa); len(msgs) > 0 {
			return fmt.Errorf("pod service account %s: %s", quote(sa), msgs[0])
		}
	}
	return validateDeclared("canonical service accounts", s.CanonicalServiceAccounts)
}

// validatePorts checks a Service's ports and returns the set of their
// numbers.
func validatePorts(ports []ServicePort) (map[int32]bool, error) {
	names := make(map[string]bool, len(ports))
	numbers := make(map[int32]bool, len(ports))
	type portProto struct {
		port  int32
		proto string
	}
	seen := make(map[portProto]bool, len(ports))
	for _, p := range ports {
		if p.Name != "" || len(ports) > 1 {
			if err := dns1123Label("port name", p.Name); err != nil {
				return nil, err
			}
		}
		if names[p.Name] {
			return nil, fmt.Errorf("port name %s appears twice", quote(p.Name))
		}
		names[p.Name] = true
		if err := portNumber("port", p.Port); err != nil {
			return nil, err
		}
		switch p.Protocol {
		case "TCP", "UDP", "SCTP":
		default:
			return nil, fmt.Errorf("port %d: protocol %s is not TCP, UDP or SCTP", p.Port, quote(p.Protocol))
		}
		if seen[portProto{p.Port, p.Protocol}] {
			return nil, fmt.Errorf("port %d/%s appears twice", p.Port, p.Protocol)
		}
		seen[portProto{p.Port, p.Protocol}] = true
		if p.AppProtocol != "" {
			if msgs := content.IsLabelKey(p.AppProtocol); len(msgs) > 0 {
				return nil, fmt.Errorf("port %d: appProtocol %s: %s", p.Port, quote(p.AppProtocol), msgs[0])
			}
		}
		numbers[p.Port] = true
	}
	return numbers, nil
}

// validateEndpoint checks one endpoint against its Service's port numbers.
func validateEndpoint(e Endpoint, servicePorts map[int32]bool) error {
	if err := endpointAddress(e.Address); err != nil {
		return err
	}
	if err := portNumber("target port", e.Port); err != nil {
		return err
	}
	if !servicePorts[e.ServicePort] {
		return fmt.Errorf("service port %d is not a port of the service", e.ServicePort)
	}
	if e.Health != Healthy && e.Health != Draining {
		return fmt.Errorf("unknown health %d", e.Health)
	}
	if err := labelValue("region", e.Region); err != nil {
		return err
	}
	return labelValue("zone", e.Zone)
}

// endpointAddress accepts what an EndpointSlice accepts as an address: an
// IPv4 or IPv6 address (no zone) that is not unspecified, loopback,
// link-local or link-local multicast.
func endpointAddress(s string) error {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil || a.Zone() != "":
		return fmt.Errorf("address %s is not an IP address", quote(s))
	case a.Unmap().IsUnspecified(), a.Unmap().IsLoopback(), a.Unmap().IsLinkLocalUnicast(), a.Unmap().IsLinkLocalMulticast():
		return fmt.Errorf("address %s is unspecified, loopback or link-local", s)
	}
	return nil
}

// validateDeclared checks a declared identity list as declaredServiceAccounts
// builds it.
func validateDeclared(what string, list []string) error {
	if len(list) > MaxDeclaredServiceAccounts {
		return fmt.Errorf("%d %s; at most %d", len(list), what, MaxDeclaredServiceAccounts)
	}
	for i, e := range list {
		switch {
		case e == "" || len(e) > maxServiceAccountBytes:
			return fmt.Errorf("%s: entry %d is empty or longer than %d bytes", what, i, maxServiceAccountBytes)
		case strings.ContainsAny(e, ", \t\r\n"):
			return fmt.Errorf("%s: entry %s holds a comma or white space", what, quote(e))
		case i > 0 && list[i-1] >= e:
			return fmt.Errorf("%s are not sorted and unique", what)
		}
	}
	return nil
}

func dns1123Label(what, v string) error {
	if msgs := content.IsDNS1123Label(v); len(msgs) > 0 {
		return fmt.Errorf("%s %s: %s", what, quote(v), msgs[0])
	}
	return nil
}

func labelValue(what, v string) error {
	if msgs := content.IsLabelValue(v); len(msgs) > 0 {
		return fmt.Errorf("%s %s: %s", what, quote(v), msgs[0])
	}
	return nil
}

func portNumber(what string, p int32) error {
	if p < 1 || p > 65535 {
		return fmt.Errorf("%s %d is not in 1-65535", what, p)
	}
	return nil
}

// maxQuoted bounds a value quoted in an error: what fails validation may be
// arbitrarily long.
const maxQuoted = 80

// quote quotes v for an error message, cut to maxQuoted bytes.
func quote(v string) string {
	if len(v) > maxQuoted {
		return strconv.Quote(v[:maxQuoted]) + "…"
	}
	return strconv.Quote(v)
}
