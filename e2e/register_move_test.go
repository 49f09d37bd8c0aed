package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"

	"github.com/hubmesh/hub/clusters/register"
	"github.com/hubmesh/hub/internal/localcluster"
)

// TestRegisterMovesFromIstioReader: a member registered as earlier
// versions of deploy/remote-member-rbac.yaml (and istioctl
// create-remote-secret) had it — a token of Istio's
// istio-reader-service-account, which the file's bindings named — moves
// to the hub's own hub-member-reader with one `hub register --rotate`: the
// bindings name both identities until the hub runs the new token (so the
// old client keeps its grants), the member stays Ready on every poll of
// the hub's API, the hub then runs a
// token of hub-member-reader, the objects in the member are the file's
// (its bindings no longer name Istio's identity), and the command says the
// old token was not its own to revoke.
func TestRegisterMovesFromIstioReader(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west := e.Cluster("primary"), e.Cluster("west")
	homeClient, westClient := client(t, home), client(t, west)
	ns := "e2e-move-" + rand.String(6)
	if err := localcluster.EnsureNamespace(ctx, homeClient, ns); err != nil {
		t.Fatal(err)
	}
	id := "move-" + rand.String(5)
	t.Cleanup(func() { cleanupRegistration(t, westClient, id) })

	// The earlier state: the file's roles, bound to Istio's reader.
	rbac, err := register.LoadMemberRBAC()
	if err != nil {
		t.Fatal(err)
	}
	if err := rbac.Apply(ctx, westClient); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the file as it is, for the tests after this one
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rbac.Apply(ctx, westClient); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	legacy := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "istio-system", Name: "istio-reader-service-account"}
	if _, err := westClient.CoreV1().ServiceAccounts(legacy.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: legacy.Name}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	crb, err := westClient.RbacV1().ClusterRoleBindings().Get(ctx, "hub-remote-member", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	crb.Subjects = []rbacv1.Subject{legacy}
	if _, err := westClient.RbacV1().ClusterRoleBindings().Update(ctx, crb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb, err := westClient.RbacV1().RoleBindings("istio-system").Get(ctx, "hub-remote-member-gateways", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rb.Subjects = []rbacv1.Subject{legacy}
	if _, err := westClient.RbacV1().RoleBindings("istio-system").Update(ctx, rb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := westClient.CoreV1().ServiceAccounts(legacy.Namespace).CreateToken(ctx, legacy.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	legacyKC := west.TokenKubeconfig(tr.Status.Token)
	if _, err := homeClient.CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "istio-remote-secret-"+id, map[string][]byte{id: legacyKC}),
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	f := writeRegisterFiles(t, home, west)
	h := startHub(t, home, "--namespace", ns, "--api-token-file", f.apiTokens)
	readyOn := func(kubeconfig []byte) func() error {
		return func() error {
			if c := h.clusters(t)[id]; c.State != "Ready" || c.KubeconfigSHA256 != sha256Hex(kubeconfig) {
				return fmt.Errorf("the hub reports %+v; want Ready with kubeconfig %s", c, sha256Hex(kubeconfig))
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, readyOn(legacyKC))

	poll := pollMember(h, id)
	out, err := runHubRegister(ctx, "--kubeconfig", f.memberKC, "--context", west.Name, "--cluster-id", id, "--hub-kubeconfig", f.homeKC,
		"--namespace", ns, "--hub-url", h.adminURL, "--hub-token-file", f.tokenFile, "--rotate", "--settle", "2s", "--token-ttl", "1h")
	states, _, polls := poll.stop()
	if err != nil {
		t.Fatalf("hub register --rotate from Istio's reader: %v\n%s", err, out)
	}
	t.Logf("hub register --rotate:\n%s", out)
	if states["Ready"] != polls {
		t.Errorf("the member during the move: %v over %d polls; want Ready on every poll", states, polls)
	}
	for _, want := range []string{
		"the hub runs a token of istio-system/istio-reader-service-account: its bindings name it too until the hub runs istio-system/hub-member-reader's",
		"the previous credential was not minted by hub register: revoke it where it was made",
		"istio-system/istio-reader-service-account removed from the member RBAC's bindings: they name istio-system/hub-member-reader only",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("hub register did not say %q:\n%s", want, out)
		}
	}
	secret, err := homeClient.CoreV1().Secrets(ns).Get(ctx, "istio-remote-secret-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	moved := secret.Data[id]
	eventually(t, 30*time.Second, readyOn(moved))
	review, err := memberTokenClient(t, west, tokenOf(t, moved)).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if user := review.Status.UserInfo.Username; user != registerSA {
		t.Errorf("the remote Secret's token is %s's; want %s", user, registerSA)
	}
	checkMemberRBACIsTheFile(ctx, t, westClient)
	if changes := memberStateChanges(t, h.logPath, id); len(changes) != 2 {
		t.Errorf("the member's state changes in the hub's log: %v; want Pending → Syncing → Ready only", changes)
	}
}
