// Package charts holds the tests of the Helm charts in this directory (hub,
// hub-member), run with a real helm binary (HUB_HELM_BIN, built by
// internal/tools/helm/build.sh). e2e/deploy_test.go applies their renders to real
// API servers and runs the hub with their RBAC.
package charts

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hubmesh/hub/charts/charttest"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// object is one parsed manifest.
type object map[string]any

func (o object) str(path ...string) string {
	var v any = map[string]any(o)
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[p]
	}
	s, _ := v.(string)
	return s
}

// key is kind/namespace/name ("" namespace for cluster-scoped objects).
func (o object) key() string {
	return o.str("kind") + "/" + o.str("metadata", "namespace") + "/" + o.str("metadata", "name")
}

// parseManifests parses a multi-document manifest into objects.
func parseManifests(t *testing.T, name string, data []byte) []object {
	t.Helper()
	var objs []object
	for _, m := range charttest.Split(t, data) {
		var o object
		if err := yaml.Unmarshal(m.Raw, &o); err != nil {
			t.Fatalf("%s: %s: %v", name, m.Key(), err)
		}
		objs = append(objs, o)
	}
	return objs
}

// byKey indexes objects by key, failing on a duplicate.
func byKey(t *testing.T, name string, objs []object) map[string]object {
	t.Helper()
	m := map[string]object{}
	for _, o := range objs {
		if _, dup := m[o.key()]; dup {
			t.Errorf("%s: %s twice", name, o.key())
		}
		m[o.key()] = o
	}
	return m
}

// render is `helm template` of a chart in this directory.
func render(t *testing.T, chart, namespace string, args ...string) []object {
	t.Helper()
	return parseManifests(t, chart+" "+strings.Join(args, " "), charttest.Template(t, chart, namespace, args...))
}

// decodeStrictInto decodes an object into its typed form v, refusing
// unknown fields (a misspelt field in a template fails here, not silently
// in a cluster).
func decodeStrictInto(t *testing.T, o object, v any) {
	t.Helper()
	data, err := yaml.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		t.Fatalf("%s: %v", o.key(), err)
	}
}

// decodeStrict is decodeStrictInto a new T.
func decodeStrict[T any](t *testing.T, o object) *T {
	t.Helper()
	v := new(T)
	decodeStrictInto(t, o, v)
	return v
}

// typed are the kinds the hub chart renders, each with a new value of its
// Go type (nil: a custom resource's kind, without one here).
var typed = map[string]func() any{
	"Deployment":              func() any { return new(appsv1.Deployment) },
	"Service":                 func() any { return new(corev1.Service) },
	"ServiceAccount":          func() any { return new(corev1.ServiceAccount) },
	"Role":                    func() any { return new(rbacv1.Role) },
	"ClusterRole":             func() any { return new(rbacv1.ClusterRole) },
	"RoleBinding":             func() any { return new(rbacv1.RoleBinding) },
	"ClusterRoleBinding":      func() any { return new(rbacv1.ClusterRoleBinding) },
	"PodDisruptionBudget":     func() any { return new(policyv1.PodDisruptionBudget) },
	"NetworkPolicy":           func() any { return new(networkingv1.NetworkPolicy) },
	"HorizontalPodAutoscaler": func() any { return new(autoscalingv2.HorizontalPodAutoscaler) },
	"ServiceMonitor":          nil,
	"PrometheusRule":          nil,
}

// ciValues are the chart's other values files (charts/hub/ci).
func ciValues(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("hub", "ci", "*-values.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("charts/hub/ci: %v %v, want at least two values files", files, err)
	}
	return files
}

// TestChartLint lints both charts with the real helm, the hub chart with its
// default values and every values file in charts/hub/ci.
func TestChartLint(t *testing.T) {
	charttest.Run(t, "lint", "--strict", "hub-member")
	charttest.Run(t, "lint", "--strict", "hub")
	for _, f := range ciValues(t) {
		charttest.Run(t, "lint", "--strict", "hub", "--namespace", "hub-lint", "-f", f)
	}
}

// hubFlags are the flags `hub serve` accepts, from docs/reference.md's flag
// reference (cmd/hub/readme_test.go keeps it equal to `hub serve --help`).
func hubFlags(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "docs", "reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, ref, ok := strings.Cut(string(readme), "<!-- hub serve --help: begin")
	ref, _, ok2 := strings.Cut(ref, "<!-- hub serve --help: end")
	if !ok || !ok2 {
		t.Fatal("docs/reference.md has no hub serve --help reference")
	}
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(ref, -1) {
		flags = append(flags, m[1])
	}
	return flags
}

// requireKnownFlags checks that every argument of the hub container is a
// flag `hub serve` has, each given once.
func requireKnownFlags(t *testing.T, args []string) {
	t.Helper()
	known := hubFlags(t)
	seen := map[string]bool{}
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !slices.Contains(known, name) {
			t.Errorf("argument %q is not a flag of hub serve", a)
		}
		if seen[name] {
			t.Errorf("flag --%s given twice", name)
		}
		seen[name] = true
	}
}

// TestChartTemplate renders the hub chart for its default values and each
// ci values file and checks what each values file is for, on objects decoded
// strictly into their Kubernetes types.
func TestChartTemplate(t *testing.T) {
	type rendered struct {
		objs map[string]object
		dep  *appsv1.Deployment
	}
	do := func(t *testing.T, ns string, args ...string) rendered {
		objs := byKey(t, "render", render(t, "hub", ns, args...))
		var r rendered
		r.objs = objs
		for k, o := range objs {
			newTyped, ok := typed[o.str("kind")]
			if !ok {
				t.Errorf("unexpected object %s", k)
				continue
			}
			if newTyped == nil { // a CRD's kind: no Go type here
				continue
			}
			v := newTyped()
			decodeStrictInto(t, o, v)
			switch v := v.(type) {
			case *appsv1.Deployment:
				r.dep = v
			case *rbacv1.RoleBinding:
				requireSubject(t, k, v.Subjects, ns)
			case *rbacv1.ClusterRoleBinding:
				requireSubject(t, k, v.Subjects, ns)
			}
			if ons := o.str("metadata", "namespace"); ons == "" && !strings.HasPrefix(o.str("kind"), "Cluster") {
				t.Errorf("%s names no namespace", k)
			}
		}
		if r.dep == nil {
			t.Fatal("no Deployment rendered")
		}
		requireKnownFlags(t, r.dep.Spec.Template.Spec.Containers[0].Args)
		return r
	}
	arg := func(d *appsv1.Deployment, flag string) string {
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
				return v
			}
		}
		return "<unset>"
	}

	t.Run("default", func(t *testing.T) {
		r := do(t, "mesh-hub")
		d := r.dep
		if *d.Spec.Replicas != 2 || r.objs["PodDisruptionBudget/mesh-hub/hub"] == nil || r.objs["HorizontalPodAutoscaler/mesh-hub/hub"] != nil {
			t.Errorf("default: replicas %d, PDB %v, HPA %v; want 2 replicas, a PDB and no HPA", *d.Spec.Replicas,
				r.objs["PodDisruptionBudget/mesh-hub/hub"] != nil, r.objs["HorizontalPodAutoscaler/mesh-hub/hub"] != nil)
		}
		if got := arg(d, "tls-dns-names"); got != "hub.mesh-hub.svc,hub.mesh-hub.svc.cluster.local,hub.mesh-hub" {
			t.Errorf("--tls-dns-names=%s; want the Service's names in the release namespace", got)
		}
		if a := d.Spec.Template.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != "8080" {
			t.Errorf("pod annotations %v; want Prometheus scrape annotations", a)
		}
		var keys []string
		for _, c := range d.Spec.Template.Spec.TopologySpreadConstraints {
			keys = append(keys, c.TopologyKey+"/"+string(c.WhenUnsatisfiable))
		}
		if !slices.Equal(keys, []string{"kubernetes.io/hostname/ScheduleAnyway", "topology.kubernetes.io/zone/ScheduleAnyway"}) {
			t.Errorf("topology spread %v; want hostname and zone, ScheduleAnyway", keys)
		}
		for _, k := range []string{"Role/istio-system/hub-remote-secrets", "Role/istio-system/hub-gateways", "Role/mesh-hub/hub", "ClusterRole//hub"} {
			if r.objs[k] == nil {
				t.Errorf("no %s", k)
			}
		}
	})

	t.Run("canary", func(t *testing.T) {
		r := do(t, "hub-canary-ns", "-f", filepath.Join("hub", "ci", "canary-values.yaml"))
		d := r.dep
		if d.Name != "hub-canary" || *d.Spec.Replicas != 1 || d.Spec.Selector.MatchLabels["hub.mesh/rev"] != "canary" ||
			d.Spec.Template.Spec.ServiceAccountName != "hub-canary" {
			t.Errorf("Deployment %s replicas %d selector %v SA %s; want hub-canary, 1, hub.mesh/rev=canary, hub-canary",
				d.Name, *d.Spec.Replicas, d.Spec.Selector.MatchLabels, d.Spec.Template.Spec.ServiceAccountName)
		}
		if len(d.Spec.Template.Spec.TopologySpreadConstraints) != 0 {
			t.Errorf("topology spread %v; want none", d.Spec.Template.Spec.TopologySpreadConstraints)
		}
		if got := arg(d, "tls-dns-names"); got != "hub-canary.hub-canary-ns.svc,hub-canary.hub-canary-ns.svc.cluster.local,hub-canary.hub-canary-ns" {
			t.Errorf("--tls-dns-names=%s", got)
		}
		for _, k := range []string{"Role/hub-e2e-remote/hub-canary-remote-secrets", "Role/hub-e2e-root/hub-canary-events",
			"Role/istio-system/hub-canary-gateways", "Role/hub-canary-ns/hub-canary", "ClusterRole//hub-canary", "Service/hub-canary-ns/hub-canary"} {
			if r.objs[k] == nil {
				t.Errorf("no %s", k)
			}
		}
		for k := range r.objs {
			if strings.HasPrefix(k, "PodDisruptionBudget/") || strings.Contains(k, "/istio-system/hub-remote-secrets") {
				t.Errorf("unexpected %s", k)
			}
		}
		if arg(d, "remote-secrets-namespace") != "hub-e2e-remote" || arg(d, "root-namespace") != "hub-e2e-root" {
			t.Errorf("args %v", d.Spec.Template.Spec.Containers[0].Args)
		}
	})

	t.Run("full", func(t *testing.T) {
		r := do(t, "hub-full", "-f", filepath.Join("hub", "ci", "full-values.yaml"))
		d := r.dep
		spec := d.Spec.Template.Spec
		if d.Spec.Replicas != nil {
			t.Errorf("replicas %d with autoscaling; want none (the HPA's)", *d.Spec.Replicas)
		}
		hpa := decodeStrict[autoscalingv2.HorizontalPodAutoscaler](t, r.objs["HorizontalPodAutoscaler/hub-full/hub"])
		if *hpa.Spec.MinReplicas != 3 || hpa.Spec.MaxReplicas != 7 || *hpa.Spec.Metrics[0].Resource.Target.AverageUtilization != 60 {
			t.Errorf("HPA %+v", hpa.Spec)
		}
		if spec.Containers[0].Image != "registry.example.com/mesh/hub:0.9.1" || spec.Containers[0].ImagePullPolicy != corev1.PullAlways {
			t.Errorf("image %s %s", spec.Containers[0].Image, spec.Containers[0].ImagePullPolicy)
		}
		if spec.NodeSelector["kubernetes.io/os"] != "linux" || len(spec.Tolerations) != 1 || spec.Affinity.NodeAffinity == nil ||
			spec.PriorityClassName != "system-cluster-critical" || d.Spec.Template.Labels["team"] != "mesh" ||
			d.Spec.Template.Annotations["example.com/team"] != "mesh" || d.Spec.Template.Annotations["prometheus.io/scrape"] != "true" {
			t.Errorf("scheduling/metadata not as in full-values.yaml: %+v %v", spec, d.Spec.Template.ObjectMeta)
		}
		if c := spec.TopologySpreadConstraints; len(c) != 1 || c[0].MaxSkew != 2 || c[0].LabelSelector.MatchLabels["app"] != "hub" {
			t.Errorf("topology spread %+v; want one zone constraint with the pods' selector filled in", c)
		}
		for flag, want := range map[string]string{
			"xds-addr": ":15010", "tls-dns-names": "hub.hub-full.svc,hub.hub-full.svc.cluster.local,hub.hub-full,hub.mesh.example.com",
			"distribute-namespaces": "istio-system,mesh-policy", "member-max-objects": "500000", "new-streams-per-second": "100",
			"admin-tls-cert": "/etc/hub/admin-tls/tls.crt", "bundle-profile": "https_web", "demote-unhealthy-members": "false",
			"debounce-after": "200ms",
		} {
			if got := arg(d, flag); got != want {
				t.Errorf("--%s=%s, want %s", flag, got, want)
			}
		}
		for _, k := range []string{"ServiceMonitor/hub-full/hub", "PrometheusRule/hub-full/hub", "ClusterRole//hub-home-sds",
			"Role/mesh-policy/hub-events", "Role/istio-system/hub-remote-secrets"} {
			if r.objs[k] == nil {
				t.Errorf("no %s", k)
			}
		}
		// The PrometheusRule carries files/prometheus-rules.yaml's groups.
		var file struct {
			Groups []any `json:"groups"`
		}
		data, err := os.ReadFile(filepath.Join("hub", "files", "prometheus-rules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &file); err != nil || len(file.Groups) == 0 {
			t.Fatalf("files/prometheus-rules.yaml: %v, %d groups", err, len(file.Groups))
		}
		got, _ := yaml.Marshal(r.objs["PrometheusRule/hub-full/hub"]["spec"].(map[string]any)["groups"])
		want, _ := yaml.Marshal(file.Groups)
		if !bytes.Equal(got, want) {
			t.Errorf("PrometheusRule groups:\n%s\nwant files/prometheus-rules.yaml's:\n%s", got, want)
		}
	})
}

func requireSubject(t *testing.T, key string, subjects []rbacv1.Subject, ns string) {
	t.Helper()
	if len(subjects) != 1 || subjects[0].Kind != "ServiceAccount" || subjects[0].Namespace != ns {
		t.Errorf("%s subjects %+v; want the hub's ServiceAccount in %s", key, subjects, ns)
	}
}

// fmtKeys lists a map's keys, sorted.
func fmtKeys[V any](m map[string]V) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return fmt.Sprint(keys)
}

// TestChartExposesEveryFlag: every flag of `hub serve` is one the chart's
// Deployment template sets, from a value or computed (the listen addresses,
// --tls-dns-names, --namespace): a flag added to the hub without a value in
// the chart fails here.
func TestChartExposesEveryFlag(t *testing.T) {
	tmpl, err := os.ReadFile(filepath.Join("hub", "templates", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range hubFlags(t) {
		if !strings.Contains(string(tmpl), `(list "`+f+`"`) && !regexp.MustCompile(`--`+regexp.QuoteMeta(f)+`\b`).Match(tmpl) {
			t.Errorf("hub serve --%s is not set anywhere in charts/hub/templates/deployment.yaml: give it a value in values.yaml", f)
		}
	}
}

// TestChartServicesKeepAdminApart: the Service an operator exposes to
// members (service.type) carries the xDS/CA port only; the admin port and
// the plaintext xDS port are in <name>-admin, ClusterIP whatever
// service.type says.
func TestChartServicesKeepAdminApart(t *testing.T) {
	const ns = "hub-system"
	objs := byKey(t, "render", render(t, "hub", ns, "--set", "service.type=LoadBalancer", "--set", "xdsPlaintextPort=15010"))
	ports := func(key string) (string, []string) {
		o, ok := objs[key]
		if !ok {
			t.Fatalf("no %s", key)
		}
		svc := decodeStrict[corev1.Service](t, o)
		var names []string
		for _, p := range svc.Spec.Ports {
			names = append(names, fmt.Sprintf("%s/%d", p.Name, p.Port))
		}
		return string(svc.Spec.Type), names
	}
	if typ, got := ports("Service/" + ns + "/hub"); typ != "LoadBalancer" || strings.Join(got, ",") != "https-xds/15012" {
		t.Errorf("Service hub: %s %v; want LoadBalancer with https-xds/15012 only", typ, got)
	}
	if typ, got := ports("Service/" + ns + "/hub-admin"); typ != "ClusterIP" || strings.Join(got, ",") != "http-admin/8080,grpc-xds/15010" {
		t.Errorf("Service hub-admin: %s %v; want ClusterIP with http-admin/8080 and grpc-xds/15010", typ, got)
	}
}

// TestChartPodOptsOutOfInjection: the hub pod carries Istio's opt-out
// label, so that no sidecar makes the plaintext port's callers look local
// (deploy/ has it too: TestChartMatchesDeploy).
func TestChartPodOptsOutOfInjection(t *testing.T) {
	const ns = "hub-system"
	objs := byKey(t, "render", render(t, "hub", ns))
	d := decodeStrict[appsv1.Deployment](t, objs["Deployment/"+ns+"/hub"])
	if v := d.Spec.Template.Labels["sidecar.istio.io/inject"]; v != "false" {
		t.Errorf("pod label sidecar.istio.io/inject = %q, want \"false\"", v)
	}
}
