# syntax=docker/dockerfile:1
# The modelpack image: the CLI, the CSI driver (node and controller) and the prepull watcher in one binary.
#   docker build --build-arg VERSION=v0.1.0 -t ghcr.io/modelpack/modelpack:v0.1.0 .
# Multi-platform: docker buildx build --platform linux/amd64,linux/arm64 … (the build cross-compiles; no emulation),
# or without Docker: make image (an OCI layout in bin/image) or make image IMAGE=host/repo:tag (pushed).

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-trixie AS build
WORKDIR /src
# Modules first, so source edits reuse the download layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS=linux
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X github.com/modelpack/modelpack/cli.Version=${VERSION}" \
      -o /out/modelpack ./cli/modelpack

# The same image `make image` builds without a container engine (internal/cmd/image): the static binary and a CA
# bundle, nothing else. The driver bind-mounts and unmounts by system calls and execs nothing, so it needs no shell,
# libc or mount(8). Debug a running pod with `kubectl debug --image=busybox`.
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/modelpack /usr/local/bin/modelpack
# Root by default: the node plugin mounts into the kubelet's directories. The controller Deployment runs it as
# 65532 through its securityContext.
ENTRYPOINT ["/usr/local/bin/modelpack"]
CMD ["--help"]
