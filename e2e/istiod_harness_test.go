package e2e

// A real istiod (Istio's pilot-discovery, built from the same Istio module as
// adscclient by e2e/interop/build-istiod.sh) as a child process against a
// local cluster's API server, for the MCP-over-XDS tests (DESIGN §3.7).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hubmesh/hub/internal/istiod"
	"github.com/hubmesh/hub/internal/istiomod"
	"github.com/hubmesh/hub/internal/localcluster"
)

// istiodBinEnv names the pilot-discovery binary; `make test` builds it with
// e2e/interop/build-istiod.sh and exports it.
const istiodBinEnv = istiomod.IstiodBinEnv

// istiodBin returns $HUB_ISTIOD_BIN, or fails the test in CI and skips it
// elsewhere, saying how to get the binary.
func istiodBin(t *testing.T) string {
	t.Helper()
	const how = "build it with `e2e/interop/build-istiod.sh` (~11 min cold on 2 cores; prints the cached binary's path) " +
		"and export " + istiodBinEnv + "=<that path>, or run `make test`"
	return binaryFromEnv(t, istiodBinEnv, how)
}

// istiodConfigSource is one entry of meshConfig.configSources.
type istiodConfigSource = istiod.ConfigSource

// istiodOptions configures startIstiod.
type istiodOptions struct {
	// ConfigSources of the mesh config; empty means [{address: "k8s://"}].
	ConfigSources []istiodConfigSource
	// ClusterID is istiod's cluster ID (--clusterID); empty means the local
	// cluster's name.
	ClusterID string
	// SystemNamespace is istiod's own namespace (POD_NAMESPACE), created if
	// missing; empty means "istio-system".
	SystemNamespace string
	// TrustDomain and Host: see istiod.Options.
	TrustDomain, Host string
	// Env and Args are added to istiod's environment and command line.
	Env, Args []string
}

// istiodProcess is a running istiod.
type istiodProcess struct{ *istiod.Process }

// startIstiod runs pilot-discovery against c's API server (admin kubeconfig)
// with the given mesh config sources (see istiod.Start) after installing the
// Istio CRDs in c, and waits until /ready answers 200. The process is
// stopped at the end of the test; its log is printed when the test failed.
func startIstiod(t *testing.T, c *localcluster.Cluster, o istiodOptions) *istiodProcess {
	t.Helper()
	bin := istiodBin(t)
	ctx := testContext(t)
	if err := istiod.InstallCRDs(ctx, c.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	if o.SystemNamespace == "" {
		o.SystemNamespace = "istio-system"
	}
	if o.ClusterID == "" {
		o.ClusterID = c.Name
	}
	if err := localcluster.EnsureNamespace(ctx, client(t, c), o.SystemNamespace); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, err := istiod.Start(ctx, istiod.Options{
		Bin: bin, Dir: dir, Kubeconfig: c.Kubeconfig(), ConfigSources: o.ConfigSources,
		ClusterID: o.ClusterID, SystemNamespace: o.SystemNamespace, TrustDomain: o.TrustDomain, Host: o.Host, Env: o.Env, Args: o.Args,
	})
	if err != nil {
		data, _ := os.ReadFile(filepath.Join(dir, "istiod.log"))
		t.Fatalf("%v; istiod log:\n%s", err, tail(string(data), 80))
	}
	t.Cleanup(func() {
		if p.Stop() {
			t.Logf("istiod did not stop within 20s of SIGTERM; killed")
		}
		if t.Failed() {
			data, _ := os.ReadFile(p.LogPath)
			t.Logf("istiod log (%s):\n%s", p.LogPath, tail(string(data), 80))
		}
	})
	return &istiodProcess{p}
}

// istiodConfig is one config object istiod holds, as /debug/configz lists
// it (a Kubernetes-style object; for an MCP source, resourceVersion is the
// resource's metadata.version).
type istiodConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string `json:"name"`
		Namespace       string `json:"namespace"`
		ResourceVersion string `json:"resourceVersion"`
		// CreationTimestamp is RFC 3339 (for an MCP source, its create_time).
		CreationTimestamp string            `json:"creationTimestamp"`
		Labels            map[string]string `json:"labels"`
		Annotations       map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

// Key is "<Kind>/<namespace>/<name>", e.g. "ServiceEntry/demo/echo".
func (c istiodConfig) Key() string {
	return c.Kind + "/" + c.Metadata.Namespace + "/" + c.Metadata.Name
}

// configz lists the config istiod holds (/debug/configz), from every source.
func (p *istiodProcess) configz() ([]istiodConfig, error) {
	body, status, err := p.Get("/debug/configz")
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("istiod /debug/configz: %d %s", status, tail(string(body), 5))
	}
	var out []istiodConfig
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("istiod /debug/configz: decoding: %w", err)
	}
	return out, nil
}

// waitConfig waits until /debug/configz holds an object with the given key
// (see istiodConfig.Key) and returns it; with gone set, it waits until
// there is none and returns the zero value.
func (p *istiodProcess) waitConfig(t *testing.T, timeout time.Duration, key string, gone bool) istiodConfig {
	t.Helper()
	var found istiodConfig
	eventually(t, timeout, func() error {
		if err := p.Exited(); err != nil {
			t.Fatal(err)
		}
		list, err := p.configz()
		if err != nil {
			return err
		}
		var keys []string
		for _, c := range list {
			if c.Key() == key {
				if gone {
					return fmt.Errorf("istiod still holds %s", key)
				}
				found = c
				return nil
			}
			keys = append(keys, c.Key())
		}
		if gone {
			return nil
		}
		return fmt.Errorf("istiod holds no %s; it holds %v", key, keys)
	})
	return found
}

// mark returns how many lines r has printed so far (for waitLineAfter).
func (r *adscRun) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lines)
}

// waitLineAfter waits, without polling, until a line printed after mark
// satisfies match, so that a state that held earlier (e.g. a CDS list
// before an object was added) does not match.
func (r *adscRun) waitLineAfter(t *testing.T, mark int, timeout time.Duration, what string, match func(adscLine) bool) adscLine {
	t.Helper()
	deadline := time.After(timeout)
	seen := mark
	for {
		r.mu.Lock()
		lines, more := r.lines[seen:], r.more
		seen = len(r.lines)
		r.mu.Unlock()
		for _, l := range lines {
			if match(l) {
				return l
			}
		}
		select {
		case <-more:
		case <-r.done:
			r.mu.Lock()
			rest := len(r.lines) > seen
			r.mu.Unlock()
			if !rest {
				t.Fatalf("adscclient %s exited (code %d) before %s", r.name, r.code, what)
			}
		case <-deadline:
			t.Fatalf("adscclient %s: no %s within %s", r.name, what, timeout)
		}
	}
}

// installIstioCRDs creates every Istio CRD in c (see istiod.InstallCRDs).
func installIstioCRDs(t *testing.T, c *localcluster.Cluster) {
	t.Helper()
	if err := istiod.InstallCRDs(testContext(t), c.RESTConfig()); err != nil {
		t.Fatal(err)
	}
}
