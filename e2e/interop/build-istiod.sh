#!/usr/bin/env bash
# Builds Istio's pilot-discovery (istiod) from the Istio module this module
# requires (the same one adscclient is built from; go.mod lists it as a
# `tool`) into the cache directory keyed by this module's go.mod, go.sum and
# this script, and prints the binary's path on stdout's last line. The same
# module's Istio CRDs are copied next to it as istio-crds.yaml (the e2e
# tests install them in the API server istiod watches). A cached build is
# reused; nothing is written inside the repository. With HUB_ISTIOD_BIN set
# to an executable, that one is printed instead.
set -euo pipefail
if [ -n "${HUB_ISTIOD_BIN:-}" ] && [ -x "$HUB_ISTIOD_BIN" ]; then
  echo "$HUB_ISTIOD_BIN"; exit 0
fi
cd "$(dirname "$0")"
KEY=$(cat go.mod go.sum "$(basename "$0")" | sha256sum | cut -c1-16)
OUT=${XDG_CACHE_HOME:-$HOME/.cache}/hub/istiod-$KEY
BIN=$OUT/pilot-discovery
CRDS=$OUT/istio-crds.yaml
if [ -x "$BIN" ] && [ -f "$CRDS" ]; then
  echo "$BIN"; exit 0
fi
mkdir -p "$OUT"
PKG=istio.io/istio/pilot/cmd/pilot-discovery
DIR=$(go list -mod=readonly -m -f '{{.Dir}}' istio.io/istio)
V=$(go list -mod=readonly -m -f '{{.Version}}' istio.io/istio)
# Istio's own build stamps <VERSION file>-dev on a development snapshot.
VER="$(cat "$DIR/VERSION" 2>/dev/null || echo unknown)-dev"
REV=${V##*-}
X=istio.io/istio/pkg/version
LD="-s -w -X $X.buildVersion=$VER -X $X.buildGitRevision=$REV -X $X.buildStatus=Clean -X $X.buildTag=$V"
TMP=$(mktemp -d "$OUT/.build-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "building pilot-discovery $VER ($V) into $OUT (cold: ~10 min on 2 cores, ~2.2 GB peak RSS)" >&2
CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$LD" -o "$TMP/pilot-discovery" "$PKG"
install -m 0644 "$DIR/manifests/charts/base/files/crd-all.gen.yaml" "$TMP/istio-crds.yaml"
mv "$TMP/istio-crds.yaml" "$CRDS"
mv "$TMP/pilot-discovery" "$BIN"
echo "$BIN"
