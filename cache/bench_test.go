package cache

import (
	"context"
	"fmt"
	"testing"

	"github.com/modelpack/modelpack/artifact"
)

// BenchmarkViewAssembly times assembling a fresh view of a 1,000-file model (one raw layer per file, as packers
// that give every file its own layer produce) and of a model whose 1,000 files are in one tar layer.
func BenchmarkViewAssembly(b *testing.B) {
	for _, tarred := range []bool{false, true} {
		b.Run(fmt.Sprintf("tar=%v", tarred), func(b *testing.B) {
			src := newMemTarget()
			var files []modelFile
			var entries []tarEntry
			for i := range 1000 {
				name := fmt.Sprintf("extra/part-%05d.json", i)
				body := fmt.Sprintf("{\"i\":%d}\n", i)
				files = append(files, modelFile{Path: name, Data: []byte(body)})
				entries = append(entries, tarEntry{Name: name, Body: body})
			}
			if tarred {
				files = []modelFile{{Path: "extra", Data: makeTar(b, true, entries...), Kind: artifact.KindWeightConfig, Format: artifact.FormatTarGzip}}
			}
			desc := src.manifestDesc(modelManifest(b, src, files))
			c := openCache(b, b.TempDir(), Options{})
			if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := c.Acquire(fmt.Sprintf("v%d", i), desc.Digest, Selector{Include: []string{"**", fmt.Sprint(i)}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
