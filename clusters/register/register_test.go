package register

import (
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

func TestLoadMemberRBAC(t *testing.T) {
	m, err := LoadMemberRBAC()
	if err != nil {
		t.Fatal(err)
	}
	if want := (types.NamespacedName{Namespace: "istio-system", Name: "istio-reader-service-account"}); m.ServiceAccount != want {
		t.Errorf("service account %s, want %s", m.ServiceAccount, want)
	}
	var kinds []string
	for _, o := range m.Objects {
		kinds = append(kinds, o.GetObjectKind().GroupVersionKind().Kind)
	}
	if got := strings.Join(kinds, ","); got != "ClusterRole,Role,RoleBinding,ClusterRoleBinding" {
		t.Errorf("objects %s", got)
	}
	if cr := m.Objects[0].(*rbacv1.ClusterRole); cr.APIVersion != "rbac.authorization.k8s.io/v1" || len(cr.Rules) == 0 {
		t.Errorf("ClusterRole %+v: the apply body needs apiVersion and the rules", cr)
	}
}

func TestParseMemberRBACRefusesOtherSubjects(t *testing.T) {
	for name, doc := range map[string]string{
		"two service accounts": `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: a}
subjects:
  - {kind: ServiceAccount, name: a, namespace: x}
  - {kind: ServiceAccount, name: b, namespace: x}
`,
		"a user": `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: a}
subjects: [{kind: User, name: alice}]
`,
		"no binding":   "# nothing\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: a}\n",
		"another kind": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
	} {
		if _, err := parseMemberRBAC([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestNetworkAnnotation(t *testing.T) {
	for _, tc := range []struct {
		cur  string
		keys []string
		want string
	}{
		{"", nil, "west=n1"},
		{"old", []string{"west"}, "west=n1"},
		{"old", []string{"west", "east"}, "east=old,west=n1"}, // east keeps what the Secret gave it
		{"east=e,west=w", []string{"west", "east", "north"}, "east=e,west=n1"},
	} {
		if got := networkAnnotation(tc.cur, tc.keys, "west", "n1"); got != tc.want {
			t.Errorf("networkAnnotation(%q, %v) = %q, want %q", tc.cur, tc.keys, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := Options{ClusterID: "west", TokenTTL: time.Hour, Namespace: "istio-system"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.ClusterID = "-west" }, "must match"},
		{func(o *Options) { o.ClusterID = strings.Repeat("a", 64) }, "1-63 characters"},
		{func(o *Options) { o.TokenTTL = time.Minute }, "shorter than"},
		{func(o *Options) { o.Network = "a=b" }, "not a label value"},
		{func(o *Options) { o.Rotate = true }, "needs the hub's cluster"},
		{func(o *Options) { o.Hub = &Hub{} }, "needs the hub's cluster"},
		{func(o *Options) { o.Namespace = "Istio" }, "namespace"},
	} {
		o := ok
		tc.edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one saying %q", o, err, tc.want)
		}
	}
}

func TestKubeconfigIsCheckedAsTheHubChecksIt(t *testing.T) {
	if _, err := Kubeconfig("west", Member{Server: "https://169.254.169.254"}, "t0ken-value"); err == nil || !strings.Contains(err.Error(), "the hub would refuse") {
		t.Errorf("a link-local server: %v", err)
	} else if strings.Contains(err.Error(), "t0ken-value") {
		t.Errorf("the error shows the token: %v", err)
	}
	data, err := Kubeconfig("west", Member{Server: "https://10.0.0.1:6443"}, "t0ken-value")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "current-context: west") {
		t.Errorf("kubeconfig:\n%s", data)
	}
}

func TestOtherBindings(t *testing.T) {
	m, err := LoadMemberRBAC()
	if err != nil {
		t.Fatal(err)
	}
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: m.ServiceAccount.Namespace, Name: m.ServiceAccount.Name}
	objs := []runtime.Object{
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "hub-remote-member"}, Subjects: []rbacv1.Subject{sa}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "hub-remote-member-gateways"}, Subjects: []rbacv1.Subject{sa}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "istio-reader-clusterrole-istio-system"}, Subjects: []rbacv1.Subject{sa}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "unrelated"}, Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "alice"}}},
	}
	got, err := m.OtherBindings(context.Background(), fake.NewClientset(objs...))
	if err != nil || strings.Join(got, ",") != "ClusterRoleBinding istio-reader-clusterrole-istio-system" {
		t.Errorf("OtherBindings: %v, %v", got, err)
	}
}
