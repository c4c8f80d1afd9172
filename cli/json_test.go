package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/cache"
	"github.com/modelpack/modelpack/csidriver/cachebackend"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/prepull"
)

// notJSONCommands print no result document under -o json, and why.
var notJSONCommands = map[string]string{
	"modelpack csi-driver": "a server: it logs until stopped and has no result",
	"modelpack completion": "cobra's: prints a shell script",
	"modelpack help":       "cobra's: prints help text",
	"modelpack save":       "its -o is the tar file it writes (docker save's flag): the file is its result",
}

// oneJSON decodes stdout as exactly one JSON document (an object or an array): nothing before it, nothing after.
func oneJSON(t *testing.T, name, stdout string) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(stdout))
	var doc any
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s -o json: stdout is not a JSON document: %v\n%s", name, err, stdout)
	}
	if _, ok := doc.(map[string]any); !ok {
		if _, ok := doc.([]any); !ok {
			t.Fatalf("%s -o json: stdout is %T, not an object or an array:\n%s", name, doc, stdout)
		}
	}
	var more any
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		t.Fatalf("%s -o json: stdout holds more than one JSON document (%v)\n%s", name, err, stdout)
	}
	return doc
}

// runnableCommands are the command paths of the tree that run something, hidden ones included.
func runnableCommands() []string {
	var paths []string
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() {
			paths = append(paths, c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(NewRoot())
	return paths
}

// startPrepullAPI serves the prepull API on a real node cache, as the driver does, and returns its socket.
func startPrepullAPI(t *testing.T, plainHTTP ...string) string {
	t.Helper()
	sock, _ := servePrepullAPI(t, t.TempDir(), plainHTTP)
	return sock
}

// servePrepullAPI serves the prepull API on the node cache at root until stop (or the test's end), as a driver
// run does: a second call on the same root after stop is the driver restarted.
func servePrepullAPI(t *testing.T, root string, plainHTTP []string) (sock string, stop func()) {
	t.Helper()
	c, err := cache.Open(cache.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	// Unix socket paths are limited to ~108 bytes; t.TempDir() can be longer.
	dir, err := os.MkdirTemp("", "pp")
	if err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(dir, "prepull.sock")
	be := cachebackend.New(c, cachebackend.Options{
		Remote: remote.Options{RegistryConfig: filepath.Join(t.TempDir(), "config.json"), PlainHTTPHosts: plainHTTP},
	}).Prepuller(nil, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- prepull.Serve(ctx, sock, be, prepull.Options{Logger: slog.New(slog.DiscardHandler)}) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("prepull.Serve: %v", err)
			}
			c.Close()
			os.RemoveAll(dir)
		})
	}
	t.Cleanup(stop)
	client := prepull.NewClient(sock)
	deadline := time.Now().Add(10 * time.Second)
	for { // readiness, as prepull's own tests wait for it
		if _, err := client.Entries(context.Background(), "", 0); err == nil {
			return sock, stop
		} else if time.Now().After(deadline) {
			t.Fatalf("prepull API did not start: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pullIntoCache pulls ref (plain HTTP) into the node cache at root, as the driver does, and closes the cache.
func pullIntoCache(t *testing.T, root, ref string) {
	t.Helper()
	repo, r, err := remote.NewRepository(ref, remote.Options{PlainHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	desc, err := repo.Resolve(context.Background(), r.Reference)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.Open(cache.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Pull(context.Background(), repo, desc, nil)
	if err := errors.Join(err, c.Close()); err != nil {
		t.Fatal(err)
	}
}

// Item: every command prints exactly one JSON document on stdout under -o json, and nothing on stderr. The runs
// below cover every runnable command of the tree but those in notJSONCommands (a new command fails this test until
// it is run here), each against the real thing: a registry, the local store, a node cache, the prepull API.
func TestEveryCommandPrintsOneJSONDocument(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	t.Setenv("COSIGN_PASSWORD", "pw")
	home := t.TempDir()
	nodeCache := t.TempDir()
	sock := startPrepullAPI(t, reg.Host)
	keys := filepath.Join(t.TempDir(), "cosign")
	model := smallModel(t)
	ref := reg.Host + "/every/model:v1"
	regConfig := filepath.Join(t.TempDir(), "config.json")

	ran := map[string]bool{}
	run := func(args ...string) any {
		t.Helper()
		cmd, _, err := NewRoot().Find(args)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		name := strings.TrimPrefix(cmd.CommandPath(), "modelpack ")
		code, out, errOut := runJSON(t, append(args, "-o", "json")...)
		if code != 0 || errOut != "" {
			t.Fatalf("%s -o json: exit %d, stderr %q", name, code, errOut)
		}
		ran[cmd.CommandPath()] = true
		return oneJSON(t, name, out)
	}
	field := func(doc any, key string) any {
		m, _ := doc.(map[string]any)
		return m[key]
	}

	if v := run("version"); field(v, "version") != Version || field(v, "go") == "" {
		t.Fatalf("version -o json: %v", v)
	}
	if k := run("key", "generate", "--output-key-prefix", keys); field(k, "privateKey") != keys+".key" || field(k, "publicKey") != keys+".pub" {
		t.Fatalf("key generate -o json: %v", k)
	}
	run("--home", home, "pack", model, "-t", "every/model:v1")
	run("--home", home, "list")
	run("--home", home, "inspect", "every/model:v1")
	run("--home", home, "scan", "every/model:v1")
	run("scan", model)
	run("--home", home, "tag", "every/model:v1", "every/model:v2")
	run("--home", home, "unpack", "every/model:v1", filepath.Join(t.TempDir(), "u"))
	run("--home", home, "push", ref, "--from", "every/model:v1", "--plain-http")
	run("pack", model, "-t", reg.Host+"/every/direct:v1", "--push", "--plain-http")
	run("--home", t.TempDir(), "pull", ref, "--plain-http")
	run("copy", ref, reg.Host+"/every/copy:v1", "--plain-http")
	run("fetch", ref, filepath.Join(t.TempDir(), "f"), "--plain-http")
	run("tags", reg.Host+"/every/model", "--plain-http")
	sbom := filepath.Join(t.TempDir(), "sbom.json")
	os.WriteFile(sbom, []byte("{}"), 0o644)
	run("attach", ref, "--artifact-type", "application/spdx+json", sbom, "--plain-http")
	run("discover", ref, "--plain-http")
	run("diff", ref, reg.Host+"/every/direct:v1", "--plain-http")
	saved := filepath.Join(t.TempDir(), "model.tar")
	if code, _, errOut := runJSON(t, "save", ref, "-r", "-o", saved, "--plain-http"); code != 0 {
		t.Fatalf("save: %s", errOut)
	}
	run("--home", t.TempDir(), "load", saved)
	run("load", saved, reg.Host+"/every/loaded:v1", "--plain-http")
	run("delete", "--force", reg.Host+"/every/loaded:v1", "--plain-http")
	run("sign", ref, "--key", keys+".key", "--plain-http")
	run("verify", ref, "--key", keys+".pub", "--insecure-ignore-tlog", "--plain-http")
	run("login", reg.Host, "-u", "ann", "-p", "pw", "--plain-http", "--registry-config", regConfig)
	run("logout", reg.Host, "--registry-config", regConfig)
	run("--home", home, "rm", "every/model:v2")
	run("--home", home, "prune")

	pullIntoCache(t, nodeCache, ref)
	entries, _ := run("cache", "ls", "--root", nodeCache).([]any)
	if len(entries) == 0 {
		t.Fatal("cache ls -o json: no entry after a pull into the cache")
	}
	run("cache", "du", "--root", nodeCache)
	run("cache", "verify", "--root", nodeCache)
	run("cache", "gc", "--root", nodeCache)
	dgst, _ := field(field(entries[0], "descriptor"), "digest").(string)
	run("cache", "rm", dgst, "--root", nodeCache)

	if pulled, _ := run("prepull", ref, "--socket", sock).([]any); len(pulled) != 1 || field(pulled[0], "state") != string(prepull.StateReady) {
		t.Fatalf("prepull -o json: %v", pulled)
	}
	if listed, _ := run("prepull", "status", "--socket", sock).([]any); len(listed) != 1 {
		t.Fatalf("prepull status -o json: %v", listed)
	}
	run("prepull", "cache", "--socket", sock)
	cancelled := run("prepull", "cancel", ref, "--socket", sock)
	if got, _ := json.Marshal(cancelled); string(got) != `{"cancelled":["`+ref+`"],"list":"`+prepull.DefaultList+`"}` {
		t.Fatalf("prepull cancel -o json: %s", got)
	}
	if listed, _ := run("prepull", "status", "--socket", sock).([]any); len(listed) != 0 {
		t.Fatalf("prepull status after cancel: %v", listed)
	}
	// Cancelling what is not listed is an error document, naming what was cancelled before it.
	code, out, errOut := runJSON(t, "prepull", "cancel", ref, "--socket", sock, "-o", "json")
	if msg, _ := field(field(oneJSON(t, "prepull cancel (stderr)", errOut), "error"), "message").(string); code != 1 || out != "" || !strings.Contains(msg, ref) {
		t.Fatalf("prepull cancel of a reference not listed: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	run("prepull", ref, "--socket", sock)
	unlisted := reg.Host + "/every/unlisted:v1"
	code, out, errOut = runJSON(t, "prepull", "cancel", ref, unlisted, "--socket", sock, "-o", "json")
	msg, _ := field(field(oneJSON(t, "prepull cancel (stderr)", errOut), "error"), "message").(string)
	if code != 1 || out != "" || !strings.HasPrefix(msg, "cancelled "+ref+"; "+unlisted+": ") {
		t.Fatalf("prepull cancel of a listed and an unlisted reference: exit %d, stdout %q, message %q; want the first named as cancelled", code, out, msg)
	}

	for _, path := range runnableCommands() {
		if _, ok := notJSONCommands[path]; !ok && !ran[path] {
			t.Errorf("%s is not run under -o json here", path)
		}
	}
}

// Item: docs/json.md names every command that prints JSON in its table's "printed by" column, and lists those that
// do not print a document.
func TestJSONDocsNameEveryCommand(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "json.md"))
	if err != nil {
		t.Fatal(err)
	}
	var printedBy strings.Builder
	for _, line := range strings.Split(string(doc), "\n") {
		if cells := strings.Split(line, "|"); len(cells) >= 4 && strings.HasPrefix(line, "|") {
			printedBy.WriteString(cells[len(cells)-2])
		}
	}
	for _, path := range runnableCommands() {
		name := strings.TrimPrefix(path, "modelpack ")
		if _, ok := notJSONCommands[path]; ok {
			if !strings.Contains(string(doc), "`"+name+"`") {
				t.Errorf("docs/json.md does not say that %s prints no document", name)
			}
			continue
		}
		if !slices.Contains(backquoted(printedBy.String()), name) {
			t.Errorf("docs/json.md: no table row is printed by `%s`", name)
		}
	}
}

// backquoted returns the `quoted` words of s.
func backquoted(s string) []string {
	var out []string
	for parts := strings.Split(s, "`"); len(parts) > 2; parts = parts[2:] {
		out = append(out, parts[1])
	}
	return out
}

// Item: under -o json, errors cobra gives before the command runs (an unknown command, an unknown flag, a missing
// argument) are one JSON document on stderr too, wherever -o json stands, through the binary, with exit code 2.
func TestJSONForFlagAndCommandErrors(t *testing.T) {
	run := binaryRunner(t)
	for _, args := range [][]string{
		{"frobnicate", "-o", "json"},
		{"-o", "json", "frobnicate"},
		{"push", "--bogus", "-o", "json"},
		{"push", "--output=json", "--bogus"},
		{"-ojson", "tags"},
		{"pack", "-o", "json"},
	} {
		code, stdout, stderr := run(args...)
		var doc struct{ Error struct{ Message string } }
		if err := json.Unmarshal([]byte(stderr), &doc); code != 2 || err != nil || doc.Error.Message == "" || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr not one JSON error document (%v):\n%s", args, code, stdout, err, stderr)
		}
	}
}
