package dialguard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
)

var names = Names{Target: "a test server", AllowFlag: "--test-cidrs", DenyFlag: "--test-deny-cidrs"}

// TestControlRefusesBeforeConnecting: a real dial through Control to a
// listening loopback port is refused when loopback is denied (the listener
// accepts nothing) and connects when it is allowed; refusals name the
// target and the flag.
func TestControlRefusesBeforeConnecting(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	denyLoopback, _ := ParseCIDRs("127.0.0.0/8")
	for _, tc := range []struct {
		name        string
		allow, deny []netip.Prefix
		want        string
	}{
		{"denied", nil, denyLoopback, "refusing to connect to a test server: address 127.0.0.1 is in the denied range 127.0.0.0/8 (--test-deny-cidrs)"},
		{"not allowed", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, nil, "address 127.0.0.1 is not in an allowed range (--test-cidrs 10.0.0.0/8)"},
		{"allowed", nil, DefaultDeny, ""},
	} {
		g, err := New(tc.allow, tc.deny, names)
		if err != nil {
			t.Fatal(err)
		}
		d := net.Dialer{ControlContext: g.Control}
		c, err := d.DialContext(context.Background(), "tcp", lis.Addr().String())
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			} else {
				c.Close()
			}
			continue
		}
		var refused *RefusedError
		if err == nil || !errors.As(err, &refused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: dial = %v; want a RefusedError with %q", tc.name, err, tc.want)
		}
		if c != nil {
			c.Close()
		}
	}
}

func TestCheckAddressForms(t *testing.T) {
	g, err := New(nil, DefaultDeny, names)
	if err != nil {
		t.Fatal(err)
	}
	for addr, refused := range map[string]bool{
		"169.254.169.254":        true,
		"::ffff:169.254.169.254": true, // IPv4-mapped
		"64:ff9b::a9fe:a9fe":     true, // NAT64 of the metadata address
		"fe80::1%eth0":           true,
		"0.0.0.0":                true,
		"::":                     true,
		"127.0.0.1":              false,
		"10.0.0.1":               false,
		"2001:db8::1":            false,
	} {
		if err := g.Check(netip.MustParseAddr(addr)); (err != nil) != refused {
			t.Errorf("Check(%s) = %v; refused want %v", addr, err, refused)
		}
	}
}

func TestParseCIDRs(t *testing.T) {
	got, err := ParseCIDRs(" 10.1.0.0/8, 192.168.1.7 ,fe80::1/10")
	if err != nil || len(got) != 3 || got[0].String() != "10.0.0.0/8" || got[1].String() != "192.168.1.7/32" || got[2].String() != "fe80::/10" {
		t.Errorf("ParseCIDRs = %v, %v", got, err)
	}
	if got, err := ParseCIDRs(""); err != nil || got == nil || len(got) != 0 {
		t.Errorf("ParseCIDRs(\"\") = %#v, %v; want an empty non-nil slice", got, err)
	}
	if _, err := ParseCIDRs("10.0.0.0/33"); err == nil {
		t.Error("ParseCIDRs accepted /33")
	}
}
