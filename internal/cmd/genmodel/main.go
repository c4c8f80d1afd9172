// Command genmodel writes a sample model directory (see internal/testmodel) for the demo and benchmarks.
package main

import (
	"flag"
	"fmt"
	"os"

	humanize "github.com/dustin/go-humanize"

	"github.com/modelpack/modelpack/internal/testmodel"
)

func main() {
	shards := flag.Int("shards", 2, "number of safetensors shards")
	size := flag.String("shard-size", "1MiB", "size of each shard (B, KiB, MiB, GiB)")
	files := flag.Int("files", 0, "extra small files under extra/")
	seed := flag.Uint64("seed", 1, "seed of the shard contents")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: genmodel [flags] DIR")
		os.Exit(2)
	}
	n, err := humanize.ParseBytes(*size)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := testmodel.Generate(flag.Arg(0), testmodel.Spec{Shards: *shards, ShardSize: int64(n), Seed: *seed, Files: *files}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
