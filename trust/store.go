package trust

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strconv"
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

func parseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM key")
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
	return nil, errors.New("unsupported private key format")
}

func encodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// loadCA reads the plugged-in cacerts Secret if there is one, else the
// self-signed root of StateSecret, creating it on first start (every replica
// converges on the first one written). Roots that were trusted before and
// have not expired stay in the bundle; the sequence increases whenever the
// set of roots changes. Only a leader (leader true) updates an existing
// StateSecret; the others use what they computed until the leader's write
// reaches them, which is the same unless the leader saw a newer cacerts.
// Creating it is always safe: the first create wins and the rest re-read.
func loadCA(ctx context.Context, secrets typedcorev1.SecretInterface, td spiffeid.TrustDomain, now time.Time, leader bool) (*caState, error) {
	state, err := secrets.Get(ctx, StateSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		state = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: StateSecret, Labels: map[string]string{"app.kubernetes.io/managed-by": "hub"}}, Data: map[string][]byte{}}
	} else if err != nil {
		return nil, fmt.Errorf("reading %s: %w", StateSecret, err)
	}
	if state.Data == nil {
		state.Data = map[string][]byte{}
	}
	var ca *CA
	var current []*x509.Certificate
	plugged, err := secrets.Get(ctx, PluggedCASecret, metav1.GetOptions{})
	switch {
	case err == nil:
		certs, err1 := parseCerts(plugged.Data["ca-cert.pem"])
		key, err2 := parseKey(plugged.Data["ca-key.pem"])
		roots, err3 := parseCerts(plugged.Data["root-cert.pem"])
		chain, _ := parseCerts(plugged.Data["cert-chain.pem"])
		if err := errors.Join(err1, err2, err3); err != nil || len(certs) == 0 || len(roots) == 0 {
			return nil, fmt.Errorf("secret %s: ca-cert.pem, ca-key.pem and root-cert.pem must hold a certificate, a key and roots: %v", PluggedCASecret, err)
		}
		ca = &CA{TrustDomain: td, Cert: certs[0], Key: key}
		if len(chain) > 1 {
			ca.Chain = chain[1:]
		}
		current = roots
	case apierrors.IsNotFound(err):
		certs, _ := parseCerts(state.Data["ca-cert.pem"])
		key, kerr := parseKey(state.Data["ca-key.pem"])
		if len(certs) == 0 || kerr != nil {
			if ca, err = NewSelfSignedCA(td, 10*365*24*time.Hour); err != nil {
				return nil, err
			}
			keyPEM, err := encodeKey(ca.Key)
			if err != nil {
				return nil, err
			}
			state.Data["ca-cert.pem"], state.Data["ca-key.pem"] = encodeCerts([]*x509.Certificate{ca.Cert}), keyPEM
		} else {
			ca = &CA{TrustDomain: td, Cert: certs[0], Key: key}
		}
		current = []*x509.Certificate{ca.Cert}
	default:
		return nil, fmt.Errorf("reading %s: %w", PluggedCASecret, err)
	}

	// Keep earlier roots until they expire.
	previous, _ := parseCerts(state.Data["roots.pem"])
	roots := append([]*x509.Certificate(nil), current...)
	for _, old := range previous {
		if now.Before(old.NotAfter) && !containsCert(roots, old) {
			roots = append(roots, old)
		}
	}
	seq, _ := strconv.ParseUint(string(state.Data["sequence"]), 10, 64)
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
			return loadCA(ctx, secrets, td, now, leader) // another replica wrote first: use its state
		}
		if err != nil {
			return nil, fmt.Errorf("persisting %s: %w", StateSecret, err)
		}
	}
	return &caState{ca: ca, roots: roots, sequence: seq}, nil
}

func containsCert(list []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range list {
		if x.Equal(c) {
			return true
		}
	}
	return false
}
