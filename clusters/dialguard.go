package clusters

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
)

// dialGuard decides which addresses a member's client may connect to. It is
// applied twice: when a kubeconfig is parsed (to a server given as an IP
// literal, so that the API refuses it at once) and on every dial, to the
// address actually connected after name resolution, so that a DNS name that
// resolves (or later re-resolves) into a denied range is refused too.
type dialGuard struct {
	allow []netip.Prefix // empty: anything not denied
	deny  []netip.Prefix
}

func newDialGuard(allow, deny []netip.Prefix) (*dialGuard, error) {
	for _, list := range [][]netip.Prefix{allow, deny} {
		for _, p := range list {
			if !p.IsValid() {
				return nil, fmt.Errorf("invalid CIDR prefix %v", p)
			}
		}
	}
	return &dialGuard{allow: allow, deny: deny}, nil
}

// nat64 is the well-known NAT64 prefix (RFC 6052): 64:ff9b::a9fe:a9fe
// reaches 169.254.169.254 through a NAT64 gateway.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// check says why addr may not be connected to, or nil if it may. An IPv4
// address embedded in a NAT64 address is judged too: denied if either is.
func (g *dialGuard) check(addr netip.Addr) error {
	addr = addr.Unmap().WithZone("")
	forms := []netip.Addr{addr}
	if nat64.Contains(addr) {
		b := addr.As16()
		forms = append(forms, netip.AddrFrom4([4]byte(b[12:])))
	}
	for _, a := range forms {
		if a.IsUnspecified() {
			return fmt.Errorf("address %s is unspecified", addr)
		}
		for _, p := range g.deny {
			if p.Contains(a) {
				return fmt.Errorf("address %s is in the denied range %s (--member-server-deny-cidrs)", addr, p)
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
	return fmt.Errorf("address %s is not in an allowed range (--member-server-cidrs %s)", addr, prefixList(g.allow))
}

// control has the signature of net.Dialer.ControlContext: it runs after the
// name is resolved and before the connection is made, with the address
// about to be connected.
func (g *dialGuard) control(_ context.Context, network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("refusing to dial %s %q: not an IP address and port", network, address)
	}
	if err := g.check(ap.Addr()); err != nil {
		return fmt.Errorf("refusing to connect to a member API server: %w", err)
	}
	return nil
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
