package api

import (
	"context"
	"errors"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestKubeAuthDecisionsKeyedByWholeUser: an access decision is cached for
// exactly the identity it was made for. Authorizers may decide on a user's
// UID and extra attributes (scoped tokens carry their scopes there, bound
// service-account tokens their pod), so a token with fewer rights must not
// reuse the decision made for another token of the same name and groups.
// Pure logic: a real API server's RBAC ignores extra attributes, so the
// SubjectAccessReview answer comes from a fake that honours a scope.
func TestKubeAuthDecisionsKeyedByWholeUser(t *testing.T) {
	cs := fake.NewClientset()
	reviews := 0
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews++
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		_, scoped := sar.Spec.Extra["scopes.example.com"]
		sar.Status.Allowed = !scoped && sar.Spec.UID != "uid-restricted"
		return true, sar, nil
	})
	k := NewKubeAuth(cs, "istio-system", KubeAuthOptions{})
	ctx := context.Background()
	full := User{Name: "ann", Groups: []string{"dev", "ops"}, UID: "uid-1"}
	if err := k.Authorize(ctx, full, Read); err != nil {
		t.Fatalf("full token: %v", err)
	}
	for name, u := range map[string]User{
		"scoped token": {Name: "ann", Groups: []string{"dev", "ops"}, UID: "uid-1",
			Extra: map[string]authenticationv1.ExtraValue{"scopes.example.com": {"user:info"}}},
		"other UID":           {Name: "ann", Groups: []string{"dev", "ops"}, UID: "uid-restricted"},
		"groups run together": {Name: "ann", Groups: []string{"dev,ops"}, UID: "uid-restricted"},
	} {
		if err := k.Authorize(ctx, u, Read); !errors.Is(err, ErrForbidden) {
			t.Errorf("%s reused the full token's decision: %v", name, err)
		}
	}
	// The same identity again is served from the cache.
	before := reviews
	if err := k.Authorize(ctx, full, Read); err != nil || reviews != before {
		t.Errorf("same identity again: %v, %d more reviews", err, reviews-before)
	}
}
