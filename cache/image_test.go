package cache

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/internal/testenv"
)

func crane(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(testenv.Tool(t, "crane"), append([]string{"--insecure"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("crane %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// exportTree lists a `crane export` tarball in listTree's format, with the permissions a read-only view has
// (write bits cleared) and hardlinks resolved to their target's content.
func exportTree(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	content := map[string]string{}
	var out []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "/"))
		perm := hdr.FileInfo().Mode().Perm() &^ 0o222
		switch hdr.Typeflag {
		case tar.TypeDir:
			out = append(out, fmt.Sprintf("%s dir %o", name, perm))
		case tar.TypeSymlink:
			out = append(out, name+" symlink "+hdr.Linkname)
		case tar.TypeLink:
			out = append(out, fmt.Sprintf("%s file %s", name, content[path.Clean(hdr.Linkname)]))
		default:
			b, _ := io.ReadAll(tr)
			content[name] = fmt.Sprintf("%o %s", perm, digest.FromBytes(b).Encoded()[:12])
			out = append(out, fmt.Sprintf("%s file %s", name, content[name]))
		}
	}
	slices.Sort(out)
	return out
}

func writeTar(t *testing.T, dir, name string, entries ...tarEntry) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, makeTar(t, false, entries...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestImageMatchesCraneExport: an image built by crane with whiteouts and an opaque directory, flattened by the
// cache, is the same tree as `crane export` gives; and a multi-arch index gives the node's platform.
func TestImageMatchesCraneExport(t *testing.T) {
	reg := startRegistry(t)
	work := t.TempDir()
	base := writeTar(t, work, "base.tar",
		tarEntry{Name: "etc/", Type: tar.TypeDir, Mode: 0o755},
		tarEntry{Name: "etc/a", Body: "a\n"},
		tarEntry{Name: "etc/b", Body: "b\n"},
		tarEntry{Name: "etc/secret", Body: "s\n", Mode: 0o600},
		tarEntry{Name: "opq/", Type: tar.TypeDir, Mode: 0o755},
		tarEntry{Name: "opq/old", Body: "old\n"},
		tarEntry{Name: "opq/sub/", Type: tar.TypeDir, Mode: 0o700},
		tarEntry{Name: "opq/sub/deep", Body: "deep\n"},
		tarEntry{Name: "bin/", Type: tar.TypeDir, Mode: 0o755},
		tarEntry{Name: "bin/tool", Body: "#!/bin/true\n", Mode: 0o755},
		tarEntry{Name: "bin/sh", Type: tar.TypeSymlink, Link: "/bin/tool"},
		tarEntry{Name: "bin/rel", Type: tar.TypeSymlink, Link: "../etc/b"},
		tarEntry{Name: "bin/hard", Type: tar.TypeLink, Link: "bin/tool"},
		tarEntry{Name: "lib/", Type: tar.TypeDir, Mode: 0o755},
		tarEntry{Name: "lib/x.so", Body: "x\n"},
	)
	upper := writeTar(t, work, "upper.tar",
		tarEntry{Name: "etc/", Type: tar.TypeDir, Mode: 0o755},
		tarEntry{Name: "etc/.wh.a", Body: ""},
		tarEntry{Name: "etc/b", Body: "b2\n"},
		tarEntry{Name: "opq/", Type: tar.TypeDir, Mode: 0o750},
		tarEntry{Name: "opq/.wh..wh..opq", Body: ""},
		tarEntry{Name: "opq/new", Body: "new\n"},
		tarEntry{Name: ".wh.lib", Body: ""},
		tarEntry{Name: "newdir/", Type: tar.TypeDir, Mode: 0o755},
		tarEntry{Name: "newdir/f", Body: "f\n"},
	)
	top := writeTar(t, work, "top.tar",
		tarEntry{Name: "lib/", Type: tar.TypeDir, Mode: 0o755},
		tarEntry{Name: "lib/y.so", Body: "y\n"},
		tarEntry{Name: "bin/", Type: tar.TypeDir, Mode: 0o755},
		tarEntry{Name: "bin/.wh.rel", Body: ""},
	)
	img := reg.Host + "/images/whiteouts"
	crane(t, "append", "-f", base, "-t", img+":base")
	crane(t, "append", "-b", img+":base", "-f", upper, "-t", img+":upper")
	crane(t, "mutate", img+":upper", "--append", top, "--label", "org.example.test=whiteouts", "--set-platform", "linux/amd64", "-t", img+":amd64")
	crane(t, "mutate", img+":upper", "--label", "org.example.test=arm", "--set-platform", "linux/arm64", "-t", img+":arm64")
	crane(t, "index", "append", "-m", img+":amd64", "-m", img+":arm64", "-t", img+":multi")

	repo := newRepo(t, reg.Host, "images/whiteouts")
	ctx := context.Background()
	for _, tc := range []struct {
		tag, platform string
	}{{"amd64", "linux/amd64"}, {"multi", "linux/amd64"}, {"multi", "linux/arm64"}} {
		t.Run(tc.tag+"-"+strings.ReplaceAll(tc.platform, "/", "-"), func(t *testing.T) {
			os, arch, _ := strings.Cut(tc.platform, "/")
			c := openCache(t, t.TempDir(), Options{Platform: ocispec.Platform{OS: os, Architecture: arch}})
			desc, err := repo.Resolve(ctx, tc.tag)
			if err != nil {
				t.Fatal(err)
			}
			m, err := c.Pull(ctx, repo, desc, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !c.Has(desc.Digest) || !c.Has(m.Digest) {
				t.Error("Has(index) / Has(manifest) false after pull")
			}
			dir, err := c.Acquire("v", desc.Digest, Selector{})
			if err != nil {
				t.Fatal(err)
			}
			exported := filepath.Join(t.TempDir(), "export.tar")
			crane(t, "export", "--platform", tc.platform, reg.Host+"/images/whiteouts:"+tc.tag, exported)
			want, got := exportTree(t, exported), listTree(t, dir)
			if !slices.Equal(got, want) {
				t.Errorf("view differs from crane export\nview:\n%s\nexport:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			// Spot checks that the comparison really covers whiteouts, opaque dirs and the platform choice.
			has := func(p string) bool {
				return slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, p+" ") })
			}
			if has("etc/a") || has("opq/old") || has("lib/x.so") || !has("opq/new") || !has("etc/secret") {
				t.Errorf("whiteouts not applied: %v", got)
			}
			if has("lib/y.so") != (arch == "amd64") {
				t.Errorf("wrong platform's manifest for %s: %v", tc.platform, got)
			}
		})
	}

	// A platform the index lacks is a clear error.
	c := openCache(t, t.TempDir(), Options{Platform: ocispec.Platform{OS: "linux", Architecture: "s390x"}})
	desc, _ := repo.Resolve(ctx, "multi")
	if _, err := c.Pull(ctx, repo, desc, nil); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "linux/s390x") {
		t.Errorf("missing platform: %v", err)
	}
}
