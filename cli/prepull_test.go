package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
	"github.com/modelpack/modelpack/prepull"
)

func TestPrepullProgressLines(t *testing.T) {
	var buf bytes.Buffer
	report := progressPrinter(&buf, &Globals{Output: "table"})
	a := prepull.Entry{Ref: "r/a:1", State: prepull.StatePending}
	report([]prepull.Entry{a})
	for _, done := range []int64{10, 20, 150, 900} { // 1%, 2%, 15%, 90% of 1000
		a.State, a.Done, a.Total = prepull.StatePulling, done, 1000
		report([]prepull.Entry{a})
	}
	a.State = prepull.StateReady
	report([]prepull.Entry{a})
	report([]prepull.Entry{a})
	want := []string{
		"r/a:1: pending",
		"r/a:1: pulling 1% (10 B / 1000 B)",
		"r/a:1: pulling 15% (150 B / 1000 B)",
		"r/a:1: pulling 90% (900 B / 1000 B)",
		"r/a:1: ready (1000 B)",
	}
	if got := strings.Split(strings.TrimSpace(buf.String()), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant (one per state and per 10%%):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	buf.Reset()
	progressPrinter(&buf, &Globals{Output: "json"})([]prepull.Entry{a})
	progressPrinter(&buf, &Globals{Output: "table", Quiet: true})([]prepull.Entry{a})
	if buf.Len() != 0 {
		t.Errorf("json or quiet printed progress: %q", buf.String())
	}
}

func TestPrepullTable(t *testing.T) {
	var buf bytes.Buffer
	printEntries(&buf, []prepull.Entry{
		{List: "cli", Ref: "r/a:1", State: prepull.StateReady, Total: 2 << 30, Digest: "sha256:abc"},
		{List: "cli", Ref: "r/bad:1", State: prepull.StateFailed, Error: "resolve: not found"},
	}, true)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "LIST") ||
		!strings.Contains(lines[1], "2.0 GiB") ||
		strings.Join(strings.Fields(lines[2]), " ") != "cli r/bad:1 failed - - resolve: not found" {
		t.Errorf("table:\n%s", buf.String())
	}
	if got := pick([]prepull.Entry{{Ref: "b"}, {Ref: "a"}}, []string{"a", "c", "b", "a"}); len(got) != 2 || got[0].Ref != "a" || got[1].Ref != "b" {
		t.Errorf("pick = %+v", got)
	}
}

// Item: `prepull status` shows the model's size also when the node's cache held it already (a model prepulled
// again after a cancel, or mounted before): no bytes moved, so no progress told the size; the cache's record does.
func TestPrepullStatusSizeOfCachedModel(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	model := t.TempDir()
	if err := testmodel.Generate(model, testmodel.Small); err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/pp/sized:v1"
	if code, _, stderr := run("pack", model, "-t", ref, "--push", "--plain-http"); code != 0 {
		t.Fatalf("pack --push: exit %d: %s", code, stderr)
	}
	root := t.TempDir()
	sock, stop := servePrepullAPI(t, root, []string{reg.Host})
	status := func() (prepull.Entry, string) {
		t.Helper()
		code, out, stderr := run("prepull", "status", "--socket", sock, "-o", "json")
		var es []prepull.Entry
		if err := json.Unmarshal([]byte(out), &es); code != 0 || err != nil || len(es) != 1 {
			t.Fatalf("prepull status -o json: exit %d, %v: %s %s", code, err, out, stderr)
		}
		code, table, stderr := run("prepull", "status", "--socket", sock)
		if code != 0 {
			t.Fatalf("prepull status: exit %d: %s", code, stderr)
		}
		return es[0], table
	}
	check := func(after string) {
		t.Helper()
		e, table := status()
		lines := strings.Split(strings.TrimSpace(table), "\n")
		if e.State != prepull.StateReady || e.Total <= 0 || e.Done != e.Total || len(lines) != 2 ||
			strings.Fields(lines[1])[2] == "-" || !strings.Contains(lines[1], humanBytes(e.Total)) {
			t.Fatalf("after %s: entry %+v, table:\n%s\nwant ready with its size", after, e, table)
		}
	}
	for _, args := range [][]string{{"prepull", ref}, {"prepull", "cancel", ref}, {"prepull", ref}} {
		if code, _, stderr := run(append(args, "--socket", sock)...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		if args[1] != "cancel" {
			check(strings.Join(args, " "))
		}
	}
	// The driver restarted: the entry comes back from its pin, with the size of the cache's record.
	stop()
	sock, _ = servePrepullAPI(t, root, []string{reg.Host})
	check("a restart")
}
