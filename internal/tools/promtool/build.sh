#!/usr/bin/env bash
# Builds Prometheus's promtool from the module this module's go.mod pins
# (github.com/prometheus/prometheus) into the cache directory keyed by this
# module's go.mod, go.sum and this script, and prints the binary's path on
# stdout's last line. The charts tests run it (`promtool check rules`,
# `promtool test rules`) on the Helm chart's alert rules. Built with
# Prometheus's documented remove_all_sd tag (no optional service discoveries:
# promtool's rule commands never use them). A cached build is reused; nothing
# is written inside the repository. With HUB_PROMTOOL_BIN set to an
# executable, that one is printed instead.
set -euo pipefail
if [ -n "${HUB_PROMTOOL_BIN:-}" ] && [ -x "$HUB_PROMTOOL_BIN" ]; then
  echo "$HUB_PROMTOOL_BIN"; exit 0
fi
cd "$(dirname "$0")"
KEY=$(cat go.mod go.sum "$(basename "$0")" | sha256sum | cut -c1-16)
OUT=${XDG_CACHE_HOME:-$HOME/.cache}/hub/promtool-$KEY
if [ -x "$OUT/promtool" ]; then
  echo "$OUT/promtool"; exit 0
fi
mkdir -p "$OUT"
# Download the module first: `go list -m -f {{.Dir}}` prints an empty
# directory for a module not yet in the module cache, and the version stamp
# (Prometheus's own, e.g. 3.16.0 for module v0.316.0) comes from it.
go mod download github.com/prometheus/prometheus
DIR=$(go list -mod=readonly -m -f '{{.Dir}}' github.com/prometheus/prometheus)
V=$(go list -mod=readonly -m -f '{{.Version}}' github.com/prometheus/prometheus)
if [ -z "$DIR" ] || [ ! -f "$DIR/VERSION" ]; then
  echo "$0: github.com/prometheus/prometheus $V is not in the module cache after 'go mod download' (directory '$DIR'; GOMODCACHE=$(go env GOMODCACHE), GOPROXY=$(go env GOPROXY))" >&2
  exit 1
fi
X=github.com/prometheus/common/version
LD="-s -w -X $X.Version=$(cat "$DIR/VERSION") -X $X.Revision=$V -X $X.Branch=module -X $X.BuildUser=hub -X $X.BuildDate=unknown"
TMP=$(mktemp -d "$OUT/.build-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "building promtool $(cat "$DIR/VERSION") ($V) into $OUT (cold: ~4 min on 2 cores, modules already downloaded)" >&2
CGO_ENABLED=0 go build -mod=readonly -trimpath -tags remove_all_sd -ldflags "$LD" -o "$TMP/promtool" \
  github.com/prometheus/prometheus/cmd/promtool
mv "$TMP/promtool" "$OUT/promtool"
echo "built promtool in ${SECONDS}s" >&2
echo "$OUT/promtool"
