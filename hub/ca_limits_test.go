package hub

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// blackholedReviewer never answers for west (its API server is
// blackholed: each review waits for its deadline) and accepts east's
// token at once. It records how many west reviews ran at once.
type blackholedReviewer struct {
	mu               sync.Mutex
	westNow, westMax int
	westSeen         chan struct{} // one value per west review started
}

func (b *blackholedReviewer) ReviewToken(ctx context.Context, cluster, token string) (string, string, error) {
	if cluster == "east" && token == "east-token-b-api" {
		return "b", "api", nil
	}
	if cluster != "west" {
		return "", "", fmt.Errorf("unknown cluster %q", cluster)
	}
	b.mu.Lock()
	b.westNow++
	b.westMax = max(b.westMax, b.westNow)
	b.mu.Unlock()
	b.westSeen <- struct{}{}
	<-ctx.Done()
	b.mu.Lock()
	b.westNow--
	b.mu.Unlock()
	return "", "", ctx.Err()
}

// Anyone who reaches the mTLS port may send a made-up token naming any
// member: each one costs a TokenReview in that member. Like access reviews
// (review.go), the reviews running at once are bounded per member, so a
// flood of made-up tokens against a member that does not answer neither
// holds unboundedly many reviews (and goroutines, and connections to the
// member, and its client's rate limit) nor delays another member's callers.
func TestTokenReviewsAreBoundedPerMember(t *testing.T) {
	reviewer := &blackholedReviewer{westSeen: make(chan struct{}, 100)}
	signer := &caSigner{}
	s := startSecureHub(t, Options{Tokens: reviewer, Signer: signer})
	signer.ca = s.ca
	anon := s.anonymous()
	csr := newCSR(t, rsaKey())

	const callers = 3 * tokenReviewsPerMember
	var wg sync.WaitGroup
	codesSeen := make(chan codes.Code, callers)
	for i := range callers {
		wg.Go(func() {
			_, err := s.createCertificate(t, s.secure, caCall{creds: anon, token: fmt.Sprintf("made-up-%d", i), cluster: "west", csr: csr})
			codesSeen <- status.Code(err)
		})
	}
	// Once west's slots are full, east's caller is still served at once.
	for range tokenReviewsPerMember {
		<-reviewer.westSeen
	}
	if _, err := s.createCertificate(t, s.secure, caCall{creds: anon, token: "east-token-b-api", cluster: "east", csr: csr}); err != nil {
		t.Errorf("east's caller while west does not answer: %v", err)
	}
	wg.Wait()
	close(codesSeen)
	for c := range codesSeen {
		if c != codes.Unauthenticated {
			t.Errorf("a made-up token got %s; want Unauthenticated", c)
		}
	}
	reviewer.mu.Lock()
	defer reviewer.mu.Unlock()
	if reviewer.westMax > tokenReviewsPerMember {
		t.Errorf("%d token reviews ran at once in west; want at most %d", reviewer.westMax, tokenReviewsPerMember)
	}
}
