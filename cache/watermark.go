package cache

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Disk-percent watermarks, as kubelet's image GC has them (--image-gc-high-threshold/--image-gc-low-threshold):
// when the cache's file system is HighWatermark percent used or more, GC evicts until it would be LowWatermark
// percent used. The file system's numbers are statfs's, what df shows: use counts every file on it, the cache's
// and anything else's, and only the cache's unused models can be evicted to bring it down.

// CheckWatermarks says what is wrong with a pair of watermarks, naming them by the given names (a caller's flags
// or fields): both 0 (off), or 0 ≤ low < high ≤ 100.
func CheckWatermarks(high, low int, highName, lowName string) error {
	switch {
	case high == 0 && low == 0:
		return nil
	case high < 1 || high > 100:
		return fmt.Errorf("%s %d: want a percent of the cache's file system from 1 to 100 (0 with %s 0: no watermarks)", highName, high, lowName)
	case low < 0 || low >= high:
		return fmt.Errorf("%s %d: want a percent from 0 to below %s (%d)", lowName, low, highName, high)
	}
	return nil
}

// fsUsage is a file system's size and what is free on it for an unprivileged writer, in bytes (statfs).
type fsUsage struct {
	Capacity, Available int64
}

func statFS(path string) (fsUsage, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return fsUsage{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	return fsUsage{Capacity: int64(s.Blocks) * int64(s.Bsize), Available: int64(s.Bavail) * int64(s.Bsize)}, nil
}

// percent is how full the file system is, rounded as kubelet rounds it (100 - available*100/capacity).
func (f fsUsage) percent() int {
	if f.Capacity <= 0 {
		return 0
	}
	return 100 - int(f.Available*100/f.Capacity)
}

// toFree is what must be freed to bring the file system down to low percent used, once it reached high; 0 below
// high (kubelet's amountToFree).
func (f fsUsage) toFree(high, low int) int64 {
	if high == 0 || f.percent() < high {
		return 0
	}
	return max(f.Capacity*int64(100-low)/100-f.Available, 0)
}

// target is the size GC evicts the cache down to, and whether it must evict at all: under MaxBytes, and, when
// the file system has reached the high watermark, under what the cache holds less what must be freed to reach
// the low one. Both apply; the lower target wins.
func (c *Cache) target(u Usage) (int64, bool, fsUsage, error) {
	target, over := int64(0), false
	if c.opts.MaxBytes > 0 && u.Bytes > c.opts.MaxBytes {
		target, over = c.opts.MaxBytes, true
	}
	var fs fsUsage
	if c.opts.HighWatermark == 0 {
		return target, over, fs, nil
	}
	fs, err := statFS(c.root)
	if err != nil {
		return target, over, fs, err
	}
	if free := fs.toFree(c.opts.HighWatermark, c.opts.LowWatermark); free > 0 {
		if t := u.Bytes - free; !over || t < target {
			target = t
		}
		over = true
	}
	return target, over, fs, nil
}
