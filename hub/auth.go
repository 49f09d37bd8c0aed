package hub

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/metadata"

	"github.com/hubmesh/hub/internal/ttlcache"
)

// TokenReviewer checks a proxy's Kubernetes service-account token in the
// proxy's own member cluster (clusters.Registry implements it).
type TokenReviewer interface {
	ReviewToken(ctx context.Context, cluster, token string) (namespace, serviceAccount string, err error)
}

// tokenAuth turns service-account tokens into workload identities of our
// trust domain. Answers are cached by a hash of (cluster, token), never the
// token itself: an accepted token for a minute, a rejected one for ten
// seconds, so a reconnecting fleet does not flood members with reviews.
type tokenAuth struct {
	reviewer TokenReviewer
	td       func() string
	accepted *ttlcache.Cache[[32]byte, identity]
	rejected *ttlcache.Cache[[32]byte, error]
}

func newTokenAuth(r TokenReviewer, td func() string) *tokenAuth {
	return &tokenAuth{
		reviewer: r, td: td,
		accepted: ttlcache.New[[32]byte, identity](10000, time.Minute),
		rejected: ttlcache.New[[32]byte, error](10000, 10*time.Second),
	}
}

// authenticate reviews token in cluster and returns the identity it proves:
// spiffe://<our td>/ns/<ns>/sa/<sa> in that cluster. It runs on the calling
// stream's goroutine (its first request) and holds no lock while the
// member is asked: a member that does not answer delays only that stream,
// for at most 5 seconds, never another stream or a push.
func (a *tokenAuth) authenticate(ctx context.Context, cluster, token string) (identity, error) {
	if a == nil || a.reviewer == nil {
		return identity{}, errors.New("service-account token authentication is not configured on this hub")
	}
	key := sha256.Sum256([]byte(cluster + "\x00" + token))
	if id, ok := a.accepted.Get(key); ok {
		return id, nil
	}
	if err, ok := a.rejected.Get(key); ok {
		return identity{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ns, sa, err := a.reviewer.ReviewToken(ctx, cluster, token)
	if err != nil {
		if ctx.Err() == nil { // a timeout is not the token's fault
			a.rejected.Add(key, err)
		}
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
	a.accepted.Add(key, id)
	return id, nil
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
