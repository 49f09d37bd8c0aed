package main

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/hubmesh/hub/distribute"
)

// demoFailoverRule is the DestinationRule the demo distributes for echo:
// its outlier detection turns on Istio's locality failover, so each
// client calls its own member's backends while that member is healthy and
// the next ones when it is not (docs/networks.md, "Locality failover").
const demoFailoverRule = "echo-locality"

// applyDemoFailoverRule creates, in the home cluster, Istio's
// DestinationRule CRD (only its name and kind: the hub reads the spec
// with Istio's own proto, not with the CRD's schema) unless it is there,
// and the demo's DestinationRule for echo in the root namespace, labelled
// for distribution. It waits until the CRD is served.
func applyDemoFailoverRule(ctx context.Context, home *rest.Config, rootNamespace, host string) error {
	dc, err := dynamic.NewForConfig(home)
	if err != nil {
		return err
	}
	crds := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "destinationrules.networking.istio.io"},
		"spec": map[string]any{
			"group": "networking.istio.io", "scope": "Namespaced",
			"names": map[string]any{"kind": "DestinationRule", "listKind": "DestinationRuleList", "plural": "destinationrules", "singular": "destinationrule", "shortNames": []any{"dr"}},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	if _, err := crds.Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the DestinationRule CRD: %w", err)
	}
	drs := dc.Resource(schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}).Namespace(rootNamespace)
	rule := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
		"metadata": map[string]any{"name": demoFailoverRule, "namespace": rootNamespace, "labels": map[string]any{distribute.Label: "true"}},
		"spec": map[string]any{"host": host, "trafficPolicy": map[string]any{
			"outlierDetection": map[string]any{"consecutive5xxErrors": int64(3), "interval": "5s", "baseEjectionTime": "30s"},
		}},
	}}
	// The CRD is served once Established: creating the rule says when.
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = drs.Create(ctx, rule, metav1.CreateOptions{})
		return last == nil || apierrors.IsAlreadyExists(last), nil
	})
	if err != nil {
		return fmt.Errorf("creating the DestinationRule %s/%s: %w (last: %v)", rootNamespace, demoFailoverRule, err, last)
	}
	return nil
}
