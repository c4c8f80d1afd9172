package pack_test

import (
	"context"
	"fmt"
	"log"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/pack"
)

// Pack a model directory into the local store, then write its config and docs back out.
func Example() {
	ctx := context.Background()
	store, err := layout.Open("/var/lib/modelpack")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	desc, err := pack.Pack(ctx, "./llama3-8b", pack.Options{Tag: "llama3:8b"}, store.Sink())
	if err != nil {
		log.Fatal(err) // a *pack.UserError names the path and the reason
	}
	fmt.Println("packed", desc.Digest)

	_, m, err := store.Manifest(ctx, "llama3:8b")
	if err != nil {
		log.Fatal(err)
	}
	filter, _ := artifact.ParseKind("weight.config")
	if _, err := pack.Unpack(ctx, store, m, "./llama3-config", pack.UnpackOptions{Kinds: []artifact.Kind{filter}}); err != nil {
		log.Fatal(err)
	}
}
