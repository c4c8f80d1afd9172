package cachebackend

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"
)

func TestBandwidthLimit(t *testing.T) {
	ctx := context.Background()
	store := memory.New()
	blob := bytes.Repeat([]byte("x"), 512<<10)
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(blob), Size: int64(len(blob))}
	if err := store.Push(ctx, desc, bytes.NewReader(blob)); err != nil {
		t.Fatal(err)
	}
	if newLimiter(0) != nil {
		t.Fatal("0 must mean no limit")
	}
	src := limitedTarget{ReadOnlyTarget: store, lim: newLimiter(1 << 20)}
	start := time.Now()
	rc, err := src.Fetch(ctx, desc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	// 512 KiB at 1 MiB/s with a burst of 100 KiB: at least ~0.4 s. Only the floor is the limiter's promise; a busy
	// machine may take any longer.
	if el := time.Since(start); el < 350*time.Millisecond {
		t.Errorf("512 KiB at 1 MiB/s took %s", el)
	}
	// A cancelled context ends a throttled read instead of waiting out the budget.
	cctx, cancel := context.WithCancel(ctx)
	rc, err = limitedTarget{ReadOnlyTarget: store, lim: newLimiter(64 << 10)}.Fetch(cctx, desc)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := io.ReadAll(rc); err == nil {
		t.Error("read went on after cancel")
	}
}

// rangeStore is a target that can start blobs at an offset, like a registry repository.
type rangeStore struct {
	*memory.Store
	offsets []int64
}

func (s *rangeStore) FetchRange(ctx context.Context, desc ocispec.Descriptor, offset int64) (io.ReadCloser, int64, error) {
	s.offsets = append(s.offsets, offset)
	rc, err := s.Fetch(ctx, desc)
	if err != nil {
		return nil, 0, err
	}
	if _, err := io.CopyN(io.Discard, rc, offset); err != nil {
		rc.Close()
		return nil, 0, err
	}
	return rc, offset, nil
}

func TestBandwidthLimitKeepsRangedReads(t *testing.T) {
	ctx := context.Background()
	blob := []byte("0123456789")
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(blob), Size: int64(len(blob))}
	src := &rangeStore{Store: memory.New()}
	if err := src.Push(ctx, desc, bytes.NewReader(blob)); err != nil {
		t.Fatal(err)
	}
	rc, start, err := limitedTarget{ReadOnlyTarget: src, lim: newLimiter(1 << 20)}.FetchRange(ctx, desc, 4)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if start != 4 || string(got) != "456789" || len(src.offsets) != 1 {
		t.Errorf("FetchRange from 4: start %d, %q, offsets %v", start, got, src.offsets)
	}
	// A source without ranges is read from the start, and says so.
	rc, start, err = limitedTarget{ReadOnlyTarget: src.Store, lim: newLimiter(1 << 20)}.FetchRange(ctx, desc, 4)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(rc)
	rc.Close()
	if start != 0 || string(got) != string(blob) {
		t.Errorf("FetchRange without ranges: start %d, %q", start, got)
	}
}
