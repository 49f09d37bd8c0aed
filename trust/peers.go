package trust

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
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

var nonNameChars = regexp.MustCompile(`[^a-z0-9.-]+`)

func configMapName(td string) string {
	return "hub-peer-" + strings.Trim(nonNameChars.ReplaceAllString(strings.ToLower(td), "-"), "-.")
}

// ApplyPeer validates a relationship and writes its ConfigMap, as
// `kubectl apply` would. It reports whether the relationship is new.
func (f *Federation) ApplyPeer(ctx context.Context, spec PeerSpec) (created bool, err error) {
	if err := spec.Validate(f.cfg.TrustDomain); err != nil {
		return false, err
	}
	cms := f.cfg.Client.CoreV1().ConfigMaps(f.cfg.Namespace)
	name := configMapName(spec.TrustDomain)
	data := map[string]string{
		keyTrustDomain: spec.TrustDomain, keyURL: spec.BundleEndpointURL, keyProfile: string(spec.Profile),
		keyEndpointID: spec.EndpointSPIFFEID, keyBootstrap: spec.Bundle, keyCABundle: spec.CABundle,
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := cms.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			created = true
			_, err = cms.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{PeerLabel: "true"}},
				Data:       data,
			}, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		if accepted, ok := cur.Data[keyAccepted]; ok && cur.Data[keyTrustDomain] == spec.TrustDomain {
			data[keyAccepted] = accepted // keep the last good bundle across spec edits
		}
		cur.Data = data
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		cur.Labels[PeerLabel] = "true"
		_, err = cms.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return false, fmt.Errorf("writing federation config %s: %w", name, err)
	}
	return created, nil
}

// DeletePeer removes a relationship; removing an absent one is not an error.
func (f *Federation) DeletePeer(ctx context.Context, td string) error {
	if td == f.cfg.TrustDomain.Name() {
		return invalid("%s is our own trust domain", td)
	}
	err := f.cfg.Client.CoreV1().ConfigMaps(f.cfg.Namespace).Delete(ctx, configMapName(td), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting federation config for %s: %w", td, err)
	}
	return nil
}

// ErrUnknownTrustDomain is returned for a trust domain we do not federate with.
var ErrUnknownTrustDomain = errors.New("unknown trust domain")

// TrustDomain returns one trust domain's status.
func (f *Federation) TrustDomain(td string) (Status, error) {
	for _, st := range f.TrustDomains() {
		if st.Spec.TrustDomain == td {
			return st, nil
		}
	}
	return Status{}, fmt.Errorf("%w %q", ErrUnknownTrustDomain, td)
}
