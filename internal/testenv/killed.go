package testenv

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// KillAfterFirstLine runs this test binary again, running no test, with env added (the package's TestMain runs the
// helper env names), reads the first line the helper prints, then kills it with SIGKILL and waits for it: a process
// killed right after the step that line reports. It returns the line, trimmed, and what the helper wrote to stderr.
func KillAfterFirstLine(t testing.TB, env ...string) (line, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errs strings.Builder
	cmd.Stderr = &errs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ = bufio.NewReader(out).ReadString('\n')
	cmd.Process.Kill()
	cmd.Wait()
	return strings.TrimSpace(line), errs.String()
}
