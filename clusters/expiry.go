package clusters

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/hubmesh/hub/internal/expiry"
)

// Credentials of a member's kubeconfig whose expiry the hub reads (the
// credential label of hub_member_credential_expiry_timestamp_seconds).
const (
	CredentialToken             = "token"
	CredentialClientCertificate = "client_certificate"
)

// Reasons of the Warning Events on a remote Secret whose member's
// credential expires within Config.ExpiryWarning, or has expired.
const (
	ReasonCredentialExpiring = "CredentialExpiring"
	ReasonCredentialExpired  = "CredentialExpired"
)

// CredentialExpiry is when one inline credential of a member's kubeconfig
// stops working, as far as the hub can tell from the credential itself
// without trusting it: a bearer token's JWT exp claim (its signature is not
// checked: only the member's API server can), a client certificate's
// notAfter. It never holds the credential.
type CredentialExpiry struct {
	// Credential is CredentialToken or CredentialClientCertificate.
	Credential string
	// NotAfter is when it expires; zero when Error says why it could not
	// be read.
	NotAfter time.Time
	// Error says why a token that is a JWT has no readable expiry ("" when
	// it has one).
	Error string
	// Level is NotAfter against Config.ExpiryWarning when the status was
	// read.
	Level expiry.Level
}

// maxJWTPayloadBytes bounds the part of a bearer token decoded to read its
// exp claim (a Kubernetes service-account token's payload is ~1 KiB).
const maxJWTPayloadBytes = 16 << 10

// maxNumericDate is 9999-12-31T23:59:59Z: an exp claim beyond it is not a
// time the hub can show or compare.
const maxNumericDate = 253402300799

// TokenExpiry reads the exp claim of a bearer token that is a JWT (JWS
// compact serialisation: three base64url parts, the first a JSON object
// with an "alg"). The token is untrusted: nothing is verified, at most
// maxJWTPayloadBytes of it is decoded, and errors say which part is wrong
// without quoting any of it. A token that is not a JWT, or a JWT without
// exp, has no known expiry (ok false, nil error); a JWT whose payload or
// exp cannot be read is an error.
func TokenExpiry(token string) (exp time.Time, ok bool, err error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || len(parts[0]) > maxJWTPayloadBytes {
		return time.Time{}, false, nil // not a JWT: an opaque token
	}
	var header struct {
		Alg any `json:"alg"`
	}
	raw, err := decodeSegment(parts[0])
	if err != nil || json.Unmarshal(raw, &header) != nil || header.Alg == nil {
		return time.Time{}, false, nil // not a JWT header: an opaque token with dots
	}
	if len(parts[1]) > base64.RawURLEncoding.EncodedLen(maxJWTPayloadBytes) {
		return time.Time{}, false, fmt.Errorf("the bearer token is a JWT whose payload is %d bytes encoded; at most %d are read", len(parts[1]), base64.RawURLEncoding.EncodedLen(maxJWTPayloadBytes))
	}
	if raw, err = decodeSegment(parts[1]); err != nil {
		return time.Time{}, false, errors.New("the bearer token is a JWT whose payload is not base64url")
	}
	var claims map[string]json.RawMessage
	if err := json.Unmarshal(raw, &claims); err != nil || claims == nil {
		return time.Time{}, false, errors.New("the bearer token is a JWT whose payload is not a JSON object")
	}
	v, has := claims["exp"]
	if !has {
		return time.Time{}, false, nil // a JWT without exp does not expire
	}
	// A JSON number, not a string holding one (json.Number takes both).
	var n json.Number
	if v = bytes.TrimSpace(v); len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) || json.Unmarshal(v, &n) != nil {
		return time.Time{}, false, errors.New("the bearer token is a JWT whose exp claim is not a number")
	}
	f, err := n.Float64()
	if err != nil || math.IsNaN(f) || f < 0 || f > maxNumericDate {
		return time.Time{}, false, fmt.Errorf("the bearer token is a JWT whose exp claim is out of range (0 to %d seconds since 1970)", maxNumericDate)
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC(), true, nil
}

// decodeSegment decodes one base64url part of a JWS, with or without padding.
func decodeSegment(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

// ClientCertificateExpiry is the earliest notAfter of the certificates in
// client-certificate-data (the leaf and any intermediates sent with it:
// the first to expire ends the credential); ok false when it holds none.
func ClientCertificateExpiry(certPEM []byte) (notAfter time.Time, ok bool) {
	for len(certPEM) > 0 {
		var block *pem.Block
		block, certPEM = pem.Decode(certPEM)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			continue // tls.X509KeyPair accepted the pair; an extra block is not ours to judge
		}
		if !ok || c.NotAfter.Before(notAfter) {
			notAfter, ok = c.NotAfter.UTC(), true
		}
	}
	return notAfter, ok
}

// credentialExpiries reads the expiry of the inline credentials of a
// member's sanitised rest.Config. Credentials in files (--kubeconfig-allow
// files), exec plugins and auth providers have no known expiry.
func credentialExpiries(rc *rest.Config) []CredentialExpiry {
	var out []CredentialExpiry
	if rc.BearerToken != "" {
		exp, ok, err := TokenExpiry(rc.BearerToken)
		switch {
		case err != nil:
			out = append(out, CredentialExpiry{Credential: CredentialToken, Error: err.Error()})
		case ok:
			out = append(out, CredentialExpiry{Credential: CredentialToken, NotAfter: exp})
		}
	}
	if len(rc.CertData) > 0 {
		if na, ok := ClientCertificateExpiry(rc.CertData); ok {
			out = append(out, CredentialExpiry{Credential: CredentialClientCertificate, NotAfter: na})
		}
	}
	return out
}

// withLevels grades creds at now against warn, in a copy.
func withLevels(creds []CredentialExpiry, now time.Time, warn time.Duration) []CredentialExpiry {
	if len(creds) == 0 {
		return nil
	}
	out := make([]CredentialExpiry, len(creds))
	for i, c := range creds {
		c.Level = expiry.LevelAt(c.NotAfter, now, warn)
		out[i] = c
	}
	return out
}

// credentialWords names a credential in messages.
func credentialWords(credential string) string {
	if credential == CredentialToken {
		return "bearer token"
	}
	return "client certificate"
}

var descCredentialExpiry = prometheus.NewDesc("hub_member_credential_expiry_timestamp_seconds",
	"When a member's kubeconfig credential expires (Unix seconds): credential=token is its bearer token's JWT exp claim, client_certificate the earliest notAfter of its client certificate. Absent when unknown (an opaque token, credentials in files, exec plugins).",
	[]string{"cluster", "credential"}, nil)

// expiryCollector reports the expiry of every member's current
// credentials, computed at scrape time from the members themselves.
type expiryCollector struct{ r *Registry }

func (c expiryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descCredentialExpiry }

func (c expiryCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.r.memberCredentials() {
		for _, cred := range m.creds {
			if !cred.NotAfter.IsZero() {
				ch <- prometheus.MustNewConstMetric(descCredentialExpiry, prometheus.GaugeValue, float64(cred.NotAfter.Unix()), m.id, cred.Credential)
			}
		}
	}
}

// memberCreds are one member's current credentials and its remote Secret.
type memberCreds struct {
	id    string
	ref   *corev1.ObjectReference
	creds []CredentialExpiry
}

// memberCredentials lists every member's active client's credentials
// (the home cluster's are the operator's own and not read).
func (r *Registry) memberCredentials() []memberCreds {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]memberCreds, 0, len(r.members))
	for id, m := range r.members {
		out = append(out, memberCreds{id: id, ref: m.ref, creds: m.active.api.credentials})
	}
	return out
}

// watchExpiry records a Warning Event on a member's remote Secret when one
// of its credentials comes within Config.ExpiryWarning of expiring
// (CredentialExpiring) and when it has expired (CredentialExpired): once
// per crossing and credential, not on every check, and only on the leader
// (a replica that gains leadership tells what it has not told itself).
// It checks when a member is added or switches to a new kubeconfig
// (expiryKick) and every expiry.CheckEvery, until ctx is done.
func (r *Registry) watchExpiry(ctx context.Context) { expiry.Watch(ctx, r.expiryKick, r.checkExpiry) }

func (r *Registry) checkExpiry(now time.Time) {
	members := r.memberCredentials()
	current := map[string]bool{}
	leader := r.cfg.IsLeader == nil || r.cfg.IsLeader()
	for _, m := range members {
		for _, cred := range m.creds {
			key := m.id + "\x00" + cred.Credential
			current[key] = true
			level := expiry.LevelAt(cred.NotAfter, now, r.cfg.ExpiryWarning)
			if !leader || m.ref == nil || !r.expiryWarned.Due(key, cred.NotAfter, level) {
				continue
			}
			what := credentialWords(cred.Credential)
			if level == expiry.Expired {
				r.log.Warn("member credential expired", "cluster", m.id, "credential", cred.Credential, "notAfter", cred.NotAfter)
				r.event(m.ref, corev1.EventTypeWarning, ReasonCredentialExpired,
					"cluster %s: the %s of its kubeconfig %s: the hub cannot authenticate to the member with it; put a new kubeconfig in the remote Secret", m.id, what, expiry.Sentence(cred.NotAfter, now))
			} else {
				r.log.Warn("member credential expires soon", "cluster", m.id, "credential", cred.Credential, "notAfter", cred.NotAfter)
				r.event(m.ref, corev1.EventTypeWarning, ReasonCredentialExpiring,
					"cluster %s: the %s of its kubeconfig %s; put a new kubeconfig in the remote Secret before then", m.id, what, expiry.Sentence(cred.NotAfter, now))
			}
			r.expiryWarned.Mark(key, cred.NotAfter, level)
		}
	}
	r.expiryWarned.Retain(func(key string) bool { return current[key] })
}
