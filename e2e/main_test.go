// Package e2e holds end-to-end tests that run the real hub binary against
// real local clusters with real xDS clients.
package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/hubproc"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/wait"
)

var (
	env     *localcluster.Env
	hubBin  string
	binsDir string
)

func TestMain(m *testing.M) {
	switch os.Getenv(clientRoleEnv) { // child processes: never return
	case "":
	case "xdsserver":
		runXDSServer()
	case "meshapp":
		runMeshApp()
	default:
		runXDSClient()
	}
	var err error
	binsDir, err = os.MkdirTemp("", "hub-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	hubBin = filepath.Join(binsDir, "hub")
	build := exec.Command("go", "build", "-o", hubBin, "github.com/hubmesh/hub/cmd/hub")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: building the hub binary: %v\n", err)
		os.Exit(1)
	}
	code := localcluster.RunTests(m, &env, "primary", "west", "east")
	os.RemoveAll(binsDir)
	os.Exit(code)
}

// hubProcess is a running hub binary and how the tests reach its API.
type hubProcess struct {
	*hubproc.Process // nil for the demo's hub, which its own binary runs
	adminURL         string
	xdsAddr          string
	logPath          string
	token            string            // an admin bearer token for the API
	addrs            map[string]string // listener name → address, from the hub's log
	stopOnce         sync.Once
}

// startHub runs the hub binary against the home cluster with free loopback
// ports and waits until /readyz answers 200.
func startHub(t *testing.T, home *localcluster.Cluster, extraArgs ...string) *hubProcess {
	t.Helper()
	return startHubAdminTLS(t, home, nil, extraArgs...)
}

// startHubAdminTLS is startHub for a hub whose admin port serves TLS when
// clientTLS is set: it waits for /readyz over HTTPS with a client that
// trusts clientTLS's roots.
func startHubAdminTLS(t *testing.T, home *localcluster.Cluster, clientTLS *tls.Config, extraArgs ...string) *hubProcess {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "home.kubeconfig")
	if err := os.WriteFile(kubeconfig, home.Kubeconfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	// Tests that name a namespace keep the hub's state and the remote
	// Secrets there; the others use the defaults (hub-system and
	// istio-system), which must exist.
	if ns, ok := flagValue(extraArgs, "--namespace"); ok {
		if _, given := flagValue(extraArgs, "--remote-secrets-namespace"); !given {
			extraArgs = append(extraArgs, "--remote-secrets-namespace", ns)
		}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, ns := range []string{"hub-system", "istio-system"} {
			if err := localcluster.EnsureNamespace(ctx, kubernetes.NewForConfigOrDie(home.RESTConfig()), ns); err != nil {
				t.Fatal(err)
			}
		}
	}
	args := append([]string{"serve",
		"--kubeconfig", kubeconfig, "--cluster-id", home.Name,
		"--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--xds-tls-addr", "", "--bundle-addr", "",
		"--remote-cluster-timeout", "20s", "--log-level", "debug",
	}, extraArgs...)
	p, err := hubproc.Start(hubproc.Options{Bin: hubBin, Args: args, LogPath: filepath.Join(dir, "hub.log")})
	if err != nil {
		t.Fatal(err)
	}
	h := &hubProcess{Process: p, logPath: p.LogPath(), token: home.AdminToken()}
	t.Cleanup(func() {
		h.stop(t)
		if t.Failed() {
			t.Logf("hub log:\n%s", h.Tail(60))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if h.addrs, err = p.Listening(ctx); err != nil {
		t.Fatal(err)
	}
	scheme, hc := "http://", http.DefaultClient
	if clientTLS != nil {
		scheme, hc = "https://", &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}, Timeout: 10 * time.Second}
	}
	h.adminURL, h.xdsAddr = scheme+h.addrs["admin"], h.addrs["xds"]
	eventually(t, 60*time.Second, func() error {
		if err := h.Exited(); err != nil {
			return err
		}
		resp, err := hc.Get(h.adminURL + "/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
	return h
}

// stop sends SIGTERM and waits for a clean exit (once: a hub a test killed
// or stopped itself is not stopped again).
func (h *hubProcess) stop(t *testing.T) {
	h.stopOnce.Do(func() {
		if err := h.Stop(20 * time.Second); err != nil {
			t.Errorf("hub did not exit cleanly on SIGTERM: %v", err)
		}
	})
}

func (h *hubProcess) clusters(t *testing.T) map[string]api.Cluster {
	t.Helper()
	var list api.List[api.Cluster]
	h.getJSON(t, "/api/v1/clusters", &list)
	out := map[string]api.Cluster{}
	for _, c := range list.Items {
		out[c.ID] = c
	}
	return out
}

func (h *hubProcess) getJSON(t *testing.T, path string, v any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.adminURL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", path, resp.Status, buf.String())
	}
	if err := json.Unmarshal(buf.Bytes(), v); err != nil {
		t.Fatalf("GET %s: decoding %q: %v", path, buf.String(), err)
	}
}

// eventually waits for cond (see internal/wait).
func eventually(t *testing.T, timeout time.Duration, cond func() error) {
	t.Helper()
	wait.Until(t, timeout, cond)
}

func client(t *testing.T, c *localcluster.Cluster) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// missing ends a test that needs a real component this machine lacks
// (docs/architecture.md §2): it fails in CI and skips elsewhere, saying so.
func missing(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg + " (skipping outside CI; in CI this fails)")
}

// binaryFromEnv returns the executable the environment variable env names,
// or ends the test (see missing) with how to build it.
func binaryFromEnv(t *testing.T, env, how string) string {
	t.Helper()
	bin := os.Getenv(env)
	if bin == "" {
		missing(t, env+" is not set: "+how)
	} else if _, err := os.Stat(bin); err != nil {
		missing(t, fmt.Sprintf("%s: %v: %s", env, err, how))
	}
	return bin
}

// flagValue is the value following name in args, if name is there.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}
