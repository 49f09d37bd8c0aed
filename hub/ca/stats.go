package ca

import (
	"sort"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubmesh/hub/hub/internal/clip"
)

// CertificateStats is what the hub's CA (Istio's CA API) issued and refused
// since this replica started (Server.Stats).
type CertificateStats struct {
	// DefaultTTL is the lifetime of a certificate whose request asks for
	// none; MaxTTL the longest one issued (--max-workload-cert-ttl).
	DefaultTTL, MaxTTL time.Duration
	// Groups are the certificates issued per member and namespace, sorted
	// by member, then namespace.
	Groups []CertificateGroup
	// Failures are the refused requests per reason, in a fixed order.
	Failures []Failure
}

// CertificateGroup is the certificates issued for one namespace of one
// member.
type CertificateGroup struct {
	Member, Namespace string
	// Issued counts the certificates issued.
	Issued uint64
	// Valid counts the identities whose latest certificate has not expired
	// yet (of those the hub remembers: see maxTrackedIdentities).
	Valid int
	// NextExpiry is the soonest NotAfter among those latest certificates:
	// when the first of these workloads loses its identity unless it
	// renews. Zero when none is valid.
	NextExpiry time.Time
}

// Failure counts the requests refused for one reason.
type Failure struct {
	// Reason is why, a label value of hub_ca_requests_failed_total.
	Reason string
	// Total since the replica started; LastHour in the last 60 minutes.
	Total, LastHour uint64
	// Last is when the latest one was refused, with what its caller was
	// told (never a token or a CSR); zero when none was.
	Last        time.Time
	LastMessage string
}

// Bounds of the CA's read model: a fleet of any size keeps it small.
const (
	// maxTrackedIdentities bounds the identities whose latest certificate
	// is remembered (least recently issued forgotten first).
	maxTrackedIdentities = 50000
	// maxCertificateGroups bounds the (member, namespace) groups counted
	// apart, here and in the metrics; later ones count under "*", "*".
	maxCertificateGroups = 10000
	// maxFailureMessage bounds the last failure message kept per reason.
	maxFailureMessage = 512
)

// overflowGroup counts the groups beyond maxCertificateGroups.
var overflowGroup = groupKey{"*", "*"}

type groupKey struct{ member, namespace string }

// latestCert is the latest certificate issued to one identity.
type latestCert struct {
	group    groupKey
	notAfter time.Time
}

// failureCounts are one reason's counts, with per-minute buckets for the
// last hour.
type failureCounts struct {
	total   uint64
	minutes [60]uint64
	stamp   [60]int64 // the Unix minute each bucket counts
	last    time.Time
	message string
}

// caStats is the CA's metrics and read model.
type caStats struct {
	issuedTotal *prometheus.CounterVec
	failedTotal *prometheus.CounterVec
	seconds     prometheus.Histogram
	latest      *lru.Cache[string, latestCert] // safe for concurrent use; by identity
	now         func() time.Time

	mu       sync.Mutex
	groups   map[groupKey]uint64
	failures map[string]*failureCounts
}

func newCAStats() *caStats {
	latest, _ := lru.New[string, latestCert](maxTrackedIdentities) // only a size ≤ 0 fails
	s := &caStats{
		issuedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_ca_certificates_issued_total",
			Help: "Workload certificates issued by the hub's CA (Istio CA API), by member cluster and namespace (\"*\" beyond 10000 pairs).",
		}, []string{"member", "namespace"}),
		failedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_ca_requests_failed_total",
			Help: "Certificate requests the hub's CA refused, by reason: no_credentials, token_rejected, review_unavailable, certificate_rejected, cluster_mismatch, not_member, invalid_csr, invalid_ttl, signing_failed.",
		}, []string{"reason"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hub_ca_issue_seconds",
			Help:    "Time to answer a certificate request that was issued: authentication (a token review unless cached), CSR check and signing.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		latest: latest, now: time.Now,
		groups: map[groupKey]uint64{}, failures: map[string]*failureCounts{},
	}
	for _, r := range caReasons { // every reason exported from the start
		s.failedTotal.WithLabelValues(r)
	}
	return s
}

func (s *caStats) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.issuedTotal, s.failedTotal, s.seconds}
}

// issued records a certificate issued to identity (of member and
// namespace) that expires at notAfter, answered in took.
func (s *caStats) issued(member, namespace, identity string, notAfter time.Time, took time.Duration) {
	g := groupKey{member, namespace}
	s.mu.Lock()
	if _, ok := s.groups[g]; !ok && len(s.groups) >= maxCertificateGroups {
		g = overflowGroup
	}
	s.groups[g]++
	s.mu.Unlock()
	s.latest.Add(member+"\x00"+identity, latestCert{group: g, notAfter: notAfter})
	s.issuedTotal.WithLabelValues(g.member, g.namespace).Inc()
	s.seconds.Observe(took.Seconds())
}

// failed records a refused request.
func (s *caStats) failed(reason, message string) {
	s.failedTotal.WithLabelValues(reason).Inc()
	now := s.now()
	minute := now.Unix() / 60
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.failures[reason]
	if f == nil {
		f = &failureCounts{}
		s.failures[reason] = f
	}
	i := minute % 60
	if f.stamp[i] != minute {
		f.stamp[i], f.minutes[i] = minute, 0
	}
	f.minutes[i]++
	f.total++
	f.last, f.message = now, clip.String(message, maxFailureMessage)
}

// snapshot builds the read model.
func (s *caStats) snapshot() CertificateStats {
	now := s.now()
	type expiry struct {
		valid int
		next  time.Time
	}
	expiries := map[groupKey]*expiry{}
	for _, c := range s.latest.Values() {
		if !c.notAfter.After(now) {
			continue
		}
		e := expiries[c.group]
		if e == nil {
			e = &expiry{}
			expiries[c.group] = e
		}
		e.valid++
		if e.next.IsZero() || c.notAfter.Before(e.next) {
			e.next = c.notAfter
		}
	}
	var out CertificateStats
	minute := now.Unix() / 60
	s.mu.Lock()
	for g, n := range s.groups {
		cg := CertificateGroup{Member: g.member, Namespace: g.namespace, Issued: n}
		if e := expiries[g]; e != nil {
			cg.Valid, cg.NextExpiry = e.valid, e.next
		}
		out.Groups = append(out.Groups, cg)
	}
	for _, r := range caReasons {
		cf := Failure{Reason: r}
		if f := s.failures[r]; f != nil {
			cf.Total, cf.Last, cf.LastMessage = f.total, f.last, f.message
			for i, m := range f.stamp {
				if minute-m < 60 {
					cf.LastHour += f.minutes[i]
				}
			}
		}
		out.Failures = append(out.Failures, cf)
	}
	s.mu.Unlock()
	sort.Slice(out.Groups, func(i, j int) bool {
		a, b := out.Groups[i], out.Groups[j]
		if a.Member != b.Member {
			return a.Member < b.Member
		}
		return a.Namespace < b.Namespace
	})
	return out
}
