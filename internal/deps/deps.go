// Package deps pins modules the project is being built on while packages that use them are written in parallel.
// Remove once every module here is imported by real code.
package deps

import (
	_ "github.com/container-storage-interface/spec/lib/go/csi"
	_ "github.com/google/go-containerregistry/pkg/v1/mutate"
	_ "github.com/klauspost/compress/zstd"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/santhosh-tekuri/jsonschema/v6"
	_ "github.com/schollz/progressbar/v3"
	_ "go.etcd.io/bbolt"
	_ "google.golang.org/grpc"
	_ "k8s.io/mount-utils"
	_ "oras.land/oras-go/v2"
	_ "oras.land/oras-go/v2/registry/remote/credentials"
	_ "sigs.k8s.io/yaml"
)
