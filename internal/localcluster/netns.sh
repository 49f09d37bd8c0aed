#!/usr/bin/env bash
# Runs a command inside a fresh network namespace whose loopback also carries
# a data-plane address from the benchmark range 198.18.0.0/15 (DESIGN.md §5):
# EndpointSlices reject loopback addresses, so test backends bind to this one.
# The namespace has no route anywhere else, so build before entering it.
# Usage: netns.sh COMMAND [ARGS...]   (exports HUB_TEST_DATAPLANE_IP)
set -euo pipefail
IP=${HUB_TEST_DATAPLANE_IP:-198.18.0.1}
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "netns.sh: not root or no iproute2; running without a network namespace (data-plane tests skip outside CI)" >&2
  exec "$@"
fi
NS=hub-test-$$
ip netns add "$NS"
trap 'ip netns del "$NS" 2>/dev/null || true' EXIT INT TERM
ip netns exec "$NS" ip link set lo up
ip netns exec "$NS" ip addr add "$IP/32" dev lo
# No network inside: the Go command must find every module in the cache
# (GOPROXY=off), keeping the caller's other GOFLAGS.
HUB_TEST_DATAPLANE_IP=$IP ip netns exec "$NS" env HUB_TEST_DATAPLANE_IP="$IP" GOPROXY=off GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly" "$@"
