package main

import (
	"flag"
	"fmt"

	"github.com/hubmesh/hub/internal/dialguard"
	"github.com/hubmesh/hub/trust"
)

// hardeningFlags are the flags of the attack pass (issue 21): who may read
// /metrics and where peers' bundle endpoints may be.
type hardeningFlags struct {
	metricsAuth        string
	bundleEndpointCIDR string
	bundleEndpointDeny string
}

// Values of --metrics-auth.
const (
	metricsAuthToken = "token"
	metricsAuthNone  = "none"
)

func (h *hardeningFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.metricsAuth, "metrics-auth", metricsAuthToken, "who may read /metrics on --admin-addr: token (a bearer token like the REST API's: with TokenReview, one allowed get on the non-resource URL /metrics or get on secrets in --remote-secrets-namespace; with --api-token-file, any token in it) or none (anyone who reaches the port)")
	fs.StringVar(&h.bundleEndpointCIDR, "bundle-endpoint-cidrs", "", "comma-separated CIDRs peers' SPIFFE bundle endpoints must be in, checked on every connection after DNS (empty: anywhere not denied)")
	fs.StringVar(&h.bundleEndpointDeny, "bundle-endpoint-deny-cidrs", "169.254.0.0/16,fe80::/10", "comma-separated CIDRs peers' SPIFFE bundle endpoints may never be in, checked on every connection after DNS (unspecified addresses are always refused)")
}

func (h *hardeningFlags) validate() error {
	if h.metricsAuth != metricsAuthToken && h.metricsAuth != metricsAuthNone {
		return fmt.Errorf("--metrics-auth must be %s or %s, not %q", metricsAuthToken, metricsAuthNone, h.metricsAuth)
	}
	_, err := h.endpointGuard()
	return err
}

// endpointGuard is the guard of bundle endpoint fetches.
func (h *hardeningFlags) endpointGuard() (*dialguard.Guard, error) {
	allow, err := dialguard.ParseCIDRs(h.bundleEndpointCIDR)
	if err != nil {
		return nil, fmt.Errorf("--bundle-endpoint-cidrs: %w", err)
	}
	deny, err := dialguard.ParseCIDRs(h.bundleEndpointDeny)
	if err != nil {
		return nil, fmt.Errorf("--bundle-endpoint-deny-cidrs: %w", err)
	}
	return dialguard.New(allow, deny, trust.EndpointGuardNames)
}
