package layout

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/diskio"
)

// sourcesFile records which repositories of each registry a blob was last pushed to or pulled from, as Docker's
// distribution metadata does: a push to another repository of that registry then asks it to mount the blob from
// there (POST ?mount=&from=) instead of sending its bytes again. It is a hint: lost or stale, a push uploads.
const sourcesFile = "blob-sources.json"

// maxSourcesPerBlob bounds the repositories kept per blob and registry, most recent first.
const maxSourcesPerBlob = 4

// sources maps registry → blob digest → repositories.
type sources map[string]map[digest.Digest][]string

// BlobRepos returns the repositories of registry a blob was last pushed to or pulled from, most recent first.
func (s *Store) BlobRepos(registry string, d digest.Digest) []string {
	src, err := s.readSources()
	if err != nil {
		return nil
	}
	return src[registry][d]
}

// RecordBlobRepos records that registry's repository repo holds the blobs ds.
func (s *Store) RecordBlobRepos(registry, repo string, ds []digest.Digest) error {
	if len(ds) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.indexLock.TryLockContext(context.Background(), lockRetry); err != nil {
		return fmt.Errorf("lock %s: %w", indexFile, err)
	}
	defer s.indexLock.Unlock()
	src, err := s.readSources()
	if err != nil {
		src = sources{} // a damaged hint file is replaced, not fatal
	}
	if src[registry] == nil {
		src[registry] = map[digest.Digest][]string{}
	}
	for _, d := range ds {
		repos := slices.DeleteFunc(slices.Clone(src[registry][d]), func(r string) bool { return r == repo })
		repos = append([]string{repo}, repos...)
		src[registry][d] = repos[:min(len(repos), maxSourcesPerBlob)]
	}
	b, err := json.Marshal(src)
	if err != nil {
		return err
	}
	return diskio.WriteFileAtomic(filepath.Join(s.root, sourcesFile), b, 0o644)
}

func (s *Store) readSources() (sources, error) {
	b, err := os.ReadFile(filepath.Join(s.root, sourcesFile))
	if os.IsNotExist(err) {
		return sources{}, nil
	}
	if err != nil {
		return nil, err
	}
	var src sources
	if err := json.Unmarshal(b, &src); err != nil {
		return nil, err
	}
	return src, nil
}
