package trust

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Names of the home-cluster Secrets that hold CA material.
const (
	// PluggedCASecret is Istio's plug-in CA Secret (ca-cert.pem, ca-key.pem,
	// root-cert.pem, cert-chain.pem); when present it is our CA.
	PluggedCASecret = "cacerts"
	// StateSecret holds the self-signed root (when no cacerts exists), the
	// roots still trusted after a rotation, and the bundle sequence number.
	StateSecret = "hub-trust-state"
)

// caState is what the hub keeps about its own trust domain.
type caState struct {
	ca       *CA
	roots    []*x509.Certificate // current roots first, then older unexpired ones
	current  int                 // how many of roots are current (the CA's own)
	secret   string              // the Secret the CA comes from (PluggedCASecret or StateSecret)
	sequence uint64
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for len(data) > 0 {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func encodeCerts(certs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// parseKey reads the first PEM private key in data (PKCS #8, SEC 1 or
// PKCS #1), skipping other blocks such as the "EC PARAMETERS" openssl
// writes before an EC key.
func parseKey(data []byte) (crypto.Signer, error) {
	for len(data) > 0 {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if !strings.HasSuffix(block.Type, "PRIVATE KEY") {
			continue
		}
		if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
			if s, ok := k.(crypto.Signer); ok {
				return s, nil
			}
		}
		if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
			return k, nil
		}
		if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
			return k, nil
		}
		return nil, fmt.Errorf("%s block: unsupported or malformed private key", block.Type)
	}
	return nil, errors.New("no PEM private key")
}

// keyMatches reports whether key is the private key of cert.
func keyMatches(cert *x509.Certificate, key crypto.Signer) bool {
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(cert.PublicKey)
}

func encodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// CorruptStateError is CA material that is stored in the home cluster but
// cannot be used: a certificate or key that is missing while the other is
// there or does not parse, a key that does not match its certificate,
// unreadable roots or sequence, a cacerts Secret without its roots. Retrying cannot
// help, and minting a new CA instead would silently cut off every workload
// and peer that trusts the stored one, so the hub refuses to start.
type CorruptStateError struct {
	Secret string // namespace/name
	What   string // which part, e.g. "stored CA key"
	Err    error
	Remedy string
}

func (e *CorruptStateError) Error() string {
	return fmt.Sprintf("%s in Secret %s is unreadable: %v; %s", e.What, e.Secret, e.Err, e.Remedy)
}

func (e *CorruptStateError) Unwrap() error { return e.Err }

const (
	stateRemedy   = "refusing to mint a new CA (delete the Secret to start over)"
	pluggedRemedy = "refusing to use it or to fall back to another CA (fix the Secret, or delete it to use the hub's own CA)"
)

// loadCA reads the plugged-in cacerts Secret if there is one, else the
// self-signed root of StateSecret, creating it on first start (every replica
// converges on the first one written). A new root is minted only when
// StateSecret holds no CA certificate and no key at all; stored material
// that cannot be used (see CorruptStateError) is an error, and nothing is
// written then. Roots that were trusted
// before and have not expired stay in the bundle; the sequence increases
// whenever the set of roots changes. Only a leader (leader true) updates an
// existing StateSecret; the others use what they computed until the
// leader's write reaches them, which is the same unless the leader saw a
// newer cacerts. Creating it is always safe: the first create wins and the
// rest re-read.
func loadCA(ctx context.Context, secrets typedcorev1.SecretInterface, ns string, td spiffeid.TrustDomain, now time.Time, leader bool) (*caState, error) {
	stateName, pluggedName := ns+"/"+StateSecret, ns+"/"+PluggedCASecret
	corrupt := func(secret, what, remedy string, err error) error {
		return &CorruptStateError{Secret: secret, What: what, Err: err, Remedy: remedy}
	}
	state, err := secrets.Get(ctx, StateSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		state = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: StateSecret, Labels: map[string]string{"app.kubernetes.io/managed-by": "hub"}}, Data: map[string][]byte{}}
	} else if err != nil {
		return nil, fmt.Errorf("reading Secret %s: %w", stateName, err)
	}
	if state.Data == nil {
		state.Data = map[string][]byte{}
	}
	// What the state keeps besides the CA: unreadable roots would drop
	// roots peers still trust, an unreadable sequence would restart at 1
	// (peers refuse a sequence that goes backwards).
	previous, err := parseCerts(state.Data["roots.pem"])
	if err != nil {
		return nil, corrupt(stateName, "stored roots (roots.pem)", stateRemedy, err)
	}
	var seq uint64
	if raw := state.Data["sequence"]; len(raw) > 0 {
		if seq, err = strconv.ParseUint(string(raw), 10, 64); err != nil {
			return nil, corrupt(stateName, "stored bundle sequence", stateRemedy, errors.New("not an unsigned integer"))
		}
	}

	var ca *CA
	var current []*x509.Certificate
	source := StateSecret
	plugged, err := secrets.Get(ctx, PluggedCASecret, metav1.GetOptions{})
	switch {
	case err == nil:
		if ca, current, err = parsePlugged(td, plugged.Data); err != nil {
			return nil, corrupt(pluggedName, "plugged-in CA (Istio cacerts)", pluggedRemedy, err)
		}
		source = PluggedCASecret
	case apierrors.IsNotFound(err):
		if ca, err = ownCA(td, state, stateName); err != nil {
			return nil, err
		}
		current = []*x509.Certificate{ca.Cert}
	default:
		return nil, fmt.Errorf("reading Secret %s: %w", pluggedName, err)
	}

	// Keep earlier roots until they expire.
	roots := append([]*x509.Certificate(nil), current...)
	for _, old := range previous {
		if now.Before(old.NotAfter) && !containsCert(roots, old) {
			roots = append(roots, old)
		}
	}
	if encoded := encodeCerts(roots); string(encoded) != string(state.Data["roots.pem"]) || seq == 0 {
		seq++
		state.Data["roots.pem"], state.Data["sequence"] = encoded, []byte(strconv.FormatUint(seq, 10))
		switch {
		case state.ResourceVersion == "":
			_, err = secrets.Create(ctx, state, metav1.CreateOptions{})
		case leader:
			_, err = secrets.Update(ctx, state, metav1.UpdateOptions{})
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			return loadCA(ctx, secrets, ns, td, now, leader) // another replica wrote first: use its state
		}
		if err != nil {
			return nil, fmt.Errorf("persisting Secret %s: %w", stateName, err)
		}
	}
	return &caState{ca: ca, roots: roots, current: len(current), secret: source, sequence: seq}, nil
}

// ownCA is the hub's own CA from its state Secret (ca-cert.pem and
// ca-key.pem), or a new self-signed root written into state when it has
// neither: on the first start, or once the operator's cacerts was removed.
// A state it cannot read is a *CorruptStateError naming stateName.
func ownCA(td spiffeid.TrustDomain, state *corev1.Secret, stateName string) (*CA, error) {
	corrupt := func(what string, err error) error {
		return &CorruptStateError{Secret: stateName, What: what, Err: err, Remedy: stateRemedy}
	}
	certPEM, keyPEM := state.Data["ca-cert.pem"], state.Data["ca-key.pem"]
	if len(certPEM) == 0 && len(keyPEM) == 0 {
		ca, err := NewSelfSignedCA(td, 10*365*24*time.Hour)
		if err != nil {
			return nil, err
		}
		keyPEM, err := encodeKey(ca.Key)
		if err != nil {
			return nil, err
		}
		state.Data["ca-cert.pem"], state.Data["ca-key.pem"] = encodeCerts([]*x509.Certificate{ca.Cert}), keyPEM
		return ca, nil
	}
	certs, err := parseCerts(certPEM)
	if err == nil && len(certs) == 0 {
		err = errors.New("no PEM certificate in ca-cert.pem")
	}
	if err != nil {
		return nil, corrupt("stored CA certificate", err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, corrupt("stored CA key", fmt.Errorf("ca-key.pem: %w", err))
	}
	if !keyMatches(certs[0], key) {
		return nil, corrupt("stored CA key", errors.New("ca-key.pem is not the key of ca-cert.pem"))
	}
	return &CA{TrustDomain: td, Cert: certs[0], Key: key}, nil
}

// parsePlugged reads Istio's plug-in CA Secret: ca-cert.pem (the signing
// certificate), its ca-key.pem, root-cert.pem and the optional
// cert-chain.pem (signing certificate first, then up to the root).
func parsePlugged(td spiffeid.TrustDomain, data map[string][]byte) (*CA, []*x509.Certificate, error) {
	certs, err := parseCerts(data["ca-cert.pem"])
	if err == nil && len(certs) == 0 {
		err = errors.New("no PEM certificate")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ca-cert.pem: %w", err)
	}
	key, err := parseKey(data["ca-key.pem"])
	if err != nil {
		return nil, nil, fmt.Errorf("ca-key.pem: %w", err)
	}
	if !keyMatches(certs[0], key) {
		return nil, nil, errors.New("ca-key.pem is not the key of ca-cert.pem")
	}
	roots, err := parseCerts(data["root-cert.pem"])
	if err == nil && len(roots) == 0 {
		err = errors.New("no PEM certificate")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("root-cert.pem: %w", err)
	}
	chain, err := parseCerts(data["cert-chain.pem"])
	if err != nil {
		return nil, nil, fmt.Errorf("cert-chain.pem: %w", err)
	}
	ca := &CA{TrustDomain: td, Cert: certs[0], Key: key}
	if len(chain) > 1 {
		ca.Chain = chain[1:]
	}
	return ca, roots, nil
}

func containsCert(list []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range list {
		if x.Equal(c) {
			return true
		}
	}
	return false
}
