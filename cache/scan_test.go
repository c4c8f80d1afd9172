package cache

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/scan"
)

// A compressed layer is inflated to a scratch file to be scanned; on a node that file belongs under the cache
// root, never in the process's temporary directory (a node plugin's root file system is read-only, and nothing
// of the node's is written outside its root). With TMPDIR pointing nowhere, the scan still finds the pickle's
// callable inside a tar+gzip layer, and leaves nothing behind in the root's scratch directory.
func TestScanOfACompressedLayerSpoolsUnderTheRoot(t *testing.T) {
	// protocol 2: GLOBAL posix.system, the argument tuple ("id",), REDUCE (pickletools' reading of
	// pickle.dumps of a class whose __reduce__ returns (os.system, ("id",)))
	evil := "\x80\x02cposix\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03."
	big := make([]byte, 2<<20) // over the in-memory threshold of a spooled member
	files := []modelFile{
		{Path: "model.safetensors", Data: shard(3, 32<<10)},
		{Path: "extra", Data: makeTar(t, true,
			tarEntry{Name: "extra/", Type: '5', Mode: 0o755},
			tarEntry{Name: "extra/pad.bin", Body: string(big), Mode: 0o644},
			tarEntry{Name: "extra/model.pkl", Body: evil, Mode: 0o644}),
			Kind: artifact.KindWeightConfig, Format: artifact.FormatTarGzip},
	}
	src := newMemTarget()
	desc := src.manifestDesc(modelManifest(t, src, files))
	root := t.TempDir()
	c := openCache(t, root, Options{})
	if _, err := c.Pull(context.Background(), src, desc, nil); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "absent"))
	layers, err := c.Scan(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	var tarRep *scan.Report
	for i, l := range layers {
		if l.MediaType != "" && l.Size == int64(len(files[1].Data)) {
			tarRep = &layers[i].Report
		}
	}
	if tarRep == nil {
		t.Fatalf("no report for the tar layer among %+v", layers)
	}
	if tarRep.Verdict != scan.Code || tarRep.FirstCallable() != "posix.system" {
		t.Fatalf("tar+gzip layer: verdict %s, first callable %q, findings %+v; want code, posix.system", tarRep.Verdict, tarRep.FirstCallable(), tarRep.Findings)
	}
	left, _ := filepath.Glob(filepath.Join(root, "tmp", "modelpack-scan-*"))
	if len(left) != 0 {
		t.Errorf("spool files left under the root: %v", left)
	}
	if _, err := os.Stat(filepath.Join(root, "tmp")); err != nil {
		t.Errorf("the root's scratch directory: %v", err)
	}
}
