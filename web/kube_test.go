package web

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
)

var env *localcluster.Env

// TestMain starts one real API server for the tests of dashboard sessions
// against Kubernetes TokenReview and SubjectAccessReview.
func TestMain(m *testing.M) { os.Exit(localcluster.RunTests(m, &env, "home")) }

// TestSessionsFollowKubernetesAuthorization: a dashboard session signed in
// with a service-account token ends, live stream included, when the token's
// read access is taken away (SubjectAccessReview now denies) or its service
// account is deleted (TokenReview now denies), once the authenticator's
// cached decision expires (a one-second window here; a minute in the hub).
func TestSessionsFollowKubernetesAuthorization(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(e.Cluster("home").RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ns := "web-" + rand.String(6)
	if err := localcluster.EnsureNamespace(ctx, cs, ns); err != nil {
		t.Fatal(err)
	}
	auth := api.NewKubeAuth(cs, ns, api.KubeAuthOptions{CacheTTL: time.Second})
	m := fakeModels{}
	s := startServer(t, Config{Membership: m, Registrar: m, Serving: m, Auth: auth, Refresh: 100 * time.Millisecond}, ServerOptions{}, nil)

	// A token that may not read cannot sign in.
	nobody := serviceAccountToken(t, ctx, cs, ns, "nobody", false)
	resp, err := s.client.PostForm(s.base+"/signin", map[string][]string{"token": {nobody}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
		t.Errorf("sign-in without read access: %s, cookies %v", resp.Status, resp.Cookies())
	}

	for _, tc := range []struct {
		name   string
		revoke func(sa string) error
	}{
		{"role binding deleted", func(sa string) error {
			return cs.RbacV1().RoleBindings(ns).Delete(ctx, sa, metav1.DeleteOptions{})
		}},
		{"service account deleted", func(sa string) error {
			return cs.CoreV1().ServiceAccounts(ns).Delete(ctx, sa, metav1.DeleteOptions{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sa := "reader-" + rand.String(5)
			token := serviceAccountToken(t, ctx, cs, ns, sa, true)
			cookie, _ := s.signIn(t, token)
			st := s.openStream(t, "/", cookie)
			if ev := st.next(t, 30*time.Second); ev.name != "update" {
				t.Fatalf("first live update: %+v", ev)
			}
			if err := tc.revoke(sa); err != nil {
				t.Fatal(err)
			}
			revoked := time.Now()
			if reason := st.waitEnd(t, 30*time.Second); reason != "session revoked" {
				t.Errorf("stream ended with %q; want %q", reason, "session revoked")
			}
			t.Logf("live stream ended %s after the revocation", time.Since(revoked).Round(time.Millisecond))
			if code, _ := s.get(t, "/", cookie); code != http.StatusSeeOther {
				t.Errorf("page after the revocation: %d; want a redirect to sign in", code)
			}
		})
	}
}

// serviceAccountToken creates a service account (allowed to get secrets in
// ns if read) and returns a token for it.
func serviceAccountToken(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns, name string, read bool) string {
	t.Helper()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if read {
		if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	exp := int64(3600)
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Status.Token
}
