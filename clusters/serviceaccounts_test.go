package clusters

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestBuildServiceDeclaredServiceAccounts(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []string
	}{
		{"", nil},
		{" , ", nil},
		{"echo", []string{"echo"}},
		{" echo-v2 ,echo,echo ", []string{"echo", "echo-v2"}},
		{strings.Repeat("a,", MaxDeclaredServiceAccounts) + "b", nil}, // too many: declares nothing
		{strings.Repeat("x", maxServiceAccountBytes+1), nil},
		{strings.Repeat("x", 1<<20), nil},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "echo", Annotations: map[string]string{
			AnnotationKubernetesServiceAccounts: tc.value, AnnotationCanonicalServiceAccounts: tc.value,
		}}}
		got := buildService(svc, nil, nil, nil)
		if !slices.Equal(got.KubernetesServiceAccounts, tc.want) || !slices.Equal(got.CanonicalServiceAccounts, tc.want) {
			t.Errorf("%.40q: declared %v / %v; want %v", tc.value, got.KubernetesServiceAccounts, got.CanonicalServiceAccounts, tc.want)
		}
	}
}

func TestStripKeepsOnlyServiceAccountAnnotations(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "echo", Annotations: map[string]string{
		AnnotationKubernetesServiceAccounts:                "echo",
		AnnotationCanonicalServiceAccounts:                 strings.Repeat("x", maxDeclaredAnnotationBytes+1),
		"kubectl.kubernetes.io/last-applied-configuration": "{}",
	}}}
	obj, err := stripObject(svc)
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*corev1.Service).Annotations
	if len(got) != 1 || got[AnnotationKubernetesServiceAccounts] != "echo" {
		t.Errorf("kept annotations %v; want only %s=echo", got, AnnotationKubernetesServiceAccounts)
	}
}
