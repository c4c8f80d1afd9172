// Command genmodel writes a sample model directory (see internal/testmodel) for the demo and benchmarks.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

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
	n, err := parseSize(*size)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := testmodel.Generate(flag.Arg(0), testmodel.Spec{Shards: *shards, ShardSize: n, Seed: *seed, Files: *files}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mul    int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(num, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("invalid size %q", s)
			}
			return v * u.mul, nil
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q (e.g. 512MiB)", s)
	}
	return v, nil
}
