package authn

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/hubmesh/hub/hub/internal/clip"
	"github.com/hubmesh/hub/internal/ttlcache"
)

// TokenReviewer checks a caller's Kubernetes service-account token in the
// caller's own member cluster (clusters.Registry implements it).
type TokenReviewer interface {
	ReviewToken(ctx context.Context, cluster, token string) (namespace, serviceAccount string, err error)
}

// MeshAccounts, when a TokenReviewer also implements it, says which
// service accounts run a member's mesh pods: the accounts whose workloads
// ask for certificates. A token claiming one of them is charged its
// failures apart from other tokens of its source (see TokenAuth).
type MeshAccounts interface {
	RunsMeshAccount(cluster, namespace, serviceAccount string) bool
}

// Token reviews running at once, as for the hub's access reviews: anyone
// who reaches the mTLS port can send a made-up token naming any member,
// and each costs a TokenReview there. A caller waits for a slot within its
// review's 5 seconds; a member that does not answer then holds at most
// TokenReviewsPerMember of them and delays no other member's callers.
const (
	TokenReviewsPerMember = 4
	TokenReviewsOverall   = 32
)

// TokenAuth turns service-account tokens into workload identities of our
// trust domain. Answers are cached by a hash of (cluster, token), never the
// token itself: an accepted token for a minute, a rejected one for
// tokenRejectedTTL, so a reconnecting fleet does not flood members with
// reviews. A caller may ask for a fresher acceptance (Authenticate's
// maxAge); a rejection then also ends the cached acceptance, for every
// caller.
//
// A member that has not synced asserts nothing (Scope.memberMay):
// its tokens are not even reviewed. Tokens a member rejects are charged to
// the caller's source address and that member (failures): a source that
// keeps sending tokens a member rejects gets ResourceExhausted for that
// member instead of more reviews,
// so anonymous callers cannot make the hub flood a member's API server.
// Accepted tokens are never charged: a fleet behind one NAT address that
// reconnects with new tokens is not limited. Nor does a neighbour behind
// that address who sends made-up tokens stop the fleet's new workloads: a
// token whose (unverified) subject is a service account the member's mesh
// pods run as (MeshAccounts) is charged to the source, the member and that
// account, apart from every other token; only tokens claiming the same
// account share its budget, and a source gets at most one budget per
// account the member's mesh runs, and all its account budgets for a member
// share a ceiling (accountFailures: AccountFailureBurst at once, then
// AccountFailureRate a second), so the reviews it can cause stay bounded
// however many accounts it names.
type TokenAuth struct {
	reviewer TokenReviewer
	td       func() string
	scope    *Scope // nil: every member may assert identities
	accepted *ttlcache.Cache[[32]byte, reviewed]
	rejected *ttlcache.Cache[[32]byte, error]
	slots    *reviewSlots
	failures *sourceLimiter
	// accountFailures is the ceiling of a source's account budgets per
	// member (the key source, member).
	accountFailures *sourceLimiter
	accounts        MeshAccounts // nil: every token is charged to its source and member
	now             func() time.Time
	reviews         *prometheus.CounterVec // TokenReviews sent, by result
	refusals        *prometheus.CounterVec // tokens refused without a review, by reason
}

// reviewed is an accepted token's identity and when its member said so.
type reviewed struct {
	id Identity
	at time.Time
}

// tokenAcceptedTTL is how long an accepted token is believed without
// asking its member again (by callers that take any cached answer);
// tokenRejectedTTL how long a rejected one is refused without asking.
const (
	tokenAcceptedTTL = time.Minute
	tokenRejectedTTL = 15 * time.Second
)

// Rejected tokens a source may cause: TokenFailureBurst at once, then one
// every TokenFailureEvery. Sources are the callers' IP addresses (IPv6 by
// /64), at most maxTokenSources remembered (least recently seen forgotten
// first, which at worst gives a forgotten source a new burst).
const (
	TokenFailureBurst = 20
	TokenFailureEvery = time.Second
	maxTokenSources   = 10000

	// AccountFailureBurst and AccountFailureRate bound the rejected tokens
	// a source may cause for one member over all the accounts it claims.
	AccountFailureBurst = 10 * TokenFailureBurst
	AccountFailureRate  = 10 // per second
)

// Label values of hub_token_reviews_total and hub_token_refusals_total.
const (
	tokenReviewAccepted    = "accepted"
	tokenReviewRejected    = "rejected"
	tokenReviewUnavailable = "unavailable"

	tokenRefusedRateLimited     = "rate_limited"
	tokenRefusedCachedRejection = "cached_rejection"
	tokenRefusedNotSynced       = ScopeMemberNotSynced
)

// NewTokenAuth authenticates tokens with r, as identities of the trust
// domain td names, of the members scope lets assert them (nil: every
// member).
func NewTokenAuth(r TokenReviewer, td func() string, scope *Scope) *TokenAuth {
	a := &TokenAuth{
		reviewer: r, td: td, scope: scope,
		accepted:        ttlcache.New[[32]byte, reviewed](10000, tokenAcceptedTTL),
		rejected:        ttlcache.New[[32]byte, error](10000, tokenRejectedTTL),
		slots:           newReviewSlots(TokenReviewsPerMember, TokenReviewsOverall),
		failures:        newSourceLimiter(rate.Every(TokenFailureEvery), TokenFailureBurst, maxTokenSources),
		accountFailures: newSourceLimiter(rate.Limit(AccountFailureRate), AccountFailureBurst, maxTokenSources),
		now:             time.Now,
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_token_reviews_total",
			Help: "TokenReviews the hub sent to members for service-account tokens (CA and mTLS xDS), by result: accepted, rejected, unavailable (no answer in time).",
		}, []string{"result"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_token_refusals_total",
			Help: "Service-account tokens refused without a TokenReview, by reason: rate_limited (the caller's source sent too many rejected tokens), cached_rejection (rejected within the last seconds), member_not_synced.",
		}, []string{"reason"}),
	}
	a.accounts, _ = r.(MeshAccounts)
	for _, v := range []string{tokenReviewAccepted, tokenReviewRejected, tokenReviewUnavailable} {
		a.reviews.WithLabelValues(v)
	}
	for _, v := range []string{tokenRefusedRateLimited, tokenRefusedCachedRejection, tokenRefusedNotSynced} {
		a.refusals.WithLabelValues(v)
	}
	return a
}

// Collectors are the token metrics: hub_token_reviews_total and
// hub_token_refusals_total.
func (a *TokenAuth) Collectors() []prometheus.Collector {
	return []prometheus.Collector{a.reviews, a.refusals}
}

// Authenticate reviews token in cluster and returns the identity it proves:
// spiffe://<our td>/ns/<ns>/sa/<sa> in that cluster. A cached acceptance
// younger than maxAge (≤ 0: any within tokenAcceptedTTL) is taken as it
// is. It runs on the caller's goroutine and holds no lock while the member
// is asked: a member that does not answer delays only that caller, for at
// most 5 seconds, never another. The identity's namespace is not checked
// here (its users check it: Scope.Allow), only that its member may assert
// any. A nil TokenAuth accepts no token.
func (a *TokenAuth) Authenticate(ctx context.Context, cluster, token string, maxAge time.Duration) (Identity, error) {
	if a == nil || a.reviewer == nil {
		return Identity{}, errors.New("service-account token authentication is not configured on this hub")
	}
	if err := a.scope.memberMay(cluster); err != nil {
		a.refusals.WithLabelValues(tokenRefusedNotSynced).Inc()
		return Identity{}, err
	}
	key := sha256.Sum256([]byte(cluster + "\x00" + token))
	if r, ok := a.accepted.Get(key); ok && (maxAge <= 0 || a.now().Sub(r.at) < maxAge) {
		return r.id, nil
	}
	if err, ok := a.rejected.Get(key); ok {
		a.refusals.WithLabelValues(tokenRefusedCachedRejection).Inc()
		return Identity{}, err
	}
	// Failures are charged to the caller's address for the member it
	// names: an address that sends made-up tokens naming one member stops
	// reviews in that member only, not those of its neighbours behind the
	// same address naming others.
	source := sourceOf(ctx)
	sourceMember := source + "\x00" + cluster
	charged, ceiling := sourceMember, ""
	if ns, sa, ok := claimedAccount(token); ok && a.accounts != nil && a.accounts.RunsMeshAccount(cluster, ns, sa) {
		charged, ceiling = sourceMember+"\x00"+ns+"/"+sa, sourceMember
	}
	if !a.failures.mayFail(charged) || ceiling != "" && !a.accountFailures.mayFail(ceiling) {
		a.refusals.WithLabelValues(tokenRefusedRateLimited).Inc()
		return Identity{}, &RateLimitedError{fmt.Sprintf("too many rejected service-account tokens from %s for member %s (at most %d, then one every %s): not reviewed",
			source, clip.String(cluster, 64), TokenFailureBurst, TokenFailureEvery)}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.slots.acquire(ctx, cluster); err != nil {
		// Not the token's fault: not remembered.
		return Identity{}, &ReviewUnavailableError{fmt.Errorf("waiting for a token review slot of member %s: %w", cluster, err)}
	}
	ns, sa, err := a.reviewer.ReviewToken(ctx, cluster, token)
	a.slots.release(cluster)
	if err != nil {
		if ctx.Err() != nil { // a timeout is not the token's fault
			a.reviews.WithLabelValues(tokenReviewUnavailable).Inc()
			return Identity{}, &ReviewUnavailableError{err}
		}
		// The member said no (the account is gone, the token revoked or
		// expired): no caller may go on believing an earlier yes.
		a.reviews.WithLabelValues(tokenReviewRejected).Inc()
		a.failures.failed(charged)
		if ceiling != "" {
			a.accountFailures.failed(ceiling)
		}
		a.accepted.Remove(key)
		a.rejected.Add(key, err)
		return Identity{}, err
	}
	a.reviews.WithLabelValues(tokenReviewAccepted).Inc()
	td, err := spiffeid.TrustDomainFromString(a.td())
	if err != nil {
		return Identity{}, fmt.Errorf("our trust domain: %w", err)
	}
	sid, err := spiffeid.FromSegments(td, "ns", ns, "sa", sa)
	if err != nil {
		return Identity{}, fmt.Errorf("service account %s/%s is not a valid SPIFFE path: %w", ns, sa, err)
	}
	id := Identity{SpiffeID: sid, Namespace: ns, Cluster: cluster, FromToken: true}
	a.accepted.Add(key, reviewed{id: id, at: a.now()})
	return id, nil
}

// claimedAccount is the service account a Kubernetes token's payload
// names in its subject (system:serviceaccount:<namespace>:<name>), read
// without verifying anything: it only picks the budget a rejection is
// charged to.
func claimedAccount(token string) (namespace, serviceAccount string, ok bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || len(parts[1]) > 8192 {
		return "", "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", "", false
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	if json.Unmarshal(payload, &claims) != nil {
		return "", "", false
	}
	f := strings.Split(claims.Sub, ":")
	if len(f) != 4 || f[0] != "system" || f[1] != "serviceaccount" || f[2] == "" || f[3] == "" {
		return "", "", false
	}
	return f[2], f[3], true
}

// sourceLimiter limits how many failures each key (a source address and
// the member it names) may cause: a token bucket per key in a bounded LRU.
// A key may try while its bucket has a token; each failure takes one. Tries running at
// once may overshoot by the review slots of their members.
type sourceLimiter struct {
	every rate.Limit
	burst int
	lims  *lru.Cache[string, *rate.Limiter]
}

func newSourceLimiter(every rate.Limit, burst, size int) *sourceLimiter {
	lims, _ := lru.New[string, *rate.Limiter](size) // size > 0: no error
	return &sourceLimiter{every: every, burst: burst, lims: lims}
}

func (l *sourceLimiter) limiter(source string) *rate.Limiter {
	lim := rate.NewLimiter(l.every, l.burst)
	if prev, found, _ := l.lims.PeekOrAdd(source, lim); found {
		l.lims.Get(source) // recently used
		return prev
	}
	return lim
}

// mayFail reports whether source has a failure left.
func (l *sourceLimiter) mayFail(source string) bool {
	return l.limiter(source).Tokens() >= 1
}

// failed charges a failure to source.
func (l *sourceLimiter) failed(source string) {
	l.limiter(source).Allow()
}

// sourceOf is the caller's address for rate limits: its IP (an IPv6
// address by its /64, which one host usually has whole), else the peer
// address as given.
func sourceOf(ctx context.Context) string {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.Addr == nil {
		return "unknown"
	}
	ap, err := netip.ParseAddrPort(pr.Addr.String())
	if err != nil {
		return pr.Addr.String()
	}
	ip := ap.Addr().Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.Prefix(64)
	return p.String()
}

// reviewSlots bounds the reviews running at once, per member and overall.
// Members are named by callers (any string): a member's count exists only
// while it has reviews running.
type reviewSlots struct {
	perMember, overall int

	mu      sync.Mutex
	running map[string]int
	total   int
	freed   chan struct{} // closed (and replaced) when a slot is released
}

func newReviewSlots(perMember, overall int) *reviewSlots {
	return &reviewSlots{perMember: perMember, overall: overall, running: map[string]int{}, freed: make(chan struct{})}
}

// acquire waits for a slot of member until ctx ends.
func (r *reviewSlots) acquire(ctx context.Context, member string) error {
	for {
		r.mu.Lock()
		if r.running[member] < r.perMember && r.total < r.overall {
			r.running[member]++
			r.total++
			r.mu.Unlock()
			return nil
		}
		freed, busy := r.freed, r.running[member]
		r.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return fmt.Errorf("no token review slot free (%d running for member %s, at most %d per member and %d overall): %w",
				busy, clip.String(member, 64), r.perMember, r.overall, ctx.Err())
		}
	}
}

// release frees a slot of member taken by acquire.
func (r *reviewSlots) release(member string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[member]--; r.running[member] <= 0 {
		delete(r.running, member)
	}
	r.total--
	close(r.freed)
	r.freed = make(chan struct{})
}

// ReviewUnavailableError means a member could not review a token in time
// (it did not answer, or its review slots stayed full): the caller should
// try again; nothing is known about the token.
type ReviewUnavailableError struct{ Err error }

// Error says the member could not review the token, and why.
func (e *ReviewUnavailableError) Error() string {
	return "the member could not review the token in time: " + e.Err.Error()
}

// Unwrap returns why the member could not review the token.
func (e *ReviewUnavailableError) Unwrap() error { return e.Err }

// RateLimitedError means a token was not reviewed because its caller's
// source sent too many tokens that were rejected.
type RateLimitedError struct{ msg string }

// Error says how many rejected tokens the source may cause.
func (e *RateLimitedError) Error() string { return e.msg }

// TokenErrorCode is the gRPC code of a token that was not accepted
// (TokenAuth.Authenticate's error): Unavailable when the member could not
// review it in time, ResourceExhausted when its source is rate limited,
// PermissionDenied when its member may assert no identity yet, else
// Unauthenticated.
func TokenErrorCode(err error) codes.Code {
	var unavailable *ReviewUnavailableError
	var limited *RateLimitedError
	var scope *ScopeError
	switch {
	case errors.As(err, &unavailable):
		return codes.Unavailable
	case errors.As(err, &limited):
		return codes.ResourceExhausted
	case errors.As(err, &scope):
		return codes.PermissionDenied
	}
	return codes.Unauthenticated
}

// BearerToken returns the token of an "authorization: Bearer <token>" gRPC
// header, as istio-agent sends it.
func BearerToken(md metadata.MD) string {
	for _, v := range md.Get("authorization") {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok && t != "" {
			return t
		}
	}
	return ""
}
