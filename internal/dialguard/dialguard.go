// Package dialguard decides which addresses the hub may connect to when an
// untrusted party names the place (a member's kubeconfig, a peer's bundle
// endpoint URL). A Guard is applied twice: to an IP literal when the input
// is accepted, so that it is refused at once, and on every dial to the
// address actually connected after name resolution (net.Dialer's
// ControlContext), so that a DNS name that resolves, or later re-resolves,
// into a denied range is refused too (no DNS rebinding around it).
package dialguard

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
)

// DefaultDeny are the ranges denied unless the operator says otherwise:
// link-local, where cloud metadata services live (169.254.169.254).
var DefaultDeny = []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fe80::/10")}

// Names say, in a Guard's errors, what is being connected to and which
// flags set its ranges.
type Names struct {
	Target    string // e.g. "a member API server"
	AllowFlag string // e.g. "--member-server-cidrs"
	DenyFlag  string // e.g. "--member-server-deny-cidrs"
}

// Guard decides which addresses may be connected to. Unspecified addresses
// (0.0.0.0, ::) are always refused.
type Guard struct {
	allow []netip.Prefix // empty: anything not denied
	deny  []netip.Prefix
	names Names
}

// New returns a guard that allows only allow (empty: anything) minus deny.
func New(allow, deny []netip.Prefix, names Names) (*Guard, error) {
	for _, list := range [][]netip.Prefix{allow, deny} {
		for _, p := range list {
			if !p.IsValid() {
				return nil, fmt.Errorf("invalid CIDR prefix %v", p)
			}
		}
	}
	return &Guard{allow: allow, deny: deny, names: names}, nil
}

// RefusedError is a connection a Guard refused.
type RefusedError struct {
	Addr   netip.Addr
	Reason string // e.g. "is in the denied range 169.254.0.0/16 (--x-deny-cidrs)"
}

func (e *RefusedError) Error() string { return fmt.Sprintf("address %s %s", e.Addr, e.Reason) }

// nat64 is the well-known NAT64 prefix (RFC 6052): 64:ff9b::a9fe:a9fe
// reaches 169.254.169.254 through a NAT64 gateway.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// Check says why addr may not be connected to (a *RefusedError), or nil if
// it may. An IPv4 address embedded in a NAT64 address is judged too: denied
// if either is.
func (g *Guard) Check(addr netip.Addr) error {
	addr = addr.Unmap().WithZone("")
	forms := []netip.Addr{addr}
	if nat64.Contains(addr) {
		b := addr.As16()
		forms = append(forms, netip.AddrFrom4([4]byte(b[12:])))
	}
	for _, a := range forms {
		if a.IsUnspecified() {
			return &RefusedError{Addr: addr, Reason: "is unspecified"}
		}
		for _, p := range g.deny {
			if p.Contains(a) {
				return &RefusedError{Addr: addr, Reason: fmt.Sprintf("is in the denied range %s (%s)", p, g.names.DenyFlag)}
			}
		}
	}
	if len(g.allow) == 0 {
		return nil
	}
	for _, p := range g.allow {
		if p.Contains(addr) {
			return nil
		}
	}
	return &RefusedError{Addr: addr, Reason: fmt.Sprintf("is not in an allowed range (%s %s)", g.names.AllowFlag, prefixList(g.allow))}
}

// Control has the signature of net.Dialer.ControlContext: it runs after the
// name is resolved and before the connection is made, with the address
// about to be connected.
func (g *Guard) Control(_ context.Context, network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("refusing to dial %s %q: not an IP address and port", network, address)
	}
	if err := g.Check(ap.Addr()); err != nil {
		return fmt.Errorf("refusing to connect to %s: %w", g.names.Target, err)
	}
	return nil
}

// ParseCIDRs parses a comma-separated list of CIDR prefixes (a bare address
// is its own /32 or /128). An empty list gives an empty, non-nil slice.
func ParseCIDRs(list string) ([]netip.Prefix, error) {
	out := []netip.Prefix{}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("%q is not a CIDR prefix or address: %w", s, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
