package hub

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/ca"
	"github.com/hubmesh/hub/internal/wait"
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

	const callers = 3 * authn.TokenReviewsPerMember
	var wg sync.WaitGroup
	codesSeen := make(chan codes.Code, callers)
	for i := range callers {
		wg.Go(func() {
			_, err := s.createCertificate(t, s.secure, caCall{creds: anon, token: fmt.Sprintf("made-up-%d", i), cluster: "west", csr: csr})
			codesSeen <- status.Code(err)
		})
	}
	// Once west's slots are full, east's caller is still served at once.
	for range authn.TokenReviewsPerMember {
		<-reviewer.westSeen
	}
	if _, err := s.createCertificate(t, s.secure, caCall{creds: anon, token: "east-token-b-api", cluster: "east", csr: csr}); err != nil {
		t.Errorf("east's caller while west does not answer: %v", err)
	}
	wg.Wait()
	close(codesSeen)
	// West never answered: not the tokens' fault, so the callers are told
	// to try again (Unavailable), not that their tokens are bad.
	for c := range codesSeen {
		if c != codes.Unavailable {
			t.Errorf("a token west could not review in time got %s; want Unavailable", c)
		}
	}
	if st, _ := s.h.Certificates(); failuresOf(st)["review_unavailable"] != callers {
		t.Errorf("failures %v; want %d review_unavailable", failuresOf(st), callers)
	}
	reviewer.mu.Lock()
	defer reviewer.mu.Unlock()
	if reviewer.westMax > authn.TokenReviewsPerMember {
		t.Errorf("%d token reviews ran at once in west; want at most %d", reviewer.westMax, authn.TokenReviewsPerMember)
	}
}

// countingSigner signs as caSigner does, holding each signature until
// release is closed, and records how many ran at once.
type countingSigner struct {
	caSigner
	release  chan struct{}
	started  chan struct{}
	mu       sync.Mutex
	now, max int
}

func (c *countingSigner) SignWorkload(pub crypto.PublicKey, id spiffeid.ID, member string, ttl time.Duration) ([]*x509.Certificate, error) {
	c.mu.Lock()
	c.now++
	c.max = max(c.max, c.now)
	c.mu.Unlock()
	c.started <- struct{}{}
	<-c.release
	c.mu.Lock()
	c.now--
	c.mu.Unlock()
	return c.caSigner.SignWorkload(pub, id, member, ttl)
}

// Checking a CSR costs CPU (an RSA-8192 CSR with the largest public
// exponent Go accepts takes ~4 ms, 120 times an RSA-2048 one) and so does
// signing: an authenticated caller sending many at once must not take
// every core from the pushes. The CA works on at most its Workers requests
// at once; the others wait.
func TestCACPUWorkIsBounded(t *testing.T) {
	signer := &countingSigner{release: make(chan struct{}), started: make(chan struct{}, 100)}
	s := startSecureHub(t, Options{Tokens: caTokens, Signer: signer})
	signer.ca = s.ca
	anon := s.anonymous()
	csr := newCSR(t, rsaKey())
	workers := s.h.ca.Workers()
	callers := workers + 4
	var wg sync.WaitGroup
	released := sync.OnceFunc(func() { close(signer.release) })
	t.Cleanup(func() { released(); wg.Wait() }) // before the hub stops, also when the test fails
	for range callers {
		wg.Go(func() {
			if _, err := s.createCertificate(t, s.secure, caCall{creds: anon, token: "west-token-a-gw", cluster: "west", csr: csr}); err != nil {
				t.Error(err)
			}
		})
	}
	for range workers {
		<-signer.started
	}
	// Every other caller's request reaches the hub and waits for a worker.
	wait.Until(t, 30*time.Second, func() error {
		if n := s.h.ca.Waiting(); n < callers-workers {
			return fmt.Errorf("%d requests wait for a worker; want %d", n, callers-workers)
		}
		return nil
	})
	released()
	wg.Wait()
	signer.mu.Lock()
	defer signer.mu.Unlock()
	if signer.max > workers {
		t.Errorf("%d requests were signed at once; want at most %d", signer.max, workers)
	}
}

// failuresOf maps each refusal reason to its total.
func failuresOf(st ca.CertificateStats) map[string]uint64 {
	m := map[string]uint64{}
	for _, f := range st.Failures {
		m[f.Reason] = f.Total
	}
	return m
}
