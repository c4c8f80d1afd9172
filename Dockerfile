# syntax=docker/dockerfile:1
# The modelpack image: the CLI, the CSI driver (node and controller) and the prepull watcher in one binary.
#   docker build --build-arg VERSION=v0.1.0 -t ghcr.io/modelpack/modelpack:v0.1.0 .
# Multi-platform: docker buildx build --platform linux/amd64,linux/arm64 … (the build cross-compiles; no emulation).

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

# Not distroless: bind mounts are system calls, but unmounts and any other mount go through k8s.io/mount-utils,
# which runs util-linux umount and mount, and those need a libc and their libraries. Debian slim with just those
# packages is the smallest base that has them.
FROM debian:13-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends mount ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && mount --version && umount --version
COPY --from=build /out/modelpack /usr/local/bin/modelpack
# Root by default: the node plugin mounts into the kubelet's directories. The controller Deployment runs it as
# 65532 through its securityContext.
ENTRYPOINT ["/usr/local/bin/modelpack"]
CMD ["--help"]
