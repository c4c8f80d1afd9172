package csidriver

import (
	"context"
	"encoding/xml"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv"
)

// startDriver runs a driver on a unix socket in dir until the test ends.
func startDriver(t *testing.T, dir string, b Backend) (*Driver, string) {
	t.Helper()
	sock := filepath.Join(dir, "csi.sock")
	d, err := New(Options{
		NodeID:   "test-node",
		Endpoint: "unix://" + sock,
		StateDir: filepath.Join(dir, "state"),
		OwnDirs:  []string{filepath.Join(dir, "cache")},
		Backend:  b,
		Logger:   discardLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("driver: %v", err)
		}
	})
	waitSocket(t, sock)
	return d, sock
}

func waitSocket(t *testing.T, sock string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("driver socket did not appear")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// CleanupMounts is cleanupMounts for the package's external tests.
var CleanupMounts = cleanupMounts

// cleanupMounts fails the test if it leaves anything mounted below dir.
func cleanupMounts(t *testing.T, dir string) { testenv.NoMountsLeftUnder(t, dir) }

// TestSanity runs the real csi-sanity against the driver, with real bind mounts.
func TestSanity(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	b.push("registry.example.com/models/tiny:v1", "tiny model")
	_, sock := startDriver(t, dir, b)
	runSanity(t, dir, sock, "reference: registry.example.com/models/tiny:v1\nfilter: weights,config\n")
}

// RunSanity is runSanity for the package's external tests.
var RunSanity = runSanity

// runSanity runs csi-sanity against the driver on sock, with paramsYAML as the StorageClass parameters of the
// volumes it creates, and requires 0 failures and skips only for capabilities the driver does not advertise.
func runSanity(t *testing.T, dir, sock, paramsYAML string) {
	t.Helper()
	bin := testenv.Tool(t, "csi-sanity")
	params := filepath.Join(dir, "params.yaml")
	if err := os.WriteFile(params, []byte(paramsYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "junit.xml")
	cmd := exec.Command(bin,
		"--csi.endpoint", "unix://"+sock,
		"--csi.mountdir", filepath.Join(dir, "mnt"),
		"--csi.stagingdir", filepath.Join(dir, "stage"),
		"--csi.testvolumeparameters", params,
		"--ginkgo.junit-report", report,
		"--ginkgo.timeout", "10m",
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("csi-sanity failed: %v\n%s", err, out)
	}
	var suites struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Skipped  int `xml:"skipped,attr"`
			Cases    []struct {
				Name    string `xml:"name,attr"`
				Skipped *struct {
					Message string `xml:"message,attr"`
				} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	rb, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(rb, &suites); err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, s := range suites.Suites {
		if s.Failures != 0 {
			t.Errorf("csi-sanity reports %d failures\n%s", s.Failures, out)
		}
		for _, c := range s.Cases {
			if c.Skipped != nil {
				t.Logf("skipped: %s (%s)", c.Name, c.Skipped.Message)
				if !strings.Contains(c.Skipped.Message, "not supported") && !strings.Contains(c.Skipped.Message, "not provided") &&
					!strings.Contains(c.Skipped.Message, "does not have") && !strings.Contains(c.Skipped.Message, "not enabled") &&
					!strings.Contains(c.Skipped.Message, "No MaxVolumesPerNode") && !strings.Contains(c.Skipped.Message, "does not report") && c.Skipped.Message != "pending" {
					t.Errorf("spec skipped for a reason other than an unadvertised capability: %s: %s", c.Name, c.Skipped.Message)
				}
				continue
			}
			ran++
		}
	}
	t.Logf("csi-sanity: %d specs passed", ran)
	if ran < 39 {
		t.Errorf("only %d specs ran", ran)
	}
}
