package pack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/artifact/schema"
	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// sampleModel writes the small test model plus files that exercise modes, nesting and every kind.
func sampleModel(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(dir, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	files := map[string]struct {
		mode os.FileMode
		data string
	}{
		"src/run.sh":             {0o755, "#!/bin/sh\necho hi\n"},
		"src/lib/model.py":       {0o644, "import torch\n"},
		"src/lib/secret.cfg":     {0o600, "k=v\n"},
		"docs/guide.md":          {0o644, "# guide\n"},
		"data/train.csv":         {0o644, "a,b\n1,2\n"},
		"data/nested/eval.jsonl": {0o640, "{}\n"},
		"sub/extra.safetensors":  {0o644, ""},
	}
	for name, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := testmodel.WriteShard(filepath.Join(dir, "sub", "extra.safetensors"), 1024, 99); err != nil {
		t.Fatal(err)
	}
	// A weight inside a directory whose other files are archived: the raw layer and the archive share a directory.
	if err := testmodel.WriteShard(filepath.Join(dir, "src", "lib", "adapter.safetensors"), 2048, 98); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "src", "lib"), 0o750); err != nil {
		t.Fatal(err)
	}
	return dir
}

func openStore(t testing.TB) *layout.Store {
	t.Helper()
	s, err := layout.Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func packInto(t testing.TB, s *layout.Store, dir string, opts pack.Options) ocispec.Descriptor {
	t.Helper()
	if opts.Tag == "" {
		opts.Tag = "test/model:v1"
	}
	desc, err := pack.Pack(context.Background(), dir, opts, s.Sink())
	if err != nil {
		t.Fatal(err)
	}
	return desc
}

func readManifest(t testing.TB, s *layout.Store, desc ocispec.Descriptor) (ocispec.Manifest, []byte) {
	t.Helper()
	b, err := content.FetchAll(context.Background(), s, desc)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	cfg, err := content.FetchAll(context.Background(), s, m.Config)
	if err != nil {
		t.Fatal(err)
	}
	return m, cfg
}

// tree maps every file and directory under dir (hidden ones excepted) to its mode and, for files, content.
func tree(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") || rel == "Modelfile" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			out[rel+"/"] = info.Mode().String()
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[rel] = info.Mode().String() + " " + digest.FromBytes(data).String()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	src := sampleModel(t)
	want := tree(t, src)
	for _, format := range artifact.Formats {
		t.Run(string(format), func(t *testing.T) {
			s := openStore(t)
			desc := packInto(t, s, src, pack.Options{LayerFormat: format, Rules: []pack.Rule{{Kind: artifact.KindDataset, Pattern: "data", Source: "--dataset"}}})
			m, cfg := readManifest(t, s, desc)
			if err := schema.ValidateConfig(cfg); err != nil {
				t.Fatalf("config invalid: %v\n%s", err, cfg)
			}
			formats := map[artifact.Format]int{}
			for _, l := range m.Layers {
				k, f, ok := artifact.ParseLayerMediaType(l.MediaType)
				if !ok {
					t.Fatalf("layer media type %q", l.MediaType)
				}
				if k == artifact.KindWeight && f != artifact.FormatRaw {
					t.Errorf("weight layer %s is %s, want raw", l.Annotations[artifact.AnnotationFilepath], f)
				}
				formats[f]++
			}
			if format != artifact.FormatRaw && formats[format] == 0 {
				t.Errorf("no %s layer in %v", format, formats)
			}
			out := filepath.Join(t.TempDir(), "out")
			if _, err := pack.Unpack(context.Background(), s, m, out, pack.UnpackOptions{}); err != nil {
				t.Fatal(err)
			}
			got := tree(t, out)
			for p, w := range want {
				if strings.HasSuffix(p, "/") && format == artifact.FormatRaw && p != "data/" && !strings.HasPrefix(p, "data/") {
					continue // raw layers carry files; their directories are created, not restored
				}
				if got[p] != w {
					t.Errorf("%s: got %q, want %q", p, got[p], w)
				}
			}
			for p := range got {
				if _, ok := want[p]; !ok {
					t.Errorf("unexpected %s", p)
				}
			}
		})
	}
}

func TestLayers(t *testing.T) {
	s := openStore(t)
	src := sampleModel(t)
	m, cfg := readManifest(t, s, packInto(t, s, src, pack.Options{LayerFormat: artifact.FormatTarGzip, Rules: []pack.Rule{{Kind: artifact.KindDataset, Pattern: "data", Source: "--dataset"}}}))
	if m.ArtifactType != artifact.ArtifactTypeModelManifest || m.Config.MediaType != artifact.MediaTypeModelConfig || m.MediaType != ocispec.MediaTypeImageManifest {
		t.Fatalf("manifest types: %s %s %s", m.MediaType, m.ArtifactType, m.Config.MediaType)
	}
	byPath := map[string]ocispec.Descriptor{}
	for _, l := range m.Layers {
		p := l.Annotations[artifact.AnnotationFilepath]
		if p == "" || l.Annotations[artifact.AnnotationTitle] != p || l.Annotations[artifact.AnnotationFileMetadata] == "" {
			t.Errorf("layer %s lacks annotations: %v", l.Digest, l.Annotations)
		}
		var meta artifact.FileMetadata
		if err := json.Unmarshal([]byte(l.Annotations[artifact.AnnotationFileMetadata]), &meta); err != nil {
			t.Errorf("metadata of %s: %v", p, err)
		}
		if !meta.ModTime.Equal(time.Unix(0, 0)) || meta.Uid != 0 || meta.Gid != 0 {
			t.Errorf("metadata of %s not reproducible: %+v", p, meta)
		}
		byPath[p] = l
	}
	want := map[string]string{
		"model-00001-of-00002.safetensors": artifact.LayerMediaType(artifact.KindWeight, artifact.FormatRaw),
		"model-00002-of-00002.safetensors": artifact.LayerMediaType(artifact.KindWeight, artifact.FormatRaw),
		"sub/extra.safetensors":            artifact.LayerMediaType(artifact.KindWeight, artifact.FormatRaw),
		"config.json":                      artifact.LayerMediaType(artifact.KindWeightConfig, artifact.FormatRaw), // single files stay raw
		"README.md":                        artifact.LayerMediaType(artifact.KindDoc, artifact.FormatRaw),
		"docs":                             artifact.LayerMediaType(artifact.KindDoc, artifact.FormatTarGzip),
		"src":                              artifact.LayerMediaType(artifact.KindCode, artifact.FormatTarGzip),
		"data":                             artifact.LayerMediaType(artifact.KindDataset, artifact.FormatTarGzip),
	}
	for p, mt := range want {
		if got := byPath[p].MediaType; got != mt {
			t.Errorf("%s: media type %q, want %q", p, got, mt)
		}
	}
	var model artifact.Model
	if err := json.Unmarshal(cfg, &model); err != nil {
		t.Fatal(err)
	}
	if len(model.ModelFS.DiffIDs) != len(m.Layers) {
		t.Fatalf("%d diffIds for %d layers", len(model.ModelFS.DiffIDs), len(m.Layers))
	}
	for i, l := range m.Layers {
		if strings.HasSuffix(l.MediaType, ".raw") && model.ModelFS.DiffIDs[i] != l.Digest {
			t.Errorf("raw layer %d diffId %s != digest %s", i, model.ModelFS.DiffIDs[i], l.Digest)
		}
		if strings.HasSuffix(l.MediaType, "+gzip") && model.ModelFS.DiffIDs[i] == l.Digest {
			t.Errorf("gzip layer %d diffId equals its compressed digest", i)
		}
	}
	// The diffId of a compressed layer is the digest of its tar.
	l := byPath["src"]
	rc, err := s.Fetch(context.Background(), l)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr, err := gunzip(rc)
	if err != nil {
		t.Fatal(err)
	}
	idx := 0
	for i, d := range m.Layers {
		if d.Digest == l.Digest {
			idx = i
		}
	}
	if digest.FromBytes(tr) != model.ModelFS.DiffIDs[idx] {
		t.Errorf("diffId of src is not the digest of its tar")
	}
	if l.Annotations["io.deis.oras.content.unpack"] != "true" {
		t.Errorf("tar+gzip directory layer lacks the ORAS unpack annotation")
	}
}

func TestInferredConfig(t *testing.T) {
	s := openStore(t)
	src := sampleModel(t)
	_, cfg := readManifest(t, s, packInto(t, s, src, pack.Options{}))
	var m artifact.Model
	if err := json.Unmarshal(cfg, &m); err != nil {
		t.Fatal(err)
	}
	if m.Config.Format != "safetensors" || m.Config.Precision != "bfloat16" || m.Config.Architecture != "transformer" || m.Descriptor.Family != "llama" || m.Config.ParamSize == "" {
		t.Fatalf("inferred %+v %+v", m.Config, m.Descriptor)
	}
	if m.Descriptor.CreatedAt != nil {
		t.Fatalf("createdAt %v without --created", m.Descriptor.CreatedAt)
	}

	// The Modelfile overrides inference, options override the Modelfile.
	if err := os.WriteFile(filepath.Join(src, "Modelfile"), []byte("NAME from-modelfile\nFAMILY mf-family\nPRECISION fp8\nPARAMSIZE 7B\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, cfg = readManifest(t, s, packInto(t, s, src, pack.Options{Descriptor: artifact.ModelDescriptor{Family: "flag-family", Licenses: []string{"MIT"}}}))
	m = artifact.Model{}
	if err := json.Unmarshal(cfg, &m); err != nil {
		t.Fatal(err)
	}
	if m.Descriptor.Name != "from-modelfile" || m.Descriptor.Family != "flag-family" || m.Config.Precision != "fp8" || m.Config.ParamSize != "7B" || m.Descriptor.Licenses[0] != "MIT" {
		t.Fatalf("overrides: %+v %+v", m.Config, m.Descriptor)
	}
	if err := schema.ValidateConfig(cfg); err != nil {
		t.Fatal(err)
	}
}

func TestParamCountIsExact(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	// Two shards of one BF16 tensor each: testmodel's shard of size S holds (S - header) / 2 parameters.
	if err := testmodel.Generate(dir, testmodel.Spec{Shards: 2, ShardSize: 3 << 20, Seed: 5}); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	_, cfg := readManifest(t, s, packInto(t, s, dir, pack.Options{}))
	var m artifact.Model
	json.Unmarshal(cfg, &m)
	if m.Config.ParamSize != "3.1M" { // 2 × ~1.57M
		t.Fatalf("paramSize %q", m.Config.ParamSize)
	}
}

func TestReproducible(t *testing.T) {
	src := sampleModel(t)
	first := packInto(t, openStore(t), src, pack.Options{LayerFormat: artifact.FormatTarZstd})

	// A copy made later, with other mtimes, packed with other concurrency into another store: same digest.
	cp := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-r", src, cp).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	later := time.Now().Add(time.Hour)
	filepath.WalkDir(cp, func(p string, _ fs.DirEntry, _ error) error { return os.Chtimes(p, later, later) })
	second := packInto(t, openStore(t), cp, pack.Options{LayerFormat: artifact.FormatTarZstd, Concurrency: 1})
	if first.Digest != second.Digest {
		t.Fatalf("digests differ: %s %s", first.Digest, second.Digest)
	}
	for _, f := range artifact.Formats {
		a := packInto(t, openStore(t), src, pack.Options{LayerFormat: f})
		b := packInto(t, openStore(t), cp, pack.Options{LayerFormat: f})
		if a.Digest != b.Digest {
			t.Errorf("%s: digests differ", f)
		}
	}

	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	c1 := packInto(t, openStore(t), src, pack.Options{Created: &created})
	c2 := packInto(t, openStore(t), cp, pack.Options{Created: &created})
	if c1.Digest != c2.Digest || c1.Digest == packInto(t, openStore(t), src, pack.Options{}).Digest {
		t.Fatalf("--created: %s %s", c1.Digest, c2.Digest)
	}
	s := openStore(t)
	m, cfg := readManifest(t, s, packInto(t, s, src, pack.Options{Created: &created}))
	if m.Annotations[ocispec.AnnotationCreated] != "2025-01-02T03:04:05Z" || !bytes.Contains(cfg, []byte(`"createdAt":"2025-01-02T03:04:05Z"`)) {
		t.Fatalf("created not recorded: %v %s", m.Annotations, cfg)
	}
}

// Bad input fails with one line naming the path and the reason, and leaves no artifact.
func TestBadInput(t *testing.T) {
	type tc struct {
		setup func(t *testing.T, dir string) (packDir string, opts pack.Options)
		want  string
	}
	cases := map[string]tc{
		"missing directory": {func(t *testing.T, dir string) (string, pack.Options) {
			return filepath.Join(dir, "nope"), pack.Options{}
		}, "nope: no such directory"},
		"a fifo": {func(t *testing.T, dir string) (string, pack.Options) {
			p := filepath.Join(dir, "pipe")
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
			return p, pack.Options{}
		}, "pipe: is a named pipe (fifo); only a model directory or a regular file can be packed"},
		"empty directory": {func(t *testing.T, dir string) (string, pack.Options) {
			e := filepath.Join(dir, "empty")
			os.MkdirAll(filepath.Join(e, "sub"), 0o755)
			os.WriteFile(filepath.Join(e, ".hidden"), []byte("x"), 0o644)
			return e, pack.Options{}
		}, "empty: directory holds no files to pack"},
		"symlink out of the directory": {func(t *testing.T, dir string) (string, pack.Options) {
			os.Symlink("/etc/passwd", filepath.Join(dir, "escape.json"))
			return dir, pack.Options{}
		}, "escape.json: symlink points outside the model directory"},
		"relative symlink out": {func(t *testing.T, dir string) (string, pack.Options) {
			os.WriteFile(filepath.Join(filepath.Dir(dir), "outside.bin"), []byte("x"), 0o644)
			os.Symlink("../outside.bin", filepath.Join(dir, "w.bin"))
			return dir, pack.Options{}
		}, "w.bin: symlink points outside the model directory"},
		"broken symlink": {func(t *testing.T, dir string) (string, pack.Options) {
			os.Symlink("missing", filepath.Join(dir, "dangling.json"))
			return dir, pack.Options{}
		}, "dangling.json: broken symlink"},
		"fifo": {func(t *testing.T, dir string) (string, pack.Options) {
			if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
				t.Fatal(err)
			}
			return dir, pack.Options{}
		}, "pipe: is a named pipe (fifo)"},
		"socket": {func(t *testing.T, dir string) (string, pack.Options) {
			fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Close(fd) })
			if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: filepath.Join(dir, "sock")}); err != nil {
				t.Fatal(err)
			}
			return dir, pack.Options{}
		}, "sock: is a socket"},
		"device": {func(t *testing.T, dir string) (string, pack.Options) {
			if err := syscall.Mknod(filepath.Join(dir, "null"), syscall.S_IFCHR|0o644, 1<<8|3); err != nil {
				// Only root may create device nodes: point a symlink at the real /dev/null from inside instead.
				os.Symlink("/dev/null", filepath.Join(dir, "null"))
				return dir, pack.Options{}
			}
			return dir, pack.Options{}
		}, "null: "},
		"duplicate layer paths (conflicting rules)": {func(t *testing.T, dir string) (string, pack.Options) {
			os.WriteFile(filepath.Join(dir, "Modelfile"), []byte("CONFIG README.md\nDOC README.md\n"), 0o644)
			return dir, pack.Options{}
		}, "README.md: duplicate layer path: "},
		"duplicate layer paths (file in a packed directory)": {func(t *testing.T, dir string) (string, pack.Options) {
			os.MkdirAll(filepath.Join(dir, "data"), 0o755)
			os.WriteFile(filepath.Join(dir, "data", "a.csv"), []byte("x"), 0o644)
			return dir, pack.Options{Rules: []pack.Rule{
				{Kind: artifact.KindDataset, Pattern: "data", Source: "--dataset"},
				{Kind: artifact.KindCode, Pattern: "data/a.csv", Source: "--kind"},
			}}
		}, "a.csv: duplicate layer path: it is inside data"},
		"bad Modelfile": {func(t *testing.T, dir string) (string, pack.Options) {
			os.WriteFile(filepath.Join(dir, "Modelfile"), []byte("NAME x\nFROM llama\n"), 0o644)
			return dir, pack.Options{}
		}, "Modelfile:2: unknown directive"},
		"missing Modelfile": {func(t *testing.T, dir string) (string, pack.Options) {
			return dir, pack.Options{Modelfile: filepath.Join(dir, "Nofile")}
		}, "Nofile: cannot read Modelfile"},
		"invalid reference": {func(t *testing.T, dir string) (string, pack.Options) {
			return dir, pack.Options{Tag: "Bad/Name:v1"}
		}, `invalid reference "Bad/Name:v1"`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "model")
			if err := testmodel.Generate(dir, testmodel.Small); err != nil {
				t.Fatal(err)
			}
			packDir, opts := c.setup(t, dir)
			if opts.Tag == "" {
				opts.Tag = "bad:input"
			}
			s := openStore(t)
			_, err := pack.Pack(context.Background(), packDir, opts, s.Sink())
			if err == nil {
				t.Fatal("packed")
			}
			if msg := err.Error(); !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q, want one line containing %q", msg, c.want)
			}
			assertEmpty(t, s)
		})
	}
}

// assertEmpty checks that a failed pack left no tag and, where the input was refused up front, no blob.
func assertEmpty(t *testing.T, s *layout.Store) {
	t.Helper()
	entries, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("tags after a failed pack: %v", entries)
	}
	blobs, _ := os.ReadDir(filepath.Join(s.Root(), "blobs", "sha256"))
	if len(blobs) != 0 {
		t.Fatalf("%d blobs after a failed pack", len(blobs))
	}
}

// An unreadable file is refused before anything is written. Root reads everything, so as root the pack runs in a
// child process with an unprivileged uid.
func TestUnreadableFile(t *testing.T) {
	if os.Getenv("PACK_TEST_CHILD") == "unreadable" {
		s, err := layout.Open(os.Getenv("PACK_TEST_STORE"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = pack.Pack(context.Background(), os.Getenv("PACK_TEST_DIR"), pack.Options{Tag: "x:y"}, s.Sink())
		if err == nil {
			t.Fatal("packed")
		}
		os.WriteFile(os.Getenv("PACK_TEST_OUT"), []byte(err.Error()), 0o644)
		return
	}
	base := t.TempDir()
	// Let the unprivileged child traverse the directories the test framework made (0700); the system temp dir
	// above them must already be open to all, as /tmp is.
	os.Chmod(base, 0o777)
	os.Chmod(filepath.Dir(base), 0o711)
	for p := filepath.Dir(filepath.Dir(base)); p != "/"; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o001 == 0 {
			testenv.Unavailable(t, "%s is not traversable by other users", p)
		}
	}
	dir := filepath.Join(base, "model")
	if err := testmodel.Generate(dir, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret.json")
	os.WriteFile(secret, []byte("{}"), 0o000)
	store, out := filepath.Join(base, "store"), filepath.Join(base, "out")
	os.MkdirAll(store, 0o777)
	os.Chmod(store, 0o777)
	if os.Geteuid() != 0 {
		s, err := layout.Open(store)
		if err != nil {
			t.Fatal(err)
		}
		_, err = pack.Pack(context.Background(), dir, pack.Options{Tag: "x:y"}, s.Sink())
		if err == nil || !strings.Contains(err.Error(), "secret.json: unreadable: permission denied") {
			t.Fatalf("got %v", err)
		}
		assertEmpty(t, s)
		return
	}
	os.WriteFile(out, nil, 0o666)
	os.Chmod(out, 0o666)
	// The test binary lives in a private build directory: run a copy the unprivileged uid can execute.
	bin := filepath.Join(base, "pack.test")
	if b, err := exec.Command("cp", os.Args[0], bin).CombinedOutput(); err != nil {
		t.Fatalf("copy test binary: %v %s", err, b)
	}
	os.Chmod(bin, 0o755)
	cmd := exec.Command(bin, "-test.run=^TestUnreadableFile$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PACK_TEST_CHILD=unreadable", "PACK_TEST_STORE="+store, "PACK_TEST_DIR="+dir, "PACK_TEST_OUT="+out, "GOCOVERDIR=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, b)
	}
	msg, _ := os.ReadFile(out)
	if !strings.Contains(string(msg), "secret.json: unreadable: permission denied") {
		t.Fatalf("got %q", msg)
	}
	s, err := layout.Open(store)
	if err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, s)
}

func TestUnpackFilters(t *testing.T) {
	s := openStore(t)
	src := sampleModel(t)
	m, _ := readManifest(t, s, packInto(t, s, src, pack.Options{}))
	for name, tc := range map[string]struct {
		opts pack.UnpackOptions
		want []string
	}{
		"config":  {pack.UnpackOptions{Kinds: []artifact.Kind{artifact.KindWeightConfig}}, []string{"config.json", "generation_config.json", "src/lib/secret.cfg", "tokenizer.json", "tokenizer_config.json"}},
		"include": {pack.UnpackOptions{Include: []string{"src"}}, []string{"src/lib/adapter.safetensors", "src/lib/model.py", "src/lib/secret.cfg", "src/run.sh"}},
		"both":    {pack.UnpackOptions{Kinds: []artifact.Kind{artifact.KindWeight}, Include: []string{"model-0000*"}}, []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}},
	} {
		out := t.TempDir()
		if _, err := pack.Unpack(context.Background(), s, m, out, tc.opts); err != nil {
			t.Fatal(err)
		}
		var got []string
		for p := range tree(t, out) {
			if !strings.HasSuffix(p, "/") {
				got = append(got, filepath.ToSlash(p))
			}
		}
		if strings.Join(sorted(got), ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: got %v, want %v", name, sorted(got), tc.want)
		}
	}
}

func sorted(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

// A manifest whose layer paths lead out of the target directory is refused, and nothing is written outside.
func TestUnpackRefusesEscapes(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	push := func(b []byte, mt string, path string) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b)), Annotations: map[string]string{artifact.AnnotationFilepath: path}}
		if err := s.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := t.TempDir()
	target := filepath.Join(base, "target")
	raw := artifact.LayerMediaType(artifact.KindDoc, artifact.FormatRaw)
	tarMT := artifact.LayerMediaType(artifact.KindDoc, artifact.FormatTar)
	for name, layer := range map[string]ocispec.Descriptor{
		"dot-dot raw":    push([]byte("evil"), raw, "../escaped"),
		"absolute raw":   push([]byte("evil"), raw, "/tmp/escaped-abs"),
		"dot-dot in tar": push(testmodel.Tar(t, "../escaped", "evil"), tarMT, "docs"),
		"nested dot-dot": push([]byte("evil"), raw, "a/../../escaped"),
	} {
		m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: artifact.ArtifactTypeModelManifest, Layers: []ocispec.Descriptor{layer}}
		_, err := pack.Unpack(ctx, s, m, target, pack.UnpackOptions{})
		if err == nil {
			t.Errorf("%s: unpacked", name)
		}
		if _, err := os.Stat(filepath.Join(base, "escaped")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s: a file was written outside the target", name)
		}
	}
	// A symlink planted in the target cannot redirect a raw layer outside it.
	os.MkdirAll(target, 0o755)
	os.Symlink(base, filepath.Join(target, "link"))
	m := ocispec.Manifest{Layers: []ocispec.Descriptor{push([]byte("evil"), raw, "link/escaped")}}
	if _, err := pack.Unpack(ctx, s, m, target, pack.UnpackOptions{}); err == nil {
		t.Error("unpacked through a symlink")
	}
	if _, err := os.Stat(filepath.Join(base, "escaped")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("a file was written through a symlink")
	}
}

func TestUnpackVerifiesDigests(t *testing.T) {
	s := openStore(t)
	src := sampleModel(t)
	m, _ := readManifest(t, s, packInto(t, s, src, pack.Options{}))
	// Corrupt a stored blob in place (same size): unpack must refuse it and not leave the file.
	l := m.Layers[0]
	p := filepath.Join(s.Root(), "blobs", "sha256", l.Digest.Encoded())
	os.Chmod(p, 0o644)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("corrupt"), 100)
	f.Close()
	out := t.TempDir()
	_, err = pack.Unpack(context.Background(), s, m, out, pack.UnpackOptions{})
	if !errors.Is(err, cas.ErrDigestMismatch) {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, l.Annotations[artifact.AnnotationFilepath])); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("corrupt file left under its final name")
	}
	// A source that sends more or fewer bytes than the descriptor says (the store refuses to; a source need not).
	for _, tail := range []int{1, -1} {
		grown := fetcherFunc(func(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
			b, err := content.FetchAll(ctx, s, ocispec.Descriptor{Digest: d.Digest, Size: d.Size})
			if err != nil {
				return nil, err
			}
			if tail > 0 {
				b = append(b, "more"...)
			} else {
				b = b[:len(b)-1]
			}
			return io.NopCloser(bytes.NewReader(b)), nil
		})
		m.Layers = m.Layers[1:]
		if _, err := pack.Unpack(context.Background(), grown, m, t.TempDir(), pack.UnpackOptions{}); !errors.Is(err, cas.ErrSizeMismatch) {
			t.Fatalf("unpack from a source %+d bytes off: %v, want a size mismatch", tail, err)
		}
	}
}

type fetcherFunc func(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error)

func (f fetcherFunc) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	return f(ctx, d)
}

// A file that changes size while it is packed must fail the pack rather than be stored under a wrong descriptor.
type shrinkSink struct {
	pack.Sink
	victim string
}

func (s shrinkSink) AddBlob(ctx context.Context, desc ocispec.Descriptor, open func() (io.ReadCloser, error)) (ocispec.Descriptor, error) {
	os.Truncate(s.victim, 3)
	return s.Sink.AddBlob(ctx, desc, open)
}

func TestFileChangedWhilePacking(t *testing.T) {
	src := sampleModel(t)
	s := openStore(t)
	_, err := pack.Pack(context.Background(), src, pack.Options{Tag: "x:y"}, shrinkSink{s.Sink(), filepath.Join(src, "README.md")})
	if err == nil || !strings.Contains(err.Error(), "README.md: file changed") {
		t.Fatalf("got %v", err)
	}
	if entries, _ := s.List(); len(entries) != 0 {
		t.Fatalf("tagged after a failed pack: %v", entries)
	}
}

// Flag rules override Modelfile rules, which override the defaults; a rule that matches nothing is warned about.
func TestRules(t *testing.T) {
	src := sampleModel(t)
	os.WriteFile(filepath.Join(src, "Modelfile"), []byte("CODE README.md\nDATASET LICENSE\nDATASET nothing-*\nMODEL docs\n"), 0o644)
	var warnings []string
	s := openStore(t)
	m, _ := readManifest(t, s, packInto(t, s, src, pack.Options{
		Rules: []pack.Rule{{Kind: artifact.KindDoc, Pattern: "LICENSE", Source: "--kind"}},
		Warn:  func(msg string) { warnings = append(warnings, msg) },
	}))
	kinds := map[string]string{}
	for _, l := range m.Layers {
		kinds[l.Annotations[artifact.AnnotationFilepath]] = l.MediaType
	}
	for p, want := range map[string]string{
		"README.md": artifact.LayerMediaType(artifact.KindCode, artifact.FormatRaw),   // Modelfile over default
		"LICENSE":   artifact.LayerMediaType(artifact.KindDoc, artifact.FormatRaw),    // flag over Modelfile
		"docs":      artifact.LayerMediaType(artifact.KindWeight, artifact.FormatTar), // a directory rule: one uncompressed tar
	} {
		if kinds[p] != want {
			t.Errorf("%s: %s, want %s", p, kinds[p], want)
		}
	}
	if _, ok := kinds["Modelfile"]; ok {
		t.Error("the Modelfile was packed")
	}
	if len(warnings) != 2 || !strings.Contains(warnings[0], `"nothing-*" matches nothing`) ||
		!strings.Contains(warnings[1], "the Modelfile names no rule for config.json (weight.config)") || strings.Contains(warnings[1], "safetensors") {
		t.Errorf("warnings %q", warnings)
	}
}

// A pack with no weights, and quoted Modelfile values, are not silent surprises.
func TestNoWeightsWarnsAndModelfileQuotes(t *testing.T) {
	src := filepath.Join(t.TempDir(), "m")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "config.json"), []byte(`{}`), 0o644)
	os.WriteFile(filepath.Join(src, "Modelfile"), []byte("NAME \"llama 3\"\nFAMILY 'llama3'\nCONFIG \"config.json\"\n"), 0o644)
	var warnings []string
	s := openStore(t)
	_, cfg := readManifest(t, s, packInto(t, s, src, pack.Options{Warn: func(msg string) { warnings = append(warnings, msg) }}))
	if len(warnings) != 1 || !strings.Contains(warnings[0], "holds no weight files") {
		t.Fatalf("warnings %q", warnings)
	}
	var model artifact.Model
	json.Unmarshal(cfg, &model)
	if model.Descriptor.Name != "llama 3" || model.Descriptor.Family != "llama3" {
		t.Fatalf("quoted Modelfile values: name %q family %q", model.Descriptor.Name, model.Descriptor.Family)
	}
}

// stallAfter writes a marker file and blocks once n bytes have been read, so the test can kill the pack mid-way.
type stallAfter struct {
	n      int64
	marker string
	read   int64
}

func (s *stallAfter) Start(int64) {}
func (s *stallAfter) Add(n int64) {
	s.read += n
	if s.read >= s.n {
		os.WriteFile(s.marker, nil, 0o644)
		time.Sleep(time.Minute)
	}
}

// A pack killed half-way (SIGKILL: no cleanup runs) leaves no tag, and every blob under its final name is complete
// and correct; prune then removes what it left.
func TestInterruptedPack(t *testing.T) {
	if os.Getenv("PACK_TEST_CHILD") == "interrupted" {
		s, err := layout.Open(os.Getenv("PACK_TEST_STORE"))
		if err != nil {
			t.Fatal(err)
		}
		p := &stallAfter{n: 5 << 20, marker: os.Getenv("PACK_TEST_OUT")}
		pack.Pack(context.Background(), os.Getenv("PACK_TEST_DIR"), pack.Options{Tag: "x:y", Concurrency: 1, Progress: p}, s.Sink())
		return
	}
	base := t.TempDir()
	dir, store, marker := filepath.Join(base, "model"), filepath.Join(base, "store"), filepath.Join(base, "marker")
	if err := testmodel.Generate(dir, testmodel.Spec{Shards: 3, ShardSize: 4 << 20, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInterruptedPack$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PACK_TEST_CHILD=interrupted", "PACK_TEST_STORE="+store, "PACK_TEST_DIR="+dir, "PACK_TEST_OUT="+marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the child pack never got going")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()

	s, err := layout.Open(store)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if entries, _ := s.List(); len(entries) != 0 {
		t.Fatalf("tag after an interrupted pack: %v", entries)
	}
	blobs, err := s.Blobs()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = blobs.Walk(func(d digest.Digest, _ int64) error {
		n++
		return blobs.Verify(d)
	})
	if err != nil {
		t.Fatalf("corrupt blob after an interrupted pack: %v", err)
	}
	if n == 0 {
		t.Fatal("the child wrote no blob before it was killed: the test proves nothing")
	}
	partials, _ := filepath.Glob(filepath.Join(store, "ingest", "*.partial"))
	if len(partials) == 0 {
		t.Fatal("no partial write was interrupted: the test proves nothing")
	}
	s.Close()
	if st, err := s.Prune(context.Background()); err != nil || st.Blobs != n {
		t.Fatalf("prune: %+v %v, want %d blobs", st, err, n)
	}
	// boot-id, barrier (the flush's), durable/ and stamps/ are the store's own files (cas), not temporaries of a
	// write; the stamps of the pruned blobs go with them.
	entries, _ := os.ReadDir(filepath.Join(store, "ingest"))
	var left []string
	for _, e := range entries {
		if !slices.Contains([]string{"boot-id", "barrier", "durable", "stamps"}, e.Name()) {
			left = append(left, e.Name())
		}
	}
	stamps, _ := os.ReadDir(filepath.Join(store, "ingest", "stamps"))
	for _, e := range stamps {
		left = append(left, "stamps/"+e.Name())
	}
	if len(left) != 0 {
		t.Fatalf("prune left temporaries: %v", left)
	}
}

// A symlink to a file inside the model directory is packed as the file it points to.
func TestSymlinkInside(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(dir, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, "alias"), 0o755)
	if err := os.Symlink("../"+testmodel.ShardName(0, 2), filepath.Join(dir, "alias", "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	plainParams := paramSize(t, dir+"-copy")
	m, cfg := readManifest(t, s, packInto(t, s, dir, pack.Options{}))
	var model artifact.Model
	json.Unmarshal(cfg, &model)
	if model.Config.ParamSize != plainParams {
		t.Errorf("paramSize %q with the alias, %q without: a file reached twice was counted twice", model.Config.ParamSize, plainParams)
	}
	out := t.TempDir()
	if _, err := pack.Unpack(context.Background(), s, m, out, pack.UnpackOptions{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(out, "alias", "model.safetensors"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("alias: %v %v", fi, err)
	}
	a, _ := os.ReadFile(filepath.Join(dir, testmodel.ShardName(0, 2)))
	b, _ := os.ReadFile(filepath.Join(out, "alias", "model.safetensors"))
	if !bytes.Equal(a, b) {
		t.Fatal("alias content differs")
	}
}

// paramSize packs a fresh copy of the small test model and returns its inferred paramSize.
func paramSize(t *testing.T, dir string) string {
	t.Helper()
	if err := testmodel.Generate(dir, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	_, cfg := readManifest(t, s, packInto(t, s, dir, pack.Options{}))
	var m artifact.Model
	json.Unmarshal(cfg, &m)
	return m.Config.ParamSize
}

// Memory does not grow with the model: packing 96 MiB of weights allocates a small fraction of it.
func TestPackStreams(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(dir, testmodel.Spec{Shards: 3, ShardSize: 32 << 20, Seed: 11}); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	packInto(t, s, dir, pack.Options{})
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("packing 96 MiB allocated %d KiB", alloc>>10)
	if alloc > 8<<20 {
		t.Fatalf("packing 96 MiB allocated %d MiB", alloc>>20)
	}
}
