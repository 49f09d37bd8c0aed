package register

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/deploy"
)

func TestLoadMemberRBAC(t *testing.T) {
	m, err := LoadMemberRBAC()
	if err != nil {
		t.Fatal(err)
	}
	if want := (types.NamespacedName{Namespace: "istio-system", Name: "hub-member-reader"}); m.ServiceAccount != want {
		t.Errorf("service account %s, want %s", m.ServiceAccount, want)
	}
	var kinds []string
	for _, o := range m.Objects {
		kinds = append(kinds, o.GetObjectKind().GroupVersionKind().Kind)
	}
	if got := strings.Join(kinds, ","); got != "ServiceAccount,ClusterRole,Role,RoleBinding,ClusterRoleBinding,ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding" {
		t.Errorf("objects %s", got)
	}
	// The policy narrows the writes of the file's ServiceAccount, by name.
	vap := m.Objects[5].(*admissionv1.ValidatingAdmissionPolicy)
	user := "system:serviceaccount:" + m.ServiceAccount.Namespace + ":" + m.ServiceAccount.Name
	if len(vap.Spec.MatchConditions) != 1 || !strings.Contains(vap.Spec.MatchConditions[0].Expression, `"`+user+`"`) {
		t.Errorf("the ValidatingAdmissionPolicy matches %+v; want the requests of %s", vap.Spec.MatchConditions, user)
	}
	if b := m.Objects[6].(*admissionv1.ValidatingAdmissionPolicyBinding); b.Spec.PolicyName != vap.Name || !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) {
		t.Errorf("the policy binding %+v; want %s with Deny", b.Spec, vap.Name)
	}
	if cr := m.Objects[1].(*rbacv1.ClusterRole); cr.APIVersion != "rbac.authorization.k8s.io/v1" || len(cr.Rules) == 0 {
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
		"no binding": "# nothing\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: a}\n",
		"a ServiceAccount the file does not create": `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: a}
subjects: [{kind: ServiceAccount, name: istio-reader-service-account, namespace: istio-system}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: hub-member-reader, namespace: istio-system}
`,
		"two ServiceAccounts created": `apiVersion: v1
kind: ServiceAccount
metadata: {name: a, namespace: x}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: b, namespace: x}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: a}
subjects: [{kind: ServiceAccount, name: a, namespace: x}]
`,
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
		cur := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{clusters.AnnotationNetwork: tc.cur}}, Data: map[string][]byte{}}
		for _, k := range tc.keys {
			cur.Data[k] = nil
		}
		if got := networkAnnotation(cur, "west", "n1"); got != tc.want {
			t.Errorf("networkAnnotation(%q, %v) = %q, want %q", tc.cur, tc.keys, got, tc.want)
		}
	}
	if got := networkAnnotation(nil, "west", "n1"); got != "west=n1" {
		t.Errorf("a new Secret: %q", got)
	}
}

// The network annotation is built from the Secret as read for the write
// that lands: another member's network, changed by a concurrent writer
// between hub register's reads, is kept. (The fake clientset stands in for
// the conflict: the first update loses to a concurrent one.)
func TestNetworkAnnotationKeepsAConcurrentEdit(t *testing.T) {
	ns := "istio-system"
	shared := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: clusters.RemoteSecretName("west"), ResourceVersion: "1",
			Labels:      map[string]string{clusters.MultiClusterLabel: "true"},
			Annotations: map[string]string{clusters.AnnotationNetwork: "east=e1,west=w0"}},
		Data: map[string][]byte{"west": []byte("old"), "east": []byte("east")},
	}
	cs := fake.NewClientset(shared)
	updates := 0
	cs.PrependReactor("update", "secrets", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if updates++; updates > 1 {
			return false, nil, nil
		}
		// Someone else moves east to network e2 first: this write conflicts.
		edited := shared.DeepCopy()
		edited.Annotations[clusters.AnnotationNetwork], edited.ResourceVersion = "east=e2,west=w0", "2"
		if err := cs.Tracker().Update(corev1.SchemeGroupVersion.WithResource("secrets"), edited, ns); err != nil {
			t.Fatal(err)
		}
		return true, nil, apierrors.NewConflict(corev1.Resource("secrets"), shared.Name, errors.New("changed"))
	})
	kubeconfig, err := Kubeconfig("west", Member{Server: "https://10.0.0.1:6443"}, "t0ken")
	if err != nil {
		t.Fatal(err)
	}
	reg := clusters.NewRegistrar(cs.CoreV1().Secrets(ns), ns, "", clusters.KubeconfigPolicy{})
	if _, _, err := reg.RegisterAnnotated(context.Background(), "west", kubeconfig, networkAnnotations("west", "w1")); err != nil {
		t.Fatal(err)
	}
	got, err := cs.CoreV1().Secrets(ns).Get(context.Background(), shared.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := got.Annotations[clusters.AnnotationNetwork]; updates != 2 || a != "east=e2,west=w1" {
		t.Errorf("after %d updates the annotation is %q; want east's concurrent e2 kept: east=e2,west=w1", updates, a)
	}
}

// Generations are named by lineage and number and created by that name:
// a rotation that lost the race to mint the same generation fails and
// says why, and a hub's lineage is not another's.
func TestMintRefusesACollision(t *testing.T) {
	sa := types.NamespacedName{Namespace: "istio-system", Name: "hub-member-reader"}
	cs := fake.NewClientset()
	toks := tokens{client: cs, sa: sa, clusterID: "west", lineage: Lineage("https://home:6443", "istio-system", "west")}
	created := 0
	cs.PrependReactor("create", "secrets", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if created++; created == 1 { // a concurrent rotation creates generation 1 between our list and create
			s := action.(k8stesting.CreateAction).GetObject().(*corev1.Secret).DeepCopy()
			if err := cs.Tracker().Create(corev1.SchemeGroupVersion.WithResource("secrets"), s, sa.Namespace); err != nil {
				t.Fatal(err)
			}
		}
		return false, nil, nil
	})
	_, err := toks.mint(context.Background(), time.Hour)
	want := "credential generation 1 of cluster west exists already (Secret istio-system/hub-member-token-" + toks.lineage + "-1): another hub register is registering or rotating it now"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("minting a generation that exists: %v; want %q", err, want)
	}
	if l := Lineage("https://home:6443", "canary", "west"); l == toks.lineage || !validLineage(l) {
		t.Errorf("lineages of two hubs: %s, %s", l, toks.lineage)
	}
	gens, err := (tokens{client: cs, sa: sa, clusterID: "west", lineage: Lineage("https://home:6443", "canary", "west")}).generations(context.Background())
	if err != nil || len(gens) != 0 {
		t.Errorf("another hub's lineage sees %d generations (%v)", len(gens), err)
	}
}

// A rotation continues the lineage of the token the remote Secret holds,
// read from the claims of the bound token and checked against the Secret
// they name.
func TestLineageOf(t *testing.T) {
	sa := types.NamespacedName{Namespace: "istio-system", Name: "hub-member-reader"}
	const lineage = "0123456789abcdef"
	gen := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: sa.Namespace, Name: "hub-member-token-" + lineage + "-3", UID: "uid-3",
			Labels: map[string]string{LabelTokenFor: "west", LabelLineage: lineage, LabelGeneration: "3"}},
		Type: SecretTypeMemberToken,
	}
	toks := tokens{client: fake.NewClientset(gen), sa: sa, clusterID: "west"}
	kubeconfigWith := func(claims string) []byte {
		token := "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString([]byte(claims)) + ".c2ln"
		kc, err := Kubeconfig("west", Member{Server: "https://10.0.0.1:6443"}, token)
		if err != nil {
			t.Fatal(err)
		}
		return kc
	}
	claims := func(ns, sa, secret, uid string) string {
		return fmt.Sprintf(`{"kubernetes.io":{"namespace":%q,"serviceaccount":{"name":%q},"secret":{"name":%q,"uid":%q}}}`, ns, sa, secret, uid)
	}
	for _, tc := range []struct {
		name       string
		kubeconfig []byte
		want       string
	}{
		{"bound to the generation", kubeconfigWith(claims(sa.Namespace, sa.Name, gen.Name, "uid-3")), lineage},
		{"another UID (the Secret was made again)", kubeconfigWith(claims(sa.Namespace, sa.Name, gen.Name, "uid-x")), ""},
		{"another ServiceAccount", kubeconfigWith(claims(sa.Namespace, "other", gen.Name, "uid-3")), ""},
		{"a Secret that is gone", kubeconfigWith(claims(sa.Namespace, sa.Name, "gone", "uid-3")), ""},
		{"not bound to a Secret", kubeconfigWith(`{"kubernetes.io":{"namespace":"istio-system","serviceaccount":{"name":"hub-member-reader"}}}`), ""},
		{"not a JWT", kubeconfigWith("x"), ""},
		{"not a kubeconfig", []byte("{"), ""},
	} {
		got, err := toks.lineageOf(context.Background(), tc.kubeconfig)
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	other := tokens{client: toks.client, sa: sa, clusterID: "east"} // the generation is west's
	if got, err := other.lineageOf(context.Background(), kubeconfigWith(claims(sa.Namespace, sa.Name, gen.Name, "uid-3"))); err != nil || got != "" {
		t.Errorf("another cluster's generation: %q, %v", got, err)
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
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "cluster-admin-for-hub"}, Subjects: []rbacv1.Subject{sa}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "unrelated"}, Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "alice"}}},
	}
	got, err := m.OtherBindings(context.Background(), fake.NewClientset(objs...))
	if err != nil || strings.Join(got, ",") != "ClusterRoleBinding cluster-admin-for-hub" {
		t.Errorf("OtherBindings: %v, %v", got, err)
	}
}

// withSubject adds the legacy identity to the bindings of a copy only.
func TestWithSubject(t *testing.T) {
	m, err := LoadMemberRBAC()
	if err != nil {
		t.Fatal(err)
	}
	both := m.withSubject(legacyServiceAccount)
	for i, obj := range both.Objects {
		var got, orig []rbacv1.Subject
		switch o := obj.(type) {
		case *rbacv1.RoleBinding:
			got, orig = o.Subjects, m.Objects[i].(*rbacv1.RoleBinding).Subjects
		case *rbacv1.ClusterRoleBinding:
			got, orig = o.Subjects, m.Objects[i].(*rbacv1.ClusterRoleBinding).Subjects
		default:
			continue
		}
		if len(got) != 2 || got[1].Name != legacyServiceAccount.Name || got[1].Namespace != legacyServiceAccount.Namespace || len(orig) != 1 {
			t.Errorf("%T subjects %v (the file's %v); want the file's and %s", obj, got, orig, legacyServiceAccount)
		}
	}
}

// The policy a registration waits for is the one the member RBAC file
// installs.
func TestWritesPolicyIsTheFiles(t *testing.T) {
	if !strings.Contains(string(deploy.RemoteMemberRBAC), "kind: ValidatingAdmissionPolicy\nmetadata:\n  name: "+WritesPolicy+"\n") {
		t.Errorf("deploy/remote-member-rbac.yaml installs no ValidatingAdmissionPolicy named %s", WritesPolicy)
	}
}
