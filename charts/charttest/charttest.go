// Package charttest runs the real helm on the charts in charts/ for tests
// (charts/chart_*_test.go, e2e/deploy_test.go) and parses what it renders.
package charttest

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Helm returns the helm binary from HUB_HELM_BIN (internal/tools/helm/build.sh
// prints it): missing, the test fails in CI (CI set) and is skipped
// elsewhere, like localcluster.Require.
func Helm(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("HUB_HELM_BIN")
	if bin == "" {
		msg := "HUB_HELM_BIN is not set (internal/tools/helm/build.sh prints it)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg + " (skipping outside CI; in CI this fails)")
	}
	return bin
}

// Dir is charts/ in this checkout.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Run runs helm in charts/ and returns its stdout, failing the test unless
// it exits 0.
func Run(t testing.TB, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(Helm(t), args...)
	cmd.Dir = Dir()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

// Template is `helm template` of the chart charts/<chart> in namespace.
func Template(t testing.TB, chart, namespace string, args ...string) []byte {
	t.Helper()
	return Run(t, append([]string{"template", chart, chart, "--namespace", namespace}, args...)...)
}

// Manifest is one object of a multi-document manifest: its YAML and identity.
type Manifest struct {
	Raw                        []byte
	Kind, APIVersion, NS, Name string
}

// Key is kind/namespace/name ("" namespace for cluster-scoped objects).
func (m Manifest) Key() string { return m.Kind + "/" + m.NS + "/" + m.Name }

// Split parses multi-document YAML; empty documents (a template that renders
// nothing) are skipped.
func Split(t testing.TB, data []byte) []Manifest {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []Manifest
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if meta.Kind == "" {
			continue
		}
		out = append(out, Manifest{Raw: doc, Kind: meta.Kind, APIVersion: meta.APIVersion, NS: meta.Metadata.Namespace, Name: meta.Metadata.Name})
	}
}

// Join is the multi-document YAML of some manifests.
func Join(ms []Manifest) []byte {
	var b bytes.Buffer
	for _, m := range ms {
		b.WriteString("---\n")
		b.Write(m.Raw)
		b.WriteString("\n")
	}
	return b.Bytes()
}
