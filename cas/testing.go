package cas

import (
	"sync"

	digest "github.com/opencontainers/go-digest"
)

// FakeBootIDForTesting makes stores opened from now on read the boot id from path instead of the kernel's, so that
// tests of packages built on cas can stage a restart of the machine; restore undoes it. Not for production use.
func FakeBootIDForTesting(path string) (restore func()) {
	old := bootIDFile
	bootIDFile = path
	return func() { bootIDFile = old }
}

// CountHashedForTesting counts, per digest, the bytes Verifiers hash from now on, so a test can tell that a path
// hashes each byte once; restore stops counting. Not for production use, nor for tests running in parallel.
func CountHashedForTesting() (hashed func(digest.Digest) int64, restore func()) {
	var mu sync.Mutex
	counts := map[digest.Digest]int64{}
	hashedHook = func(d digest.Digest, n int) {
		mu.Lock()
		counts[d] += int64(n)
		mu.Unlock()
	}
	return func(d digest.Digest) int64 {
			mu.Lock()
			defer mu.Unlock()
			return counts[d]
		}, func() {
			hashedHook = nil
		}
}
