package cli

import (
	"bytes"
	"fmt"

	"github.com/modelpack/modelpack/internal/testmodel"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Item: every command a user runs shows Examples in its help, each naming that command.
func TestEveryCommandHasExamples(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.Runnable() || c.Hidden || c.Name() == "help" || strings.HasPrefix(c.Name(), "__") || c.Parent() == nil || c.Parent().Name() == "completion" {
			return
		}
		if c.Example == "" {
			t.Errorf("%s has no Examples", c.CommandPath())
			return
		}
		for _, line := range strings.Split(strings.ReplaceAll(c.Example, "\\\n", " "), "\n") {
			line = strings.TrimSpace(line)
			if strings.Contains(line, "&&") || !strings.HasPrefix(line, "modelpack ") {
				continue // a pipeline, or another tool (cosign) shown alongside
			}
			if !strings.HasPrefix(line, c.CommandPath()) {
				t.Errorf("%s: example %q runs another command", c.CommandPath(), line)
				continue
			}
			// The flags it shows exist and parse.
			args := strings.Fields(strings.TrimPrefix(line, c.CommandPath()))
			fresh, rest, err := NewRoot().Find(append(strings.Fields(strings.TrimPrefix(c.CommandPath(), "modelpack ")), args...))
			if err == nil {
				err = fresh.ParseFlags(rest)
			}
			if err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), line, err)
			}
		}
	}
	walk(NewRoot())
}

// Item: completion offers stored references for unpack's REF and push --from, and directories for unpack's DIR.
func TestCompletion(t *testing.T) {
	home := t.TempDir()
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	mustRun(t, home, "pack", model, "-t", "llama3:8b", "-q")
	complete := func(args ...string) string {
		t.Helper()
		return mustRun(t, home, append([]string{"__complete"}, args...)...)
	}
	dirs := fmt.Sprintf(":%d\n", cobra.ShellCompDirectiveFilterDirs)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"unpack", ""}, "llama3:8b\n"},
		{[]string{"unpack", "llama3:8b", ""}, dirs},
		{[]string{"fetch", "registry.local/org/m:v1", ""}, dirs},
		{[]string{"push", "registry.local/org/m:v1", "--from", ""}, "llama3:8b\n"},
	} {
		if out := complete(c.args...); !strings.Contains(out, c.want) {
			t.Errorf("completion of %q: %q, want %q in it", c.args, out, c.want)
		}
	}
}

// Item: one unit family: pack and unpack bars count in MiB like every other size printed.
func TestBarUnitsAreBinary(t *testing.T) {
	var b bytes.Buffer
	bar := newBytesBar(&b, 5<<20, "packing")
	bar.Add64(3 << 20)
	if s := bar.String(); !strings.Contains(s, "MiB") || strings.Contains(s, " MB") {
		t.Fatalf("bar %q, want MiB", s)
	}
	if got := humanBytes(5 << 30); got != "5.0 GiB" {
		t.Fatalf("humanBytes: %q", got)
	}
}
