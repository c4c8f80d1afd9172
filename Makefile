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

TOOL_BINS := $(TOOLS)/registry $(TOOLS)/csi-sanity $(TOOLS)/oras $(TOOLS)/crane $(TOOLS)/cosign $(TOOLS)/kustomize $(TOOLS)/helm

.PHONY: all build tools test test-unit test-race fuzz demo bench manifests clean

all: build

build:
	$(GO) build -trimpath -o $(BIN)/modelpack ./cli/modelpack

tools: $(TOOL_BINS)

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
test: tools build
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 30m ./...
	$(GO) test -count=1 -race -timeout 20m ./cache/... ./csidriver/... ./artifact/...
	$(MAKE) fuzz

FUZZTIME ?= 10s
fuzz:
	@set -e; for spec in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs grep -ho '^func Fuzz[A-Za-z0-9_]*' /dev/null | sort -u); do :; done; \
	for f in $$(grep -rl --include='*_test.go' '^func Fuzz' .); do \
	  pkg=./$$(dirname $$f); \
	  for fn in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$f | sed 's/^func //'); do \
	    echo "fuzz $$pkg $$fn"; $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

demo: tools build
	bash e2e/demo.sh

bench: tools build
	bash e2e/bench.sh

manifests: tools
	bash deploy/render.sh

clean:
	rm -rf $(BIN)/modelpack
