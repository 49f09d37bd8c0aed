package api

import (
	"time"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/expiry"
	"github.com/hubmesh/hub/trust"
)

// CredentialExpiry is when one inline credential of a member's kubeconfig
// expires: its bearer token's JWT exp claim (credential "token") or its
// client certificate's notAfter ("client_certificate"). It never holds the
// credential.
type CredentialExpiry struct {
	Credential string `json:"credential"`
	// NotAfter is absent when Error says why it could not be read.
	NotAfter *time.Time `json:"notAfter,omitempty"`
	// State is "valid", "expiring" (within --expiry-warning) or "expired"
	// (absent with Error).
	State string `json:"state,omitempty"`
	// Badge is what the dashboard shows: "expires in 3d", "expired".
	Badge string `json:"badge,omitempty"`
	Error string `json:"error,omitempty"`
}

// CertExpiry is when a certificate expires.
type CertExpiry struct {
	Subject  string    `json:"subject"`
	NotAfter time.Time `json:"notAfter"`
	// State is "valid", "expiring" (within --expiry-warning) or "expired".
	State string `json:"state"`
	// Badge is what the dashboard shows: "expires in 3d", "expired".
	Badge string `json:"badge"`
}

// CAExpiry is when our CA's root (the first of its current roots to
// expire) and its signing chain (the first of its signing certificate and
// intermediates) expire, and the Secret (namespace/name) holding the CA.
type CAExpiry struct {
	Root   CertExpiry `json:"root"`
	Chain  CertExpiry `json:"chain"`
	Secret string     `json:"secret"`
}

// ToCredentialExpiries converts a member's credential expiries (nil for none).
func ToCredentialExpiries(creds []clusters.CredentialExpiry) []CredentialExpiry {
	var out []CredentialExpiry
	now := time.Now()
	for _, c := range creds {
		e := CredentialExpiry{Credential: c.Credential, Error: c.Error}
		if !c.NotAfter.IsZero() {
			e.NotAfter, e.State, e.Badge = timePtr(c.NotAfter), c.Level.String(), expiry.Badge(c.NotAfter, now)
		}
		out = append(out, e)
	}
	return out
}

// ToCertExpiry converts a certificate's expiry (nil for none).
func ToCertExpiry(e trust.CertExpiry) *CertExpiry {
	if e.NotAfter.IsZero() {
		return nil
	}
	return &CertExpiry{Subject: e.Subject, NotAfter: e.NotAfter.UTC(), State: e.Level.String(), Badge: expiry.Badge(e.NotAfter, time.Now())}
}

// ToCAExpiry converts our CA's expiry (nil until the CA is loaded).
func ToCAExpiry(ca *trust.CAExpiry) *CAExpiry {
	if ca == nil {
		return nil
	}
	out := &CAExpiry{Secret: ca.Secret}
	if r := ToCertExpiry(ca.Root); r != nil {
		out.Root = *r
	}
	if c := ToCertExpiry(ca.Chain); c != nil {
		out.Chain = *c
	}
	return out
}
