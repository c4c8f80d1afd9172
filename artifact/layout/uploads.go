package layout

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/internal/diskio"
)

// uploadsFile records the registry upload session a push left unfinished for each blob, so the next push resumes
// it. It is a hint like sourcesFile: lost or expired, a push sends the blob from the start.
const uploadsFile = "upload-sessions.json"

// uploads maps "registry/repository@digest" → the session's location URL.
type uploads map[string]string

func uploadKey(registry, repo string, d digest.Digest) string {
	return registry + "/" + repo + "@" + d.String()
}

// UploadSession returns the location of the upload session a push of d to registry/repo left, if any.
func (s *Store) UploadSession(registry, repo string, d digest.Digest) string {
	u, err := s.readUploads()
	if err != nil {
		return ""
	}
	return u[uploadKey(registry, repo, d)]
}

// RecordUploadSession remembers location as the upload session of d in registry/repo; "" forgets it.
func (s *Store) RecordUploadSession(registry, repo string, d digest.Digest, location string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.indexLock.TryLockContext(context.Background(), lockRetry); err != nil {
		return fmt.Errorf("lock %s: %w", indexFile, err)
	}
	defer s.indexLock.Unlock()
	u, err := s.readUploads()
	if err != nil {
		u = uploads{} // a damaged hint file is replaced, not fatal
	}
	k := uploadKey(registry, repo, d)
	if location == "" {
		if _, ok := u[k]; !ok {
			return nil
		}
		delete(u, k)
	} else {
		u[k] = location
	}
	b, err := json.Marshal(u)
	if err != nil {
		return err
	}
	return diskio.WriteFileAtomic(filepath.Join(s.root, uploadsFile), b, 0o600)
}

func (s *Store) readUploads() (uploads, error) {
	b, err := os.ReadFile(filepath.Join(s.root, uploadsFile))
	if os.IsNotExist(err) {
		return uploads{}, nil
	}
	if err != nil {
		return nil, err
	}
	var u uploads
	if err := json.Unmarshal(b, &u); err != nil {
		return nil, err
	}
	return u, nil
}
