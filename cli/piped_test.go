package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/modelpack/modelpack/internal/testenv"
)

// binaryRunner runs the built binary with stdout and stderr piped (not a terminal), as in CI, and returns its exit
// code, stdout and stderr.
func binaryRunner(t *testing.T, env ...string) func(args ...string) (int, string, string) {
	bin := testenv.Modelpack(t)
	return func(args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("modelpack %s: %v", strings.Join(args, " "), err)
		}
		return code, out.String(), errb.String()
	}
}

var blobVerbs = map[string]bool{"pushing": true, "pushed": true, "pulling": true, "pulled": true, "copying": true, "copied": true,
	"fetching": true, "fetched": true, "exists": true, "mounted": true, "failed": true, "packed": true}

// progressLabels are the blob labels of piped progress lines ("pushing  LABEL  SIZE…"), each with its line.
func progressLabels(t *testing.T, stderr string) map[string]string {
	t.Helper()
	labels := map[string]string{}
	for _, line := range strings.Split(stderr, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == "warning:" || f[0] == "classified" { // pack's one summary of the classification
			continue
		}
		if !blobVerbs[f[0]] || len(line) < 10 {
			t.Fatalf("not a progress line: %q in\n%s", line, stderr)
		}
		labels[strings.SplitN(line[9:], "  ", 2)[0]] = line
	}
	return labels
}

// Item: piped progress names a layer by its file in every command that moves blobs (pack --push too), and a blob
// holding no file (a config, a signature) by its short digest.
func TestPipedProgressLabelsLayersByFile(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	home := t.TempDir()
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir(), "MODELPACK_HOME="+home, "MODELPACK_PROGRESS_INTERVAL=1h")
	model := smallModel(t)
	var files []string
	filepath.WalkDir(model, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(model, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return err
	})
	digestLabel := regexp.MustCompile(`^[0-9a-f]{12}( \(config\))?$`)
	check := func(name string, files []string, moved map[string]bool, args ...string) {
		t.Helper()
		code, _, errOut := run(args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errOut)
		}
		labels := progressLabels(t, errOut)
		for _, f := range files {
			if _, ok := labels[f]; !ok {
				t.Errorf("%s: no progress line names %s:\n%s", name, f, errOut)
			}
		}
		seen := map[string]bool{}
		for label, line := range labels {
			switch {
			case digestLabel.MatchString(label):
				seen[strings.TrimPrefix(label[12:], " ")] = true // "(config)" or "" (a blob of no file)
			case !slices.Contains(files, label):
				t.Errorf("%s: label %q is neither a file of the model nor a short digest: %q", name, label, line)
			}
		}
		for want := range moved {
			if !seen[want] {
				t.Errorf("%s: no blob labelled by its digest%s:\n%s", name, map[string]string{"(config)": " and (config)", "": " alone"}[want], errOut)
			}
		}
	}
	config := map[string]bool{"(config)": true}
	ref := reg.Host + "/labels/model:v1"
	check("pack --push", files, config, "pack", model, "-t", ref, "--push", "--plain-http")
	// A local pack prints a line per blob too (issue 21: the README promises it; it printed none).
	check("pack", files, config, "pack", model, "-t", "labels/model:v1")
	check("push", files, config, "push", reg.Host+"/labels/pushed:v1", "--from", "labels/model:v1", "--plain-http")
	check("pull", files, config, "--home", t.TempDir(), "pull", ref, "--plain-http")
	check("copy", files, config, "copy", ref, reg.Host+"/labels/copied:v1", "--plain-http")
	check("fetch", files, nil, "fetch", ref, filepath.Join(t.TempDir(), "out"), "--plain-http")

	// A container image's layers name no file: their short digest labels them.
	image := reg.Host + "/labels/image:v1"
	pushContainerImage(t, image)
	check("pull of an image", nil, map[string]bool{"(config)": true, "": true}, "--home", t.TempDir(), "pull", image, "--plain-http")
}

// Item: one failure, one message. A registry that is not there (nothing listening, a name DNS does not know) is
// one line naming the cause and the action, for every blob-moving command, piped and under -o json; no
// "failed <blob>" line per layer.
func TestUnreachableRegistryIsOneLine(t *testing.T) {
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir())
	home := t.TempDir()
	if code, _, stderr := run("--home", home, "pack", smallModel(t), "-t", "m:v1", "-q"); code != 0 {
		t.Fatal(stderr)
	}
	down := testenv.FreeAddr(t) // nothing listens there
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"push", down + "/x/m:v1", "--from", "m:v1"}, "connection refused: no registry listens at " + down},
		{[]string{"pull", down + "/x/m:v1"}, "connection refused"},
		{[]string{"fetch", down + "/x/m:v1", t.TempDir()}, "connection refused"},
		{[]string{"copy", down + "/x/m:v1", down + "/y/m:v1"}, "connection refused"},
		{[]string{"push", "registry.invalid:5000/x/m:v1", "--from", "m:v1"}, `unknown host "registry.invalid"`},
	} {
		args := append(append([]string{"--home", home}, c.args...), "--plain-http")
		code, _, stderr := run(args...)
		if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, c.want) || strings.Contains(stderr, "http://") {
			t.Errorf("%v: exit %d, want one line saying %q:\n%s", c.args, code, c.want, stderr)
		}
		code, _, stderr = run(append(args, "-o", "json")...)
		var doc struct{ Error struct{ Message string } }
		if err := json.Unmarshal([]byte(stderr), &doc); code != 1 || err != nil || strings.Contains(doc.Error.Message, "\n") || !strings.Contains(doc.Error.Message, c.want) {
			t.Errorf("%v -o json: exit %d, .error.message %q (%v)", c.args, code, doc.Error.Message, err)
		}
	}
}

// inPty runs the binary under script(1), in a pseudo-terminal of the given width (0: a pty that reports no size),
// and returns what the terminal showed.
func inPty(t *testing.T, cols int, args ...string) string {
	t.Helper()
	script, err := exec.LookPath("script")
	if err != nil {
		testenv.Unavailable(t, "script(1) (util-linux) not installed")
	}
	line := fmt.Sprintf("stty cols %d rows 40; exec %s", cols, testenv.Modelpack(t))
	for _, a := range args {
		line += " '" + a + "'"
	}
	out, err := exec.Command(script, "-qec", line, "/dev/null").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	return string(out)
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// Item: progress fits the terminal. In a pty 60 columns wide no line drawn is wider than that (a wider one wraps and
// the block redrawn in place stacks fragments); in a pty with no size pack draws no empty "||"; piped, pack prints a
// line per blob.
func TestProgressFitsTerminal(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	model := smallModel(t)
	home := t.TempDir()
	ref := reg.Host + "/org/a-rather-long-repository-name-for-the-progress-bar/model:v1"
	mustRemoteCLI(t, "--home", home, "pack", model, "-t", ref, "--push", "--plain-http", "-q")
	shown := inPty(t, 60, "--home", t.TempDir(), "pull", ref, "--plain-http")
	for _, l := range strings.FieldsFunc(ansi.ReplaceAllString(shown, ""), func(r rune) bool { return r == '\n' || r == '\r' }) {
		f := strings.Fields(l)
		if len(f) == 0 || (!blobVerbs[f[0]] && !strings.Contains(l, "%")) {
			continue // the summary is printed once, not redrawn: it may wrap
		}
		if n := len([]rune(l)); n > 60 {
			t.Errorf("a %d-column line in a 60-column terminal: %q", n, l)
		}
	}
	if shown := inPty(t, 0, "--home", t.TempDir(), "pack", model, "-t", "sizeless:v1"); strings.Contains(shown, "||") {
		t.Errorf("pack in a pty without a size drew an empty bar:\n%q", shown)
	}
	code, _, stderr := binaryRunner(t)("--home", t.TempDir(), "pack", model, "-t", "piped:v1")
	labels := progressLabels(t, stderr)
	if code != 0 || labels["config.json"] == "" || !strings.HasPrefix(labels["config.json"], "packed") {
		t.Errorf("piped pack: exit %d, no line per blob:\n%s", code, stderr)
	}
}
