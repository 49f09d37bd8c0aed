package register

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	admissionv1 "k8s.io/api/admissionregistration/v1"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/hubmesh/hub/deploy"
)

// fieldManager owns what `hub register` writes (server-side apply).
const fieldManager = "hub-register"

// MemberRBAC is what a member grants its remote Secret's credentials:
// exactly the objects of deploy/remote-member-rbac.yaml, the
// ServiceAccount their bindings name among them.
type MemberRBAC struct {
	// Objects are the file's objects in its order (ServiceAccount,
	// ClusterRole, Role, RoleBinding, ClusterRoleBinding, and the
	// ValidatingAdmissionPolicy and its binding that narrow the Role's
	// Service writes).
	Objects []runtime.Object
	// ServiceAccount is the one subject of the file's bindings, created by
	// the file, whose tokens `hub register` mints.
	ServiceAccount types.NamespacedName
}

// legacyServiceAccount is the identity earlier versions of
// deploy/remote-member-rbac.yaml bound (istioctl create-remote-secret's).
// A rotation from a token of it keeps it bound (withSubject) until the hub
// runs the new credential on every answer, so the old client keeps its
// grants (token reviews, gateway writes) until it is replaced.
var legacyServiceAccount = types.NamespacedName{Namespace: "istio-system", Name: "istio-reader-service-account"}

// withSubject returns a copy of m whose bindings also name sa.
func (m *MemberRBAC) withSubject(sa types.NamespacedName) *MemberRBAC {
	out := &MemberRBAC{ServiceAccount: m.ServiceAccount}
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name}
	for _, obj := range m.Objects {
		obj = obj.DeepCopyObject()
		switch o := obj.(type) {
		case *rbacv1.RoleBinding:
			o.Subjects = append(o.Subjects, subject)
		case *rbacv1.ClusterRoleBinding:
			o.Subjects = append(o.Subjects, subject)
		}
		out.Objects = append(out.Objects, obj)
	}
	return out
}

// LoadMemberRBAC decodes deploy/remote-member-rbac.yaml.
func LoadMemberRBAC() (*MemberRBAC, error) { return parseMemberRBAC(deploy.RemoteMemberRBAC) }

func parseMemberRBAC(data []byte) (*MemberRBAC, error) {
	out := &MemberRBAC{}
	var created types.NamespacedName // the file's ServiceAccount
	dec := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("member RBAC: %w", err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("member RBAC: %w", err)
		}
		obj.GetObjectKind().SetGroupVersionKind(*gvk) // the apply body needs it
		var subjects []rbacv1.Subject
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			if created.Name != "" {
				return nil, fmt.Errorf("member RBAC: more than one ServiceAccount (%s, %s/%s)", created, o.Namespace, o.Name)
			}
			created = types.NamespacedName{Namespace: o.Namespace, Name: o.Name}
		case *rbacv1.ClusterRole, *rbacv1.Role, *admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding:
		case *rbacv1.RoleBinding:
			subjects = o.Subjects
		case *rbacv1.ClusterRoleBinding:
			subjects = o.Subjects
		default:
			return nil, fmt.Errorf("member RBAC: unexpected %T", obj)
		}
		for _, s := range subjects {
			sa := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
			if s.Kind != rbacv1.ServiceAccountKind || out.ServiceAccount.Name != "" && out.ServiceAccount != sa {
				return nil, fmt.Errorf("member RBAC: bindings must name one ServiceAccount, not also %s %s", s.Kind, sa)
			}
			out.ServiceAccount = sa
		}
		out.Objects = append(out.Objects, obj)
	}
	if out.ServiceAccount.Name == "" {
		return nil, errors.New("member RBAC binds no ServiceAccount")
	}
	if created != out.ServiceAccount {
		return nil, fmt.Errorf("member RBAC: the bindings name ServiceAccount %s, which the file does not create (it creates %q)", out.ServiceAccount, created)
	}
	return out, nil
}

// stripComments drops comment lines, so that a document of comments alone
// counts as empty.
func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// Apply makes the member grant exactly this: the ServiceAccount's namespace
// (created if absent), then every object by server-side apply, so that a
// second run, or one after the file changed, converges.
func (m *MemberRBAC) Apply(ctx context.Context, c kubernetes.Interface) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: m.ServiceAccount.Namespace}}
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{FieldManager: fieldManager}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ns.Name, err)
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: &force}
	for _, obj := range m.Objects {
		body, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		rbac := c.RbacV1()
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, body, opts)
		case *rbacv1.ClusterRole:
			_, err = rbac.ClusterRoles().Patch(ctx, o.Name, types.ApplyPatchType, body, opts)
		case *rbacv1.Role:
			_, err = rbac.Roles(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, body, opts)
		case *rbacv1.RoleBinding:
			_, err = rbac.RoleBindings(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, body, opts)
		case *rbacv1.ClusterRoleBinding:
			_, err = rbac.ClusterRoleBindings().Patch(ctx, o.Name, types.ApplyPatchType, body, opts)
		case *admissionv1.ValidatingAdmissionPolicy:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Patch(ctx, o.Name, types.ApplyPatchType, body, opts)
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Patch(ctx, o.Name, types.ApplyPatchType, body, opts)
		}
		switch _, vap := obj.(*admissionv1.ValidatingAdmissionPolicy); {
		case err != nil && vap && apierrors.IsNotFound(err):
			return fmt.Errorf("applying %s: the member's API server does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies (Kubernetes 1.30 and later do): without the policy the member's credential could rewrite every Service of istio-system; upgrade the member: %w", describe(obj), err)
		case err != nil:
			return fmt.Errorf("applying %s: %w", describe(obj), err)
		}
	}
	return nil
}

// OtherBindings lists the bindings in the member that name the
// ServiceAccount but are not the file's (kind namespace/name): through
// them its tokens may do more than the file grants (an operator's binding
// of hub-member-reader to more, or a file edited to bind Istio's
// istio-reader-service-account, which Istio binds where it is installed).
func (m *MemberRBAC) OtherBindings(ctx context.Context, c kubernetes.Interface) ([]string, error) {
	ours := map[string]bool{}
	for _, obj := range m.Objects {
		switch o := obj.(type) {
		case *rbacv1.RoleBinding:
			ours["RoleBinding "+o.Namespace+"/"+o.Name] = true
		case *rbacv1.ClusterRoleBinding:
			ours["ClusterRoleBinding "+o.Name] = true
		}
	}
	names := func(subjects []rbacv1.Subject) bool {
		for _, s := range subjects {
			if s.Kind == rbacv1.ServiceAccountKind && s.Namespace == m.ServiceAccount.Namespace && s.Name == m.ServiceAccount.Name {
				return true
			}
		}
		return false
	}
	var out []string
	crbs, err := c.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing ClusterRoleBindings: %w", err)
	}
	for _, b := range crbs.Items {
		if key := "ClusterRoleBinding " + b.Name; names(b.Subjects) && !ours[key] {
			out = append(out, key)
		}
	}
	rbs, err := c.RbacV1().RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing RoleBindings: %w", err)
	}
	for _, b := range rbs.Items {
		if key := "RoleBinding " + b.Namespace + "/" + b.Name; names(b.Subjects) && !ours[key] {
			out = append(out, key)
		}
	}
	return out, nil
}

// describe names an object as kubectl does (kind/namespace/name).
func describe(obj runtime.Object) string {
	meta, err := metaOf(obj)
	if err != nil {
		return fmt.Sprintf("%T", obj)
	}
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	if meta.GetNamespace() != "" {
		return kind + " " + meta.GetNamespace() + "/" + meta.GetName()
	}
	return kind + " " + meta.GetName()
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", obj)
	}
	return m, nil
}
