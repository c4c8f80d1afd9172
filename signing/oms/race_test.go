package oms

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// While a goroutine swaps a model file, then a model sub-directory, with a link to an outside file or directory
// by rename(2) in a loop, HashDir (what `sign --oms DIR` and verify compute) never hashes the outside bytes: each
// run gives the inside file's digest or refuses the link by name.
func TestHashDirRacingSwaps(t *testing.T) {
	secret := bytes.Repeat([]byte("OUTSIDE-SECRET!"), 700)
	inside := bytes.Repeat([]byte("inside-weights."), 700)
	sum := func(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }
	for name, swapped := range map[string]string{"file": "sub/model.safetensors", "parent directory": "sub"} {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			dir := filepath.Join(base, "model")
			os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
			os.MkdirAll(filepath.Join(base, "outside", "sub"), 0o755)
			os.WriteFile(filepath.Join(dir, "sub", "model.safetensors"), inside, 0o644)
			os.WriteFile(filepath.Join(base, "outside", "sub", "model.safetensors"), secret, 0o644)
			os.WriteFile(filepath.Join(base, "outside", "model.safetensors"), secret, 0o644)
			target := filepath.Join(base, "outside", swapped)
			if swapped == "sub" {
				target = filepath.Join(base, "outside")
			}
			// The link waits in the ignored .git path, so only the swapped name is ever a link.
			os.MkdirAll(filepath.Join(dir, ".git"), 0o755)
			if err := os.Symlink(target, filepath.Join(dir, ".git", "swap")); err != nil {
				t.Fatal(err)
			}
			a, b := filepath.Join(dir, swapped), filepath.Join(dir, ".git", "swap")
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
					if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
						t.Errorf("rename exchange: %v", err)
						return
					}
					runtime.Gosched()
				}
			}()
			defer func() { close(stop); wg.Wait() }()
			ok, refused := 0, 0
			for range 300 {
				files, err := HashDir(dir, Serialization{Method: MethodFiles, HashType: "sha256"}, nil)
				if err != nil {
					if !strings.Contains(err.Error(), "symbolic link") && !strings.Contains(err.Error(), "file changed") {
						t.Errorf("unclear refusal: %v", err)
					}
					refused++
					continue
				}
				for f, d := range files {
					if d == sum(secret) {
						t.Fatalf("hashed the outside file as %s", f)
					}
				}
				ok++
			}
			t.Logf("%d hashed, %d refused", ok, refused)
		})
	}
}
