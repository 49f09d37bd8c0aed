package charts

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// The chart's alert rules and their promtool unit tests.
var (
	rulesFile     = filepath.Join("hub", "files", "prometheus-rules.yaml")
	rulesTestFile = filepath.Join("hub", "files", "prometheus-rules_test.yaml")
)

// ruleFile is the part of Prometheus's rule-file format these tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// rulesPromtool returns the promtool that HUB_PROMTOOL_BIN names (built by
// internal/tools/promtool/build.sh; `make test` sets it), or ends the test:
// it fails in CI and skips elsewhere.
func rulesPromtool(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("HUB_PROMTOOL_BIN")
	msg := ""
	if bin == "" {
		msg = "HUB_PROMTOOL_BIN is not set"
	} else if _, err := os.Stat(bin); err != nil {
		msg = "HUB_PROMTOOL_BIN: " + err.Error()
	}
	if msg == "" {
		return bin
	}
	msg += `: export HUB_PROMTOOL_BIN=$(internal/tools/promtool/build.sh)`
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg + " (skipping outside CI; in CI this fails)")
	return ""
}

// runPromtool runs promtool with args and returns its combined output and
// whether it exited 0; it fails the test if promtool could not run at all.
func runPromtool(t *testing.T, bin string, args ...string) (string, bool) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if _, exited := err.(*exec.ExitError); err != nil && !exited {
		t.Fatalf("running %s %s: %v", bin, strings.Join(args, " "), err)
	}
	return out.String(), err == nil
}

func loadRules(t *testing.T, path string) ruleFile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return f
}

// TestPrometheusRulesCheck: a real `promtool check rules`, with every lint
// check fatal, accepts the chart's rules and counts all of them.
func TestPrometheusRulesCheck(t *testing.T) {
	bin := rulesPromtool(t)
	n := 0
	for _, g := range loadRules(t, rulesFile).Groups {
		n += len(g.Rules)
	}
	out, ok := runPromtool(t, bin, "check", "rules", "--lint=all", "--lint-fatal", rulesFile)
	if want := fmt.Sprintf("SUCCESS: %d rules found", n); !ok || !strings.Contains(out, want) {
		t.Fatalf("promtool check rules (want %q):\n%s", want, out)
	}
}

// TestPrometheusRulesUnitTests: a real `promtool test rules` passes the
// recorded series of prometheus-rules_test.yaml through the rules.
func TestPrometheusRulesUnitTests(t *testing.T) {
	bin := rulesPromtool(t)
	if out, ok := runPromtool(t, bin, "test", "rules", rulesTestFile); !ok || !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules:\n%s", out)
	}
}

// TestPrometheusRulesConventions: every rule is an alert with a severity of
// warning or critical, a summary and a description, and a `for:` of at
// least a minute (no alert fires on a single evaluation).
func TestPrometheusRulesConventions(t *testing.T) {
	seen := map[string]bool{}
	for _, g := range loadRules(t, rulesFile).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule that is not an alert (record %q)", g.Name, r.Record)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("%s: defined twice", r.Alert)
			}
			seen[r.Alert] = true
			if !strings.HasPrefix(r.Alert, "Hub") {
				t.Errorf("%s: alert names start with Hub", r.Alert)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q; want warning or critical", r.Alert, s)
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
			if d, err := time.ParseDuration(r.For); err != nil || d < time.Minute {
				t.Errorf("%s: for %q; want at least 1m", r.Alert, r.For)
			}
		}
	}
}

// failedAlert is how promtool names an alert whose expectation failed.
var failedAlert = regexp.MustCompile(`alertname: (\w+), time:`)

// TestPrometheusRulesForBoundaries proves that the unit tests pin each
// alert's `for:` on both sides: with every `for:` one evaluation interval
// (1m) shorter, each alert fires where a test expects it not to yet; one
// longer, it does not fire where a test expects it to. promtool reports
// every failed expectation, so one run per direction names every alert.
func TestPrometheusRulesForBoundaries(t *testing.T) {
	bin := rulesPromtool(t)
	testData, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, shift := range []time.Duration{-time.Minute, time.Minute} {
		t.Run(fmt.Sprintf("for%+dm", int(shift/time.Minute)), func(t *testing.T) {
			f := loadRules(t, rulesFile)
			var alerts []string
			for gi := range f.Groups {
				for ri := range f.Groups[gi].Rules {
					r := &f.Groups[gi].Rules[ri]
					d, err := time.ParseDuration(r.For)
					if err != nil {
						t.Fatalf("%s: for %q: %v", r.Alert, r.For, err)
					}
					r.For = fmt.Sprintf("%dm", int((d+shift)/time.Minute))
					alerts = append(alerts, r.Alert)
				}
			}
			mutated, err := yaml.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			for name, data := range map[string][]byte{filepath.Base(rulesFile): mutated, filepath.Base(rulesTestFile): testData} {
				if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			out, ok := runPromtool(t, bin, "test", "rules", filepath.Join(dir, filepath.Base(rulesTestFile)))
			if ok {
				t.Fatalf("the unit tests pass with every for: shifted by %s:\n%s", shift, out)
			}
			failed := map[string]bool{}
			for _, m := range failedAlert.FindAllStringSubmatch(out, -1) {
				failed[m[1]] = true
			}
			var untested []string
			for _, a := range alerts {
				if !failed[a] {
					untested = append(untested, a)
				}
			}
			if len(untested) > 0 {
				slices.Sort(untested)
				t.Errorf("no unit test fails with the for: of %v shifted by %s; promtool said:\n%s", untested, shift, out)
			}
		})
	}
}
