package localcluster

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
)

// AdminTokenKubeconfig creates, in a fresh namespace of the cluster, a
// service account bound to cluster-admin and returns a kubeconfig holding
// a TokenRequest token of it that expires after ttl (a real, signed JWT
// with that exp), the expiry the API server states, and a cleanup that
// deletes the namespace and the binding.
func (c *Cluster) AdminTokenKubeconfig(ctx context.Context, ttl time.Duration) (kubeconfig []byte, exp time.Time, cleanup func(), err error) {
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		return nil, time.Time{}, nil, err
	}
	ns := "sa-" + rand.String(6)
	cleanup = func() {
		bg := context.Background()
		_ = cs.RbacV1().ClusterRoleBindings().Delete(bg, ns, metav1.DeleteOptions{})
		_ = cs.CoreV1().Namespaces().Delete(bg, ns, metav1.DeleteOptions{})
	}
	fail := func(err error) ([]byte, time.Time, func(), error) {
		cleanup()
		return nil, time.Time{}, nil, fmt.Errorf("making a %s token for cluster %s: %w", ttl, c.Name, err)
	}
	if err := EnsureNamespace(ctx, cs, ns); err != nil {
		return fail(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "admin"}}, metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "admin", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	secs := int64(ttl / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "admin", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		return fail(err)
	}
	return c.TokenKubeconfig(tr.Status.Token), tr.Status.ExpirationTimestamp.UTC(), cleanup, nil
}
