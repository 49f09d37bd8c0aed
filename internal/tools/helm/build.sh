#!/usr/bin/env bash
# Builds helm from the Go module proxy (the version this module pins) into the
# cache directory ${XDG_CACHE_HOME:-$HOME/.cache}/hub/helm-<key>, keyed by this
# module's go.mod, go.sum and this script, and prints the binary's path on
# stdout's last line (for HUB_HELM_BIN). A cached build is reused; nothing is
# written inside the repository.
set -euo pipefail
cd "$(dirname "$0")"
KEY=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-16)
OUT=${XDG_CACHE_HOME:-$HOME/.cache}/hub/helm-$KEY
if [ -x "$OUT/helm" ]; then
  echo "$OUT/helm"; exit 0
fi
mkdir -p "$OUT"
V=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
TMP=$(mktemp -d "$OUT/.build-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "building helm $V into $OUT (cold: ~3 min)" >&2
CGO_ENABLED=0 go build -mod=readonly -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$V -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
  -o "$TMP/helm" helm.sh/helm/v4/cmd/helm
mv "$TMP/helm" "$OUT/helm"
echo "built helm $V in ${SECONDS}s" >&2
echo "$OUT/helm"
