#!/usr/bin/env bash
# Builds Istio's pilot-discovery (istiod), pilot-agent (istio-agent) and
# istioctl from the Istio module this module requires (the same one
# adscclient is built from; go.mod lists the three as a `tool`) into the cache
# directory keyed by this module's go.mod, go.sum and this script, and prints
# the path of the binary named by the argument (pilot-discovery, the default,
# pilot-agent or istioctl) on stdout's last line. The same module's Istio CRDs are copied next to them as
# istio-crds.yaml (the e2e tests install them in the API server istiod
# watches). A cached build is reused; nothing is written inside the
# repository. With HUB_ISTIOD_BIN (pilot-discovery), HUB_PILOT_AGENT_BIN
# (pilot-agent) or HUB_ISTIOCTL_BIN (istioctl) set to an executable, that one
# is printed instead.
set -euo pipefail
NAME=${1:-pilot-discovery}
case "$NAME" in
  pilot-discovery) PRESET=${HUB_ISTIOD_BIN:-} ;;
  pilot-agent) PRESET=${HUB_PILOT_AGENT_BIN:-} ;;
  istioctl) PRESET=${HUB_ISTIOCTL_BIN:-} ;;
  *) echo "usage: $0 [pilot-discovery|pilot-agent|istioctl]" >&2; exit 2 ;;
esac
if [ -n "$PRESET" ] && [ -x "$PRESET" ]; then
  echo "$PRESET"; exit 0
fi
cd "$(dirname "$0")"
KEY=$(cat go.mod go.sum "$(basename "$0")" | sha256sum | cut -c1-16)
OUT=${XDG_CACHE_HOME:-$HOME/.cache}/hub/istio-$KEY
CRDS=$OUT/istio-crds.yaml
if [ -x "$OUT/pilot-discovery" ] && [ -x "$OUT/pilot-agent" ] && [ -x "$OUT/istioctl" ] && [ -f "$CRDS" ]; then
  echo "$OUT/$NAME"; exit 0
fi
# Download the module first: `go list -m -f {{.Dir}}` prints an empty
# directory for a module not yet in the module cache (a fresh machine), and
# the CRDs and the version stamp come from that directory.
go mod download istio.io/istio
DIR=$(go list -mod=readonly -m -f '{{.Dir}}' istio.io/istio)
V=$(go list -mod=readonly -m -f '{{.Version}}' istio.io/istio)
SRC_CRDS=$DIR/manifests/charts/base/files/crd-all.gen.yaml
if [ -z "$DIR" ] || [ ! -f "$DIR/VERSION" ] || [ ! -f "$SRC_CRDS" ]; then
  echo "$0: istio.io/istio $V is not in the module cache after 'go mod download' (directory '$DIR'; GOMODCACHE=$(go env GOMODCACHE), GOPROXY=$(go env GOPROXY))" >&2
  exit 1
fi
# Istio's own build stamps <VERSION file>-dev on a development snapshot.
VER="$(cat "$DIR/VERSION")-dev"
mkdir -p "$OUT"
REV=${V##*-}
X=istio.io/istio/pkg/version
LD="-s -w -X $X.buildVersion=$VER -X $X.buildGitRevision=$REV -X $X.buildStatus=Clean -X $X.buildTag=$V"
TMP=$(mktemp -d "$OUT/.build-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "building pilot-discovery, pilot-agent and istioctl $VER ($V) into $OUT (cold, modules downloaded: ~7 min on 2 cores, ~2.3 GB peak RSS)" >&2
# One go command for the three: they share most packages.
CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$LD" -o "$TMP/" \
  istio.io/istio/pilot/cmd/pilot-discovery istio.io/istio/pilot/cmd/pilot-agent \
  istio.io/istio/istioctl/cmd/istioctl
install -m 0644 "$SRC_CRDS" "$TMP/istio-crds.yaml"
mv "$TMP/istio-crds.yaml" "$CRDS"
mv "$TMP/istioctl" "$OUT/istioctl"
mv "$TMP/pilot-agent" "$OUT/pilot-agent"
mv "$TMP/pilot-discovery" "$OUT/pilot-discovery"
echo "built pilot-discovery, pilot-agent and istioctl in ${SECONDS}s" >&2
echo "$OUT/$NAME"
