package trust

import (
	"context"
	"crypto/x509"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/hubmesh/hub/internal/expiry"
)

// Reasons of the Warning Events the hub records when our CA (on the
// Secret it comes from) or a peer's bundle (on the peer's ConfigMap)
// comes within Config.ExpiryWarning of expiring, and when it has expired.
const (
	ReasonCAExpiring         = "CAExpiring"
	ReasonCAExpired          = "CAExpired"
	ReasonPeerBundleExpiring = "PeerBundleExpiring"
	ReasonPeerBundleExpired  = "PeerBundleExpired"
)

// CertExpiry is when one certificate (or the first of a set) expires.
type CertExpiry struct {
	Subject  string
	NotAfter time.Time
	// Level is NotAfter against Config.ExpiryWarning when it was read.
	Level expiry.Level
}

// CAExpiry is when our CA stops working: Root is the first of its current
// roots to expire (older roots still trusted after a rotation are not
// counted: they are on their way out), Chain the first of its signing
// certificate and the intermediates up to the root (for a self-signed CA,
// the root itself). Secret (namespace/name) holds the CA.
type CAExpiry struct {
	Root, Chain CertExpiry
	Secret      string
}

// earliest is the certificate of certs that expires first (zero if none).
func earliest(certs []*x509.Certificate) CertExpiry {
	var out CertExpiry
	for _, c := range certs {
		if out.NotAfter.IsZero() || c.NotAfter.Before(out.NotAfter) {
			out = CertExpiry{Subject: c.Subject.String(), NotAfter: c.NotAfter.UTC()}
		}
	}
	return out
}

// bundleExpiry is the X.509 authority of b that expires first (zero if
// none or no bundle).
func bundleExpiry(b *spiffebundle.Bundle) CertExpiry {
	if b == nil {
		return CertExpiry{}
	}
	return earliest(b.X509Authorities())
}

func (f *Domains) warning() time.Duration { return f.cfg.ExpiryWarning }

// CAExpiry reports when our CA's root and chain expire, graded at now;
// false until the CA is loaded.
func (f *Domains) CAExpiry(now time.Time) (CAExpiry, bool) {
	f.mu.RLock()
	st := f.local
	f.mu.RUnlock()
	if st == nil {
		return CAExpiry{}, false
	}
	out := CAExpiry{
		Root:   earliest(st.roots[:st.current]),
		Chain:  earliest(append([]*x509.Certificate{st.ca.Cert}, st.ca.Chain...)),
		Secret: f.cfg.Namespace + "/" + st.secret,
	}
	out.Root.Level = expiry.LevelAt(out.Root.NotAfter, now, f.warning())
	out.Chain.Level = expiry.LevelAt(out.Chain.NotAfter, now, f.warning())
	return out, true
}

var (
	descRootExpiry = prometheus.NewDesc("citadel_server_root_cert_expiry_timestamp",
		"When the hub CA's root certificate expires (Unix seconds; the first of its current roots to expire), as Istio's istiod names it.", nil, nil)
	descChainExpiry = prometheus.NewDesc("citadel_server_cert_chain_expiry_timestamp",
		"When the hub CA's certificate chain expires (Unix seconds; the first of its signing certificate and intermediates to expire), as Istio's istiod names it.", nil, nil)
	descPeerRefresh = prometheus.NewDesc("hub_trust_peer_bundle_last_refresh_timestamp_seconds",
		"When a federated peer's bundle was last fetched and accepted by this replica (Unix seconds; absent until the first since it started).", []string{"trust_domain"}, nil)
	descPeerExpiry = prometheus.NewDesc("hub_trust_peer_bundle_expiry_timestamp_seconds",
		"When the first X.509 authority of a federated peer's current bundle expires (Unix seconds; absent while the hub has no bundle of it).", []string{"trust_domain"}, nil)
)

// Collector reports the expiry of our CA and of peers' bundles, computed
// at scrape time from the federation's state, so that it never disagrees
// with the API.
func (f *Domains) Collector() prometheus.Collector { return expiryCollector{f} }

type expiryCollector struct{ f *Domains }

func (c expiryCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRootExpiry, descChainExpiry, descPeerRefresh, descPeerExpiry} {
		ch <- d
	}
}

func (c expiryCollector) Collect(ch chan<- prometheus.Metric) {
	if ca, ok := c.f.CAExpiry(time.Now()); ok {
		ch <- prometheus.MustNewConstMetric(descRootExpiry, prometheus.GaugeValue, float64(ca.Root.NotAfter.Unix()))
		ch <- prometheus.MustNewConstMetric(descChainExpiry, prometheus.GaugeValue, float64(ca.Chain.NotAfter.Unix()))
	}
	for _, p := range c.f.peerStatuses() {
		if !p.status.LastSuccess.IsZero() {
			ch <- prometheus.MustNewConstMetric(descPeerRefresh, prometheus.GaugeValue, float64(p.status.LastSuccess.Unix()), p.status.Spec.TrustDomain)
		}
		if e := bundleExpiry(p.status.Bundle); !e.NotAfter.IsZero() {
			ch <- prometheus.MustNewConstMetric(descPeerExpiry, prometheus.GaugeValue, float64(e.NotAfter.Unix()), p.status.Spec.TrustDomain)
		}
	}
}

// peerState is one peer's status and the ConfigMap that declares it.
type peerState struct {
	status Status
	cmName string
}

func (f *Domains) peerStatuses() []peerState {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]peerState, 0, len(f.peers))
	for _, p := range f.peers {
		out = append(out, peerState{p.status, p.cmName})
	}
	return out
}

// withExpiry grades a trust domain's status at now: a peer's bundle
// expiry, our CA's.
func (f *Domains) withExpiry(st Status, now time.Time) Status {
	if st.Local {
		if ca, ok := f.CAExpiry(now); ok {
			st.CA = &ca
		}
		return st
	}
	e := bundleExpiry(st.Bundle)
	e.Level = expiry.LevelAt(e.NotAfter, now, f.warning())
	st.BundleExpiry = e
	return st
}

// watchExpiry records Warning Events when our CA's root or chain
// (CAExpiring, CAExpired, on the Secret holding the CA) or a peer's bundle
// (PeerBundleExpiring, PeerBundleExpired, on its ConfigMap) comes within
// Config.ExpiryWarning of expiring and when it has expired: once per
// crossing, only on the leader; it checks when roots change and every
// expiry.CheckEvery, until ctx is done.
func (f *Domains) watchExpiry(ctx context.Context) {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: f.cfg.Client.CoreV1().Events(f.cfg.Namespace)})
	defer broadcaster.Shutdown()
	rec := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "hub"})
	expiry.Watch(ctx, f.expiryKick, func(now time.Time) { f.checkExpiry(rec, now) })
}

func (f *Domains) checkExpiry(rec record.EventRecorder, now time.Time) {
	if !f.leader() {
		return // a replica that gains leadership warns of what it never did
	}
	current := map[string]bool{}
	warn := func(key string, e CertExpiry, ref *corev1.ObjectReference, expiring, expired, format string, args ...any) {
		current[key] = true
		level := expiry.LevelAt(e.NotAfter, now, f.warning())
		if !f.expiryWarned.Due(key, e.NotAfter, level) {
			return
		}
		reason := expiring
		if level == expiry.Expired {
			reason = expired
		}
		f.log.Warn("expiry warning", "reason", reason, "object", ref.Name, "subject", e.Subject, "notAfter", e.NotAfter)
		rec.Eventf(ref, corev1.EventTypeWarning, reason, format+" "+expiry.Sentence(e.NotAfter, now), args...)
		f.expiryWarned.Mark(key, e.NotAfter, level)
	}
	if ca, ok := f.CAExpiry(now); ok {
		ref := &corev1.ObjectReference{Kind: "Secret", APIVersion: "v1", Namespace: f.cfg.Namespace, Name: ca.Secret[len(f.cfg.Namespace)+1:]}
		td := f.cfg.TrustDomain.Name()
		warn("ca/root", ca.Root, ref, ReasonCAExpiring, ReasonCAExpired, "trust domain %s: our CA's root certificate %q", td, ca.Root.Subject)
		warn("ca/chain", ca.Chain, ref, ReasonCAExpiring, ReasonCAExpired, "trust domain %s: our CA's signing certificate chain (first to expire: %q)", td, ca.Chain.Subject)
	}
	for _, p := range f.peerStatuses() {
		e := bundleExpiry(p.status.Bundle)
		if e.NotAfter.IsZero() {
			continue
		}
		ref := &corev1.ObjectReference{Kind: "ConfigMap", APIVersion: "v1", Namespace: f.cfg.Namespace, Name: p.cmName}
		warn("peer/"+p.status.Spec.TrustDomain, e, ref, ReasonPeerBundleExpiring, ReasonPeerBundleExpired,
			"trust domain %s: the first X.509 authority of the peer's bundle (%q), last refreshed %s,", p.status.Spec.TrustDomain, e.Subject, refreshedWords(p.status.LastSuccess))
	}
	f.expiryWarned.Retain(func(key string) bool { return current[key] })
}

func refreshedWords(t time.Time) string {
	if t.IsZero() {
		return "never by this replica"
	}
	return t.UTC().Format(time.RFC3339)
}
