package trust

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/hubmesh/hub/internal/dialguard"
)

// Limits on what a peer's bundle endpoint may send (go-spiffe's own
// FetchBundle checks none of them).
const (
	MaxBundleBytes = 1 << 20
	FetchTimeout   = 10 * time.Second
)

// Profile is how a peer's bundle endpoint authenticates itself.
type Profile string

// Bundle endpoint profiles of the SPIFFE federation specification.
const (
	ProfileHTTPSWeb    Profile = "https_web"
	ProfileHTTPSSPIFFE Profile = "https_spiffe"
)

// Endpoint describes how to reach one peer's bundle endpoint.
type Endpoint struct {
	TrustDomain spiffeid.TrustDomain
	URL         string
	Profile     Profile
	// EndpointID is the SPIFFE ID the endpoint's certificate must carry (https_spiffe).
	EndpointID spiffeid.ID
	// Roots authenticate an https_web endpoint; nil means the system roots.
	Roots *x509.CertPool
	// Timeout bounds the whole fetch; zero means FetchTimeout.
	Timeout time.Duration
	// Guard checks every address the fetch connects to, after name
	// resolution; nil means DefaultEndpointGuard.
	Guard *dialguard.Guard
}

// EndpointGuardNames name bundle endpoints and the flags that set their
// allowed and denied ranges in a guard's refusals.
var EndpointGuardNames = dialguard.Names{
	Target: "a bundle endpoint", AllowFlag: "--bundle-endpoint-cidrs", DenyFlag: "--bundle-endpoint-deny-cidrs",
}

// DefaultEndpointGuard allows bundle endpoints anywhere but in
// dialguard.DefaultDeny (link-local: cloud metadata) and unspecified
// addresses.
var DefaultEndpointGuard = func() *dialguard.Guard {
	g, err := dialguard.New(nil, dialguard.DefaultDeny, EndpointGuardNames)
	if err != nil {
		panic(err)
	}
	return g
}()

// FetchError is a rejected fetch; Reason is a short machine-friendly cause.
type FetchError struct {
	Reason string
	Err    error
}

func (e *FetchError) Error() string { return e.Err.Error() }
func (e *FetchError) Unwrap() error { return e.Err }

func reject(reason, format string, args ...any) error {
	return &FetchError{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// Fetch gets and validates a peer's bundle. auth is the peer's currently
// trusted bundle, used to authenticate an https_spiffe endpoint; last is the
// last accepted bundle (nil if none), whose sequence number must not go
// backwards. Fetch never returns a bundle that failed any check.
func Fetch(ctx context.Context, ep Endpoint, auth *spiffebundle.Bundle, last *spiffebundle.Bundle) (*spiffebundle.Bundle, error) {
	var tlsCfg *tls.Config
	switch ep.Profile {
	case ProfileHTTPSSPIFFE:
		if auth == nil || len(auth.X509Authorities()) == 0 {
			return nil, reject("no_bootstrap", "https_spiffe endpoint of %s needs a bootstrap bundle to authenticate it", ep.TrustDomain)
		}
		tlsCfg = tlsconfig.TLSClientConfig(auth, tlsconfig.AuthorizeID(ep.EndpointID))
	case ProfileHTTPSWeb:
		tlsCfg = &tls.Config{RootCAs: ep.Roots, MinVersion: tls.VersionTLS12}
	default:
		return nil, reject("bad_profile", "unknown bundle endpoint profile %q", ep.Profile)
	}
	timeout := ep.Timeout
	if timeout <= 0 {
		timeout = FetchTimeout
	}
	guard := ep.Guard
	if guard == nil {
		guard = DefaultEndpointGuard
	}
	// Direct connections only (no HTTPS_PROXY of the hub's environment):
	// through a proxy the guard would see only the proxy's address, and the
	// proxy would resolve and connect the peer's host wherever it points.
	dialer := &net.Dialer{Timeout: timeout, ControlContext: guard.Control}
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			TLSClientConfig: tlsCfg, DialContext: dialer.DialContext,
			ResponseHeaderTimeout: timeout, DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return errors.New("redirects are not followed") },
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.URL, nil)
	if err != nil {
		return nil, reject("bad_url", "bundle endpoint URL %q: %v", ep.URL, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		var refused *dialguard.RefusedError
		if errors.As(err, &refused) {
			return nil, reject("address_refused", "fetching %s: refusing to connect to a bundle endpoint: %v", ep.URL, refused)
		}
		if ctx.Err() != nil {
			return nil, reject("timeout", "fetching %s: no answer within %s", ep.URL, timeout)
		}
		return nil, reject("connect", "fetching %s: %v", ep.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, reject("http_status", "fetching %s: HTTP %s", ep.URL, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBundleBytes+1))
	switch {
	case ctx.Err() != nil: // a cut-off body may end without an error
		return nil, reject("timeout", "reading %s: body not complete within %s", ep.URL, timeout)
	case err != nil:
		return nil, reject("read", "reading %s: %v", ep.URL, err)
	}
	if len(body) > MaxBundleBytes {
		return nil, reject("too_large", "bundle from %s exceeds %d bytes", ep.URL, MaxBundleBytes)
	}
	return Validate(ep.TrustDomain, body, last)
}

// Validate parses a bundle document for a trust domain and applies every
// check: it must parse, carry at least one X.509 or JWT authority, and its
// sequence number must not be lower than last's.
func Validate(td spiffeid.TrustDomain, body []byte, last *spiffebundle.Bundle) (*spiffebundle.Bundle, error) {
	b, err := spiffebundle.Parse(td, body)
	if err != nil {
		return nil, reject("parse", "bundle for %s does not parse: %v", td, err)
	}
	if len(b.X509Authorities()) == 0 && len(b.JWTAuthorities()) == 0 {
		return nil, reject("empty", "bundle for %s has no X.509 or JWT authorities", td)
	}
	// A document does not name its trust domain, but CA certificates issued
	// by SPIFFE implementations carry it as a URI SAN: those must match.
	for _, c := range b.X509Authorities() {
		for _, u := range c.URIs {
			if id, err := spiffeid.FromURI(u); err == nil && id.TrustDomain() != td {
				return nil, reject("trust_domain", "bundle for %s holds an authority of trust domain %s", td, id.TrustDomain())
			}
		}
	}
	if last != nil {
		prev, hadPrev := last.SequenceNumber()
		seq, has := b.SequenceNumber()
		if hadPrev && (!has || seq < prev) {
			return nil, reject("sequence", "bundle for %s has sequence %d, lower than the accepted %d", td, seq, prev)
		}
	}
	return b, nil
}

// Warnings lists non-fatal problems of an accepted bundle: expired or
// non-CA X.509 authorities.
func Warnings(b *spiffebundle.Bundle, now time.Time) []string {
	var out []string
	for _, c := range b.X509Authorities() {
		if now.After(c.NotAfter) {
			out = append(out, fmt.Sprintf("authority %q expired at %s", c.Subject.String(), c.NotAfter.UTC().Format(time.RFC3339)))
		}
		if !c.IsCA {
			out = append(out, fmt.Sprintf("authority %q is not a CA certificate", c.Subject.String()))
		}
	}
	return out
}
