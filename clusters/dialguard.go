package clusters

import (
	"context"
	"net/netip"
	"syscall"

	"github.com/hubmesh/hub/internal/dialguard"
)

// dialGuard decides which addresses a member's client may connect to
// (dialguard.Guard, its errors naming --member-server-cidrs and
// --member-server-deny-cidrs). It is applied twice: when a kubeconfig is
// parsed (to a server given as an IP literal, so that the API refuses it at
// once) and on every dial, to the address actually connected after name
// resolution, so that a DNS name that resolves (or later re-resolves) into a
// denied range is refused too.
type dialGuard struct{ g *dialguard.Guard }

// memberGuardNames name member API servers and their flags in refusals.
var memberGuardNames = dialguard.Names{
	Target: "a member API server", AllowFlag: "--member-server-cidrs", DenyFlag: "--member-server-deny-cidrs",
}

func newDialGuard(allow, deny []netip.Prefix) (*dialGuard, error) {
	g, err := dialguard.New(allow, deny, memberGuardNames)
	if err != nil {
		return nil, err
	}
	return &dialGuard{g: g}, nil
}

// check says why addr may not be connected to, or nil if it may.
func (g *dialGuard) check(addr netip.Addr) error { return g.g.Check(addr) }

// control has the signature of net.Dialer.ControlContext (dialguard.Guard.Control).
func (g *dialGuard) control(ctx context.Context, network, address string, c syscall.RawConn) error {
	return g.g.Control(ctx, network, address, c)
}
