package cli

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/modelpack/modelpack/internal/testenv"
)

// Issue 31 §4: while a goroutine swaps model.safetensors with a link to a file outside the model by rename(2) in
// a loop, `modelpack pack` and `modelpack pack --push` run again and again, to the local store and to a real
// registry. No blob either ever holds the outside bytes, and every refusal names the file and a reason.
func TestPackRacingSwapCLI(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	base := t.TempDir()
	model := filepath.Join(base, "model")
	secret := bytes.Repeat([]byte("OUTSIDE-SECRET!"), 1000)
	os.MkdirAll(model, 0o755)
	os.WriteFile(filepath.Join(model, "model.safetensors"), bytes.Repeat([]byte("inside-weights."), 1000), 0o644)
	os.WriteFile(filepath.Join(model, "config.json"), []byte(`{"model_type":"race"}`), 0o644)
	os.WriteFile(filepath.Join(base, "outside"), secret, 0o644)
	if err := os.Symlink(filepath.Join(base, "outside"), filepath.Join(model, ".swap")); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(model, "model.safetensors"), unix.AT_FDCWD, filepath.Join(model, ".swap"), unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("rename exchange: %v", err)
				return
			}
			runtime.Gosched()
		}
	}()
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt)
	runs := 60
	if testing.Short() {
		runs = 15
	}
	ok := 0
	for i := range runs {
		args := []string{"--home", home, "pack", model, "-t", fmt.Sprintf("local/race:%d", i), "-q"}
		if i%2 == 1 {
			args = []string{"--home", home, "pack", model, "-t", fmt.Sprintf("%s/race/m:%d", reg.Host, i), "--push", "--plain-http", "-q"}
		}
		_, err := runRemoteCLI(t, "", args...)
		if err == nil {
			ok++
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "model.safetensors") || !(strings.Contains(msg, "symlink points outside the model directory") ||
			strings.Contains(msg, "symbolic link") || strings.Contains(msg, "file changed")) {
			t.Errorf("pack %d: unclear refusal: %v", i, err)
		}
	}
	halt()
	t.Logf("%d of %d packs OK", ok, runs)
	for _, root := range []string{home, reg.Dir} {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			if b, _ := os.ReadFile(p); bytes.Contains(b, secret[:64]) {
				t.Errorf("%s holds the outside bytes", p)
			}
			return nil
		})
	}
}
