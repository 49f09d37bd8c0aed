package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/ttlcache"
)

// User is an authenticated API caller.
type User struct {
	Name   string
	Groups []string
	UID    string
	Extra  map[string]authenticationv1.ExtraValue
}

// Access is what a request needs: reading the hub's state, changing it, or
// scraping its metrics.
type Access int

// Access levels.
const (
	Read Access = iota
	Write
	// Metrics is reading /metrics: granted by the non-resource URL /metrics
	// (verb get, as Prometheus scrapes every Kubernetes component), or by
	// Read access.
	Metrics
)

// Errors of Authenticator.
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrForbidden       = errors.New("forbidden")
)

// Authenticator checks bearer tokens and what their holders may do.
type Authenticator interface {
	// Authenticate maps a bearer token to a user (ErrUnauthenticated if invalid).
	Authenticate(ctx context.Context, token string) (User, error)
	// Authorize reports whether the user has the access (ErrForbidden if not).
	Authorize(ctx context.Context, u User, a Access) error
}

// StaticTokens authenticates with a file of lines "token,user,role" where
// role is "read" or "write" (blank lines and # comments are ignored). The
// file is read again when it changes (checked at most once a second, on use),
// so removing a line revokes its token within a second and emptying the file
// revokes them all; a file that becomes unreadable or invalid (a line that
// does not parse) keeps the last good tokens and logs why.
type StaticTokens struct {
	path  string
	every time.Duration // how often the file is checked for changes
	log   *slog.Logger
	now   func() time.Time

	mu      sync.Mutex // serialises reloads; never held over anything slow
	checked time.Time  // last time the file was read
	sum     [32]byte   // SHA-256 of the file's last read contents
	users   atomic.Pointer[map[[32]byte]staticUser]
}

type staticUser struct {
	name  string
	write bool
}

// LoadStaticTokens reads a static token file.
func LoadStaticTokens(path string) (*StaticTokens, error) {
	st := &StaticTokens{path: path, every: time.Second, log: slog.Default(), now: time.Now}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading API token file: %w", err)
	}
	users, err := parseStaticTokens(data)
	if err != nil {
		return nil, err
	}
	if len(users) == 0 {
		return nil, errors.New("API token file has no tokens")
	}
	st.users.Store(&users)
	st.sum, st.checked = sha256.Sum256(data), st.now()
	return st, nil
}

func parseStaticTokens(data []byte) (map[[32]byte]staticUser, error) {
	users := map[[32]byte]staticUser{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 3 || f[0] == "" || f[1] == "" || (f[2] != "read" && f[2] != "write") {
			return nil, fmt.Errorf("API token file line %d: want token,user,read|write", n)
		}
		users[sha256.Sum256([]byte(f[0]))] = staticUser{name: f[1], write: f[2] == "write"}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading API token file: %w", err)
	}
	return users, nil
}

// current returns the tokens, reading the file again if it is due.
func (s *StaticTokens) current() map[[32]byte]staticUser {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := s.now(); now.Sub(s.checked) >= s.every {
		s.checked = now
		data, err := os.ReadFile(s.path)
		switch {
		case err != nil:
			s.log.Warn("cannot read the API token file; keeping the last good tokens", "path", s.path, "error", err)
		case sha256.Sum256(data) != s.sum:
			users, err := parseStaticTokens(data)
			if err != nil {
				// The error names a line number, never a token.
				s.log.Warn("invalid API token file; keeping the last good tokens", "path", s.path, "error", err)
				break
			}
			s.sum = sha256.Sum256(data)
			s.users.Store(&users)
			if len(users) == 0 {
				s.log.Warn("API token file has no tokens: every static API token is revoked", "path", s.path)
				break
			}
			s.log.Info("API token file reloaded", "path", s.path, "tokens", len(users))
		}
	}
	return *s.users.Load()
}

// Authenticate implements Authenticator in constant time per token.
func (s *StaticTokens) Authenticate(_ context.Context, token string) (User, error) {
	sum := sha256.Sum256([]byte(token))
	for k, u := range s.current() {
		if subtle.ConstantTimeCompare(k[:], sum[:]) == 1 {
			group := "hub:read"
			if u.write {
				group = "hub:write"
			}
			return User{Name: u.name, Groups: []string{group}}, nil
		}
	}
	return User{}, ErrUnauthenticated
}

// Authorize implements Authenticator.
// Every valid token, read or write, may scrape /metrics.
func (s *StaticTokens) Authorize(_ context.Context, u User, a Access) error {
	if a == Read || a == Metrics || len(u.Groups) == 1 && u.Groups[0] == "hub:write" {
		return nil
	}
	return fmt.Errorf("%w: %s may only read", ErrForbidden, u.Name)
}

// KubeAuth authenticates with TokenReview and authorises with
// SubjectAccessReview against the home cluster: reading needs "get secrets"
// in the hub's namespace, writing "create", "update" and "delete" secrets
// there, scraping /metrics "get" on the non-resource URL /metrics (or read
// access). Token reviews (by the token's SHA-256) and decisions (per verb and
// whole identity: name, UID, groups, extra) are cached for
// KubeAuthOptions.CacheTTL (a minute) so that
// the dashboard's live pages and Prometheus do not hammer the API server; a
// revoked token or a removed permission takes effect when its cached
// decision expires.
type KubeAuth struct {
	client    kubernetes.Interface
	namespace string
	audiences []string
	tokens    *ttlcache.Cache[[32]byte, User]
	decisions *ttlcache.Cache[[32]byte, bool] // by decisionKey
}

// KubeAuthOptions tune a KubeAuth.
type KubeAuthOptions struct {
	// Audiences, if set, are sent as the TokenReview's spec.audiences: only
	// tokens issued for one of them are accepted (--api-audience). Empty
	// means the API server's own audiences.
	Audiences []string
	// CacheTTL is how long token reviews and access decisions are cached
	// (default and maximum one minute).
	CacheTTL time.Duration
}

// NewKubeAuth creates a KubeAuth for the home cluster.
func NewKubeAuth(client kubernetes.Interface, namespace string, opts KubeAuthOptions) *KubeAuth {
	if opts.CacheTTL <= 0 || opts.CacheTTL > time.Minute {
		opts.CacheTTL = time.Minute
	}
	return &KubeAuth{
		client: client, namespace: namespace, audiences: opts.Audiences,
		tokens:    ttlcache.New[[32]byte, User](4096, opts.CacheTTL),
		decisions: ttlcache.New[[32]byte, bool](4096, opts.CacheTTL),
	}
}

// Authenticate implements Authenticator.
func (k *KubeAuth) Authenticate(ctx context.Context, token string) (User, error) {
	key := sha256.Sum256([]byte(token))
	if u, ok := k.tokens.Get(key); ok {
		return u, nil
	}
	tr, err := k.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: k.audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return User{}, fmt.Errorf("token review: %w", err)
	}
	if !tr.Status.Authenticated || !audienceMatches(k.audiences, tr.Status.Audiences) {
		return User{}, ErrUnauthenticated
	}
	u := User{Name: tr.Status.User.Username, Groups: tr.Status.User.Groups, UID: tr.Status.User.UID, Extra: tr.Status.User.Extra}
	k.tokens.Add(key, u)
	return u, nil
}

// Authorize implements Authenticator.
func (k *KubeAuth) Authorize(ctx context.Context, u User, a Access) error {
	if a == Metrics {
		ok, err := k.allowed(ctx, u, metricsKey, authorizationv1.SubjectAccessReviewSpec{
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: metricsPath, Verb: "get"}})
		if err != nil || ok {
			return err
		}
		if err := k.Authorize(ctx, u, Read); err != nil {
			if errors.Is(err, ErrForbidden) {
				return fmt.Errorf("%w: %s may not get %s (non-resource URL) nor get secrets in namespace %s", ErrForbidden, u.Name, metricsPath, k.namespace)
			}
			return err
		}
		return nil
	}
	verbs := []string{"get"}
	if a == Write {
		verbs = []string{"create", "update", "delete"}
	}
	for _, verb := range verbs {
		ok, err := k.allowed(ctx, u, verb, authorizationv1.SubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: k.namespace, Verb: verb, Resource: "secrets"}})
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %s may not %s secrets in namespace %s", ErrForbidden, u.Name, verb, k.namespace)
		}
	}
	return nil
}

// metricsPath is the non-resource URL a metrics scraper needs "get" on;
// metricsKey keys its decisions apart from the secrets verbs'.
const (
	metricsPath = "/metrics"
	metricsKey  = "get " + metricsPath
)

// allowed asks (or recalls from the cache under decisionKey(u, key)) whether
// u may do what spec's attributes say; the user's fields are filled in here.
func (k *KubeAuth) allowed(ctx context.Context, u User, key string, spec authorizationv1.SubjectAccessReviewSpec) (bool, error) {
	dk := decisionKey(u, key)
	if allowed, ok := k.decisions.Get(dk); ok {
		return allowed, nil
	}
	spec.User, spec.Groups, spec.UID, spec.Extra = u.Name, u.Groups, u.UID, extraValues(u.Extra)
	sar, err := k.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("subject access review: %w", err)
	}
	k.decisions.Add(dk, sar.Status.Allowed)
	return sar.Status.Allowed, nil
}

// decisionKey identifies one access decision: the verb and everything of
// the user a SubjectAccessReview sends (name, UID, groups, extra), each
// part length-prefixed so that no two users share a key. Authorizers may
// decide on UID and extra (scoped tokens carry their scopes there), so a
// decision made for one token is never reused for another that differs in
// any of them.
func decisionKey(u User, verb string) [32]byte {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(verb)
	field(u.Name)
	field(u.UID)
	field(strconv.Itoa(len(u.Groups)))
	for _, g := range u.Groups {
		field(g)
	}
	keys := slices.Sorted(maps.Keys(u.Extra))
	field(strconv.Itoa(len(keys)))
	for _, k := range keys {
		field(k)
		field(strconv.Itoa(len(u.Extra[k])))
		for _, v := range u.Extra[k] {
			field(v)
		}
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// audienceMatches reports whether a TokenReview that asked for want answered
// with at least one of them, as the TokenReview API asks of its callers (an
// authenticator that ignores audiences answers with none).
func audienceMatches(want, got []string) bool {
	if len(want) == 0 {
		return true
	}
	for _, g := range got {
		if slices.Contains(want, g) {
			return true
		}
	}
	return false
}

func extraValues(in map[string]authenticationv1.ExtraValue) map[string]authorizationv1.ExtraValue {
	if in == nil {
		return nil
	}
	out := make(map[string]authorizationv1.ExtraValue, len(in))
	for k, v := range in {
		out[k] = authorizationv1.ExtraValue(v)
	}
	return out
}
