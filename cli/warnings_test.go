package cli

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// decodeOne decodes stdout as exactly one JSON object: nothing before it, nothing after it.
func decodeOne(t *testing.T, name, stdout string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(stdout))
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s -o json: stdout is not a JSON object: %v\n%s", name, err, stdout)
	}
	var more any
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		t.Fatalf("%s -o json: stdout holds more than one JSON document (%v)\n%s", name, err, stdout)
	}
	return doc
}

// Item: under -o json a warning is one string of the result's "warnings" (omitted when there is none) and stderr
// stays empty; without -o json the same warning reaches stderr, prefixed "warning:", and stdout keeps the result.
func TestWarningsUnderJSON(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir(), "MODELPACK_HOME="+t.TempDir(), "COSIGN_PASSWORD=pw")
	noWeights := t.TempDir()
	os.WriteFile(filepath.Join(noWeights, "README.md"), []byte("no weights here\n"), 0o644)
	unsigned := reg.Host + "/warn/noweights:v1"

	image := reg.Host + "/warn/image:v1"
	pushContainerImage(t, image)
	keys := filepath.Join(t.TempDir(), "cosign")
	if code, _, errOut := run("key", "generate", "--output-key-prefix", keys); code != 0 {
		t.Fatalf("key generate: %s", errOut)
	}
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policy, []byte("default:\n  mode: warn\n  keys: ["+keys+".pub]\n  transparencyLog: waive\n"), 0o644)
	cacheRoot := t.TempDir()
	if code, _, errOut := run("cache", "du", "--root", cacheRoot); code != 0 {
		t.Fatalf("cache du of a new cache: %s", errOut)
	}
	died := func() { // the marker a cache process leaves when it dies without closing the cache
		if err := os.WriteFile(filepath.Join(cacheRoot, "running"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	for _, c := range []struct {
		name    string
		args    []string
		warning string // "" for a command that must not warn
		before  func()
	}{
		{"pack", []string{"pack", noWeights, "-t", "warn/noweights:v1"}, "holds no weight files", nil},
		{"pack --push", []string{"pack", noWeights, "-t", unsigned, "--push", "--plain-http"}, "holds no weight files", nil},
		{"pack of a model", []string{"pack", smallModel(t), "-t", "warn/model:v1"}, "", nil},
		{"pull of a container image", []string{"pull", image, "--plain-http"}, "is a container image, not a model", nil},
		{"pull of a model", []string{"pull", unsigned, "--plain-http"}, "", nil},
		{"verify by a warn rule", []string{"verify", unsigned, "--policy", policy, "--plain-http"}, "allowed by a warn rule", nil},
		{"cache du after a crash", []string{"cache", "du", "--root", cacheRoot}, "cache was not closed cleanly", died},
		{"cache verify after a crash", []string{"cache", "verify", "--root", cacheRoot}, "cache was not closed cleanly", died},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.before != nil {
				c.before()
			}
			code, out, errOut := run(append(c.args, "-o", "json")...)
			if code != 0 || errOut != "" {
				t.Fatalf("-o json: exit %d, stderr %q", code, errOut)
			}
			doc := decodeOne(t, c.name, out)
			list, _ := doc["warnings"].([]any)
			switch {
			case c.warning == "" && doc["warnings"] != nil:
				t.Fatalf("-o json: warnings where there are none: %v", doc["warnings"])
			case c.warning != "" && (len(list) != 1 || !strings.Contains(list[0].(string), c.warning)):
				t.Fatalf("-o json: warnings %v, want one saying %q", doc["warnings"], c.warning)
			}

			if c.before != nil {
				c.before()
			}
			code, out, errOut = run(c.args...)
			if code != 0 || strings.Contains(out, "warning") {
				t.Fatalf("exit %d, stdout %q", code, out)
			}
			var warned []string // beside piped progress lines
			for _, line := range strings.Split(errOut, "\n") {
				if strings.HasPrefix(line, "warning: ") {
					warned = append(warned, line)
				}
			}
			if c.warning == "" && len(warned) > 0 || c.warning != "" && (len(warned) != 1 || !strings.Contains(warned[0], c.warning)) {
				t.Fatalf("stderr %q, want the warning %q", errOut, c.warning)
			}
		})
	}
}

// Item: a command that warned and then failed keeps its warnings under -o json: they are in the error document's
// "warnings" (omitted when there are none), beside the message; stdout stays empty.
func TestWarningsBeforeAFailureUnderJSON(t *testing.T) {
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir(), "MODELPACK_HOME="+t.TempDir())
	noWeights := t.TempDir()
	os.WriteFile(filepath.Join(noWeights, "README.md"), []byte("no weights here\n"), 0o644)
	refused := testenv.FreeAddr(t) // nothing listens there

	for _, c := range []struct {
		name, dir, warning string
	}{
		{"warned, then refused", noWeights, "holds no weight files"},
		{"refused without a warning", smallModel(t), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := run("pack", c.dir, "-t", refused+"/warn/failed:v1", "--push", "--plain-http", "-o", "json")
			if code != 1 || out != "" {
				t.Fatalf("exit %d, stdout %q; want 1 and nothing", code, out)
			}
			doc := decodeOne(t, "pack --push (stderr)", errOut)
			e, _ := doc["error"].(map[string]any)
			if msg, _ := e["message"].(string); !strings.Contains(msg, "connection refused") {
				t.Fatalf("error document %v: want the refusal as its message", doc)
			}
			list, _ := e["warnings"].([]any)
			switch {
			case c.warning == "" && e["warnings"] != nil:
				t.Fatalf("error document has warnings where there are none: %v", e["warnings"])
			case c.warning != "" && (len(list) != 1 || !strings.Contains(list[0].(string), c.warning)):
				t.Fatalf("error document's warnings %v, want one saying %q", e["warnings"], c.warning)
			}
		})
	}
}
