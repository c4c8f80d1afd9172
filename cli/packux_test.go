package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testenv/hubserver"
)

// writeTree writes files (path → content) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
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

// packedPaths are the layer paths of the artifact stored under ref, sorted.
func packedPaths(t *testing.T, home, ref string) []string {
	t.Helper()
	_, m, _ := stored(t, home, ref)
	var ps []string
	for p := range layerDigests(m) {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

// Issue 32 item 6: DIR/.modelpackignore leaves out what it names with .gitignore's meaning (a directory, a glob
// at any depth, "!" re-including, a pattern with a "/" anchored at DIR, "?"), --include/--exclude narrow what it
// leaves and never bring back what it ignores, the ignore file is never packed, --ignore-file names another
// (itself not packed when inside DIR) and --no-ignore-file reads none.
func TestPackIgnoreFile(t *testing.T) {
	run := binaryRunner(t)
	model := t.TempDir()
	writeTree(t, model, map[string]string{
		"model.safetensors": "w", "config.json": "{}", "README.md": "r",
		"logs/run.log": "l", "a.tmp": "t", "keep.tmp": "k", "doc/frotz.md": "anchored", "sub/doc/frotz.md": "not anchored",
		"file1.txt": "q", "other.ignore": "config.json\n",
		pack.IgnoreFileName: "# comment\nlogs/\n*.tmp\n!keep.tmp\ndoc/frotz.md\nfile?.txt\n",
	})
	// A pickle that runs code, in an ignored directory: not packed, so neither warned of nor refused.
	evil, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "scan", "testdata", "vectors", "evil_torch.pt"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(model, "logs", "pytorch_model.bin"), evil, 0o644)
	home := t.TempDir()
	if code, _, errOut := run("--home", home, "pack", model, "-t", "m:ignored", "--refuse-code"); code != 0 || strings.Contains(errOut, "pytorch_model.bin") {
		t.Fatalf("pack --refuse-code with %s ignoring a pickle: exit %d\n%s", pack.IgnoreFileName, code, errOut)
	}
	want := []string{"README.md", "config.json", "keep.tmp", "model.safetensors", "other.ignore", "sub/doc/frotz.md"}
	if got := packedPaths(t, home, "m:ignored"); !slices.Equal(got, want) {
		t.Errorf("with %s packed %q, want %q", pack.IgnoreFileName, got, want)
	}

	// The flags narrow: --include '*.tmp' cannot bring back a.tmp, --exclude takes README.md too.
	if code, _, errOut := run("--home", home, "pack", model, "-t", "m:narrow", "--include", "*.tmp", "--include", "*.safetensors"); code != 0 {
		t.Fatalf("pack --include: exit %d\n%s", code, errOut)
	}
	if got := packedPaths(t, home, "m:narrow"); !slices.Equal(got, []string{"keep.tmp", "model.safetensors"}) {
		t.Errorf("ignore file and --include '*.tmp' packed %q", got)
	}

	// --ignore-file names another file, inside DIR: it is not packed, and DIR/.modelpackignore is not read.
	if code, _, errOut := run("--home", home, "pack", model, "-t", "m:other", "--ignore-file", filepath.Join(model, "other.ignore")); code != 0 {
		t.Fatalf("pack --ignore-file: exit %d\n%s", code, errOut)
	}
	got := packedPaths(t, home, "m:other")
	if slices.Contains(got, "config.json") || slices.Contains(got, "other.ignore") || !slices.Contains(got, "a.tmp") || !slices.Contains(got, "logs/run.log") {
		t.Errorf("--ignore-file other.ignore packed %q", got)
	}

	if code, _, errOut := run("--home", home, "pack", model, "-t", "m:all", "--no-ignore-file"); code != 0 {
		t.Fatalf("pack --no-ignore-file: exit %d\n%s", code, errOut)
	}
	if got := packedPaths(t, home, "m:all"); len(got) != 11 || slices.Contains(got, pack.IgnoreFileName) {
		t.Errorf("--no-ignore-file packed %q, want the 11 files and not the ignore file", got)
	}

	if code, _, errOut := run("--home", home, "pack", model, "-t", "m:x", "--no-ignore-file", "--ignore-file", "x"); code != 2 {
		t.Errorf("--ignore-file with --no-ignore-file: exit %d, want 2\n%s", code, errOut)
	}
	code, _, errOut := run("--home", home, "pack", model, "-t", "m:x", "--ignore-file", filepath.Join(model, "missing"))
	if code == 0 || !strings.Contains(errOut, "missing") || !strings.Contains(errOut, "cannot read ignore file") {
		t.Errorf("--ignore-file of a missing file: exit %d\n%s", code, errOut)
	}
	code, _, errOut = run("--home", home, "pack", model, "-t", "m:x", "--include", "*.tmp", "--exclude", "keep.tmp")
	if code == 0 || !strings.Contains(errOut, pack.IgnoreFileName) || !strings.Contains(errOut, "leaves no file to pack") {
		t.Errorf("an ignore file and flags that leave nothing: exit %d\n%s", code, errOut)
	}
}

// Issue 32 item 6: pack prints one summary of the classification (per kind, files and bytes; in -o json too), a
// file whose name says nothing of its kind is a warning naming it and the way out (--kind PATTERN=KIND), --kind
// takes --include's globs and overrides the kind, a bad --kind names the value and the valid kinds (exit 2), and
// --strict fails on a file of unknown kind before anything is stored.
func TestPackSummaryKindsAndUnknown(t *testing.T) {
	run := binaryRunner(t)
	model := t.TempDir()
	writeTree(t, model, map[string]string{
		"model.safetensors": "weights", "config.json": "{}", "README.md": "readme", "weird.dat": "?",
		"eval/x/part.bin2": "data", "tools/run.py": "print()",
	})
	home := t.TempDir()
	code, _, errOut := run("--home", home, "pack", model, "-t", "m:v1")
	if code != 0 {
		t.Fatalf("pack: exit %d\n%s", code, errOut)
	}
	if n := strings.Count(errOut, "classified "); n != 1 || !strings.Contains(errOut, "classified 6 files into 6 layers: weight 1 (7 B), weight.config 3 (7 B), doc 1 (6 B), code 1 (7 B)") {
		t.Errorf("want one classification summary, got:\n%s", errOut)
	}
	if !strings.Contains(errOut, "warning: unknown kind: eval/x/part.bin2, weird.dat packed as weight.config; use --kind PATTERN=KIND") {
		t.Errorf("no warning naming the files of unknown kind:\n%s", errOut)
	}

	code, out, errOut := run("--home", home, "-o", "json", "pack", model, "-t", "m:v2", "--kind", "*.dat=doc", "--kind", "eval/**=dataset", "--kind", "weight=tools")
	if code != 0 {
		t.Fatalf("pack --kind: exit %d\n%s%s", code, out, errOut)
	}
	var res struct {
		Summary struct {
			Kinds []struct {
				Kind  string
				Files int
				Bytes int64
			}
			Unknown []any
		}
		Warnings []string
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	kinds := map[string]int{}
	for _, k := range res.Summary.Kinds {
		kinds[k.Kind] = k.Files
	}
	if want := map[string]int{"weight": 2, "weight.config": 1, "doc": 2, "dataset": 1}; !sameCounts(kinds, want) || len(res.Summary.Unknown) != 0 {
		t.Errorf("summary with --kind: %v unknown %v, want %v and none unknown\n%s", kinds, res.Summary.Unknown, want, out)
	}
	for _, w := range res.Warnings {
		if strings.Contains(w, "unknown kind") {
			t.Errorf("warned of unknown kinds although --kind names them: %s", w)
		}
	}
	_, m, _ := stored(t, home, "m:v2")
	for _, l := range m.Layers {
		title := l.Annotations[artifact.AnnotationFilepath]
		switch title {
		case "weird.dat":
			if l.MediaType != artifact.LayerMediaType(artifact.KindDoc, artifact.FormatRaw) {
				t.Errorf("--kind '*.dat=doc': weird.dat is %s", l.MediaType)
			}
		case "eval":
			if l.MediaType != artifact.LayerMediaType(artifact.KindDataset, artifact.FormatTar) {
				t.Errorf("--kind 'eval/**=dataset': eval is %s", l.MediaType)
			}
		case "tools":
			if l.MediaType != artifact.LayerMediaType(artifact.KindWeight, artifact.FormatTar) {
				t.Errorf("--kind weight=tools (the older KIND=PATTERN): tools is %s", l.MediaType)
			}
		}
	}

	for _, bad := range []struct{ flag, want string }{
		{"*.dat=wieght", `--kind "*.dat=wieght": want PATTERN=KIND, and neither "wieght" nor "*.dat" is a kind (valid: weight, weight.config, doc, code, dataset`},
		{"*.dat", `--kind "*.dat": want PATTERN=KIND (valid kinds: weight, weight.config, doc, code, dataset)`},
		{"/abs=doc", `--kind: pattern "/abs" must be relative to the model directory`},
	} {
		code, _, errOut := run("--home", home, "pack", model, "-t", "m:bad", "--kind", bad.flag)
		if code != 2 || !strings.Contains(errOut, bad.want) {
			t.Errorf("--kind %q: exit %d, want 2 and %q\n%s", bad.flag, code, bad.want, errOut)
		}
	}

	emptyHome := t.TempDir()
	code, _, errOut = run("--home", emptyHome, "pack", model, "-t", "m:strict", "--strict")
	if code == 0 || !strings.Contains(errOut, "unknown kind: eval/x/part.bin2, weird.dat") || !strings.Contains(errOut, "nothing was packed (strict)") {
		t.Errorf("--strict with files of unknown kind: exit %d\n%s", code, errOut)
	}
	if blobs, _ := filepath.Glob(filepath.Join(emptyHome, "*", "blobs", "sha256", "*")); len(blobs) > 0 {
		t.Errorf("--strict failed but stored %d blobs", len(blobs))
	}
}

func sameCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Issue 32 item 6: --dry-run prints what would be written or sent and writes nothing, exit 0: pack creates no
// store (not even its directory); push and copy make only GET/HEAD requests of a real registry (its access log),
// which holds afterwards exactly what it held before (oras repo ls and oras repo tags agree), and say which blobs
// the destination has or would mount.
func TestDryRunWritesNothing(t *testing.T) {
	run := binaryRunner(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{AccessLog: true})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := smallModel(t)
	home := filepath.Join(t.TempDir(), "home")

	code, out, errOut := run("--home", home, "pack", model, "-t", reg.Host+"/org/m:v1", "--dry-run", "--push")
	if code != 0 || !strings.Contains(out, "nothing was written") || !strings.Contains(out, "application/vnd.cncf.model.weight.v1.raw") || !strings.Contains(errOut, "classified ") {
		t.Fatalf("pack --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat(home); !os.IsNotExist(err) {
		t.Errorf("pack --dry-run created the store %s: %v", home, err)
	}

	mustRemoteCLI(t, "--home", home, "pack", model, "-t", "local/m:v1", "-q")
	oras := testenv.Tool(t, "oras")
	repos := func() string {
		t.Helper()
		b, err := exec.Command(oras, "repo", "ls", "--plain-http", reg.Host).CombinedOutput()
		if err != nil {
			t.Fatalf("oras repo ls: %v\n%s", err, b)
		}
		return string(b)
	}
	writes := regexp.MustCompile(`"(PUT|POST|PATCH|DELETE) /v2/`)
	logSince := func(before int) string {
		b, _ := os.ReadFile(reg.LogPath)
		return string(b[before:])
	}
	logLen := func() int { b, _ := os.ReadFile(reg.LogPath); return len(b) }

	before := logLen()
	code, out, errOut = run("--home", home, "push", reg.Host+"/org/m:v1", "--from", "local/m:v1", "--dry-run")
	if code != 0 || !strings.Contains(out, "nothing was sent") || !strings.Contains(out, "the tag would be created") || strings.Contains(out, "exists") {
		t.Fatalf("push --dry-run to an empty registry: exit %d\n%s%s", code, out, errOut)
	}
	if w := writes.FindString(logSince(before)); w != "" || repos() != "" {
		t.Fatalf("push --dry-run wrote to the registry: %s; repositories %q", w, repos())
	}

	mustRemoteCLI(t, "--home", home, "push", reg.Host+"/org/m:v1", "--from", "local/m:v1", "-q")
	tagsBefore, _ := exec.Command(oras, "repo", "tags", "--plain-http", reg.Host+"/org/m").CombinedOutput()
	before = logLen()
	code, out, errOut = run("--home", home, "-o", "json", "push", reg.Host+"/org/m:v1", "--from", "local/m:v1", "--dry-run")
	var plan struct {
		DryRun    bool
		TagDigest string
		Send      int64
		Root      struct{ Digest string }
		Items     []struct {
			Role   string
			Exists bool
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &plan) != nil || !plan.DryRun || plan.Send != 0 || plan.TagDigest != plan.Root.Digest || len(plan.Items) < 3 {
		t.Fatalf("push --dry-run of what the registry has: exit %d\n%s%s", code, out, errOut)
	}
	for _, it := range plan.Items {
		if !it.Exists {
			t.Errorf("push --dry-run: a %s the registry has is not said to exist", it.Role)
		}
	}

	code, out, errOut = run("copy", reg.Host+"/org/m:v1", reg.Host+"/team/m", "--dry-run")
	if code != 0 || !strings.Contains(out, "would mount from org/m") || !strings.Contains(out, "nothing was sent") {
		t.Fatalf("copy --dry-run within one registry: exit %d\n%s%s", code, out, errOut)
	}
	log := logSince(before)
	if w := writes.FindString(log); w != "" {
		t.Fatalf("dry runs wrote to the registry: %s", w)
	}
	if !strings.Contains(log, `"HEAD /v2/team/m/blobs/`) {
		t.Errorf("copy --dry-run asked the destination nothing:\n%s", log)
	}
	tagsAfter, _ := exec.Command(oras, "repo", "tags", "--plain-http", reg.Host+"/org/m").CombinedOutput()
	if got := repos(); got != "org/m\n" || string(tagsAfter) != string(tagsBefore) {
		t.Errorf("after the dry runs the registry holds %q, tags %q (were %q)", got, tagsAfter, tagsBefore)
	}
}

// Issue 32 item 6: copy -r --dry-run between two registries lists the referrers oras attached (and their blobs)
// beside the model, all to send; after the real copy -r the same dry run finds every one at the destination, the
// tag naming the root, nothing to send.
func TestCopyReferrersDryRun(t *testing.T) {
	run := binaryRunner(t)
	src := testenv.StartRegistry(t, testenv.RegistryOptions{})
	dst := testenv.StartRegistry(t, testenv.RegistryOptions{AccessLog: true})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	ref := src.Host + "/org/m:v1"
	mustRemoteCLI(t, "--home", t.TempDir(), "pack", smallModel(t), "-t", ref, "--push", "-q")
	work := t.TempDir()
	os.WriteFile(filepath.Join(work, "sbom.json"), []byte(`{"spdxVersion":"SPDX-2.3"}`), 0o644)
	attach := exec.Command(testenv.Tool(t, "oras"), "attach", "--plain-http", ref, "--artifact-type", "application/spdx+json", "sbom.json")
	attach.Dir = work
	if b, err := attach.CombinedOutput(); err != nil {
		t.Fatalf("oras attach: %v\n%s", err, b)
	}
	type item struct {
		Role        string
		Exists      bool
		Annotations map[string]string
	}
	type plan struct {
		TagDigest string
		Send      int64
		Root      struct{ Digest string }
		Items     []item
	}
	dryRun := func() plan {
		t.Helper()
		code, out, errOut := run("-o", "json", "copy", "-r", ref, dst.Host+"/org/m", "--dry-run")
		var p plan
		if code != 0 || json.Unmarshal([]byte(out), &p) != nil {
			t.Fatalf("copy -r --dry-run: exit %d\n%s%s", code, out, errOut)
		}
		return p
	}
	p := dryRun()
	sbom := false
	for _, it := range p.Items {
		sbom = sbom || it.Annotations["org.opencontainers.image.title"] == "sbom.json"
		if it.Exists {
			t.Errorf("an empty destination has a %s", it.Role)
		}
	}
	referrer := slices.ContainsFunc(p.Items, func(it item) bool { return it.Role == "referrer" })
	if !sbom || !referrer || p.Items[0].Role != "manifest" || p.TagDigest != "" || p.Send == 0 {
		t.Errorf("copy -r --dry-run to an empty registry: %+v", p)
	}
	if b, _ := os.ReadFile(dst.LogPath); regexp.MustCompile(`"(PUT|POST|PATCH|DELETE) /v2/`).Match(b) {
		t.Fatalf("copy -r --dry-run wrote to the destination:\n%s", b)
	}

	mustRemoteCLI(t, "copy", "-r", ref, dst.Host+"/org/m", "-q")
	p2 := dryRun()
	if len(p2.Items) != len(p.Items) || p2.Send != 0 || p2.TagDigest != p2.Root.Digest {
		t.Errorf("copy -r --dry-run after the copy: %+v", p2)
	}
	for _, it := range p2.Items {
		if !it.Exists {
			t.Errorf("after copy -r, the destination lacks a %s", it.Role)
		}
	}
}

// Issue 32 item 6: pack hf://… --dry-run lists the layers with the digests the Hub states for its LFS files (the
// very digests a real pack writes), opens no store and refuses --ignore-file (a Hub model's files are chosen with
// --include/--exclude).
func TestPackHFDryRun(t *testing.T) {
	repo, _ := hubRepo(t, "acme/tiny")
	s := hubserver.Start(t, repo)
	hubEnv(t, s)
	run := binaryRunner(t)
	home := filepath.Join(t.TempDir(), "home")
	code, out, errOut := run("--home", home, "-o", "json", "pack", "hf://acme/tiny", "-t", "tiny:v1", "--dry-run")
	var res struct {
		DryRun  bool
		Summary struct {
			Layers []struct {
				Path   string
				Digest digest.Digest
			}
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || !res.DryRun {
		t.Fatalf("pack hf:// --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat(home); !os.IsNotExist(err) {
		t.Errorf("pack hf:// --dry-run created the store: %v", err)
	}
	packed := t.TempDir()
	if code, _, errOut := run("--home", packed, "pack", "hf://acme/tiny", "-t", "tiny:v1", "-q"); code != 0 {
		t.Fatalf("pack hf://: exit %d\n%s", code, errOut)
	}
	_, m, _ := stored(t, packed, "tiny:v1")
	written := layerDigests(m)
	stated := 0
	for _, l := range res.Summary.Layers {
		if l.Digest != "" {
			stated++
			if written[l.Path] != l.Digest {
				t.Errorf("%s: the dry run says %s, the pack wrote %s", l.Path, l.Digest, written[l.Path])
			}
		}
	}
	if stated == 0 || len(res.Summary.Layers) != len(written) {
		t.Errorf("dry run: %d layers, %d with a digest; the pack wrote %d", len(res.Summary.Layers), stated, len(written))
	}
	if code, _, errOut := run("--home", home, "pack", "hf://acme/tiny", "-t", "tiny:v1", "--ignore-file", "x"); code != 2 || !strings.Contains(errOut, "--include/--exclude") {
		t.Errorf("pack hf:// --ignore-file: exit %d\n%s", code, errOut)
	}
}
