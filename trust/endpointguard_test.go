package trust

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hubmesh/hub/internal/dialguard"
	"github.com/hubmesh/hub/internal/wait"
)

func endpointGuard(t *testing.T, allow, deny string) *dialguard.Guard {
	t.Helper()
	a, err := dialguard.ParseCIDRs(allow)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dialguard.ParseCIDRs(deny)
	if err != nil {
		t.Fatal(err)
	}
	g, err := dialguard.New(a, d, EndpointGuardNames)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// noLoopback denies loopback on top of the defaults.
const noLoopback = "127.0.0.0/8,::1/128,169.254.0.0/16,fe80::/10"

// TestFetchGuardsEveryConnection: a real HTTPS bundle endpoint on loopback
// is fetched by default (tests and the demo federate on loopback); a guard
// that denies loopback refuses it before connecting, whether the URL names
// the address or a DNS name that resolves to it, and so does an allow list
// without loopback. The endpoint never sees a refused fetch.
func TestFetchGuardsEveryConnection(t *testing.T) {
	ca := mustCA(t, tdA)
	var requests atomic.Int32
	ep := webPeer(t, tdA, func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		_, _ = w.Write(bundleJSON(t, ca, 1))
	})
	if b, err := Fetch(context.Background(), ep, nil, nil); err != nil || !b.HasX509Authority(ca.Cert) {
		t.Fatalf("default guard, loopback endpoint: %v", err)
	}
	byName := ep
	byName.URL = strings.Replace(ep.URL, "127.0.0.1", "localhost", 1)
	for _, tc := range []struct {
		name string
		ep   Endpoint
		g    *dialguard.Guard
		msg  string
	}{
		{"denied address", ep, endpointGuard(t, "", noLoopback), "refusing to connect to a bundle endpoint: address 127.0.0.1 is in the denied range 127.0.0.0/8 (--bundle-endpoint-deny-cidrs)"},
		{"name resolving to a denied address", byName, endpointGuard(t, "", noLoopback), "(--bundle-endpoint-deny-cidrs)"},
		{"outside the allow list", ep, endpointGuard(t, "10.0.0.0/8", ""), "address 127.0.0.1 is not in an allowed range (--bundle-endpoint-cidrs 10.0.0.0/8)"},
	} {
		tc.ep.Guard = tc.g
		b, err := Fetch(context.Background(), tc.ep, nil, nil)
		var fe *FetchError
		if b != nil || !errors.As(err, &fe) || fe.Reason != "address_refused" || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: Fetch = %v, %v; want reason address_refused with %q", tc.name, b, err, tc.msg)
		}
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("the endpoint served %d requests; want only the allowed one", n)
	}
}

// TestPeerEndpointGuard: applying a relationship whose bundleEndpointURL
// is an IP literal the guard denies (link-local metadata, unspecified) is
// refused up front; one by a DNS name is accepted and refused on every
// dial, which leaves the trust domain in Error with the reason.
func TestPeerEndpointGuard(t *testing.T) {
	client, ns := homeNamespace(t)
	ctx := context.Background()
	f := New(Config{Client: client, Namespace: ns, TrustDomain: spiffeid.RequireTrustDomainFromString("local.example"),
		EndpointGuard: endpointGuard(t, "", noLoopback)})
	runFederation(t, f)
	peerTD := spiffeid.RequireTrustDomainFromString("peer.example")
	peer := newBundlePeer(t, peerTD)
	for url, msg := range map[string]string{
		"https://169.254.169.254/bundle":      "address 169.254.169.254 is in the denied range 169.254.0.0/16 (--bundle-endpoint-deny-cidrs)",
		"https://[fe80::1]:8443/":             "address fe80::1 is in the denied range fe80::/10",
		"https://0.0.0.0:8443/":               "address 0.0.0.0 is unspecified",
		"https://[::]:8443/":                  "address :: is unspecified",
		"https://[64:ff9b::a9fe:a9fe]/bundle": "address 64:ff9b::a9fe:a9fe is in the denied range 169.254.0.0/16",
		peer.url:                              "address 127.0.0.1 is in the denied range 127.0.0.0/8",
	} {
		spec := peer.spec()
		spec.BundleEndpointURL = url
		_, err := f.ApplyPeer(ctx, spec)
		var inv *InvalidError
		if !errors.As(err, &inv) || !strings.Contains(err.Error(), msg) {
			t.Errorf("ApplyPeer(%s) = %v; want an InvalidError with %q", url, err, msg)
		}
	}
	if _, err := f.TrustDomain(peerTD.Name()); err == nil {
		t.Fatal("a refused relationship was written")
	}

	spec := peer.spec()
	spec.BundleEndpointURL = strings.Replace(peer.url, "127.0.0.1", "localhost", 1)
	if _, err := f.ApplyPeer(ctx, spec); err != nil {
		t.Fatalf("a DNS name is checked when dialled, not when applied: %v", err)
	}
	wait.Until(t, 30*time.Second, func() error {
		st, err := f.TrustDomain(peerTD.Name())
		if err != nil {
			return err
		}
		if st.State != StateError || !strings.Contains(st.Message, "refusing to connect to a bundle endpoint: address ") ||
			!strings.Contains(st.Message, "(--bundle-endpoint-deny-cidrs)") {
			return errors.New(string(st.State) + ": " + st.Message)
		}
		return nil
	})
}
