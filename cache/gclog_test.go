package cache

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// GC says at info what it evicted, and when the cache stays over MaxBytes because of MinAge; MinAge is what the
// caller sets (the driver's --cache-min-age), 1 minute by default rather than 5.
func TestGCLogsEvictionsAndMinAge(t *testing.T) {
	if DefaultMinAge.Minutes() != 1 {
		t.Fatalf("DefaultMinAge %s", DefaultMinAge)
	}
	src := newMemTarget()
	m := src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "w.safetensors", Data: shard(60, 64<<10)}}))
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		minAge int64
		want   string
	}{
		{"no minimum age: evicted and said so", -1, "evicted from the cache"},
		{"fresh content kept over the maximum: said so", 0, "all of it is in use or used within the minimum age"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs lockedBuffer
			opts := Options{MaxBytes: 1, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
			if c.minAge < 0 {
				opts.MinAge = -1
			}
			cc := openCache(t, t.TempDir(), opts)
			if _, err := cc.Pull(ctx, src, m, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := cc.GC(ctx); err != nil {
				t.Fatal(err)
			}
			out := logs.String()
			if !strings.Contains(out, c.want) || !strings.Contains(out, "level=INFO") {
				t.Fatalf("log lacks %q at info:\n%s", c.want, out)
			}
			if c.minAge < 0 && !strings.Contains(out, m.Digest.String()) {
				t.Fatalf("the eviction does not name the manifest:\n%s", out)
			}
		})
	}
}
