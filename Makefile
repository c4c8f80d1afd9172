# modelpack — build, test, demo and bench.
# Every tool the tests need is installed here, pinned, into ./bin/tools.

SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
TOOLS := $(BIN)/tools
export PATH := $(TOOLS):$(BIN):$(PATH)

REGISTRY_VERSION   := v3.1.2
CSI_SANITY_VERSION := v5.6.0
ORAS_VERSION       := v1.3.6
CRANE_VERSION      := v0.22.1
COSIGN_VERSION     := v2.6.5
KUSTOMIZE_VERSION  := v5.7.1
HELM_VERSION       := v3.22.0

# modelpack's own version: the image tag deploy/ pins (Chart.yaml appVersion, deploy/base newTag) — a test checks
# they agree. The commit is stamped too: Go's build info lacks it where go cannot read the checkout (GOFLAGS
# -buildvcs=false, git worktrees on some setups).
VERSION := v0.1.0
REVISION := $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)

TOOL_BINS := $(TOOLS)/registry $(TOOLS)/csi-sanity $(TOOLS)/oras $(TOOLS)/crane $(TOOLS)/cosign $(TOOLS)/kustomize $(TOOLS)/helm

# The official Hugging Face Hub JS client (@huggingface/hub, version and dependencies pinned by the lockfile), which
# the Hub import tests run against their local Hub; npm installs it into ./bin/npm.
HUB_JS_DIR := internal/testenv/hubserver/npm
HUB_JS := $(BIN)/npm/node_modules/@huggingface/hub/package.json

.PHONY: all build image tools test test-unit test-race fuzz demo bench manifests clean cluster-deps cluster-build cluster-up cluster-down e2e-cluster fleet-build kraken-image fleet-up fleet-down e2e-fleet

all: build

build:
	$(GO) build -trimpath -ldflags "-X github.com/modelpack/modelpack/cli.Version=$(VERSION) -X github.com/modelpack/modelpack/cli.Revision=$(REVISION)" -o $(BIN)/modelpack ./cli/modelpack

# The driver image for linux/amd64 and linux/arm64 as one OCI index, without a container engine
# (internal/cmd/image): an OCI image layout in bin/image tagged $(VERSION), or pushed with IMAGE=host/repo:tag.
IMAGE ?=
PLATFORMS ?= linux/amd64,linux/arm64
image:
	$(GO) run ./internal/cmd/image --version $(VERSION) --revision $(REVISION) --platforms $(PLATFORMS) $(if $(IMAGE),$(IMAGE),--layout $(BIN)/image)

tools: $(TOOL_BINS) $(HUB_JS)

$(HUB_JS): $(HUB_JS_DIR)/package.json $(HUB_JS_DIR)/package-lock.json
	mkdir -p $(BIN)/npm
	cp $^ $(BIN)/npm/
	cd $(BIN)/npm && npm ci --no-audit --no-fund --omit=dev
	touch $@

$(TOOLS)/registry:
	GOBIN=$(TOOLS) $(GO) install github.com/distribution/distribution/v3/cmd/registry@$(REGISTRY_VERSION)
$(TOOLS)/csi-sanity:
	GOBIN=$(TOOLS) $(GO) install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$(CSI_SANITY_VERSION)
$(TOOLS)/oras:
	GOBIN=$(TOOLS) $(GO) install oras.land/oras/cmd/oras@$(ORAS_VERSION)
$(TOOLS)/crane:
	GOBIN=$(TOOLS) $(GO) install github.com/google/go-containerregistry/cmd/crane@$(CRANE_VERSION)
$(TOOLS)/cosign:
	GOBIN=$(TOOLS) $(GO) install github.com/sigstore/cosign/v2/cmd/cosign@$(COSIGN_VERSION)
$(TOOLS)/kustomize:
	GOBIN=$(TOOLS) $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
$(TOOLS)/helm:
	GOBIN=$(TOOLS) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

# The whole suite: unit, race, short fuzz runs, interop, csi-sanity and e2e.
# Tests find the pinned tools on PATH; under CI=true a missing tool or root is a failure, never a skip.
# Packages with concurrency run once, under the race detector; the rest (CLI, e2e, deploy) run plainly.
RACE_PKGS := ./cas/... ./transfer/... ./cache/... ./csidriver/... ./artifact/... ./signing/... ./prepull/... ./internal/readahead/... ./internal/unixsock/...
test: tools build
	$(GO) vet ./...
	$(GO) vet -tags cluster ./e2e/cluster/...
	$(GO) test -count=1 -race -timeout 25m $(RACE_PKGS)
	$(GO) test -count=1 -timeout 25m $$($(GO) list ./... | grep -v -E '/(cas|transfer|cache|csidriver|artifact|signing|prepull|readahead|unixsock)(/|$$)')
	$(MAKE) fuzz
	$(MAKE) e2e-cluster
	$(MAKE) e2e-fleet

# A real single-node Kubernetes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# containerd 2.x) built from the Go module proxy into bin/k8s, on 127.0.0.1, with modelpack deployed from
# deploy/overlays/local-cluster. One cluster per machine at a time (flock /tmp/modelpack-cluster.lock).
# e2e-cluster builds, starts, runs the `cluster`-tagged suite and always tears down; see e2e/cluster/README.md.
cluster-deps:
	bash e2e/cluster/deps.sh
cluster-build: cluster-deps
	bash e2e/cluster/build.sh
cluster-up: tools build cluster-build
	bash e2e/cluster/up.sh
cluster-down:
	bash e2e/cluster/down.sh
e2e-cluster: tools build
	bash e2e/cluster/run.sh

# A real multi-node Kubernetes on this machine (e2e/fleet/cluster: the control plane on the host, 3 worker nodes
# each a kubelet + containerd in a network and mount namespace of its own) with modelpack and Uber Kraken deployed
# from deploy/overlays/fleet-cluster-kraken as on a real cluster; the `fleet`-tagged suite runs against it (one
# copy for 3 nodes, an agent killed mid-pull, a lying agent), and the simulated-node suite (csi-driver processes
# with Kraken agents on loopback) after it. Shares e2e-cluster's lock. fleet-build builds Kraken (pinned) into
# bin/kraken and installs nginx-light. e2e-fleet always tears down; see e2e/fleet/README.md.
fleet-build:
	bash e2e/fleet/build.sh
# The Kraken image deploy/components/p2p-kraken runs (Kraken's binaries, Debian's nginx-light), without a container
# engine, pushed to IMAGE (e.g. make kraken-image IMAGE=registry.example.com/modelpack/kraken:v0.1.27).
kraken-image: fleet-build
	bash e2e/fleet/kraken-image.sh $(IMAGE) --plain-http=false
fleet-up: cluster-build fleet-build
	bash e2e/fleet/cluster/up.sh
fleet-down:
	bash e2e/fleet/cluster/down.sh
e2e-fleet: $(TOOLS)/registry build
	$(GO) vet -tags fleet ./e2e/fleet/...
	bash e2e/fleet/run.sh

# A count, not a duration: with a duration, Go 1.26's fuzz coordinator can report its own end-of-time deadline as
# a failure ("context deadline exceeded", no input written) when a worker answers late on a busy machine
# (golang/go#75804, fixed in Go 1.27). A count has no deadline to race.
FUZZTIME ?= 20000x
# Every fuzz target in the tree, FUZZTIME each (go test -fuzz takes one target at a time).
fuzz:
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' --exclude-dir=bin .); do \
	  for fn in $$(grep -o '^func Fuzz[A-Za-z0-9_]*' $$f | sed 's/^func //'); do \
	    echo "fuzz ./$$(dirname $$f) $$fn"; \
	    $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) ./$$(dirname $$f); \
	  done; \
	done

demo: $(TOOLS)/registry build
	bash e2e/demo.sh

bench: tools build fleet-build
	go run ./internal/cmd/bench

manifests: tools
	bash deploy/render.sh

clean:
	rm -rf $(BIN)/modelpack
