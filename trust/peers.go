package trust

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"regexp"
	"sort"
	"strings"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"

	"github.com/hubmesh/hub/internal/dialguard"
)

// InvalidError is a federation request the hub refuses; its message says why.
type InvalidError struct{ msg string }

func (e *InvalidError) Error() string { return e.msg }

func invalid(format string, args ...any) error { return &InvalidError{fmt.Sprintf(format, args...)} }

// Validate checks a relationship before anything is written.
func (s PeerSpec) Validate(local spiffeid.TrustDomain) error {
	td, err := spiffeid.TrustDomainFromString(s.TrustDomain)
	if err != nil {
		return invalid("trust domain %q: %v", s.TrustDomain, err)
	}
	if td == local {
		return invalid("%s is our own trust domain", td.Name())
	}
	u, err := url.Parse(s.BundleEndpointURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		return invalid("bundleEndpointURL must be an https:// URL with a host and no user info")
	}
	switch s.Profile {
	case ProfileHTTPSWeb:
		if s.CABundle != "" && !x509.NewCertPool().AppendCertsFromPEM([]byte(s.CABundle)) {
			return invalid("caBundle holds no PEM certificates")
		}
	case ProfileHTTPSSPIFFE:
		id, err := spiffeid.FromString(s.EndpointSPIFFEID)
		if err != nil {
			return invalid("endpointSPIFFEID: %v", err)
		}
		if id.TrustDomain() != td {
			return invalid("endpointSPIFFEID %s is not in trust domain %s", id, td.Name())
		}
		if s.Bundle == "" {
			return invalid("https_spiffe needs a bootstrap bundle (the peer's SPIFFE bundle JSON) in \"bundle\"")
		}
		b, err := spiffebundle.Parse(td, []byte(s.Bundle))
		if err != nil {
			return invalid("bootstrap bundle: %v", err)
		}
		if len(b.X509Authorities()) == 0 {
			return invalid("bootstrap bundle has no X.509 authorities to authenticate the endpoint")
		}
	default:
		return invalid("profile must be https_web or https_spiffe, not %q", s.Profile)
	}
	return nil
}

// checkEndpointAddress refuses a bundle endpoint URL whose host is an IP
// literal the guard denies; a DNS name is checked when it is dialled, on
// every fetch.
func checkEndpointAddress(rawURL string, guard *dialguard.Guard) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return invalid("bundleEndpointURL does not parse")
	}
	a, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return nil
	}
	if err := guard.Check(a); err != nil {
		return invalid("bundleEndpointURL: the hub refuses to connect to a bundle endpoint at %v", err)
	}
	return nil
}

// TrustDomainAnnotation names, on a ConfigMap the hub creates, the trust
// domain it declares (for people; the hub itself reads the trustDomain key).
const TrustDomainAnnotation = "hub.federation/trust-domain"

var nonAlnum = regexp.MustCompile(`[^a-z0-9]+`)

// PeerConfigMapName is the name ApplyPeer gives the ConfigMap of a new
// relationship: "hub-peer-", a readable part of the trust domain, and the
// first 16 hex digits of the SHA-256 of its name. The hash keeps apart
// trust domains that differ only where a Kubernetes name cannot
// (a_b.example and a-b.example); before it, both were "hub-peer-a-b.example".
// ConfigMaps under other names (such older ones, or any applied with
// kubectl) are found by their trustDomain key, not by name.
func PeerConfigMapName(td spiffeid.TrustDomain) string {
	sum := sha256.Sum256([]byte(td.Name()))
	readable := strings.Trim(nonAlnum.ReplaceAllString(td.Name(), "-"), "-")
	if len(readable) > 37 { // at most 63 characters in all
		readable = strings.TrimRight(readable[:37], "-")
	}
	if readable != "" {
		readable += "-"
	}
	return "hub-peer-" + readable + hex.EncodeToString(sum[:8])
}

// peerConfigMaps lists the federation ConfigMaps declaring td, by name
// (the first is the one the peer loop uses).
func (f *Domains) peerConfigMaps(ctx context.Context, td spiffeid.TrustDomain) ([]corev1.ConfigMap, error) {
	list, err := f.cfg.Client.CoreV1().ConfigMaps(f.cfg.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{PeerLabel: "true"}).String()})
	if err != nil {
		return nil, fmt.Errorf("listing federation configs: %w", err)
	}
	var out []corev1.ConfigMap
	for _, cm := range list.Items {
		if id, err := spiffeid.TrustDomainFromString(cm.Data[keyTrustDomain]); err == nil && id == td {
			out = append(out, cm)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ApplyPeer validates a relationship and writes its ConfigMap, as
// `kubectl apply` would: the ConfigMap that already declares that trust
// domain is updated in place, whatever its name (so relationships created
// under the names of earlier versions keep theirs), else one named
// PeerConfigMapName is created. It reports whether the relationship is new.
func (f *Domains) ApplyPeer(ctx context.Context, spec PeerSpec) (created bool, err error) {
	if err := spec.Validate(f.cfg.TrustDomain); err != nil {
		return false, err
	}
	if err := checkEndpointAddress(spec.BundleEndpointURL, f.cfg.EndpointGuard); err != nil {
		return false, err
	}
	td, err := spiffeid.TrustDomainFromString(spec.TrustDomain)
	if err != nil {
		return false, invalid("trust domain %q: %v", spec.TrustDomain, err)
	}
	cms := f.cfg.Client.CoreV1().ConfigMaps(f.cfg.Namespace)
	name := PeerConfigMapName(td)
	data := map[string]string{
		keyTrustDomain: spec.TrustDomain, keyURL: spec.BundleEndpointURL, keyProfile: string(spec.Profile),
		keyEndpointID: spec.EndpointSPIFFEID, keyBootstrap: spec.Bundle, keyCABundle: spec.CABundle,
	}
	// A conflict, or a create racing another one, is retried from a fresh read.
	retriable := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
	err = retry.OnError(retry.DefaultRetry, retriable, func() error {
		created = false
		existing, err := f.peerConfigMaps(ctx, td)
		if err != nil {
			return err
		}
		if len(existing) == 0 {
			name = PeerConfigMapName(td)
			_, err = cms.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{PeerLabel: "true"},
					Annotations: map[string]string{TrustDomainAnnotation: td.Name()}},
				Data: data,
			}, metav1.CreateOptions{})
			created = err == nil
			return err
		}
		cur := &existing[0]
		name = cur.Name
		next := maps.Clone(data)
		if accepted, ok := cur.Data[keyAccepted]; ok {
			next[keyAccepted] = accepted // keep the last good bundle across spec edits
		}
		cur.Data = next
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		cur.Labels[PeerLabel] = "true"
		_, err = cms.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return false, fmt.Errorf("writing federation config %s/%s: %w", f.cfg.Namespace, name, err)
	}
	return created, nil
}

// DeletePeer removes a relationship: every ConfigMap declaring the trust
// domain. Removing an absent one (or one whose name is no valid trust
// domain) is not an error.
func (f *Domains) DeletePeer(ctx context.Context, td string) error {
	if td == f.cfg.TrustDomain.Name() {
		return invalid("%s is our own trust domain", td)
	}
	id, err := spiffeid.TrustDomainFromString(td)
	if err != nil {
		return nil // no relationship can declare it, so none is there
	}
	existing, err := f.peerConfigMaps(ctx, id)
	if err != nil {
		return fmt.Errorf("deleting federation config for %s: %w", td, err)
	}
	for _, cm := range existing {
		err := f.cfg.Client.CoreV1().ConfigMaps(f.cfg.Namespace).Delete(ctx, cm.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &cm.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting federation config %s/%s for %s: %w", f.cfg.Namespace, cm.Name, td, err)
		}
	}
	return nil
}

// ErrUnknownTrustDomain is returned for a trust domain we do not federate with.
var ErrUnknownTrustDomain = errors.New("unknown trust domain")

// TrustDomain returns one trust domain's status.
func (f *Domains) TrustDomain(td string) (Status, error) {
	for _, st := range f.TrustDomains() {
		if st.Spec.TrustDomain == td {
			return st, nil
		}
	}
	return Status{}, fmt.Errorf("%w %q", ErrUnknownTrustDomain, td)
}
