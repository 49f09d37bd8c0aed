package hub

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/hubmesh/hub/internal/ttlcache"
)

// TokenReviewer checks a proxy's Kubernetes service-account token in the
// proxy's own member cluster (clusters.Registry implements it).
type TokenReviewer interface {
	ReviewToken(ctx context.Context, cluster, token string) (namespace, serviceAccount string, err error)
}

// Token reviews running at once, as for access reviews (review.go):
// anyone who reaches the mTLS port can send a made-up token naming any
// member, and each costs a TokenReview there. A caller waits for a slot
// within its review's 5 seconds; a member that does not answer then holds
// at most tokenReviewsPerMember of them and delays no other member's
// callers.
const (
	tokenReviewsPerMember = 4
	tokenReviewsOverall   = 32
)

// tokenAuth turns service-account tokens into workload identities of our
// trust domain. Answers are cached by a hash of (cluster, token), never the
// token itself: an accepted token for a minute, a rejected one for ten
// seconds, so a reconnecting fleet does not flood members with reviews. A
// caller may ask for a fresher acceptance (the CA does: caTokenMaxAge); a
// rejection then also ends the cached acceptance, for every caller.
type tokenAuth struct {
	reviewer TokenReviewer
	td       func() string
	accepted *ttlcache.Cache[[32]byte, reviewed]
	rejected *ttlcache.Cache[[32]byte, error]
	slots    *reviewSlots
	now      func() time.Time
}

// reviewed is an accepted token's identity and when its member said so.
type reviewed struct {
	id identity
	at time.Time
}

// tokenAcceptedTTL is how long an accepted token is believed without
// asking its member again (by callers that take any cached answer).
const tokenAcceptedTTL = time.Minute

func newTokenAuth(r TokenReviewer, td func() string) *tokenAuth {
	return &tokenAuth{
		reviewer: r, td: td,
		accepted: ttlcache.New[[32]byte, reviewed](10000, tokenAcceptedTTL),
		rejected: ttlcache.New[[32]byte, error](10000, 10*time.Second),
		slots:    newReviewSlots(tokenReviewsPerMember, tokenReviewsOverall),
		now:      time.Now,
	}
}

// authenticate reviews token in cluster and returns the identity it proves:
// spiffe://<our td>/ns/<ns>/sa/<sa> in that cluster. A cached acceptance
// younger than maxAge (≤ 0: any within tokenAcceptedTTL) is taken as it
// is. It runs on the calling stream's goroutine (its first request) and
// holds no lock while the member is asked: a member that does not answer
// delays only that stream, for at most 5 seconds, never another stream or
// a push.
func (a *tokenAuth) authenticate(ctx context.Context, cluster, token string, maxAge time.Duration) (identity, error) {
	if a == nil || a.reviewer == nil {
		return identity{}, errors.New("service-account token authentication is not configured on this hub")
	}
	key := sha256.Sum256([]byte(cluster + "\x00" + token))
	if r, ok := a.accepted.Get(key); ok && (maxAge <= 0 || a.now().Sub(r.at) < maxAge) {
		return r.id, nil
	}
	if err, ok := a.rejected.Get(key); ok {
		return identity{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.slots.acquire(ctx, cluster); err != nil {
		// Not the token's fault: not remembered.
		return identity{}, &ReviewUnavailableError{fmt.Errorf("waiting for a token review slot of member %s: %w", cluster, err)}
	}
	ns, sa, err := a.reviewer.ReviewToken(ctx, cluster, token)
	a.slots.release(cluster)
	if err != nil {
		if ctx.Err() != nil { // a timeout is not the token's fault
			return identity{}, &ReviewUnavailableError{err}
		}
		// The member said no (the account is gone, the token revoked or
		// expired): no caller may go on believing an earlier yes.
		a.accepted.Remove(key)
		a.rejected.Add(key, err)
		return identity{}, err
	}
	td, err := spiffeid.TrustDomainFromString(a.td())
	if err != nil {
		return identity{}, fmt.Errorf("our trust domain: %w", err)
	}
	sid, err := spiffeid.FromSegments(td, "ns", ns, "sa", sa)
	if err != nil {
		return identity{}, fmt.Errorf("service account %s/%s is not a valid SPIFFE path: %w", ns, sa, err)
	}
	id := identity{spiffeID: sid, namespace: ns, cluster: cluster, fromToken: true}
	a.accepted.Add(key, reviewed{id: id, at: a.now()})
	return id, nil
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
				busy, truncate(member, 64), r.perMember, r.overall, ctx.Err())
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

func (e *ReviewUnavailableError) Error() string {
	return "the member could not review the token in time: " + e.Err.Error()
}
func (e *ReviewUnavailableError) Unwrap() error { return e.Err }

// tokenErrorCode is the gRPC code of a token that was not accepted:
// Unavailable when the member could not review it in time, else
// Unauthenticated.
func tokenErrorCode(err error) codes.Code {
	var unavailable *ReviewUnavailableError
	if errors.As(err, &unavailable) {
		return codes.Unavailable
	}
	return codes.Unauthenticated
}

// bearerToken returns the token of an "authorization: Bearer <token>" gRPC
// header, as istio-agent sends it.
func bearerToken(md metadata.MD) string {
	for _, v := range md.Get("authorization") {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok && t != "" {
			return t
		}
	}
	return ""
}
