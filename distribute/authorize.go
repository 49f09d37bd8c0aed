package distribute

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// Why an object is left out (Rejection.Reason).
const (
	// ReasonNamespace: the object is not in a namespace distribution is
	// allowed from (Options.Namespaces).
	ReasonNamespace = "NamespaceNotAllowed"
	// ReasonHost: the object names a host the hub owns (HostGuard).
	ReasonHost = "HostNotAllowed"
	// ReasonSpec: the object's spec does not convert to its kind's proto.
	ReasonSpec = "InvalidSpec"
)

// HostGuard refuses distributed objects that name a host the hub owns:
// any host under the federated domain (the hosts of the ServiceEntries the
// hub generates, <name>.<namespace>.svc.<FederatedDomain>), and the hosts
// of the Services it federates (<name>.<namespace>.svc.<DomainSuffix>).
// A distributed object reaches every member's istiod; one that defined
// such a host would take the hub's own traffic there (istiod gives a host
// defined in several namespaces to the oldest object).
//
// The hosts checked are those that define or take traffic for a host:
// ServiceEntry hosts, VirtualService hosts, DestinationRule host and
// Sidecar egress hosts (namespace/host). A short name (no dot) is read as
// Istio reads it, in the object's namespace. A wildcard is refused when it
// lies within the federated domain ("*.svc.clusterset.local") or covers it
// from inside a label ("*clusterset.local", "*set.local"); and, in a
// ServiceEntry, VirtualService or DestinationRule, whenever it matches a
// host of the hub at all ("*", "*.local"): istiod applies the most
// specific host's object, and a federated host without one of its own
// takes the wildcard's routes or traffic policy (a tls mode DISABLE would
// turn the hub's mTLS off). A Sidecar's egress wildcards import
// namespaces' services, and a VirtualService bound only to gateways (not
// "mesh") routes their ingress: they claim no mesh traffic and pass.
type HostGuard struct {
	// FederatedDomain is the suffix of the generated ServiceEntries' hosts.
	FederatedDomain string
	// DomainSuffix is the members' service domain, for short names.
	DomainSuffix string
	// Federated reports whether the hub federates a hostname (in the
	// DomainSuffix form); nil: none. It must be safe for concurrent use
	// and not block.
	Federated func(host string) bool
	// Hostnames lists the hostnames the hub federates (in the
	// DomainSuffix form), for wildcards; nil: none. The same terms as
	// Federated.
	Hostnames func() []string
}

// check returns why spec (of an object in namespace) may not be
// distributed, or nil.
func (g HostGuard) check(namespace string, spec proto.Message) error {
	claims := wildcardsClaim(spec)
	for _, h := range namedHosts(spec) {
		if err := g.checkHost(namespace, h, claims); err != nil {
			return err
		}
	}
	return nil
}

// checkHost refuses one host named by an object in namespace; claims says
// a wildcard host takes traffic for every host it matches (see HostGuard).
func (g HostGuard) checkHost(namespace, host string, claims bool) error {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if h != "*" && !strings.Contains(h, ".") && g.DomainSuffix != "" {
		h = h + "." + namespace + ".svc." + g.DomainSuffix
	}
	fd := strings.ToLower(g.FederatedDomain)
	if fd != "" && (h == fd || strings.HasSuffix(h, "."+fd) || partialWildcardOver(h, fd)) {
		return fmt.Errorf("host %q is under the federated domain %s: only the hub defines those hosts", host, fd)
	}
	if suffix, wildcard := strings.CutPrefix(h, "*"); wildcard && claims {
		if fd != "" && strings.HasSuffix("svc."+fd, suffix) {
			return fmt.Errorf("host %q matches every host of the federated domain %s: it would take the hub's traffic wherever no object names the host itself", host, fd)
		}
		if g.Hostnames != nil {
			for _, fh := range g.Hostnames() {
				if strings.HasSuffix(fh, suffix) {
					return fmt.Errorf("host %q matches %s, a Service the hub federates: it would take that traffic wherever no object names the host itself", host, fh)
				}
			}
		}
	}
	if g.Federated != nil && !strings.HasPrefix(h, "*") && g.Federated(h) {
		return fmt.Errorf("host %q is a Service the hub federates: only its own cluster's objects may define it", host)
	}
	return nil
}

// partialWildcardOver reports whether h is a wildcard with text after its
// "*" in the first label ("*clusterset.local", "*set.local": Istio accepts
// them and matches every host ending in what follows the "*") that matches
// every host under domain, as "*.<domain>" would.
func partialWildcardOver(h, domain string) bool {
	rest, ok := strings.CutPrefix(h, "*")
	return ok && rest != "" && !strings.HasPrefix(rest, ".") && strings.HasSuffix("."+domain, rest)
}

// wildcardsClaim reports whether the wildcard hosts of spec take the mesh's
// traffic for the hosts they match: not a Sidecar's egress (an import),
// nor a VirtualService bound only to gateways (ingress routes: "mesh" is
// not among its gateways).
func wildcardsClaim(spec proto.Message) bool {
	switch s := spec.(type) {
	case *networking.Sidecar:
		return false
	case *networking.VirtualService:
		return len(s.GetGateways()) == 0 || slices.Contains(s.GetGateways(), "mesh")
	}
	return true
}

// namedHosts lists the hosts an object's spec defines or takes traffic
// for (see HostGuard).
func namedHosts(spec proto.Message) []string {
	switch s := spec.(type) {
	case *networking.ServiceEntry:
		return s.GetHosts()
	case *networking.VirtualService:
		return s.GetHosts()
	case *networking.DestinationRule:
		if s.GetHost() == "" {
			return nil
		}
		return []string{s.GetHost()}
	case *networking.Sidecar:
		var out []string
		for _, l := range s.GetEgress() {
			for _, nh := range l.GetHosts() {
				_, h, ok := strings.Cut(nh, "/")
				if !ok {
					h = nh
				}
				out = append(out, h)
			}
		}
		return out
	}
	return nil
}

// namesHosts reports whether objects of a kind can name hosts (and so need
// checking again when the federated hosts change).
func namesHosts(spec proto.Message) bool {
	switch spec.(type) {
	case *networking.ServiceEntry, *networking.VirtualService, *networking.DestinationRule, *networking.Sidecar:
		return true
	}
	return false
}

// authorize returns why o may not be distributed: its namespace is not
// allowed, or it names a host the hub owns.
func (s *Source) authorize(o Object) (reason string, err error) {
	if !slices.Contains(s.opts.Namespaces, o.Namespace) {
		return ReasonNamespace, fmt.Errorf("namespace %s is not one distribution is allowed from (%s)", o.Namespace, strings.Join(s.opts.Namespaces, ", "))
	}
	if err := s.checkHosts(o); err != nil {
		return ReasonHost, err
	}
	return "", nil
}

// checkHosts is HostGuard.check of o, saying of a DestinationRule that
// the hub's own xDS still reads it (Source.Rules).
func (s *Source) checkHosts(o Object) error {
	err := s.opts.Hosts.check(o.Namespace, o.Spec)
	if _, ok := o.Spec.(*networking.DestinationRule); ok && err != nil {
		err = fmt.Errorf("%w; not distributed to members, but the hub's own xDS applies its load balancing settings to the hosts it serves", err)
	}
	return err
}
