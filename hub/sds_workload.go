package hub

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/proto"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/ca"
	"github.com/hubmesh/hub/hub/sds"
	"github.com/hubmesh/hub/hub/xdsgen"
)

// workloadCerts issues the workload certificate SDS serves a hub-fed Envoy
// as "default" (xdsgen.SDSWorkloadCert), Istio's name for it: the key is
// made by the hub and the certificate is for the identity the stream
// proved, bound to the member it proved, from our CA (the signer of
// Istio's CA API). It is never longer-lived than the credential that
// proved the identity (as the CA API renews), and is renewed at half its
// life: the earliest renewal due is what the hub's renewal tick reads
// (due), which then re-evaluates every subscriber of roots and "default".
type workloadCerts struct {
	signer ca.WorkloadSigner // nil: none served
	ttl    time.Duration
	// next is the earliest renewal due (unix nanoseconds; 0: none).
	next atomic.Int64
}

// minWorkloadTTL is the shortest workload certificate SDS issues: a client
// certificate that expires sooner must be renewed by its owner first.
const minWorkloadTTL = 2 * time.Minute

// workloadCert is one stream's issued workload certificate, as an SDS
// Secret (it holds the private key: never logged, redacted by the API).
type workloadCert struct {
	id      spiffeid.ID
	member  string
	renewAt time.Time
	secret  *tlsv3.Secret
}

// streamWorkload is a stream's workload certificate, renewed in place; its
// own lock, as pushes evaluate the stream's SDS watch beside its loop.
type streamWorkload struct {
	mu   sync.Mutex
	cert *workloadCert
}

// secret returns the stream's workload certificate for id, issuing one
// when it has none for id or the one it has is due for renewal.
func (wc *workloadCerts) secret(sw *streamWorkload, id authn.Identity, roots authn.RootSource) (proto.Message, error) {
	if wc == nil || wc.signer == nil || roots == nil {
		return nil, fmt.Errorf("%w: the hub has no CA: SDS serves no workload certificate (%q)", sds.ErrDenied, xdsgen.SDSWorkloadCert)
	}
	if local := roots.LocalTrustDomain(); !id.Verified(local) {
		return nil, fmt.Errorf("%w: a workload certificate is issued only to a verified workload identity of %s over mTLS", sds.ErrDenied, local)
	}
	if id.Conflict != "" {
		return nil, fmt.Errorf("%w: %s claims a member its certificate is not bound to", sds.ErrDenied, id.SpiffeID)
	}
	now := time.Now()
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if c := sw.cert; c != nil && c.id == id.SpiffeID && c.member == id.Cluster && now.Before(c.renewAt) {
		wc.due(c.renewAt) // a tick that fired for another's is past: this one's is still ahead
		return c.secret, nil
	}
	ttl := wc.ttl
	if !id.NotAfter.IsZero() {
		ttl = min(ttl, id.NotAfter.Sub(now))
	}
	if ttl < minWorkloadTTL {
		return nil, fmt.Errorf("%w: the client certificate of %s expires in %s: renew it before asking for a workload certificate", sds.ErrDenied, id.SpiffeID, ttl.Round(time.Second))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	chain, err := wc.signer.SignWorkload(key.Public(), id.SpiffeID, id.Cluster, ttl)
	if err != nil {
		return nil, fmt.Errorf("issuing the workload certificate of %s: %w", id.SpiffeID, err)
	}
	if len(chain) == 0 {
		return nil, errors.New("issuing a workload certificate: empty chain")
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	var certPEM []byte
	for _, c := range chain {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	leaf := chain[0]
	renewAt := now.Add(leaf.NotAfter.Sub(now) / 2)
	sw.cert = &workloadCert{id: id.SpiffeID, member: id.Cluster, renewAt: renewAt, secret: &tlsv3.Secret{
		Name: xdsgen.SDSWorkloadCert,
		Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: certPEM}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})}},
		}},
	}}
	wc.due(renewAt)
	return sw.cert.secret, nil
}

// due records that a certificate is due for renewal at t.
func (wc *workloadCerts) due(t time.Time) {
	for {
		cur := wc.next.Load()
		if cur != 0 && cur <= t.UnixNano() {
			return
		}
		if wc.next.CompareAndSwap(cur, t.UnixNano()) {
			return
		}
	}
}

// renewalDue reports whether a renewal is due at now, and if so forgets
// it: the re-evaluation it triggers records the next ones.
func (wc *workloadCerts) renewalDue(now time.Time) bool {
	next := wc.next.Load()
	if next == 0 || now.UnixNano() < next {
		return false
	}
	return wc.next.CompareAndSwap(next, 0)
}

// workloadRenewalTick is how often the hub checks whether a workload
// certificate SDS issued is due for renewal.
const workloadRenewalTick = 30 * time.Second
