//go:build !linux

package cache

import "os"

// syncFS flushes dir itself where syncfs(2) does not exist.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
