#!/usr/bin/env bash
# Builds etcd, kube-apiserver and kubectl from the Go module proxy into the
# cache directory printed on stdout's last line, keyed by this module's go.sum.
# A cached build is reused; nothing is written inside the repository.
set -euo pipefail
cd "$(dirname "$0")"
KEY=$(cat go.mod go.sum | sha256sum | cut -c1-16)
OUT=${HUB_K8S_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hub/k8s-$KEY}
if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/etcd" ] && [ -x "$OUT/kubectl" ]; then
  echo "$OUT"; exit 0
fi
mkdir -p "$OUT"
V=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
MINOR=$(echo "$V" | cut -d. -f2)
LD="-s -w -X k8s.io/component-base/version.gitVersion=$V -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$V"
TMP=$(mktemp -d "$OUT/.build-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "building kube-apiserver, kubectl and etcd $V into $OUT (cold: ~10 min)" >&2
CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$LD" -o "$TMP/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3
mv "$TMP/server" "$OUT/etcd"
mv "$TMP/kube-apiserver" "$TMP/kubectl" "$OUT/"
echo "built kube-apiserver, kubectl and etcd in ${SECONDS}s" >&2
echo "$OUT"
