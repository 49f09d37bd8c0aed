package localcluster

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// ServiceExportGVR is the Multi-Cluster Services API's ServiceExport.
var ServiceExportGVR = schema.GroupVersionResource{Group: "multicluster.x-k8s.io", Version: "v1alpha1", Resource: "serviceexports"}

// CRDGVR is CustomResourceDefinitions.
var CRDGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallServiceExportCRD installs the Multi-Cluster Services API's
// ServiceExport CRD (as sigs.k8s.io/mcs-api ships it, with a status
// subresource; schema not enforced) and waits until it is served. It
// returns a dynamic client of the cluster.
func InstallServiceExportCRD(ctx context.Context, cfg *rest.Config) (dynamic.Interface, error) {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "serviceexports.multicluster.x-k8s.io"},
		"spec": map[string]any{
			"group": "multicluster.x-k8s.io", "scope": "Namespaced",
			"names": map[string]any{"plural": "serviceexports", "singular": "serviceexport", "kind": "ServiceExport", "listKind": "ServiceExportList"},
			"versions": []any{map[string]any{
				"name": "v1alpha1", "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object", "x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}}
	if _, err := dc.Resource(CRDGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating the ServiceExport CRD: %w", err)
	}
	for {
		_, err := dc.Resource(ServiceExportGVR).Namespace("default").List(ctx, metav1.ListOptions{})
		if err == nil {
			return dc, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the ServiceExport CRD: %w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ServiceExport is a ServiceExport of namespace/name.
func ServiceExport(namespace, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
		"metadata": map[string]any{"name": name, "namespace": namespace},
	}}
}
