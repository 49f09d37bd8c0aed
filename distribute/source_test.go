package distribute

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/wait"
)

func mtls(mode string) map[string]any { return map[string]any{"mtls": map[string]any{"mode": mode}} }

// A labelled PeerAuthentication is distributed with its spec proto and a
// version that follows its content; unlabelled ones are not; removing the
// label removes it.
func TestDistributesLabelledObjects(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("home")
	dyn, kube := clients(t, home)
	installCRDs(t, dyn, slices.Collect(func(yield func(string) bool) {
		for _, k := range kinds {
			if !yield(k.kind) {
				return
			}
		}
	})...)
	ctx := context.Background()
	ns := testNamespace(t, kube, "pa-test")
	s, ch := runSource(t, home, nil, ns)
	wait.Until(t, time.Minute, func() error { _, err := objectsOf(s, paKind, ns); return err })

	pas := dyn.Resource(paGVR).Namespace(ns)
	for _, o := range []struct {
		name       string
		distribute bool
	}{{"labelled", true}, {"other", true}, {"plain", false}} {
		if _, err := pas.Create(ctx, istioObject(paGVR, "PeerAuthentication", ns, o.name, o.distribute, mtls("STRICT")), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var first Object
	wait.Until(t, time.Minute, func() error {
		m, err := objectsOf(s, paKind, ns)
		if err != nil {
			return err
		}
		if len(m) != 2 || m["labelled"].Spec == nil || m["other"].Spec == nil {
			return fmt.Errorf("objects %v, want labelled and other", m)
		}
		first = m["labelled"]
		return nil
	})
	want := &securityv1beta1.PeerAuthentication{Mtls: &securityv1beta1.PeerAuthentication_MutualTLS{Mode: securityv1beta1.PeerAuthentication_MutualTLS_STRICT}}
	if !proto.Equal(first.Spec, want) {
		t.Errorf("spec %v, want %v", first.Spec, want)
	}
	if first.Kind != paKind || first.Namespace != ns || first.Version == "" || first.CreationTimestamp.IsZero() || first.Labels[Label] != "true" {
		t.Errorf("object %+v", first)
	}

	// Ready, then one change per labelled object.
	wait.Until(t, time.Minute, func() error {
		if n := ch.count(paKind); n != 3 {
			return fmt.Errorf("%d changes reported, want 3", n)
		}
		return nil
	})

	// A status write is not content: same version, no change reported. The
	// informer handles events in order, so once the later edit of "other"
	// is seen, the status write was handled.
	before := ch.count(paKind)
	got, err := pas.Get(ctx, "labelled", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Object["status"] = map[string]any{"observedGeneration": int64(1)}
	if _, err := pas.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pas.Update(ctx, mustGet(t, pas, "labelled"), metav1.UpdateOptions{}); err != nil { // identical re-apply
		t.Fatal(err)
	}
	other := mustGet(t, pas, "other")
	other.Object["spec"] = mtls("DISABLE")
	if _, err := pas.Update(ctx, other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		m, err := objectsOf(s, paKind, ns)
		if err != nil {
			return err
		}
		if m["other"].Spec.(*securityv1beta1.PeerAuthentication).GetMtls().GetMode() != securityv1beta1.PeerAuthentication_MutualTLS_DISABLE {
			return errNotYet
		}
		if m["labelled"].Version != first.Version {
			t.Fatalf("a status write or identical re-apply changed the version")
		}
		return nil
	})
	if n := ch.count(paKind) - before; n != 1 {
		t.Errorf("%d changes reported for one edit, want 1", n)
	}

	// An edit of the spec, then of an annotation, changes the version.
	labelled := mustGet(t, pas, "labelled")
	labelled.Object["spec"] = mtls("PERMISSIVE")
	if _, err := pas.Update(ctx, labelled, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var edited Object
	wait.Until(t, time.Minute, func() error {
		m, _ := objectsOf(s, paKind, ns)
		if edited = m["labelled"]; edited.Version == first.Version {
			return errNotYet
		}
		return nil
	})
	if mode := edited.Spec.(*securityv1beta1.PeerAuthentication).GetMtls().GetMode(); mode != securityv1beta1.PeerAuthentication_MutualTLS_PERMISSIVE {
		t.Errorf("mode %v after the edit", mode)
	}
	labelled = mustGet(t, pas, "labelled")
	labelled.SetAnnotations(map[string]string{"team": "platform"})
	if _, err := pas.Update(ctx, labelled, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		m, _ := objectsOf(s, paKind, ns)
		if o := m["labelled"]; o.Version == edited.Version || o.Annotations["team"] != "platform" {
			return errNotYet
		}
		return nil
	})

	// Removing the label removes the object.
	labelled = mustGet(t, pas, "labelled")
	labelled.SetLabels(nil)
	if _, err := pas.Update(ctx, labelled, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		m, _ := objectsOf(s, paKind, ns)
		if _, ok := m["labelled"]; ok || len(m) != 1 {
			return fmt.Errorf("objects %v, want only other", m)
		}
		return nil
	})
	// Every kind watched and, once its watch synced (a CRD established
	// just before may take a moment to serve lists), ready.
	wait.Until(t, time.Minute, func() error {
		st := s.Status()
		if !st.Discovered || len(st.Kinds) != len(kinds) {
			return fmt.Errorf("status %+v", st)
		}
		for _, k := range st.Kinds {
			if k.Served == "" || !k.Ready || k.Message != "" {
				return fmt.Errorf("kind %+v: want watched and ready with every CRD installed", k)
			}
		}
		return nil
	})
}

// A spec that does not convert is reported on its object, once per
// generation, and left out; a valid object of the same kind still goes.
func TestRejectsInvalidSpec(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("home")
	dyn, kube := clients(t, home)
	installCRDs(t, dyn, "DestinationRule")
	ctx := context.Background()
	ns := testNamespace(t, kube, "dr-test")
	s, _ := runSource(t, home, nil, ns)
	drs := dyn.Resource(drGVR).Namespace(ns)
	// The CRD schema types idleTimeout as a plain string; the proto wants a
	// Duration.
	idle := func(d string) map[string]any {
		return map[string]any{"host": "echo", "trafficPolicy": map[string]any{"connectionPool": map[string]any{"tcp": map[string]any{"idleTimeout": d}}}}
	}
	if _, err := drs.Create(ctx, istioObject(drGVR, "DestinationRule", ns, "bad", true, idle("soon")), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the CRD refused the spec the test relies on it to let through: %v", err)
	}
	if _, err := drs.Create(ctx, istioObject(drGVR, "DestinationRule", ns, "good", true, idle("30s")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		m, err := objectsOf(s, drKind, ns)
		if err != nil {
			return err
		}
		if _, ok := m["good"]; !ok || len(m) != 1 {
			return fmt.Errorf("objects %v, want only good", m)
		}
		if n, err := rejections(ctx, kube, ns, "bad"); err != nil || n != 1 {
			return fmt.Errorf("%d rejection events on bad (%v), want 1", n, err)
		}
		return nil
	})
	evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=bad"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := evs.Items[0]; ev.Type != "Warning" || !strings.Contains(ev.Message, "google.protobuf.Duration") || ev.InvolvedObject.Kind != "DestinationRule" || ev.InvolvedObject.UID == "" {
		t.Errorf("event %+v", ev)
	}
	if st := s.Status(); st.Rejected < 1 || !slices.Equal(rejectedIn(st, drKind, ns), []string{ns + "/bad"}) {
		t.Errorf("status %+v, want %s/bad rejected", st, ns)
	}

	// A metadata write keeps the generation: no second Event. Seen once the
	// later edit of good is.
	bad := mustGet(t, drs, "bad")
	bad.SetAnnotations(map[string]string{"touched": "yes"})
	if _, err := drs.Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	good := mustGet(t, drs, "good")
	good.Object["spec"] = idle("40s")
	if _, err := drs.Update(ctx, good, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		m, _ := objectsOf(s, drKind, ns)
		if d := idleOf(m["good"]); d != 40*time.Second {
			return fmt.Errorf("good's idle timeout %v, want 40s", d)
		}
		return nil
	})
	if n, _ := rejections(ctx, kube, ns, "bad"); n != 1 {
		t.Errorf("%d rejection events after a metadata write, want still 1", n)
	}

	// A new generation that still fails is reported again; once fixed, it goes.
	bad = mustGet(t, drs, "bad")
	bad.Object["spec"] = idle("later")
	if _, err := drs.Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		if n, err := rejections(ctx, kube, ns, "bad"); err != nil || n != 2 {
			return fmt.Errorf("%d rejection events on bad (%v), want 2", n, err)
		}
		return nil
	})
	bad = mustGet(t, drs, "bad")
	bad.Object["spec"] = idle("5s")
	if _, err := drs.Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		m, _ := objectsOf(s, drKind, ns)
		if r := rejectedIn(s.Status(), drKind, ns); len(m) != 2 || len(r) != 0 {
			return fmt.Errorf("objects %v, rejected %v; want both, none rejected", m, r)
		}
		return nil
	})
}

// A kind whose CRD is missing is reported, ready and empty, without an error
// loop; installing its CRD later starts its watch, deleting it stops it.
func TestMissingCRDs(t *testing.T) {
	e := localcluster.Require(t, env)
	partial := e.Cluster("partial")
	dyn, kube := clients(t, partial)
	installCRDs(t, dyn, "PeerAuthentication")
	logs := &recordingHandler{}
	late := testNamespace(t, kube, "late")
	s, ch := runSource(t, partial, slog.New(logs), late)
	wait.Until(t, time.Minute, func() error {
		if _, err := objectsOf(s, paKind, ""); err != nil {
			return err
		}
		if _, err := objectsOf(s, drKind, ""); err != nil {
			return err
		}
		return nil
	})
	st := s.Status()
	if k := kindStatus(st, paKind); k.Served != "security.istio.io/v1" || !k.Ready {
		t.Errorf("PeerAuthentication %+v, want watched in v1", k)
	}
	dr := kindStatus(st, drKind)
	if dr.Served != "" || !dr.Ready || !strings.Contains(dr.Message, "destinationrules.networking.istio.io") {
		t.Errorf("DestinationRule %+v, want missing with a message naming its CRD", dr)
	}
	if ch.count(drKind) != 1 {
		t.Errorf("%d changes for the missing kind, want 1 (ready)", ch.count(drKind))
	}
	// Several rediscoveries later: still no warning, no further change.
	last := st.LastDiscovery
	for range 3 {
		wait.Until(t, time.Minute, func() error {
			if !s.Status().LastDiscovery.After(last) {
				return errNotYet
			}
			return nil
		})
		last = s.Status().LastDiscovery
	}
	if w := logs.warnings(); len(w) != 0 {
		t.Errorf("warnings with a CRD missing: %v", w)
	}
	if ch.count(drKind) != 1 {
		t.Errorf("%d changes for the missing kind after rediscoveries, want 1", ch.count(drKind))
	}

	// Installed later: picked up.
	ctx := context.Background()
	ns := late
	installCRDs(t, dyn, "DestinationRule")
	if _, err := dyn.Resource(drGVR).Namespace(ns).Create(ctx, istioObject(drGVR, "DestinationRule", ns, "late", true, map[string]any{"host": "echo"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		m, err := objectsOf(s, drKind, ns)
		if err != nil {
			return err
		}
		if _, ok := m["late"]; !ok {
			return errNotYet
		}
		if k := kindStatus(s.Status(), drKind); k.Served != "networking.istio.io/v1" || k.Message != "" {
			return fmt.Errorf("DestinationRule %+v", k)
		}
		return nil
	})

	// Its CRD deleted: dropped, reported missing again.
	if err := dyn.Resource(crdGVR).Delete(ctx, "destinationrules.networking.istio.io", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		objs, ready := s.Objects(drKind)
		if k := kindStatus(s.Status(), drKind); len(objs) != 0 || !ready || k.Served != "" || k.Message == "" {
			return fmt.Errorf("DestinationRule %+v with %d objects", k, len(objs))
		}
		return nil
	})
}

func idleOf(o Object) time.Duration {
	dr, _ := o.Spec.(*networkingv1alpha3.DestinationRule)
	return dr.GetTrafficPolicy().GetConnectionPool().GetTcp().GetIdleTimeout().AsDuration()
}

// rejectedIn lists the rejected objects of a kind in namespace ns.
func rejectedIn(st Status, kind, ns string) []string {
	var out []string
	for _, r := range kindStatus(st, kind).Rejected {
		if strings.HasPrefix(r.Object, ns+"/") {
			out = append(out, r.Object)
		}
	}
	return out
}

func kindStatus(st Status, kind string) KindStatus {
	for _, k := range st.Kinds {
		if k.Kind == kind {
			return k
		}
	}
	return KindStatus{}
}

// recordingHandler keeps the warnings logged.
type recordingHandler struct {
	mu   sync.Mutex
	warn []string
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.mu.Lock()
		h.warn = append(h.warn, r.Message)
		h.mu.Unlock()
	}
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }
func (h *recordingHandler) warnings() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.warn)
}

// A replica that may not write (not the leader) records no Event; it
// records one on the object's next change once it may.
func TestRejectionEventsOnlyWhenMayWrite(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("home")
	dyn, kube := clients(t, home)
	installCRDs(t, dyn, "DestinationRule")
	ctx := context.Background()
	ns := testNamespace(t, kube, "follower")
	var leader atomic.Bool
	s := runSourceWith(t, home, Options{MayWrite: leader.Load, Namespaces: []string{ns}})

	drs := dyn.Resource(drGVR).Namespace(ns)
	bad := map[string]any{"host": "echo", "trafficPolicy": map[string]any{"connectionPool": map[string]any{"tcp": map[string]any{"idleTimeout": "soon"}}}}
	if _, err := drs.Create(ctx, istioObject(drGVR, "DestinationRule", ns, "bad", true, bad), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		if !slices.Contains(rejectedIn(s.Status(), drKind, ns), ns+"/bad") {
			return errNotYet
		}
		return nil
	})
	if n, _ := rejections(ctx, kube, ns, "bad"); n != 0 {
		t.Errorf("%d Events recorded by a replica that may not write", n)
	}
	leader.Store(true)
	u := mustGet(t, drs, "bad")
	u.SetAnnotations(map[string]string{"touched": "yes"})
	if _, err := drs.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Minute, func() error {
		if n, err := rejections(ctx, kube, ns, "bad"); err != nil || n != 1 {
			return fmt.Errorf("%d rejection events (%v), want 1", n, err)
		}
		return nil
	})
}
