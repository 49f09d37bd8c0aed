package clusters

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"

	"github.com/hubmesh/hub/internal/localcluster"
)

// TestServiceExportConditions: with --export-mode=serviceexport, two
// members on real API servers export a Service whose port 80 is TCP in
// one and UDP in the other: both ServiceExports get Valid=True and
// Conflict=True (PortConflict naming the other member), written into
// their status; once the protocols agree, Conflict=False (NoConflicts). A
// ServiceExport without its Service is Valid=False (NoService). The
// registry reports the same per member.
func TestServiceExportConditions(t *testing.T) {
	ctx := context.Background()
	sink := newRecordingSink()
	r, ns := startRegistryWith(t, func(c *Config) { c.SyncTimeout, c.Sink, c.ExportMode = 30*time.Second, sink, ExportServiceExport })
	app := "mcs-" + rand.String(5)
	dyn := map[string]dynamic.Interface{}
	for id, name := range map[string]string{"x1": "member1", "x2": "member2"} {
		c := env.Cluster(name)
		d, err := localcluster.InstallServiceExportCRD(ctx, c.RESTConfig())
		if err != nil {
			t.Fatal(err)
		}
		dyn[id] = d
		kc := kube(t, c)
		if err := localcluster.EnsureNamespace(ctx, kc, app); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kc.CoreV1().Namespaces().Delete(context.Background(), app, metav1.DeleteOptions{}) })
		if err := localcluster.ApplyService(ctx, kc, app, "web", "http", 80, []localcluster.Backend{{IP: "198.18.40.1", Port: 8080}}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Resource(localcluster.ServiceExportGVR).Namespace(app).Create(ctx, localcluster.ServiceExport(app, "web"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setProtocol := func(t *testing.T, p corev1.Protocol) {
		t.Helper()
		kc := kube(t, env.Cluster("member2"))
		svc, err := kc.CoreV1().Services(app).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Spec.Ports[0].Protocol = p
		if _, err := kc.CoreV1().Services(app).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setProtocol(t, corev1.ProtocolUDP)
	if _, err := dyn["x1"].Resource(localcluster.ServiceExportGVR).Namespace(app).Create(ctx, localcluster.ServiceExport(app, "ghost"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secret := localcluster.RemoteSecret(ns, "mcs", map[string][]byte{"x1": env.Cluster("member1").Kubeconfig(), "x2": env.Cluster("member2").Kubeconfig()})
	if _, err := kube(t, env.Cluster("home")).CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// written reads a ServiceExport's conditions from its status as
	// "Type=Status/Reason" and checks the registry reports the same.
	conditions := func(id, name string, want ...string) func() error {
		return func() error {
			obj, err := dyn[id].Resource(localcluster.ServiceExportGVR).Namespace(app).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
			var have []string
			for _, c := range conds {
				m := c.(map[string]any)
				have = append(have, fmt.Sprintf("%s=%s/%s", m["type"], m["status"], m["reason"]))
				if m["lastTransitionTime"] == "" || m["message"] == "" {
					return fmt.Errorf("condition %v lacks a time or message", m)
				}
			}
			if strings.Join(have, " ") != strings.Join(want, " ") {
				return fmt.Errorf("%s's ServiceExport %s has %v, want %v", id, name, have, want)
			}
			st, _ := r.Cluster(id)
			es, ok := st.ServiceExports[ServiceKey{Namespace: app, Name: name}]
			if !ok || !es.Written || es.WriteError != "" {
				return fmt.Errorf("%s reports %+v for %s", id, es, name)
			}
			return nil
		}
	}
	eventually(t, 60*time.Second, conditions("x1", "web", "Valid=True/ServiceExported", "Conflict=True/PortConflict"))
	eventually(t, 10*time.Second, conditions("x2", "web", "Valid=True/ServiceExported", "Conflict=True/PortConflict"))
	eventually(t, 10*time.Second, conditions("x1", "ghost", "Valid=False/NoService", "Conflict=False/NoService"))
	st, _ := r.Cluster("x1")
	if msg := st.ServiceExports[ServiceKey{Namespace: app, Name: "web"}].Conditions[1].Message; !strings.Contains(msg, "port 80 is TCP here and UDP in x2") {
		t.Errorf("x1's conflict message = %q", msg)
	}

	setProtocol(t, corev1.ProtocolTCP)
	eventually(t, 30*time.Second, conditions("x1", "web", "Valid=True/ServiceExported", "Conflict=False/NoConflicts"))
	eventually(t, 10*time.Second, conditions("x2", "web", "Valid=True/ServiceExported", "Conflict=False/NoConflicts"))
}

// TestServiceExportCRDInstalledLater: in export mode serviceexport a member
// whose API server does not serve ServiceExports exports nothing (and runs
// no informer that cannot list); once the CRD is installed, a poll finds it
// and its ServiceExports count.
func TestServiceExportCRDInstalledLater(t *testing.T) {
	ctx := context.Background()
	sink := newRecordingSink()
	r, ns := startRegistryWith(t, func(c *Config) {
		c.SyncTimeout, c.Sink, c.ExportMode, c.ServiceExportPoll = 30*time.Second, sink, ExportServiceExport, 200*time.Millisecond
	})
	// The home API server: no test installs the CRD there but this one,
	// which removes it again.
	c := env.Cluster("home")
	kc := kube(t, c)
	app := "late-" + rand.String(5)
	if err := localcluster.EnsureNamespace(ctx, kc, app); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kc.CoreV1().Namespaces().Delete(context.Background(), app, metav1.DeleteOptions{}) })
	if err := localcluster.ApplyService(ctx, kc, app, "web", "http", 80, []localcluster.Backend{{IP: "198.18.41.1", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	secret := localcluster.RemoteSecret(ns, "late", map[string][]byte{"late": c.Kubeconfig()})
	secret.Annotations = map[string]string{AnnotationWatchNamespaces: app}
	if _, err := kc.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	key := ServiceKey{Namespace: app, Name: "web"}
	exported := func(want bool, reason string) func() error {
		return func() error {
			svc := sink.service("late", key)
			if svc == nil || svc.NotExported == want || !strings.Contains(svc.ExportReason, reason) {
				return fmt.Errorf("web in late: %+v; want exported %v (reason containing %q)", svc, want, reason)
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, exported(false, "CRD is absent"))

	d, err := localcluster.InstallServiceExportCRD(ctx, c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Resource(localcluster.CRDGVR).Delete(context.Background(), "serviceexports.multicluster.x-k8s.io", metav1.DeleteOptions{})
	})
	eventually(t, 30*time.Second, exported(false, "no ServiceExport"))
	if _, err := d.Resource(localcluster.ServiceExportGVR).Namespace(app).Create(ctx, localcluster.ServiceExport(app, "web"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, exported(true, ""))
	if st, _ := r.Cluster("late"); st.Objects["ServiceExport"] != 1 {
		t.Errorf("late holds %v", st.Objects)
	}
}

// TestExportConflictsNameOnlyWhatTheReaderIsOffered: a ServiceExport's
// Conflict condition, read in its member, names only the members whose
// views are exported to that member; a clash with a view kept from it
// (hub.federation/export-to) is not reported there.
func TestExportConflictsNameOnlyWhatTheReaderIsOffered(t *testing.T) {
	ports := map[string]exportedView{
		"west":  {ports: []ServicePort{{Port: 80, Protocol: "TCP"}}},
		"east":  {ports: []ServicePort{{Port: 80, Protocol: "UDP"}}, exportTo: []string{"north"}},
		"north": {ports: []ServicePort{{Port: 80, Protocol: "SCTP"}}},
	}
	conflict := func(member string) string {
		for _, c := range exportConditions(member, false, ports) {
			if c.Type == ConditionConflict {
				return c.Message
			}
		}
		return ""
	}
	if got := conflict("west"); strings.Contains(got, "east") || strings.Contains(got, "UDP") || !strings.Contains(got, "SCTP in north") {
		t.Errorf("west's Conflict: %q; want north's clash only, nothing of east's view (exported to north only)", got)
	}
	if got := conflict("north"); !strings.Contains(got, "UDP in east") || !strings.Contains(got, "TCP in west") {
		t.Errorf("north's Conflict: %q; want east's and west's clashes", got)
	}
}
