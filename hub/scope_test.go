package hub

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/internal/xdstest"
)

// fakeScopes is an authn.IdentityScopes whose answers a test changes (the
// registry's own are tested on real API servers in clusters/).
type fakeScopes struct {
	mu sync.Mutex
	m  map[string]clusters.IdentityScope
}

func (f *fakeScopes) IdentityScope(cluster string) (clusters.IdentityScope, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sc, ok := f.m[cluster]
	if !ok {
		return sc, fmt.Errorf("%w %q", clusters.ErrUnknownCluster, cluster)
	}
	return sc, nil
}

func (f *fakeScopes) set(cluster string, sc clusters.IdentityScope) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[cluster] = sc
}

func (f *fakeScopes) remove(cluster string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, cluster)
}

// scopedReviewer accepts tokens "<cluster>:<namespace>" in their cluster
// (service account gw) and counts the reviews it answers per cluster.
type scopedReviewer struct {
	mu      sync.Mutex
	reviews map[string]int
}

func (r *scopedReviewer) ReviewToken(_ context.Context, cluster, token string) (string, string, error) {
	r.mu.Lock()
	r.reviews[cluster]++
	r.mu.Unlock()
	if ns, ok := strings.CutPrefix(token, cluster+":"); ok && ns != "" {
		return ns, "gw", nil
	}
	return "", "", fmt.Errorf("%w: token not valid in %s", clusters.ErrTokenRejected, cluster)
}

func (r *scopedReviewer) count(cluster string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reviews[cluster]
}

// startScopedHub serves the CA and SDS for home (the home cluster), west
// (synced, no annotations) and east (not synced yet), with the hub's
// namespace hub-system and the root namespace istio-system.
func startScopedHub(t *testing.T) (*secureHub, *fakeScopes, *scopedReviewer) {
	t.Helper()
	scopes := &fakeScopes{m: map[string]clusters.IdentityScope{
		"home": {Home: true, Synced: true, State: clusters.StateReady, AllowRootNamespace: true},
		"west": {Synced: true, State: clusters.StateReady},
		"east": {State: clusters.StateUnreachable},
	}}
	reviewer := &scopedReviewer{reviews: map[string]int{}}
	signer := &caSigner{}
	s := startSecureHub(t, Options{Tokens: reviewer, Signer: signer, IdentityScopes: scopes, Namespace: "hub-system", RootNamespace: "istio-system"})
	signer.ca = s.ca
	return s, scopes, reviewer
}

// The CA issues a member's workload only an identity the member may
// assert: not before it has synced, never in the hub's namespace, in the
// root namespace only with its remote Secret's annotation, and within the
// namespaces the Secret lists. Annotation changes apply to the next
// request, renewals by certificate included.
func TestCAIssuesOnlyIdentitiesTheMemberMayAssert(t *testing.T) {
	s, scopes, reviewer := startScopedHub(t)
	anon := s.anonymous()
	csr := newCSR(t, rsaKey())
	issue := func(token, cluster string) error {
		_, err := s.createCertificate(t, s.secure, caCall{creds: anon, token: token, cluster: cluster, csr: csr})
		return err
	}
	check := func(what string, err error, code codes.Code, says string) {
		t.Helper()
		if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), says) {
			t.Errorf("%s: %v; want %s saying %q", what, err, code, says)
		}
	}
	check("west, namespace a", issue("west:a", "west"), codes.OK, "")
	check("west, the root namespace", issue("west:istio-system", "west"), codes.PermissionDenied,
		`member west may not assert identities of Istio's root namespace istio-system: its remote Secret lacks the annotation hub.federation/allow-root-namespace-identities: "true"`)
	check("west, the hub's namespace", issue("west:hub-system", "west"), codes.PermissionDenied, "namespace hub-system, the hub's own, are never issued")
	check("east, not synced", issue("east:a", "east"), codes.PermissionDenied, "member east has not synced since this hub started (state Unreachable)")
	if n := reviewer.count("east"); n != 0 {
		t.Errorf("%d token reviews sent to east, which has not synced; want none", n)
	}
	check("home, the root namespace", issue("home:istio-system", "home"), codes.OK, "")
	check("home, the hub's namespace", issue("home:hub-system", "home"), codes.PermissionDenied, "the hub's own")

	// Annotations change: the next request follows them.
	scopes.set("west", clusters.IdentityScope{Synced: true, AllowRootNamespace: true, Namespaces: []string{"b"}})
	check("west, the root namespace, allowed", issue("west:istio-system", "west"), codes.OK, "")
	check("west, a namespace the Secret does not list", issue("west:a", "west"), codes.PermissionDenied,
		"member west may not assert identities of namespace a: its remote Secret's annotation hub.federation/identity-namespaces does not list it")
	check("west, a listed namespace", issue("west:b", "west"), codes.OK, "")
	scopes.set("west", clusters.IdentityScope{Synced: true, Namespaces: []string{}, Invalid: "annotation …: \"B_C\" is not a namespace name"})
	check("west, an invalid list", issue("west:b", "west"), codes.PermissionDenied, "is invalid (annotation …: \"B_C\" is not a namespace name), so no namespace is allowed")

	// A renewal by certificate is scoped as well: a root-namespace
	// certificate issued while the annotation was there renews only while
	// it is.
	scopes.set("west", clusters.IdentityScope{Synced: true, AllowRootNamespace: true})
	resp, err := s.createCertificate(t, s.secure, caCall{creds: anon, token: "west:istio-system", cluster: "west", csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	renew := caCall{creds: s.withIssued(t, resp), cluster: "west", csr: csr}
	if _, err := s.createCertificate(t, s.secure, renew); err != nil {
		t.Errorf("renewal in the root namespace with the annotation: %v", err)
	}
	scopes.set("west", clusters.IdentityScope{Synced: true})
	_, err = s.createCertificate(t, s.secure, renew)
	check("renewal in the root namespace once the annotation is gone", err, codes.PermissionDenied, "root namespace istio-system")

	// West is removed: a certificate bound to it, still valid, renews
	// nothing (its member's consent ended with it).
	scopes.set("west", clusters.IdentityScope{Synced: true, AllowRootNamespace: true})
	resp, err = s.createCertificate(t, s.secure, caCall{creds: anon, token: "west:a", cluster: "west", csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	bound := caCall{creds: s.withIssued(t, resp), cluster: "west", csr: csr}
	scopes.remove("west")
	_, err = s.createCertificate(t, s.secure, bound)
	check("renewal by a certificate of a removed member", err, codes.PermissionDenied, "member west is not registered (removed, or never was)")
	scopes.set("west", clusters.IdentityScope{Synced: true})

	// East syncs: its workloads get their identities.
	scopes.set("east", clusters.IdentityScope{Synced: true, State: clusters.StateReady})
	check("east, synced", issue("east:a", "east"), codes.OK, "")

	for reason, want := range map[string]float64{"root_namespace": 2, "hub_namespace": 2, "member_not_synced": 1, "namespace_not_allowed": 2, "member_unknown": 1} {
		if n := counterValue(t, s, "hub_ca_requests_failed_total", map[string]string{"reason": reason}); n != want {
			t.Errorf("hub_ca_requests_failed_total{reason=%s} = %v; want %v", reason, n, want)
		}
		if n := counterValue(t, s, "hub_identity_scope_refusals_total", map[string]string{"surface": "ca", "reason": reason}); n != want {
			t.Errorf("hub_identity_scope_refusals_total{surface=ca,reason=%s} = %v; want %v", reason, n, want)
		}
	}
	if n := s.logs.count("workload certificate refused", map[string]string{"cluster": "west", "reason": "root_namespace", "code": "PermissionDenied"}); n != 2 {
		t.Errorf("%d log lines for west's root-namespace refusals; want 2", n)
	}
	if logs := s.logs.String(); strings.Contains(logs, "west:istio-system") || strings.Contains(logs, "east:a") {
		t.Error("the hub's log contains a token")
	}
}

// SDS serves a member's Kubernetes Secrets only to identities the member
// may assert; a change of scope (the member syncs, its annotation
// changes) is followed once the registry announces it (SecretsSynced). A
// token stream from a member that has not synced is refused.
func TestSDSServesOnlyIdentitiesTheMemberMayAssert(t *testing.T) {
	s, scopes, reviewer := startScopedHub(t)
	gw := clusters.ServiceKey{Namespace: "istio-system", Name: "gw"}
	app := clusters.ServiceKey{Namespace: "a", Name: "gw"}
	s.secrets.data["west"] = map[clusters.ServiceKey]*clusters.TLSSecret{gw: {Cert: []byte("C"), Key: []byte("K")}}
	s.secrets.data["east"] = map[clusters.ServiceKey]*clusters.TLSSecret{app: {Cert: []byte("C"), Key: []byte("K")}}
	names := []string{"kubernetes://gw", "ROOTCA"}

	// A gateway of west's root namespace, by token: roots only until the
	// annotation allows the root namespace.
	c := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()), grpc.WithPerRPCCredentials(bearerCreds("west:istio-system")))
	c.Send(t, sdsRequest("west-gw", "west", names...))
	if got := secretsOf(t, c, names); got["ROOTCA"] == nil || got["kubernetes://gw"] != nil {
		t.Fatalf("west's root-namespace gateway without the annotation got %v; want only ROOTCA", keys(got))
	}
	scopes.set("west", clusters.IdentityScope{Synced: true, AllowRootNamespace: true})
	s.h.changes.SecretsSynced("west")
	if got := secretsOf(t, c, names); got["kubernetes://gw"] == nil {
		t.Fatalf("west's root-namespace gateway with the annotation got %v; want its Secret", keys(got))
	}
	if n := counterValue(t, s, "hub_identity_scope_refusals_total", map[string]string{"surface": "sds", "reason": "root_namespace"}); n != 1 {
		t.Errorf("hub_identity_scope_refusals_total{surface=sds,reason=root_namespace} = %v; want 1", n)
	}

	// East has not synced: its token stream is refused without a review;
	// a certificate bound to east gets roots only until east syncs.
	refused := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()), grpc.WithPerRPCCredentials(bearerCreds("east:a")))
	refused.Send(t, sdsRequest("east-token", "east", names...))
	refused.Refused(t, "a token stream of a member that has not synced", codes.PermissionDenied)
	if n := reviewer.count("east"); n != 0 {
		t.Errorf("%d token reviews sent to east; want none", n)
	}
	bound := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "east")))
	bound.Send(t, sdsRequest("east-cert", "east", names...))
	if got := secretsOf(t, bound, names); got["ROOTCA"] == nil || got["kubernetes://gw"] != nil {
		t.Fatalf("a certificate bound to east before east synced got %v; want only ROOTCA", keys(got))
	}
	scopes.set("east", clusters.IdentityScope{Synced: true})
	s.h.changes.SecretsSynced("east")
	if got := secretsOf(t, bound, names); got["kubernetes://gw"] == nil {
		t.Fatalf("a certificate bound to east once east synced got %v; want its Secret", keys(got))
	}
}

// Anyone who reaches the mTLS port may send made-up tokens: each costs a
// TokenReview in the member it names. A rejected token is remembered (by
// its hash) and not reviewed again for a while, and a source whose tokens
// keep being rejected gets ResourceExhausted instead of more reviews.
func TestRejectedTokensAreLimitedPerSource(t *testing.T) {
	s, _, reviewer := startScopedHub(t)
	anon := s.anonymous()
	csr := newCSR(t, rsaKey())
	call := func(token string) error {
		_, err := s.createCertificate(t, s.secure, caCall{creds: anon, token: token, cluster: "west", csr: csr})
		return err
	}
	// The same bad token again: answered from the negative cache.
	for range 3 {
		if err := call("made-up"); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("a made-up token: %v; want Unauthenticated", err)
		}
	}
	if n := reviewer.count("west"); n != 1 {
		t.Errorf("%d reviews for one made-up token sent three times; want 1", n)
	}
	// New made-up tokens: the source's allowance runs out.
	const tries = 3 * authn.TokenFailureBurst
	exhausted := 0
	start := time.Now()
	for i := range tries {
		switch err := call(fmt.Sprintf("made-up-%d", i)); status.Code(err) {
		case codes.ResourceExhausted:
			exhausted++
			if !strings.Contains(status.Convert(err).Message(), "too many rejected service-account tokens from 127.0.0.1") {
				t.Errorf("rate limited: %v", err)
			}
		case codes.Unauthenticated:
		default:
			t.Fatalf("a made-up token: %v", err)
		}
	}
	refills := int(time.Since(start)/authn.TokenFailureEvery) + 1
	reviewed := reviewer.count("west") - 1
	// The allowance refills at one per authn.TokenFailureEvery: the bound is
	// the burst plus what refilled while the loop ran (however slow the
	// machine; with tries > burst + refills some were refused).
	if reviewed > authn.TokenFailureBurst+refills || (tries > authn.TokenFailureBurst+refills && exhausted == 0) {
		t.Errorf("%d of %d made-up tokens reviewed, %d refused as rate limited; want at most the burst %d (plus refills)", reviewed, tries, exhausted, authn.TokenFailureBurst)
	}
	if n := counterValue(t, s, "hub_token_refusals_total", map[string]string{"reason": "rate_limited"}); n != float64(exhausted) {
		t.Errorf("hub_token_refusals_total{reason=rate_limited} = %v; want %d", n, exhausted)
	}
	if n := counterValue(t, s, "hub_token_reviews_total", map[string]string{"result": "rejected"}); n != float64(reviewed+1) {
		t.Errorf("hub_token_reviews_total{result=rejected} = %v; want %d", n, reviewed+1)
	}
	if n := counterValue(t, s, "hub_ca_requests_failed_total", map[string]string{"reason": "rate_limited"}); n != float64(exhausted) {
		t.Errorf("hub_ca_requests_failed_total{reason=rate_limited} = %v; want %d", n, exhausted)
	}
}
