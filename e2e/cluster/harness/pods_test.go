package harness

import (
	"os"
	"path/filepath"
	"testing"
)

func TestNodeLogsReadsCRIFiles(t *testing.T) {
	root := t.TempDir()
	write := func(dir, container, name, text string) {
		p := filepath.Join(root, dir, container, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("default_bench-fleet-1-7b4bf-abcde_0d2c4a1e-1111", "c", "0.log",
		"2026-12-02T13:15:02.948403791Z stdout F start 12.50\n"+
			"2026-12-02T13:15:03.1Z stdout P do\n"+
			"2026-12-02T13:15:03.2Z stdout F ne 14.25\n")
	write("default_bench-fleet-1-7b4bf-abcde_0d2c4a1e-1111", "other", "0.log", "2026-12-02T13:15:02Z stdout F not c\n")
	write("default_bench-fleet-10-9c8d7-fghij_0d2c4a1e-2222", "c", "0.log", "2026-12-02T13:15:02Z stdout F start 1\n")
	write("kube-system_bench-fleet-1-7b4bf-zzzzz_0d2c4a1e-3333", "c", "0.log", "2026-12-02T13:15:02Z stdout F start 2\n")

	got := nodeLogsIn(t, root, "default", "bench-fleet-1-", "c")
	want := map[string]string{"bench-fleet-1-7b4bf-abcde": "start 12.50\ndone 14.25\n"}
	if len(got) != len(want) || got["bench-fleet-1-7b4bf-abcde"] != want["bench-fleet-1-7b4bf-abcde"] {
		t.Fatalf("logs = %q, want %q (partial lines joined, other namespaces, containers and pod 10 left out)", got, want)
	}
	if got := nodeLogsIn(t, root, "default", "bench-fleet-2-", "c"); len(got) != 0 {
		t.Fatalf("no pod matches: got %q", got)
	}
}
