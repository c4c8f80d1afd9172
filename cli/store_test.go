package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/artifact/schema"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// run executes the CLI in-process against home and returns stdout, stderr and the error.
func run(t *testing.T, home string, args ...string) (string, string, error) {
	t.Helper()
	root := NewRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"--home", home}, args...))
	err := root.Execute()
	return out.String(), errOut.String(), err
}

func mustRun(t *testing.T, home string, args ...string) string {
	t.Helper()
	out, errOut, err := run(t, home, args...)
	if err != nil {
		t.Fatalf("modelpack %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out
}

func TestStoreCommands(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	model := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(model, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := run(t, home, "pack", model, "-t", "demo/model:v1", "--license", "Apache-2.0")
	if err != nil || !strings.Contains(out, "packed demo/model:v1") {
		t.Fatalf("pack: %v %q", err, out)
	}
	// Piped, pack prints its classification summary, a line per blob and no bar.
	for i, l := range strings.Split(strings.TrimSpace(errOut), "\n") {
		if i == 0 && strings.HasPrefix(l, "classified 8 files into 8 layers: weight 2 (8.0 KiB), ") {
			continue
		}
		if !strings.HasPrefix(l, "packed ") || strings.Contains(l, "%") {
			t.Fatalf("pack printed %q on a non-TTY stderr", errOut)
		}
	}
	var packed struct {
		Reference  string `json:"reference"`
		Descriptor struct {
			Digest string `json:"digest"`
		} `json:"descriptor"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, home, "build", model, "-t", "demo/model:v1", "--license", "Apache-2.0", "-o", "json")), &packed); err != nil {
		t.Fatal(err)
	}
	if packed.Reference != "demo/model:v1" || !strings.HasPrefix(packed.Descriptor.Digest, "sha256:") {
		t.Fatalf("pack -o json: %+v", packed)
	}

	mustRun(t, home, "tag", "demo/model:v1", "demo/model:stable")
	ls := mustRun(t, home, "ls")
	if !strings.Contains(ls, "REFERENCE") || !strings.Contains(ls, "demo/model:v1") || !strings.Contains(ls, "demo/model:stable") || !strings.Contains(ls, "llama") {
		t.Fatalf("ls:\n%s", ls)
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, home, "list", "-o", "json")), &list); err != nil || len(list) != 2 {
		t.Fatalf("list -o json: %v %v", list, err)
	}

	insp := mustRun(t, home, "inspect", "demo/model:stable")
	for _, want := range []string{packed.Descriptor.Digest, "Format:", "safetensors", "bfloat16", "Apache-2.0", "weight ", "model-00001-of-00002.safetensors", "README.md", "weight.config"} {
		if !strings.Contains(insp, want) {
			t.Errorf("inspect lacks %q:\n%s", want, insp)
		}
	}
	var info struct {
		Manifest struct {
			Layers []json.RawMessage `json:"layers"`
		} `json:"manifest"`
		Config struct {
			Descriptor struct {
				Licenses []string `json:"licenses"`
			} `json:"descriptor"`
		} `json:"config"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, home, "inspect", "demo/model:v1", "-o", "json")), &info); err != nil || len(info.Manifest.Layers) != 8 || info.Config.Descriptor.Licenses[0] != "Apache-2.0" {
		t.Fatalf("inspect -o json: %+v %v", info, err)
	}

	// The spec's kind names and their plural aliases select the same layers.
	for _, filter := range []string{"weight.config,doc", "config,docs", "Configs,Docs"} {
		dst := filepath.Join(t.TempDir(), "out")
		mustRun(t, home, "unpack", "demo/model:v1", dst, "--filter", filter)
		entries, _ := os.ReadDir(dst)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if strings.Join(names, ",") != "LICENSE,README.md,config.json,generation_config.json,tokenizer.json,tokenizer_config.json" {
			t.Fatalf("unpack --filter %s wrote %v", filter, names)
		}
	}
	all := filepath.Join(t.TempDir(), "all")
	mustRun(t, home, "unpack", "demo/model:v1", all)
	for _, n := range []string{"config.json", testmodel.ShardName(1, 2)} {
		a, _ := os.ReadFile(filepath.Join(model, n))
		b, err := os.ReadFile(filepath.Join(all, n))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs after unpack", n)
		}
	}

	// Shell completion offers the stored references.
	comp := mustRun(t, home, "__complete", "inspect", "")
	if !strings.Contains(comp, "demo/model:stable") || !strings.Contains(comp, "demo/model:v1") {
		t.Fatalf("completion:\n%s", comp)
	}

	mustRun(t, home, "rm", "demo/model:v1")
	out = mustRun(t, home, "prune")
	if !strings.Contains(out, "pruned 0 blobs") { // stable still holds everything
		t.Fatalf("prune with a remaining tag: %q", out)
	}
	out = mustRun(t, home, "rm", "demo/model:stable", "--prune")
	if !strings.Contains(out, "removed demo/model:stable") || !strings.Contains(out, "pruned 10 blobs") {
		t.Fatalf("rm --prune: %q", out)
	}
	if ls := mustRun(t, home, "ls", "-o", "json"); strings.TrimSpace(ls) != "[]" {
		t.Fatalf("ls after rm: %s", ls)
	}
}

// Errors are one line naming what is wrong, and the command fails.
func TestCommandErrors(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	model := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(model, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	mustRun(t, home, "pack", model, "-t", "m:v1")
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"invalid reference":  {[]string{"pack", model, "-t", "Not/Valid"}, `invalid reference "Not/Valid"`},
		"missing tag":        {[]string{"pack", model}, `required flag(s) "tag" not set`},
		"missing dir":        {[]string{"pack", model + "-nope", "-t", "m:v2"}, "model-nope: no such directory"},
		"bad layer format":   {[]string{"pack", model, "-t", "m:v2", "--layer-format", "zip"}, `unknown layer format "zip"`},
		"bad kind rule":      {[]string{"pack", model, "-t", "m:v2", "--kind", "models=x"}, `--kind "models=x": want PATTERN=KIND, and neither "x" nor "models" is a kind (valid: weight, weight.config, doc, code, dataset`},
		"bad created":        {[]string{"pack", model, "-t", "m:v2", "--created", "yesterday"}, "--created"},
		"relative URL":       {[]string{"pack", model, "-t", "m:v2", "--source-url", "github.com/x"}, `--source-url "github.com/x"`},
		"unknown filter":     {[]string{"unpack", "m:v1", t.TempDir(), "--filter", "models"}, `--filter: unknown kind "models" (valid: weight, weight.config, doc, code, dataset`},
		"bad include":        {[]string{"unpack", "m:v1", t.TempDir(), "--include", "["}, `--include "["`},
		"unknown reference":  {[]string{"inspect", "m:v9"}, "m:v9: not found"},
		"rm unknown":         {[]string{"rm", "m:v9"}, "m:v9: not found"},
		"tag invalid target": {[]string{"tag", "m:v1", "UPPER"}, `invalid reference "UPPER"`},
		"bad output":         {[]string{"ls", "-o", "yaml"}, `invalid --output "yaml"`},
	} {
		_, _, err := run(t, home, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v, want one line containing %q", name, err, tc.want)
		}
	}
	// Nothing but m:v1 was stored by the failed packs.
	if ls := mustRun(t, home, "ls", "-q"); strings.Count(ls, "m:") != 1 {
		t.Fatalf("ls after failed packs:\n%s", ls)
	}
}

// Every descriptor and config flag ends up in a config that the ModelPack schema accepts.
func TestPackFlagsGiveValidConfig(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	model := filepath.Join(t.TempDir(), "model")
	if err := testmodel.Generate(model, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	mustRun(t, home, "pack", model, "-t", "m:v1", "--name", "tiny", "--family", "llama3", "--model-version", "1.0",
		"--vendor", "ACME", "--title", "Tiny", "--description", "a tiny model", "--source-url", "https://example.com/src",
		"--doc-url", "https://example.com/doc", "--revision", "abc123", "--license", "Apache-2.0", "--license", "MIT",
		"--author", "a@example.com", "--arch", "transformer", "--format", "safetensors", "--param-size", "1234567",
		"--precision", "bf16", "--quantization", "awq", "--created", "2025-06-01T12:00:00Z")
	var info struct {
		Config json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, home, "inspect", "m:v1", "-o", "json")), &info); err != nil {
		t.Fatal(err)
	}
	if err := schema.ValidateConfig(info.Config); err != nil {
		t.Fatalf("%v\n%s", err, info.Config)
	}
	var compact bytes.Buffer
	json.Compact(&compact, info.Config)
	info.Config = compact.Bytes()
	for _, want := range []string{`"paramSize":"1.2M"`, `"createdAt":"2025-06-01T12:00:00Z"`, `"licenses":["Apache-2.0","MIT"]`, `"name":"tiny"`, `"quantization":"awq"`} {
		if !strings.Contains(string(info.Config), want) {
			t.Errorf("config lacks %s: %s", want, info.Config)
		}
	}
}
