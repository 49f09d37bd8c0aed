package charts

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"
)

// helmLabels are Helm's bookkeeping labels, the only difference allowed
// between a chart's render and deploy/.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance"}

// stripHelm drops Helm's bookkeeping labels from an object's metadata.
func stripHelm(t *testing.T, o object) object {
	t.Helper()
	md, _ := o["metadata"].(map[string]any)
	labels, _ := md["labels"].(map[string]any)
	for _, l := range helmLabels {
		if _, ok := labels[l]; !ok {
			t.Errorf("%s lacks Helm's label %s", o.key(), l)
		}
		delete(labels, l)
	}
	return o
}

// deployObjects parses deploy/ files.
func deployObjects(t *testing.T, files ...string) map[string]object {
	t.Helper()
	var objs []object
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join("..", "deploy", f))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, parseManifests(t, "deploy/"+f, data)...)
	}
	return byKey(t, "deploy/", objs)
}

// requireSameObjects compares two sets of objects exactly.
func requireSameObjects(t *testing.T, chartName string, chart, deploy map[string]object) {
	t.Helper()
	for k, d := range deploy {
		c, ok := chart[k]
		if !ok {
			t.Errorf("%s is in deploy/ but not in the %s chart's render", k, chartName)
			continue
		}
		if !reflect.DeepEqual(map[string]any(c), map[string]any(d)) {
			cy, _ := yaml.Marshal(c)
			dy, _ := yaml.Marshal(d)
			t.Errorf("%s differs:\n--- %s chart render\n%s--- deploy/\n%s", k, chartName, cy, dy)
		}
	}
	for k := range chart {
		if _, ok := deploy[k]; !ok {
			t.Errorf("%s is in the %s chart's render but not in deploy/", k, chartName)
		}
	}
	if t.Failed() {
		t.Logf("chart: %s\ndeploy/: %s", fmtKeys(chart), fmtKeys(deploy))
	}
}

// TestChartMatchesDeploy proves deploy/ (kustomize users') equal to the
// charts' default renders, object by object, but for Helm's bookkeeping
// labels: deploy/'s base to the hub chart in hub-system (its Namespace
// aside: Helm does not template the release namespace, `helm install
// --create-namespace` creates it), home-sds-rbac.yaml to what
// homeSDS.enabled adds, and remote-member-rbac.yaml to the hub-member chart
// in istio-system. deploy/ is kept by hand for its comments, which say which
// code needs each rule; this test fails when the two drift.
func TestChartMatchesDeploy(t *testing.T) {
	var kust struct {
		Resources []string `json:"resources"`
	}
	data, err := os.ReadFile(filepath.Join("..", "deploy", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &kust); err != nil {
		t.Fatal(err)
	}
	base := deployObjects(t, kust.Resources...)
	if base["Namespace//hub-system"] == nil {
		t.Fatalf("deploy/ base has no Namespace hub-system: %s", fmtKeys(base))
	}
	delete(base, "Namespace//hub-system")

	strip := func(objs []object) map[string]object {
		for _, o := range objs {
			stripHelm(t, o)
		}
		return byKey(t, "render", objs)
	}
	t.Run("hub", func(t *testing.T) {
		requireSameObjects(t, "hub", strip(render(t, "hub", "hub-system")), base)
	})
	t.Run("hub homeSDS", func(t *testing.T) {
		withSDS := strip(render(t, "hub", "hub-system", "--set", "homeSDS.enabled=true"))
		for k := range base {
			delete(withSDS, k)
		}
		requireSameObjects(t, "hub (homeSDS.enabled, beyond the default)", withSDS, deployObjects(t, "home-sds-rbac.yaml"))
	})
	t.Run("hub-member", func(t *testing.T) {
		requireSameObjects(t, "hub-member", strip(render(t, "hub-member", "istio-system")), deployObjects(t, "remote-member-rbac.yaml"))
	})
}
