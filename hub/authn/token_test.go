package authn

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/peer"
)

// reviewerFunc adapts a function to TokenReviewer.
type reviewerFunc func(ctx context.Context, cluster, token string) (string, string, error)

func (f reviewerFunc) ReviewToken(ctx context.Context, cluster, token string) (string, string, error) {
	return f(ctx, cluster, token)
}

// caTokenMaxAge is the oldest token review the CA takes (hub/ca); SDS
// takes any that is cached.
const caTokenMaxAge = 5 * time.Second

// The CA believes a token review for caTokenMaxAge, SDS for a minute; once
// the member says no (its account was deleted), neither believes the
// earlier yes.
func TestTokenRejectionEndsTheCachedAcceptance(t *testing.T) {
	var deleted atomic.Bool
	var reviews atomic.Int32
	reviewer := reviewerFunc(func(_ context.Context, cluster, token string) (string, string, error) {
		reviews.Add(1)
		if deleted.Load() {
			return "", "", errors.New(`serviceaccounts "gw" not found`)
		}
		return "a", "gw", nil
	})
	a := NewTokenAuth(reviewer, func() string { return "example.org" }, nil)
	now := time.Unix(1_800_000_000, 0)
	a.now = func() time.Time { return now }
	ctx := context.Background()
	if _, err := a.Authenticate(ctx, "west", "tok", caTokenMaxAge); err != nil {
		t.Fatal(err)
	}
	deleted.Store(true)
	now = now.Add(caTokenMaxAge / 2)
	if _, err := a.Authenticate(ctx, "west", "tok", caTokenMaxAge); err != nil || reviews.Load() != 1 {
		t.Fatalf("within caTokenMaxAge: %v after %d reviews; want the cached acceptance", err, reviews.Load())
	}
	now = now.Add(caTokenMaxAge)
	if _, err := a.Authenticate(ctx, "west", "tok", 0); err != nil {
		t.Fatalf("SDS within a minute: %v; want the cached acceptance", err)
	}
	if _, err := a.Authenticate(ctx, "west", "tok", caTokenMaxAge); err == nil || reviews.Load() != 2 {
		t.Fatalf("after caTokenMaxAge: %v after %d reviews; want a new review refusing the deleted account", err, reviews.Load())
	}
	if _, err := a.Authenticate(ctx, "west", "tok", 0); err == nil {
		t.Fatal("SDS after the member's refusal: accepted from the cache")
	}
}

func TestSourceOfGroupsIPv6By64(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:4000":            "127.0.0.1",
		"[::ffff:10.1.2.3]:80":      "10.1.2.3",
		"[2001:db8:1:2:3:4:5:6]:80": "2001:db8:1:2::/64",
		"[2001:db8:1:2::9]:81":      "2001:db8:1:2::/64",
	} {
		ap, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := sourceOf(peer.NewContext(context.Background(), &peer.Peer{Addr: ap})); got != want {
			t.Errorf("sourceOf(%s) = %q; want %q", addr, got, want)
		}
	}
}

// meshReviewer accepts only the tokens in good and says which accounts run
// mesh pods.
type meshReviewer struct {
	good     map[string][2]string // token → namespace, service account
	accounts map[string]bool      // "<namespace>/<sa>" run by mesh pods of west
}

func (m meshReviewer) ReviewToken(_ context.Context, cluster, token string) (string, string, error) {
	if id, ok := m.good[token]; ok && cluster == "west" {
		return id[0], id[1], nil
	}
	return "", "", errors.New("not authenticated")
}

func (m meshReviewer) RunsMeshAccount(cluster, ns, sa string) bool {
	return cluster == "west" && m.accounts[ns+"/"+sa]
}

// fakeToken is a JWT-shaped token whose payload's subject is sub.
func fakeToken(sub, salt string) string {
	payload, _ := json.Marshal(map[string]string{"sub": sub, "jti": salt})
	return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(payload) + ".sig"
}

// A neighbour behind the same NAT address sends made-up tokens for west
// until its budget is spent; a new workload of west's mesh behind that
// address still gets its token reviewed (accepted), as its account runs
// mesh pods of west. Made-up tokens that claim that account share its
// budget only; claiming an account no mesh pod runs, or none, they share
// the source's.
func TestMadeUpTokensDoNotStopANeighboursWorkloads(t *testing.T) {
	good := fakeToken("system:serviceaccount:shop:web", "real")
	r := meshReviewer{good: map[string][2]string{good: {"shop", "web"}}, accounts: map[string]bool{"shop/web": true}}
	a := NewTokenAuth(r, func() string { return "example.org" }, nil)
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 40000}})
	var limited *RateLimitedError
	spend := func(sub string) {
		t.Helper()
		for i := range TokenFailureBurst + 1 {
			_, err := a.Authenticate(ctx, "west", fakeToken(sub, fmt.Sprint(i)), 0)
			if errors.As(err, &limited) {
				return
			}
		}
		t.Fatalf("%d made-up tokens claiming %q were all reviewed; want the budget spent", TokenFailureBurst+1, sub)
	}
	spend("system:serviceaccount:shop:nobody") // not a mesh account: the source's budget
	if _, err := a.Authenticate(ctx, "west", "garbage", 0); !errors.As(err, &limited) {
		t.Errorf("a token claiming no account after the source's budget: %v; want rate limited", err)
	}
	if id, err := a.Authenticate(ctx, "west", good, 0); err != nil || id.SpiffeID.String() != "spiffe://example.org/ns/shop/sa/web" {
		t.Fatalf("the neighbour's workload: %v, %v; want accepted", id, err)
	}
	spend("system:serviceaccount:shop:web") // forged claims of the workload's account spend its budget only
	if _, err := a.Authenticate(ctx, "west", fakeToken("system:serviceaccount:shop:web", "new"), 0); !errors.As(err, &limited) {
		t.Errorf("after its budget, another token claiming shop/web: %v; want rate limited", err)
	}
}

func TestClaimedAccount(t *testing.T) {
	for token, want := range map[string]string{
		fakeToken("system:serviceaccount:a:b", ""):   "a/b",
		fakeToken("system:serviceaccount:a:", ""):    "",
		fakeToken("system:node:x", ""):               "",
		fakeToken("system:serviceaccount:a:b:c", ""): "",
		"not.a.token": "",
		"x":           "",
	} {
		ns, sa, ok := claimedAccount(token)
		if got := ns + "/" + sa; ok != (want != "") || ok && got != want {
			t.Errorf("claimedAccount(%q) = %s, %v; want %q", token, got, ok, want)
		}
	}
}

// A source that claims many mesh accounts of one member, each with made-up
// tokens, causes at most AccountFailureBurst reviews at once over them all.
func TestAccountBudgetsShareACeiling(t *testing.T) {
	accounts := map[string]bool{}
	for i := range 30 {
		accounts[fmt.Sprintf("shop/sa%d", i)] = true
	}
	var reviews int
	r := meshReviewer{accounts: accounts}
	a := NewTokenAuth(reviewerCounting{r, &reviews}, func() string { return "example.org" }, nil)
	a.accounts = r
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 9), Port: 40000}})
	start := time.Now()
	for i := range 30 {
		for j := range TokenFailureBurst + 1 {
			_, _ = a.Authenticate(ctx, "west", fakeToken(fmt.Sprintf("system:serviceaccount:shop:sa%d", i), fmt.Sprint(j)), 0)
		}
	}
	// The ceiling refills at AccountFailureRate while the loop runs: a
	// slow machine earns more reviews, never more than the refill allows.
	ceiling := AccountFailureBurst + 1 + int(time.Since(start).Seconds()*AccountFailureRate)
	if reviews > ceiling {
		t.Errorf("%d reviews for made-up tokens over 30 accounts in %s; want at most %d", reviews, time.Since(start), ceiling)
	}
}

// reviewerCounting counts the reviews a reviewer is asked for.
type reviewerCounting struct {
	r TokenReviewer
	n *int
}

func (c reviewerCounting) ReviewToken(ctx context.Context, cluster, token string) (string, string, error) {
	*c.n++
	return c.r.ReviewToken(ctx, cluster, token)
}
