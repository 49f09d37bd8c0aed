package distribute

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/wait"
)

// TestUnreadablePoliciesAndNotes: an AuthorizationPolicy whose spec does
// not convert (a field this hub's Istio API does not know), in a
// namespace distribution is allowed from, is in Rules with a nil Spec
// (the hub's xDS fails closed on it); one in another namespace is not. A
// note set on an object shows in Status and is recorded once as a Warning
// Event on it.
func TestUnreadablePoliciesAndNotes(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("home")
	dyn, kube := clients(t, home)
	installCRDs(t, dyn, "AuthorizationPolicy")
	ctx := context.Background()
	// As a newer Istio's CRD would: its spec keeps fields this hub's Istio
	// API does not know.
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	wait.Until(t, time.Minute, func() error {
		crd, err := crds.Get(ctx, "authorizationpolicies.security.istio.io", metav1.GetOptions{})
		if err != nil {
			return err
		}
		versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
		for _, v := range versions {
			if err := unstructured.SetNestedField(v.(map[string]any), true, "schema", "openAPIV3Schema", "properties", "spec", "x-kubernetes-preserve-unknown-fields"); err != nil {
				return err
			}
		}
		if err := unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions"); err != nil {
			return err
		}
		_, err = crds.Update(ctx, crd, metav1.UpdateOptions{})
		return err // a conflict: again
	})
	allowed, other := testNamespace(t, kube, "unread"), testNamespace(t, kube, "elsewhere")
	gvr := schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "authorizationpolicies"}
	const kind = "security.istio.io/v1/AuthorizationPolicy"
	s := runSourceWith(t, home, Options{Namespaces: []string{allowed}})
	future := map[string]any{"action": "ALLOW", "fromTheFuture": true}
	for _, ns := range []string{allowed, other} {
		if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, istioObject(gvr, "AuthorizationPolicy", ns, "future", true, future), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dyn.Resource(gvr).Namespace(allowed).Create(ctx, istioObject(gvr, "AuthorizationPolicy", allowed, "fine", true, map[string]any{"action": "DENY"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		objs, ready := s.Rules(kind)
		if !ready {
			return fmt.Errorf("not ready")
		}
		got := map[string]bool{}
		for _, o := range objs {
			got[o.Namespace+"/"+o.Name] = o.Spec == nil
		}
		if unreadable, ok := got[allowed+"/future"]; !ok || !unreadable || got[allowed+"/fine"] || len(got) != 2 {
			return fmt.Errorf("rules %v; want %s/future unreadable (nil spec) and %s/fine", got, allowed, allowed)
		}
		return nil
	})

	s.SetNotes(kind, []Note{{Object: allowed + "/fine", Message: "a note"}})
	wait.Until(t, time.Minute, func() error {
		if n := kindStatus(s.Status(), kind).Notes; len(n) != 1 || n[0].Object != allowed+"/fine" {
			return fmt.Errorf("notes in status: %v", n)
		}
		evs, err := kube.CoreV1().Events(allowed).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + NoteReason})
		if err != nil {
			return err
		}
		if len(evs.Items) != 1 || evs.Items[0].InvolvedObject.Name != "fine" || evs.Items[0].Message != "applied by the hub's xDS: a note" {
			return fmt.Errorf("%d note Events: %v", len(evs.Items), evs.Items)
		}
		return nil
	})
	// The same note again records nothing new.
	s.SetNotes(kind, []Note{{Object: allowed + "/fine", Message: "a note"}})
	s.SetNotes(kind, []Note{{Object: allowed + "/fine", Message: "a note"}, {Object: allowed + "/fine", Message: "another"}})
	wait.Until(t, time.Minute, func() error {
		evs, err := kube.CoreV1().Events(allowed).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + NoteReason})
		if err != nil {
			return err
		}
		if len(evs.Items) != 2 {
			return fmt.Errorf("%d note Events; want 2 (each note once)", len(evs.Items))
		}
		return nil
	})
}
