package authn

import (
	"context"
	"errors"
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
