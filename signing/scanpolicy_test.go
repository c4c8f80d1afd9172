package signing

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/scan"
)

func scanVector(t *testing.T, name string) scan.Report {
	t.Helper()
	f, err := os.Open("../scan/testdata/vectors/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	return scan.File(f, st.Size())
}

// allowCode defaults to false: a code or malformed file is refused under every rule that does not say otherwise,
// naming the file, its format and the first callable; exceptions allow single files of single models.
func TestAllowsScan(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "policy.yaml", `
default: {mode: enforce, none: true}
rules:
- name: legacy
  match: ["registry.example.com/legacy/**"]
  none: true
  allowCode: true
- name: team
  match: ["registry.example.com/models/**"]
  none: true
  exceptions:
  - {reference: "registry.example.com/models/bert", path: "**/training_args.bin"}
  - {reference: "registry.example.com/models/gpt@sha256:`+strings.Repeat("a", 64)+`", path: "*.pt"}
`)
	p, err := LoadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	evil, benign, broken := scanVector(t, "evil_torch.pt"), scanVector(t, "ok.safetensors"), scanVector(t, "zip_duplicate_names.pt")
	pinned := "registry.example.com/models/gpt@sha256:" + strings.Repeat("a", 64)
	other := "registry.example.com/models/gpt@sha256:" + strings.Repeat("b", 64)
	for _, c := range []struct {
		ref, file string
		r         scan.Report
		allowed   bool
	}{
		{"registry.example.com/models/x:1", "model.safetensors", benign, true},
		{"registry.example.com/models/x:1", "pytorch_model.bin", evil, false},
		{"registry.example.com/models/x:1", "pytorch_model.bin", broken, false},
		{"other.example.com/x:1", "pytorch_model.bin", evil, false}, // the default rule: allowCode false too
		{"registry.example.com/legacy/x:1", "pytorch_model.bin", evil, true},
		{"registry.example.com/models/bert:1", "ckpt/training_args.bin", evil, true},
		{"registry.example.com/models/bert:1", "training_args.bin", evil, true},
		{"registry.example.com/models/bert:1", "pytorch_model.bin", evil, false},
		{pinned, "model.pt", evil, true},
		{pinned, "sub/model.pt", evil, false},
		{other, "model.pt", evil, false},
		{"registry.example.com/models/gpt:latest", "model.pt", evil, false}, // a pinned exception needs the digest
	} {
		err := p.AllowsScan(c.ref, c.file, c.r)
		if (err == nil) != c.allowed {
			t.Errorf("%s %s: %v, want allowed=%v", c.ref, c.file, err, c.allowed)
		}
		if err != nil && !errors.Is(err, ErrUnsafeContent) {
			t.Errorf("%v does not wrap ErrUnsafeContent", err)
		}
	}
	if p.ScanNeeded("registry.example.com/legacy/x:1") || !p.ScanNeeded("registry.example.com/models/x:1") || !p.ScanNeeded("other.example.com/x:1") {
		t.Error("ScanNeeded does not follow allowCode")
	}
	err = p.AllowsScan("registry.example.com/models/x:1", "pytorch_model.bin", evil)
	for _, want := range []string{`rule "team"`, `"pytorch_model.bin"`, "code (pytorch-zip)", "posix.system"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %s", err, want)
		}
	}
	err = p.AllowsScan("registry.example.com/models/x:1", "m.pt", broken)
	if !strings.Contains(err.Error(), "malformed (zip)") || !strings.Contains(err.Error(), "two entries") {
		t.Errorf("%q does not name the fault", err)
	}
}

func TestScanExceptionErrors(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ body, want string }{
		{`{reference: "r.example.com/x", path: ""}`, "exceptions[0]: path"},
		{`{reference: "r.example.com/x", path: "/abs"}`, "exceptions[0]: path"},
		{`{reference: "r.example.com/x@sha256:zz", path: "a"}`, "digest after @"},
		{`{reference: "", path: "a"}`, "exceptions[0]: reference"},
	} {
		path := writeFile(t, dir, "p.yaml", "default: {none: true, exceptions: ["+c.body+"]}\n")
		if _, err := LoadPolicy(path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.body, err, c.want)
		}
	}
}

// A tar layer holds several model files: each finding is judged by the file it is in, so an exception for one
// file does not let another through, and the refusal names the file inside the layer.
func TestAllowsScanTarLayer(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "policy.yaml", `
default:
  none: true
  exceptions: [{reference: "registry.example.com/m", path: "ckpt/optimizer.pt"}]
`)
	p, err := LoadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	evil, _ := os.ReadFile("../scan/testdata/vectors/evil_torch.pt")
	layer := func(names ...string) scan.Report {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, n := range names {
			tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(evil)), Typeflag: tar.TypeReg})
			tw.Write(evil)
		}
		tw.Close()
		return scan.File(bytes.NewReader(b.Bytes()), int64(b.Len()))
	}
	if err := p.AllowsScan("registry.example.com/m:1", "ckpt", layer("ckpt/optimizer.pt")); err != nil {
		t.Errorf("excepted member refused: %v", err)
	}
	err = p.AllowsScan("registry.example.com/m:1", "ckpt", layer("ckpt/optimizer.pt", "ckpt/model.pt"))
	if err == nil || !strings.Contains(err.Error(), `file "ckpt/model.pt" is code (tar layer ckpt)`) || !strings.Contains(err.Error(), "posix.system (in archive/data.pkl)") {
		t.Errorf("got %v", err)
	}
}
