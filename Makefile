# hub: build, run the demo, test. See README.md.
SHELL       := /bin/bash
.SHELLFLAGS := -euo pipefail -c
GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
K8S_BIN      = internal/localcluster/k8sbin/build.sh
ISTIOD_BIN   = e2e/interop/build-istiod.sh
NETNS        = internal/localcluster/netns.sh
TRACKED      = .ci/check-tracked-files.sh

.PHONY: all build demo test lint unit k8s-bin istiod-bin bench clean

all: build

build:
	$(GO) build -o bin/hub ./cmd/hub

# Kubernetes binaries for local clusters (cached outside the repo).
k8s-bin:
	$(K8S_BIN)

# Istio's pilot-discovery (istiod) and pilot-agent from e2e/interop's Istio
# module, for the MCP-over-XDS and workload-certificate e2e tests (cached
# outside the repo; prints istiod's path, `e2e/interop/build-istiod.sh
# pilot-agent` the agent's).
istiod-bin:
	$(ISTIOD_BIN)

# Three real local clusters, sample workloads and the hub on them.
demo: build
	HUB_K8S_BIN_DIR=$$($(K8S_BIN)) ./bin/hub demo

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
# address. Modules and binaries are fetched and built first, outside it:
# also Istio's adsc client, istiod and pilot-agent (e2e/interop, its own
# module) for the e2e tests.
# Each stage prints its wall time ("make test: <stage>: <s>s") on stderr.
test: lint
	@stage() { echo "make test: $$1: $$((SECONDS - t))s" >&2; t=$$SECONDS; }; t=$$SECONDS; \
	HUB_K8S_BIN_DIR=$$($(K8S_BIN)); export HUB_K8S_BIN_DIR; stage "Kubernetes binaries"; \
	HUB_ISTIOD_BIN=$$($(ISTIOD_BIN)); HUB_PILOT_AGENT_BIN=$$($(ISTIOD_BIN) pilot-agent); \
	export HUB_ISTIOD_BIN HUB_PILOT_AGENT_BIN; stage "Istio binaries"; \
	(cd e2e/interop && $(GO) vet ./... && $(GO) build -o $(abspath bin)/adscclient ./cmd/adscclient); \
	export HUB_ADSC_BIN=$(abspath bin)/adscclient; \
	$(GO) build ./...; $(GO) test -race -count=1 -exec /bin/true ./... >/dev/null; stage "build (adsc, hub, test binaries)"; \
	$(NETNS) $(GO) test -race -count=1 -timeout 20m ./...; stage tests

# Fast tests only (no local clusters needed for these packages).
unit:
	$(GO) test -race -count=1 ./clusters/... ./hub/... ./api/...

# The load benchmark (docs/performance.md), e.g.
#   make bench BENCH_ARGS="--members 3 --services 300 --endpoints 3000 --streams 200"
#   make bench BENCH_ARGS="--shape envoy --writes 20 --hub-env=GOMEMLIMIT=1152MiB"   # Envoy sidecars
#   make bench BENCH_ARGS="--shape grpc --writes 20 --hub-env=GOMEMLIMIT=1152MiB"    # grpc-go clients
bench:
	HUB_K8S_BIN_DIR=$$($(K8S_BIN)) $(GO) run ./cmd/hubbench $(BENCH_ARGS)

clean:
	rm -rf bin
