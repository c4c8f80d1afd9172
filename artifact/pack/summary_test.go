package pack

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/artifact"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func layerPaths(s *Summary) []string {
	var ps []string
	for _, l := range s.Layers {
		ps = append(ps, l.Path)
	}
	slices.Sort(ps)
	return ps
}

// Plan classifies as Pack does and writes nothing; the ignore file's verdict comes first and Include/Exclude
// narrow it; files of unknown kind are listed and warned of; a flag rule overrides the kind with --include's globs.
func TestPlanIgnoreRulesAndUnknown(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"model.safetensors": "wwww", "config.json": "{}", "notes": "n", "cache/x.bin": "c", "a/b/c.dat": "d",
		"build/keep.md": "k", IgnoreFileName: "cache/\nbuild\n!build/keep.md\n",
	})
	var warned []string
	s, err := Plan(dir, Options{Warn: func(m string) { warned = append(warned, m) }})
	if err != nil {
		t.Fatal(err)
	}
	// build/keep.md stays ignored: as in git, "!" cannot re-include a file of an ignored directory.
	if got, want := layerPaths(s), []string{"a/b/c.dat", "config.json", "model.safetensors", "notes"}; !slices.Equal(got, want) {
		t.Errorf("planned %q, want %q", got, want)
	}
	if want := []UnknownFile{{"a/b/c.dat", artifact.KindWeightConfig}, {"notes", artifact.KindWeightConfig}}; !slices.Equal(s.Unknown, want) {
		t.Errorf("unknown %v, want %v", s.Unknown, want)
	}
	if len(warned) != 1 || !strings.HasPrefix(warned[0], "unknown kind: a/b/c.dat, notes packed as weight.config; use --kind PATTERN=KIND") {
		t.Errorf("warnings %q", warned)
	}
	if want := []KindTotal{{artifact.KindWeight, 1, 4}, {artifact.KindWeightConfig, 3, 4}}; !slices.Equal(s.Kinds, want) {
		t.Errorf("kinds %v, want %v", s.Kinds, want)
	}

	r1, err := ParseRule("*.dat=dataset", "--kind")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := ParseRule("doc=notes", "--kind") // the older KIND=PATTERN
	if err != nil {
		t.Fatal(err)
	}
	s, err = Plan(dir, Options{Rules: []Rule{r1, r2}, Exclude: []string{"config.json"}, NoIgnoreFile: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Unknown) != 0 {
		t.Errorf("rules name every file, yet unknown %v", s.Unknown)
	}
	for _, l := range s.Layers {
		want := map[string]artifact.Kind{"a/b/c.dat": artifact.KindDataset, "notes": artifact.KindDoc, "model.safetensors": artifact.KindWeight}[l.Path]
		if l.Path == "config.json" || (want != "" && l.Kind != want) {
			t.Errorf("layer %s is %s, want %s", l.Path, l.Kind, want)
		}
		if l.Path == IgnoreFileName {
			t.Errorf("the ignore file is packed")
		}
	}
	if !slices.Contains(layerPaths(s), "cache/x.bin") {
		t.Errorf("NoIgnoreFile: cache/x.bin not planned: %q", layerPaths(s))
	}

	if _, err := Plan(dir, Options{Strict: true}); err == nil || !strings.Contains(err.Error(), "nothing was packed (strict)") {
		t.Errorf("Strict with files of unknown kind: %v", err)
	}
}

func TestParseRule(t *testing.T) {
	for in, want := range map[string]Rule{
		"*.dat=doc":       {Kind: artifact.KindDoc, Pattern: "*.dat"},
		"data/**=dataset": {Kind: artifact.KindDataset, Pattern: "data/**"},
		"weights=x.y":     {Kind: artifact.KindWeight, Pattern: "x.y"}, // KIND=PATTERN, an alias
		"doc=weight":      {Kind: artifact.KindWeight, Pattern: "doc"}, // both kinds: PATTERN=KIND
		"a=b=code":        {Kind: artifact.KindCode, Pattern: "a=b"},   // the last "=" splits
		"dir/=docs":       {Kind: artifact.KindDoc, Pattern: "dir"},    // a directory's slash dropped
	} {
		got, err := ParseRule(in, "--kind")
		if err != nil || got.Kind != want.Kind || got.Pattern != want.Pattern || !got.Glob {
			t.Errorf("ParseRule(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{
		"x.dat":      "want PATTERN=KIND (valid kinds: weight, weight.config, doc, code, dataset)",
		"x.dat=nope": `neither "nope" nor "x.dat" is a kind (valid: weight`,
		"=doc":       "empty pattern",
		"../x=doc":   "must be relative",
		"[=doc":      "invalid pattern",
	} {
		if _, err := ParseRule(in, "--kind"); err == nil || !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), "--kind") {
			t.Errorf("ParseRule(%q): %v, want an error naming --kind and saying %q", in, err, msg)
		}
	}
}

// FuzzParseRule: any value parses to a rule whose pattern is a valid relative glob and whose kind is a spec kind,
// or fails naming the flag.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"*.dat=doc", "doc=*.md", "a=b=c", "=", "[=doc", "**/x=weights", "/x=doc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s, "--kind")
		if err != nil {
			if !strings.Contains(err.Error(), "--kind") {
				t.Fatalf("ParseRule(%q): %v does not name the flag", s, err)
			}
			return
		}
		if !slices.Contains(artifact.Kinds, r.Kind) || artifact.ValidateGlob(r.Pattern) != nil {
			t.Fatalf("ParseRule(%q) = %+v", s, r)
		}
		r.Matches("a/b") // must not panic
	})
}

// FuzzParseIgnore: any ignore file parses, and matching any path does not panic.
func FuzzParseIgnore(f *testing.F) {
	f.Add("logs/\n*.tmp\n!keep.tmp\n# c\n\\#x\n**/a/**\n[", "logs/x")
	f.Fuzz(func(t *testing.T, content, p string) {
		ig, err := parseIgnore(strings.NewReader(content), "f")
		if err != nil {
			t.Fatal(err)
		}
		ig.ignores(p)
	})
}

// The plan is what Pack writes: the same layers in the same order with the same media types and, for raw layers,
// sizes; and Pack tells Options.Summary the plan once, before its first blob.
func TestPlanIsWhatPackWrites(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"model.safetensors": "wwww", "config.json": "{}", "README.md": "r", "tok/vocab.txt": "v", "tok/merges.txt": "m",
		"notes": "n",
	})
	opts := Options{LayerFormat: artifact.FormatTarGzip}
	plan, err := Plan(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{blobs: map[string][]byte{}}
	var told []*Summary
	opts.Summary = func(s *Summary) {
		if len(sink.blobs) > 0 {
			t.Error("Summary told after a blob was written")
		}
		told = append(told, s)
	}
	desc, err := Pack(context.Background(), dir, opts, sink)
	if err != nil {
		t.Fatal(err)
	}
	if len(told) != 1 || !reflect.DeepEqual(told[0], plan) {
		t.Fatalf("Summary told %d times; %+v, plan %+v", len(told), told, plan)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(sink.blobs[desc.Digest.String()], &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != len(plan.Layers) {
		t.Fatalf("%d layers written, %d planned", len(m.Layers), len(plan.Layers))
	}
	for i, l := range m.Layers {
		p := plan.Layers[i]
		if l.Annotations[artifact.AnnotationFilepath] != p.Path || l.MediaType != p.MediaType {
			t.Errorf("layer %d: wrote %s %s, planned %s %s", i, l.Annotations[artifact.AnnotationFilepath], l.MediaType, p.Path, p.MediaType)
		}
		if strings.HasSuffix(p.MediaType, ".raw") && l.Size != p.Bytes {
			t.Errorf("layer %s: wrote %d bytes, planned %d", p.Path, l.Size, p.Bytes)
		}
	}
}
