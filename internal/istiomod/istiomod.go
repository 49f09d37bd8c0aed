// Package istiomod finds files of the Istio module that e2e/interop
// requires, the one the tests build istiod, pilot-agent and adsc from, so
// that the Istio CRDs a test installs match the istiod it runs.
package istiomod

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// IstiodBinEnv names pilot-discovery built by e2e/interop/build-istiod.sh,
// which copies the module's CRDs next to it as istio-crds.yaml.
const IstiodBinEnv = "HUB_ISTIOD_BIN"

// crdPath is the CRD manifest's path inside the Istio module.
const crdPath = "manifests/charts/base/files/crd-all.gen.yaml"

// CRDs returns the Istio module's CRD manifest: the copy next to
// $HUB_ISTIOD_BIN if there is one, else the file in the module cache. It
// never downloads: a module that is not in the cache is an error that says
// how to get it (make istiod-bin), not an empty path.
func CRDs() ([]byte, error) {
	if bin := os.Getenv(IstiodBinEnv); bin != "" {
		data, err := os.ReadFile(filepath.Join(filepath.Dir(bin), "istio-crds.yaml"))
		if err == nil {
			return data, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	dir, err := moduleDir()
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(dir, crdPath))
}

// EnvoyBootstrapTemplate returns the path of Istio's Envoy bootstrap
// template in the module cache (tools/packaging/common/envoy_bootstrap.json),
// the --templateFile pilot-agent renders Envoy's bootstrap from, as the
// istio-proxy image ships it.
func EnvoyBootstrapTemplate() (string, error) {
	dir, err := moduleDir()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "tools/packaging/common/envoy_bootstrap.json")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("the Istio module's Envoy bootstrap template: %w", err)
	}
	return path, nil
}

// moduleDir returns the directory of e2e/interop's istio.io/istio in the
// module cache.
func moduleDir() (string, error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate e2e/interop: set " + IstiodBinEnv)
	}
	interop := filepath.Join(filepath.Dir(self), "..", "..", "e2e", "interop")
	cmd := exec.Command("go", "mod", "download", "-json", "istio.io/istio")
	cmd.Dir = interop
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=")
	out, err := cmd.Output() // the JSON carries the error too
	var mod struct{ Version, Dir, Error string }
	if jerr := json.Unmarshal(out, &mod); jerr != nil {
		return "", fmt.Errorf("go mod download istio.io/istio in %s: %v (%v)", interop, err, jerr)
	}
	if mod.Error != "" || mod.Dir == "" {
		return "", fmt.Errorf("istio.io/istio %s is not in the module cache (%s); run `make istiod-bin` or set %s", mod.Version, mod.Error, IstiodBinEnv)
	}
	return mod.Dir, nil
}
