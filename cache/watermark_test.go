package cache

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/internal/testenv"
)

// diskPercent is what df says of the file system dir is on.
func diskPercent(t *testing.T, dir string) int {
	t.Helper()
	fs, err := statFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	return fs.percent()
}

// fill writes n bytes of a file that is not the cache's onto the cache's file system: the watermarks count it, as
// kubelet's count every file on the image file system.
func fill(t *testing.T, path string, n int) {
	t.Helper()
	if err := os.WriteFile(path, shard(99, n), 0o600); err != nil {
		t.Fatal(err)
	}
}

// On a real 8 MiB file system (statfs's numbers, not a fake's): below the high watermark GC evicts nothing; at it,
// GC evicts unused models, least recently used first, until the file system would be at the low watermark; a
// referenced model stays whatever the watermarks say.
func TestGCDiskWatermarks(t *testing.T) {
	disk := testenv.SmallDisk(t, "8m")
	src := newMemTarget()
	var models []ocispec.Descriptor
	for i := range 3 {
		models = append(models, src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "w.safetensors", Data: shard(byte(70+i), 1536<<10)}})))
	}
	ctx := context.Background()
	c := openCache(t, filepath.Join(disk, "cache"), Options{HighWatermark: 75, LowWatermark: 50, MinAge: -1})
	fill(t, filepath.Join(disk, "other"), 2<<20)
	for _, m := range models[:2] {
		if _, err := c.Pull(ctx, src, m, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Model 0 is in use by a volume: never evicted.
	if _, err := c.Acquire("vol", models[0].Digest, Selector{}); err != nil {
		t.Fatal(err)
	}
	if p := diskPercent(t, disk); p >= 75 {
		t.Fatalf("setup: the disk is %d%% used before the third model", p)
	}
	st, err := c.GC(ctx)
	if err != nil || len(st.Evicted) != 0 {
		t.Fatalf("below the high watermark (%d%% used) GC evicted %v, err %v", diskPercent(t, disk), st.Evicted, err)
	}
	if _, err := c.Pull(ctx, src, models[2], nil); err != nil {
		t.Fatal(err)
	}
	before := diskPercent(t, disk)
	if before < 75 {
		t.Fatalf("setup: the disk is %d%% used with three models, under the high watermark", before)
	}
	st, err = c.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after := diskPercent(t, disk)
	t.Logf("disk %d%% used before GC, %d%% after; evicted %d", before, after, len(st.Evicted))
	if len(st.Evicted) != 2 || !c.Has(models[0].Digest) || c.Has(models[1].Digest) || c.Has(models[2].Digest) {
		t.Fatalf("GC at %d%% evicted %v: want models 1 and 2 (unused), model 0 (in use) kept", before, st.Evicted)
	}
	if after > 50 {
		t.Fatalf("after GC the disk is %d%% used, over the low watermark 50", after)
	}
}

// Both limits apply and the one asking for the smaller cache wins: a MaxBytes far over the cache does not stop
// the high watermark from evicting, and a MaxBytes under the cache evicts although the disk is under the high
// watermark.
func TestGCWatermarksWithMaxBytes(t *testing.T) {
	src := newMemTarget()
	var models []ocispec.Descriptor
	for i := range 2 {
		models = append(models, src.manifestDesc(modelManifest(t, src, []modelFile{{Path: "w.safetensors", Data: shard(byte(80+i), 1<<20)}})))
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		maxBytes  int64
		filler    int
		evictions int
	}{
		{"the watermark asks for less", 1 << 30, 4700 << 10, 1},
		{"MaxBytes asks for less", 1536 << 10, 0, 1},
		{"neither asks", 1 << 30, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := testenv.SmallDisk(t, "8m")
			c := openCache(t, filepath.Join(disk, "cache"), Options{MaxBytes: tc.maxBytes, HighWatermark: 80, LowWatermark: 75, MinAge: -1})
			for _, m := range models {
				if _, err := c.Pull(ctx, src, m, nil); err != nil {
					t.Fatal(err)
				}
			}
			if tc.filler > 0 {
				fill(t, filepath.Join(disk, "other"), tc.filler)
			}
			st, err := c.GC(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Evicted) != tc.evictions {
				t.Fatalf("disk %d%% used, cache %d bytes, MaxBytes %d: evicted %d, want %d", diskPercent(t, disk), st.Before, tc.maxBytes, len(st.Evicted), tc.evictions)
			}
			if tc.evictions > 0 && c.Has(models[0].Digest) {
				t.Fatal("the most recently used model was evicted instead of the least")
			}
		})
	}
}

// Watermarks out of range are refused at Open, naming the field and the valid range.
func TestOpenRefusesBadWatermarks(t *testing.T) {
	for _, tc := range []struct {
		high, low int
		want      string
	}{
		{101, 80, "HighWatermark 101: want a percent of the cache's file system from 1 to 100"},
		{80, 80, "LowWatermark 80: want a percent from 0 to below HighWatermark (80)"},
		{80, -1, "LowWatermark -1"},
		{0, 10, "HighWatermark 0"},
	} {
		_, err := Open(Options{Root: t.TempDir(), HighWatermark: tc.high, LowWatermark: tc.low})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("high %d low %d: %v, want %q", tc.high, tc.low, err, tc.want)
		}
	}
}
