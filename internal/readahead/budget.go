package readahead

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Auto is the default budget: half the memory the node has available now (MemAvailable), and at most half the
// memory limit of the process's cgroup, which is charged for the pages it reads. So a readahead never pushes the
// node, or the driver's own container, into reclaim: a model bigger than that is read ahead in part. 0 when the
// node's memory cannot be read.
func Auto() int64 {
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	budget := memAvailable(string(meminfo)) / 2
	cgroups, err1 := os.ReadFile("/proc/self/cgroup")
	mounts, err2 := os.ReadFile("/proc/self/mountinfo")
	if err1 == nil && err2 == nil {
		if limit := cgroupLimit(string(cgroups), string(mounts)); limit > 0 {
			budget = min(budget, limit/2)
		}
	}
	return budget
}

// memAvailable reads MemAvailable, in bytes, from /proc/meminfo's text; 0 if absent.
func memAvailable(meminfo string) int64 {
	for line := range strings.Lines(meminfo) {
		rest, ok := strings.CutPrefix(line, "MemAvailable:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || n < 0 || n > 1<<53 {
			return 0
		}
		return n << 10
	}
	return 0
}

// noLimit is where cgroup v1 reports no limit (a page-rounded MaxInt64); anything above is no limit too.
const noLimit = 1 << 62

// cgroupLimit returns the smallest memory limit on the process's cgroup and its ancestors visible in the mounts
// (cgroup v2's memory.max, v1's memory.limit_in_bytes), or 0 if none is set. procCgroup and mountinfo are the
// texts of /proc/self/cgroup and /proc/self/mountinfo.
func cgroupLimit(procCgroup, mountinfo string) int64 {
	var best int64
	for _, m := range memoryCgroupDirs(procCgroup, mountinfo) {
		for dir := m.dir; ; dir = filepath.Dir(dir) {
			if n := readLimit(filepath.Join(dir, m.file)); n > 0 && (best == 0 || n < best) {
				best = n
			}
			if dir == m.mount || !strings.HasPrefix(dir, m.mount) {
				break
			}
		}
	}
	return best
}

type cgroupDir struct{ dir, mount, file string }

// memoryCgroupDirs finds the directories of the process's memory cgroup: for each hierarchy (v2's unified one,
// v1's memory controller) the mount whose root holds the process's cgroup path, and that path below it.
func memoryCgroupDirs(procCgroup, mountinfo string) []cgroupDir {
	var out []cgroupDir
	for line := range strings.Lines(procCgroup) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var fstype, file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			fstype, file = "cgroup2", "memory.max"
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			fstype, file = "cgroup", "memory.limit_in_bytes"
		default:
			continue
		}
		for ml := range strings.Lines(mountinfo) {
			root, mnt, ok := cgroupMount(ml, fstype)
			if !ok {
				continue
			}
			rel, ok := strings.CutPrefix(parts[2], root)
			if !ok || (root != "/" && rel != "" && !strings.HasPrefix(rel, "/")) {
				continue
			}
			out = append(out, cgroupDir{dir: filepath.Join(mnt, rel), mount: mnt, file: file})
		}
	}
	return out
}

// cgroupMount parses one mountinfo line: the root and mount point of a mount of fstype (for "cgroup", one that
// carries the memory controller).
func cgroupMount(line, fstype string) (root, mnt string, ok bool) {
	pre, post, found := strings.Cut(strings.TrimSpace(line), " - ")
	f, g := strings.Fields(pre), strings.Fields(post)
	if !found || len(f) < 5 || len(g) < 3 || g[0] != fstype {
		return "", "", false
	}
	if fstype == "cgroup" && !slices.Contains(strings.Split(g[2], ","), "memory") {
		return "", "", false
	}
	return unescape(f[3]), unescape(f[4]), true
}

// unescape undoes mountinfo's octal escapes of spaces, tabs, newlines and backslashes.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// readLimit reads a memory limit file: 0 for "max", no limit, or anything unreadable.
func readLimit(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(sc.Text()), 10, 64)
	if err != nil || n <= 0 || n >= noLimit {
		return 0
	}
	return n
}
