package clusters

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
)

// ExportMode says which of a member's Services are federated to the other
// members (--export-mode).
type ExportMode string

const (
	// ExportAll federates every Service but those labelled
	// hub.federation/export: "false" (the default).
	ExportAll ExportMode = "all"
	// ExportServiceExport federates only Services with a Multi-Cluster
	// Services ServiceExport (multicluster.x-k8s.io) of the same namespace
	// and name, as the MCS API defines; a member without the CRD exports
	// nothing.
	ExportServiceExport ExportMode = "serviceexport"
)

// ParseExportMode reads --export-mode.
func ParseExportMode(s string) (ExportMode, error) {
	switch m := ExportMode(s); m {
	case ExportAll, ExportServiceExport:
		return m, nil
	}
	return "", fmt.Errorf("export mode %q: want %s or %s", s, ExportAll, ExportServiceExport)
}

// AnnotationExportTo on a Service limits the members it is exported to:
// a comma-separated list of member IDs (hub.federation/export-to: west,east).
// Its own member always has it. A list that is not understood exports the
// Service to no other member (and says why).
const AnnotationExportTo = "hub.federation/export-to"

// maxExportTo bounds the member IDs AnnotationExportTo may list.
const maxExportTo = 512

// ServiceExportGVR is the Multi-Cluster Services API's ServiceExport.
var ServiceExportGVR = schema.GroupVersionResource{Group: "multicluster.x-k8s.io", Version: "v1alpha1", Resource: "serviceexports"}

// ExportedTo reports whether the view is offered to a member other than
// its own: it is exported (not NotExported) and, when ExportTo lists
// members, member is among them.
func (s *Service) ExportedTo(member string) bool {
	return !s.NotExported && (s.ExportTo == nil || slices.Contains(s.ExportTo, member))
}

// Restricted reports whether some member other than its own may not have
// the view.
func (s *Service) Restricted() bool { return s.NotExported || s.ExportTo != nil }

// exportOf works out whether a Service is exported and to whom: the
// label, the export mode's ServiceExport, then AnnotationExportTo.
// exported says whether the member has a ServiceExport of it (ok: the
// member's ServiceExports are listed).
func exportOf(svc *corev1.Service, mode ExportMode, exported, ok bool) (notExported bool, to []string, reason string) {
	switch {
	case svc.Labels[LabelExport] == "false":
		return true, nil, fmt.Sprintf("labelled %s: \"false\"", LabelExport)
	case mode == ExportServiceExport && !ok:
		return true, nil, "the member's ServiceExports (multicluster.x-k8s.io) are not listed: the CRD is absent or not readable, so no Service is exported (--export-mode=serviceexport)"
	case mode == ExportServiceExport && !exported:
		return true, nil, "no ServiceExport of the same name (--export-mode=serviceexport)"
	}
	list, has := svc.Annotations[AnnotationExportTo]
	if !has {
		return false, nil, ""
	}
	to = []string{}
	for _, id := range strings.Split(list, ",") {
		id = strings.TrimSpace(id)
		if id == "" {
			continue
		}
		if err := ValidateClusterID(id); err != nil {
			return true, nil, fmt.Sprintf("annotation %s: %v; exported to no other member", AnnotationExportTo, err)
		}
		to = append(to, id)
	}
	slices.Sort(to)
	to = slices.Compact(to)
	if len(to) > maxExportTo {
		return true, nil, fmt.Sprintf("annotation %s lists %d members, more than %d; exported to no other member", AnnotationExportTo, len(to), maxExportTo)
	}
	return false, to, ""
}

// serviceExports watches a namespace's ServiceExports (names only).
type serviceExports struct {
	factory metadatainformer.SharedInformerFactory
	inf     cache.SharedIndexInformer
}

// watchServiceExports adds a ServiceExport watch to w (export mode
// serviceexport): each change rebuilds the Service of the same name.
func (b *watchBuilder) watchServiceExports(w *nsWatch) error {
	factory := metadatainformer.NewFilteredSharedInformerFactory(b.meta, 0, w.namespace, nil)
	inf := factory.ForResource(ServiceExportGVR).Informer()
	if err := inf.SetTransform(stripToName); err != nil {
		return fmt.Errorf("setting informer transform: %w", err)
	}
	on := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if m, ok := obj.(metav1.Object); ok {
			b.views.enqueue(ServiceKey{Namespace: m.GetNamespace(), Name: m.GetName()})
		}
	}
	if _, err := inf.AddEventHandler(b.objects.counting(w.counts, "ServiceExport", cache.ResourceEventHandlerFuncs{AddFunc: on, DeleteFunc: on})); err != nil {
		return fmt.Errorf("adding ServiceExport event handler: %w", err)
	}
	w.exports = &serviceExports{factory: factory, inf: inf}
	return nil
}

// serviceExportsServed reports whether the member's API server serves
// ServiceExports (the CRD is installed): false only when it says it does
// not (404), so that the first publish does not wait for an informer that
// cannot list.
func (a *memberAPI) serviceExportsServed(ctx context.Context) bool {
	err := a.client.Discovery().RESTClient().Get().AbsPath("/apis", ServiceExportGVR.Group, ServiceExportGVR.Version).Do(optionalRequest(ctx)).Error()
	return !apierrors.IsNotFound(err)
}

// serviceExportPoll is how often a member that does not serve
// ServiceExports is asked again whether it does.
const serviceExportPoll = 30 * time.Second

// watchServiceExportsWhenServed runs the member's ServiceExport informers
// once its API server serves ServiceExports (export mode serviceexport):
// at once if it does now (reported true: the first publish may wait for
// them), else when a poll finds the CRD installed (every Service is then
// rebuilt once they are listed). An informer on a resource the server
// does not serve would fail every list, and say so in the log, for as
// long as it ran.
func (c *Cluster) watchServiceExportsWhenServed(ctx, first context.Context, wg *sync.WaitGroup) bool {
	if c.api.serviceExportsServed(first) {
		c.ns.startExports()
		return true
	}
	c.log.Info("the member does not serve ServiceExports (multicluster.x-k8s.io CRD absent): none of its Services is exported; asking again", "every", c.exports.poll.String())
	wg.Go(func() {
		t := time.NewTicker(c.exports.poll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if c.api.serviceExportsServed(ctx) {
				c.log.Info("the member serves ServiceExports now")
				// Every Service is rebuilt once they are listed: those
				// without one now say so instead of "not listed".
				if cache.WaitForCacheSync(ctx.Done(), c.ns.startExports()...) {
					c.views.enqueueAll()
				}
				return
			}
		}
	})
	return false
}

// serviceExported reports whether Service namespace/name has a
// ServiceExport, and whether the member's ServiceExports are listed.
func (n *namespaceWatches) serviceExported(namespace, name string) (exported, listed bool) {
	w := n.of(namespace)
	if w == nil || w.exports == nil {
		return false, false
	}
	if !w.exports.inf.HasSynced() {
		return false, false
	}
	_, exported, _ = w.exports.inf.GetStore().GetByKey(namespace + "/" + name)
	return exported, true
}
