package pack_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
)

func remoteFile(p string, data []byte, stated digest.Digest) pack.RemoteFile {
	return pack.RemoteFile{Path: p, Size: int64(len(data)), Digest: stated,
		Open: func(_ context.Context, offset int64) (io.ReadCloser, int64, error) {
			return io.NopCloser(bytes.NewReader(data[offset:])), offset, nil
		}}
}

// Remote files join the directory's in its walk order, under the name the source gives them; bytes that do not
// match what the source states are refused, naming the file, whichever sink takes them.
func TestPackRemoteFiles(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type":"llama"}`), 0o644)
	w := []byte("weights")
	good := pack.Options{Tag: "r:v1", Source: "hf://acme/tiny@c", Remote: []pack.RemoteFile{
		remoteFile("sub/model.safetensors", w, digest.FromBytes(w)), remoteFile("a.bin", w, digest.FromBytes(w))}}
	s := openStore(t)
	m, _ := readManifest(t, s, packInto(t, s, dir, good))
	var paths []string
	for _, l := range m.Layers {
		paths = append(paths, l.Annotations[artifact.AnnotationFilepath])
		if l.Annotations[artifact.AnnotationFilepath] != "config.json" && l.Digest != digest.FromBytes(w) {
			t.Errorf("%v: digest %s", paths, l.Digest)
		}
	}
	if strings.Join(paths, " ") != "a.bin sub/model.safetensors config.json" {
		t.Errorf("layers %v", paths)
	}

	for name, c := range map[string]struct {
		remote pack.RemoteFile
		want   string
	}{
		"wrong digest":   {remoteFile("w.bin", w, digest.FromString("other")), "hf://acme/tiny@c/w.bin: "},
		"short":          {pack.RemoteFile{Path: "w.bin", Size: 99, Digest: digest.FromBytes(w), Open: remoteFile("w.bin", w, "").Open}, "size mismatch"},
		"escape":         {remoteFile("../w.bin", w, digest.FromBytes(w)), "not a clean relative path"},
		"hidden":         {remoteFile(".git/w.bin", w, digest.FromBytes(w)), "not a clean relative path"},
		"over the local": {remoteFile("config.json", w, digest.FromBytes(w)), "duplicate layer path"},
	} {
		t.Run(name, func(t *testing.T) {
			for _, sink := range []pack.Sink{openStore(t).Sink(), plainSink{openStore(t).Sink()}} {
				_, err := pack.Pack(context.Background(), dir, pack.Options{Tag: "r:v1", Source: "hf://acme/tiny@c", Remote: []pack.RemoteFile{c.remote}}, sink)
				if err == nil || !strings.Contains(err.Error(), c.want) || (name == "wrong digest" && !strings.Contains(err.Error(), "digest mismatch")) {
					t.Errorf("%T: %v, want %q", sink, err, c.want)
				}
			}
		})
	}
}

// plainSink hides the store's StatedSink: pack then reads remote files through AddBlob.
type plainSink struct{ pack.Sink }
