package pack_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/testenv"
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

	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	for name, c := range map[string]struct {
		remote pack.RemoteFile
		want   string
		is     error
	}{
		"wrong digest":   {remoteFile("w.bin", w, digest.FromString("other")), "hf://acme/tiny@c/w.bin: ", cas.ErrDigestMismatch},
		"short":          {pack.RemoteFile{Path: "w.bin", Size: 99, Digest: digest.FromBytes(w), Open: remoteFile("w.bin", w, "").Open}, "hf://acme/tiny@c/w.bin: ", cas.ErrSizeMismatch},
		"long":           {pack.RemoteFile{Path: "w.bin", Size: 3, Digest: digest.FromBytes(w[:3]), Open: remoteFile("w.bin", w, "").Open}, "hf://acme/tiny@c/w.bin: ", cas.ErrSizeMismatch},
		"escape":         {remoteFile("../w.bin", w, digest.FromBytes(w)), "not a clean relative path", nil},
		"hidden":         {remoteFile(".git/w.bin", w, digest.FromBytes(w)), "not a clean relative path", nil},
		"over the local": {remoteFile("config.json", w, digest.FromBytes(w)), "duplicate layer path", nil},
	} {
		t.Run(name, func(t *testing.T) {
			for _, sink := range []pack.Sink{openStore(t).Sink(), plainSink{openStore(t).Sink()}, registrySink(t, reg, "r/"+strings.ReplaceAll(name, " ", "-"))} {
				_, err := pack.Pack(context.Background(), dir, pack.Options{Tag: "v1", Source: "hf://acme/tiny@c", Remote: []pack.RemoteFile{c.remote}}, sink)
				if err == nil || !strings.Contains(err.Error(), c.want) || (c.is != nil && !errors.Is(err, c.is)) {
					t.Errorf("%T: %v, want %q (%v)", sink, err, c.want, c.is)
				}
			}
		})
	}
}

// A remote weight taken by a StatedSink is hashed once, by the sink (the store's ingest, the push), not also on
// its way there.
func TestStatedSinkHashesOnce(t *testing.T) {
	dir := t.TempDir()
	w := bytes.Repeat([]byte("weights!"), 128<<10)
	d := digest.FromBytes(w)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	for _, sink := range []pack.Sink{openStore(t).Sink(), registrySink(t, reg, "r/once")} {
		hashed, restore := cas.CountHashedForTesting()
		_, err := pack.Pack(context.Background(), dir, pack.Options{Tag: "v1", Remote: []pack.RemoteFile{remoteFile("w.bin", w, d)}}, sink)
		restore()
		if err != nil {
			t.Fatalf("%T: %v", sink, err)
		}
		if n := hashed(d); n != int64(len(w)) {
			t.Errorf("%T hashed %d bytes of a %d-byte weight, want each byte once", sink, n, len(w))
		}
	}
}

func registrySink(t *testing.T, reg *testenv.Registry, repo string) pack.Sink {
	r, _, err := remote.NewRepository(reg.Host+"/"+repo+":v1", remote.Options{PlainHTTP: true, RegistryConfig: filepath.Join(t.TempDir(), "config.json")})
	if err != nil {
		t.Fatal(err)
	}
	return remote.PackSink(r, nil, nil)
}

// plainSink hides the store's StatedSink: pack then reads remote files through AddBlob.
type plainSink struct{ pack.Sink }
