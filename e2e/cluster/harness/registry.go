package harness

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// blobGET matches a served blob GET in the registry's access log (combined log format).
var blobGET = regexp.MustCompile(`^(\S+) .*"GET /v2/(\S+)/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" (\d{3}) (\d+|-)`)

// LogMark is a position in the registry's access log: counts after it are what a test step caused.
type LogMark int64

// Mark returns the current end of the registry's access log.
func (c *Cluster) Mark(t testing.TB) LogMark { t.Helper(); return MarkLog(t, c.registryLog()) }

// BlobGETs counts the successful blob GETs (2xx) the registry served since mark, by digest.
func (c *Cluster) BlobGETs(t testing.TB, since LogMark) map[string]int {
	t.Helper()
	return BlobGETsIn(t, c.registryLog(), since)
}

// MarkLog returns the current end of a registry access log (another registry's than the cluster's).
func MarkLog(t testing.TB, path string) LogMark {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return LogMark(fi.Size())
}

// BlobGETsIn counts the successful blob GETs (2xx) in a registry access log since mark, by digest.
func BlobGETsIn(t testing.TB, path string, since LogMark) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(int64(since), io.SeekStart); err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		if m := blobGET.FindStringSubmatch(s.Text()); m != nil && strings.HasPrefix(m[4], "2") {
			n[m[3]]++
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// BlobServe is what the registry served for one blob since a mark: successful GETs (2xx, ranges included), the
// bytes they sent, and the GETs by client address.
type BlobServe struct {
	GETs     int
	Bytes    int64
	ByClient map[string]int
}

// BlobsServed is BlobGETs with the bytes sent and the clients, by digest.
func (c *Cluster) BlobsServed(t testing.TB, since LogMark) map[string]*BlobServe {
	t.Helper()
	return BlobsServedIn(t, c.registryLog(), since)
}

// BlobsServedIn is BlobsServed for any registry's access log (a registry a test starts itself).
func BlobsServedIn(t testing.TB, path string, since LogMark) map[string]*BlobServe {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(int64(since), io.SeekStart); err != nil {
		t.Fatal(err)
	}
	served := map[string]*BlobServe{}
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		m := blobGET.FindStringSubmatch(s.Text())
		if m == nil || !strings.HasPrefix(m[4], "2") {
			continue
		}
		b := served[m[3]]
		if b == nil {
			b = &BlobServe{ByClient: map[string]int{}}
			served[m[3]] = b
		}
		b.GETs++
		b.ByClient[m[1]]++
		if n, err := strconv.ParseInt(m[5], 10, 64); err == nil {
			b.Bytes += n
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return served
}

func (c *Cluster) registryLog() string { return filepath.Join(c.Dir, "logs", "registry.log") }

// PushModel packs dir as a ModelPack artifact with the modelpack CLI and pushes it to the cluster's registry
// as Registry/repoTag. It returns the reference by digest and the digests of the model's layers.
func (c *Cluster) PushModel(t testing.TB, dir, repoTag string) (ref string, layers []string) {
	t.Helper()
	tagged := c.Registry + "/" + repoTag
	cmd := exec.Command(c.Modelpack, "pack", dir, "-t", tagged, "--push", "--plain-http", "-q")
	cmd.Env = append(os.Environ(), "MODELPACK_HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("modelpack pack --push %s: %v\n%s", tagged, err, out)
	}
	repo, tag, _ := strings.Cut(repoTag, ":")
	m, digest := c.Manifest(t, repo, tag)
	for _, l := range m.Layers {
		layers = append(layers, l.Digest)
	}
	return c.Registry + "/" + repo + "@" + digest, layers
}

// Manifest is the part of an OCI manifest the tests look at.
type Manifest struct {
	ArtifactType string `json:"artifactType"`
	Config       struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	} `json:"config"`
	Layers []struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations"`
	} `json:"layers"`
}

// Manifest fetches repo:reference's manifest from the cluster's registry and returns it with its digest.
func (c *Cluster) Manifest(t testing.TB, repo, reference string) (*Manifest, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+c.Registry+"/v2/"+repo+"/manifests/"+reference, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("manifest %s:%s: %s", repo, reference, resp.Status)
	}
	var m Manifest
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return &m, resp.Header.Get("Docker-Content-Digest")
}

// PushImage builds a single-layer container image from host files (HOSTPATH=IMAGEPATH) with e2e/cmd/ociimage
// and pushes it to Registry/repoTag; it returns the reference by digest.
func (c *Cluster) PushImage(t testing.TB, repoTag string, files ...string) string {
	t.Helper()
	args := []string{}
	for _, f := range files {
		args = append(args, "--file", f)
	}
	args = append(args, c.Registry+"/"+repoTag)
	out, err := exec.Command(filepath.Join(c.Dir, "images", "ociimage"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ociimage %s: %v\n%s", repoTag, err, out)
	}
	return strings.TrimSpace(string(out))
}
