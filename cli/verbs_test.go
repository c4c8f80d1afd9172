package cli

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/modelpack/modelpack/internal/testenv"
)

// peer runs a real peer tool (oras, crane) with the test's docker config.
func peer(t *testing.T, docker, tool string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(testenv.Tool(t, tool), args...)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+docker)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

func mustPeer(t *testing.T, docker, tool string, args ...string) string {
	t.Helper()
	out, err := peer(t, docker, tool, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
	return out
}

// writeModel writes files (path → content) into a fresh directory.
func writeModel(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, body := range files {
		full := filepath.Join(dir, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

type discovered struct {
	Digest    digest.Digest `json:"digest"`
	Referrers []struct {
		Digest       digest.Digest     `json:"digest"`
		ArtifactType string            `json:"artifactType"`
		Annotations  map[string]string `json:"annotations"`
	} `json:"referrers"`
}

// Item (beyond the peers): attach and discover interoperate with oras both ways — oras attaches, modelpack
// discovers; modelpack attaches, oras discovers it and oras pull of the referrer gives the file — with the referrers
// API (distribution 3.1.2 has none: referrersAPI serves it in front) and without it (a proxy answering 404 on
// /referrers/ and dropping OCI-Subject, as distribution itself behaves), where both tools keep and read the
// referrers tag sha256-<hex>.
func TestAttachDiscoverWithOras(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	var apiQueries atomic.Int64
	noAPI := testenv.StartProxy(t, reg.Host, testenv.ProxyHooks{
		Request: func(w http.ResponseWriter, r *http.Request) bool {
			if strings.Contains(r.URL.Path, "/referrers/") {
				apiQueries.Add(1)
				http.Error(w, `{"errors":[{"code":"UNSUPPORTED","message":"no referrers API"}]}`, http.StatusNotFound)
				return false
			}
			return true
		},
		Response: func(resp *http.Response) { resp.Header.Del("OCI-Subject") },
	})
	api := &referrersAPI{byRepoSubject: map[string][]ocispec.Descriptor{}, subjectOf: map[digest.Digest]digest.Digest{}}
	withAPI := testenv.StartProxy(t, reg.Host, testenv.ProxyHooks{Request: api.request, Response: api.response})
	for name, host := range map[string]string{"referrers API": withAPI.Host, "referrers tag": noAPI.Host} {
		t.Run(name, func(t *testing.T) {
			docker := t.TempDir()
			run := binaryRunner(t, "DOCKER_CONFIG="+docker, "MODELPACK_HOME="+t.TempDir())
			repo := host + "/org/" + strings.ToLower(strings.ReplaceAll(name, " ", "-"))
			ref := repo + ":v1"
			model := writeModel(t, map[string]string{"model.safetensors": "weights", "config.json": "{}"})
			if code, _, stderr := run("pack", model, "-t", ref, "--push", "-q"); code != 0 {
				t.Fatalf("pack: %s", stderr)
			}
			card := filepath.Join(t.TempDir(), "card.md")
			os.WriteFile(card, []byte("# card\n"), 0o644)
			mustPeer(t, docker, "oras", "attach", "--plain-http", "--disable-path-validation", ref, "--artifact-type", "application/vnd.example.card", card)

			sbom := filepath.Join(t.TempDir(), "sbom.spdx.json")
			os.WriteFile(sbom, []byte(`{"spdxVersion":"SPDX-2.3"}`), 0o644)
			code, stdout, stderr := run("attach", ref, "--artifact-type", "application/spdx+json", "--annotation", "org.example.k=v", sbom, "-o", "json")
			if code != 0 {
				t.Fatalf("attach: %d %s", code, stderr)
			}
			var attached struct {
				Descriptor ocispec.Descriptor `json:"descriptor"`
			}
			if err := json.Unmarshal([]byte(stdout), &attached); err != nil || attached.Descriptor.Digest == "" {
				t.Fatalf("attach -o json: %v %s", err, stdout)
			}

			code, stdout, stderr = run("discover", ref, "-o", "json")
			if code != 0 {
				t.Fatalf("discover: %s", stderr)
			}
			var d discovered
			if err := json.Unmarshal([]byte(stdout), &d); err != nil {
				t.Fatal(err, stdout)
			}
			types := map[string]digest.Digest{}
			for _, r := range d.Referrers {
				types[r.ArtifactType] = r.Digest
			}
			if len(types) != 2 || types["application/vnd.example.card"] == "" || types["application/spdx+json"] != attached.Descriptor.Digest {
				t.Fatalf("discover found %v, want oras's card and modelpack's SBOM %s", types, attached.Descriptor.Digest)
			}
			code, stdout, _ = run("discover", ref, "--artifact-type", "application/spdx+json", "-o", "json")
			d = discovered{}
			json.Unmarshal([]byte(stdout), &d)
			if code != 0 || len(d.Referrers) != 1 || d.Referrers[0].Annotations["org.example.k"] != "v" {
				t.Fatalf("discover --artifact-type: %d %s", code, stdout)
			}
			if code, stdout, _ = run("discover", ref); code != 0 || !strings.Contains(stdout, "── application/spdx+json") || !strings.Contains(stdout, attached.Descriptor.Digest.String()) {
				t.Fatalf("discover tree:\n%s", stdout)
			}

			out := mustPeer(t, docker, "oras", "discover", "--plain-http", "--format", "json", "--artifact-type", "application/spdx+json", ref)
			if !strings.Contains(out, attached.Descriptor.Digest.String()) {
				t.Fatalf("oras discover does not list modelpack's referrer %s:\n%s", attached.Descriptor.Digest, out)
			}
			dir := t.TempDir()
			mustPeer(t, docker, "oras", "pull", "--plain-http", "-o", dir, repo+"@"+attached.Descriptor.Digest.String())
			if b, err := os.ReadFile(filepath.Join(dir, "sbom.spdx.json")); err != nil || string(b) != `{"spdxVersion":"SPDX-2.3"}` {
				t.Fatalf("oras pull of the referrer: %q %v", b, err)
			}

			_, tags, _ := run("tags", repo)
			if hasTag := strings.Contains(tags, "sha256-"); hasTag != (name == "referrers tag") {
				t.Fatalf("%s: referrers tag written: %t; tags:\n%s", name, hasTag, tags)
			}
		})
	}
	if apiQueries.Load() == 0 {
		t.Fatal("the proxy hiding the API saw no referrers API request: the fallback was not exercised")
	}
	if api.answered.Load() == 0 {
		t.Fatal("the proxy serving the referrers API answered no query: the API was not used")
	}
}

// referrersAPI is the OCI 1.1 referrers API in front of distribution 3.1.2, which has none (GET /referrers/ answers
// 404; a manifest PUT no OCI-Subject, so oras-go keeps the referrers tag): the proxy records each manifest pushed
// with a subject, answers its PUT with OCI-Subject (so clients write no tag) and serves the referrers queries.
type referrersAPI struct {
	mu            sync.Mutex
	byRepoSubject map[string][]ocispec.Descriptor
	subjectOf     map[digest.Digest]digest.Digest
	answered      atomic.Int64
}

func (a *referrersAPI) request(w http.ResponseWriter, r *http.Request) bool {
	repo, rest, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v2/"), "/referrers/")
	if ok && r.Method == http.MethodGet {
		a.mu.Lock()
		found := append([]ocispec.Descriptor{}, a.byRepoSubject[repo+"@"+rest]...)
		a.mu.Unlock()
		if at := r.URL.Query().Get("artifactType"); at != "" {
			kept := []ocispec.Descriptor{}
			for _, d := range found {
				if d.ArtifactType == at {
					kept = append(kept, d)
				}
			}
			found = kept
			w.Header().Set("OCI-Filters-Applied", "artifactType")
		}
		a.answered.Add(1)
		w.Header().Set("Content-Type", ocispec.MediaTypeImageIndex)
		json.NewEncoder(w).Encode(ocispec.Index{Versioned: specsV2, MediaType: ocispec.MediaTypeImageIndex, Manifests: found})
		return false
	}
	repo, _, ok = strings.Cut(strings.TrimPrefix(r.URL.Path, "/v2/"), "/manifests/")
	if !ok || r.Method != http.MethodPut {
		return true
	}
	b, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	var m ocispec.Manifest
	if json.Unmarshal(b, &m) != nil || m.Subject == nil {
		return true
	}
	d := ocispec.Descriptor{MediaType: r.Header.Get("Content-Type"), Digest: digest.FromBytes(b), Size: int64(len(b)),
		ArtifactType: m.ArtifactType, Annotations: m.Annotations}
	if d.ArtifactType == "" {
		d.ArtifactType = m.Config.MediaType
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key := repo + "@" + m.Subject.Digest.String()
	for _, have := range a.byRepoSubject[key] {
		if have.Digest == d.Digest {
			return true
		}
	}
	a.byRepoSubject[key] = append(a.byRepoSubject[key], d)
	a.subjectOf[d.Digest] = m.Subject.Digest
	return true
}

func (a *referrersAPI) response(resp *http.Response) {
	if resp.Request.Method != http.MethodPut || resp.StatusCode != http.StatusCreated {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if s, ok := a.subjectOf[digest.Digest(resp.Header.Get("Docker-Content-Digest"))]; ok {
		resp.Header.Set("OCI-Subject", s.String())
	}
}

// Item (beyond the peers): delete resolves a tag to its digest and deletes the manifest; without --force it asks on
// stdin as oras does (an empty answer deletes nothing, exit 0), --force never asks and passes over a missing
// manifest; a registry with deletes off is named with how to enable them.
func TestDeleteManifest(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	docker := t.TempDir()
	bin := testenv.Modelpack(t)
	home := t.TempDir()
	run := binaryRunner(t, "DOCKER_CONFIG="+docker, "MODELPACK_HOME="+home)
	withStdin := func(stdin string, args ...string) (int, string, string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+docker, "MODELPACK_HOME="+home)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return code, out.String(), errb.String()
	}
	ref := reg.Host + "/org/model:v1"
	model := writeModel(t, map[string]string{"model.safetensors": "weights"})
	if code, _, stderr := run("pack", model, "-t", ref, "--push", "-q"); code != 0 {
		t.Fatalf("pack: %s", stderr)
	}
	if code, stdout, stderr := withStdin("", "delete", ref); code != 0 || !strings.Contains(stdout, "Cancelled") || !strings.Contains(stderr, "[y/N]") {
		t.Fatalf("delete with no answer: %d %s %s", code, stdout, stderr)
	}
	mustPeer(t, docker, "oras", "manifest", "fetch", "--plain-http", ref)
	code, stdout, stderr := withStdin("y\n", "delete", ref, "-o", "json")
	if code != 0 || !strings.Contains(stdout, `"status": "deleted"`) {
		t.Fatalf("delete answered y: %d %s %s", code, stdout, stderr)
	}
	if out, err := peer(t, docker, "oras", "manifest", "fetch", "--plain-http", ref); err == nil {
		t.Fatalf("the manifest is still there after delete:\n%s", out)
	}
	if code, _, stderr := withStdin("", "delete", ref); code != 1 || !strings.Contains(stderr, "no manifest v1") {
		t.Fatalf("delete of a missing manifest: %d %s", code, stderr)
	}
	if code, stdout, stderr := withStdin("", "delete", "--force", ref); code != 0 || !strings.Contains(stdout, "Missing") {
		t.Fatalf("delete --force of a missing manifest: %d %s %s", code, stdout, stderr)
	}

	locked := testenv.StartRegistry(t, testenv.RegistryOptions{NoDelete: true})
	lref := locked.Host + "/org/model:v1"
	if code, _, stderr := run("pack", model, "-t", lref, "--push", "-q"); code != 0 {
		t.Fatalf("pack: %s", stderr)
	}
	code, _, stderr = run("delete", "--force", lref)
	if code != 1 || !strings.Contains(stderr, "does not allow deletes") || !strings.Contains(stderr, "storage.delete.enabled") {
		t.Fatalf("delete on a registry refusing deletes: %d %s", code, stderr)
	}
	mustPeer(t, docker, "oras", "manifest", "fetch", "--plain-http", lref)
}

type diffJSON struct {
	Added, Removed, Changed []struct {
		Path string `json:"path"`
	}
	Unchanged  int                  `json:"unchanged"`
	Fetch      []ocispec.Descriptor `json:"fetch"`
	FetchBytes int64                `json:"fetchBytes"`
}

func paths(cs []struct {
	Path string `json:"path"`
}) string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Path)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// Item (beyond the peers): diff names the files added, removed and changed between two models, and the bytes a node
// holding the first fetches for the second: the second's blobs the first lacks, each once (a file that moved, or a
// copy of a kept file, costs nothing). Registry references and local-store names give the same answer.
func TestDiff(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	run := binaryRunner(t, "DOCKER_CONFIG="+t.TempDir(), "MODELPACK_HOME="+t.TempDir())
	v1 := writeModel(t, map[string]string{"a.safetensors": strings.Repeat("a", 1000), "b.safetensors": strings.Repeat("b", 2000),
		"LICENSE": "apache", "docs/guide.md": "old guide"})
	v2 := writeModel(t, map[string]string{"a.safetensors": strings.Repeat("a", 1000), "b.safetensors": strings.Repeat("B", 3000),
		"moved/LICENSE": "apache", "docs/guide.md": "new guide", "c.safetensors": strings.Repeat("a", 1000)})
	for tag, dir := range map[string]string{"v1": v1, "v2": v2} {
		if code, _, stderr := run("pack", dir, "-t", reg.Host+"/org/m:"+tag, "--push", "-q"); code != 0 {
			t.Fatalf("pack %s: %s", tag, stderr)
		}
		if code, _, stderr := run("pack", dir, "-t", "m:"+tag, "-q"); code != 0 {
			t.Fatalf("pack %s: %s", tag, stderr)
		}
	}
	manifest := func(ref string) ocispec.Manifest {
		_, out, _ := run("inspect", ref, "-o", "json")
		var info struct {
			Manifest ocispec.Manifest `json:"manifest"`
		}
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatal(err, out)
		}
		return info.Manifest
	}
	m1, m2 := manifest("m:v1"), manifest("m:v2")
	have := map[digest.Digest]bool{m1.Config.Digest: true}
	for _, l := range m1.Layers {
		have[l.Digest] = true
	}
	var want int64
	seen := map[digest.Digest]bool{}
	for _, b := range append([]ocispec.Descriptor{m2.Config}, m2.Layers...) {
		if !have[b.Digest] && !seen[b.Digest] {
			want += b.Size
		}
		seen[b.Digest] = true
	}
	for _, refs := range [][2]string{{reg.Host + "/org/m:v1", reg.Host + "/org/m:v2"}, {"m:v1", "m:v2"}} {
		code, stdout, stderr := run("diff", refs[0], refs[1], "-o", "json")
		if code != 0 {
			t.Fatalf("diff %v: %s", refs, stderr)
		}
		var d diffJSON
		if err := json.Unmarshal([]byte(stdout), &d); err != nil {
			t.Fatal(err, stdout)
		}
		if paths(d.Added) != "c.safetensors,moved/LICENSE" || paths(d.Removed) != "LICENSE" || paths(d.Changed) != "b.safetensors,docs/guide.md" || d.Unchanged != 1 {
			t.Fatalf("diff %v: added %s removed %s changed %s unchanged %d", refs, paths(d.Added), paths(d.Removed), paths(d.Changed), d.Unchanged)
		}
		if d.FetchBytes != want || want < 3000 || want > 3000+int64(len("new guide"))+m2.Config.Size+2048 {
			t.Fatalf("diff %v: fetch %d bytes, want %d (the new weights, the new guide and the config)", refs, d.FetchBytes, want)
		}
		for _, f := range d.Fetch {
			if have[f.Digest] {
				t.Fatalf("diff %v: fetch lists %s, which v1 has", refs, f.Digest)
			}
		}
	}
	code, stdout, _ := run("diff", "m:v1", "m:v2")
	if code != 0 || !strings.Contains(stdout, "changed  b.safetensors") || !strings.Contains(stdout, "2 added, 1 removed, 2 changed, 1 unchanged") {
		t.Fatalf("diff table:\n%s", stdout)
	}
}

// Item (beyond the peers): save writes an OCI layout tar that oras (manifest fetch, pull, discover --oci-layout on
// the extracted tar) and crane (push DIR) read, with the referrers under -r; load puts it back in a local store or
// pushes it, referrers included, to a registry.
func TestSaveLoadInterop(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	docker := t.TempDir()
	run := binaryRunner(t, "DOCKER_CONFIG="+docker, "MODELPACK_HOME="+t.TempDir(), "COSIGN_PASSWORD=pw")
	ref := reg.Host + "/org/model:v1"
	model := writeModel(t, map[string]string{"model.safetensors": "weights", "config.json": "{}", "docs/README.md": "# hi"})
	if code, _, stderr := run("pack", model, "-t", ref, "--push", "-q"); code != 0 {
		t.Fatalf("pack: %s", stderr)
	}
	keys := filepath.Join(t.TempDir(), "cosign")
	if code, _, stderr := run("key", "generate", "--output-key-prefix", keys); code != 0 {
		t.Fatalf("key generate: %s", stderr)
	}
	if code, _, stderr := run("sign", ref, "--key", keys+".key"); code != 0 {
		t.Fatalf("sign: %s", stderr)
	}
	root := strings.TrimSpace(mustPeer(t, docker, "crane", "digest", "--insecure", ref))
	sbom := filepath.Join(t.TempDir(), "sbom.json")
	os.WriteFile(sbom, []byte("sbom"), 0o644)
	code, stdout, stderr := run("attach", ref, "--artifact-type", "application/spdx+json", sbom, "-q")
	if code != 0 {
		t.Fatalf("attach: %s", stderr)
	}
	sbomDigest := strings.TrimSpace(stdout)

	tmp := t.TempDir()
	tarPath := filepath.Join(tmp, "model.tar")
	if code, _, stderr := run("save", ref, "-r", "-o", tarPath, "-q"); code != 0 {
		t.Fatalf("save: %s", stderr)
	}
	layoutDir := filepath.Join(tmp, "layout")
	os.Mkdir(layoutDir, 0o755)
	if b, err := exec.Command("tar", "-xf", tarPath, "-C", layoutDir).CombinedOutput(); err != nil {
		t.Fatalf("tar -xf: %v %s", err, b)
	}
	out := mustPeer(t, docker, "oras", "manifest", "fetch", "--oci-layout", "--descriptor", layoutDir+":v1")
	if !strings.Contains(out, root) {
		t.Fatalf("oras manifest fetch --oci-layout: %s, want %s", out, root)
	}
	pulled := t.TempDir()
	mustPeer(t, docker, "oras", "pull", "--oci-layout", "-o", pulled, layoutDir+":v1")
	if b, err := os.ReadFile(filepath.Join(pulled, "model.safetensors")); err != nil || string(b) != "weights" {
		t.Fatalf("oras pull --oci-layout: %q %v", b, err)
	}
	if out := mustPeer(t, docker, "oras", "discover", "--oci-layout", layoutDir+":v1"); !strings.Contains(out, sbomDigest) {
		t.Fatalf("oras discover --oci-layout does not list the saved referrer %s:\n%s", sbomDigest, out)
	}

	// crane push DIR takes a layout of one image: save without -r.
	plainTar := filepath.Join(tmp, "plain.tar")
	if code, _, stderr := run("save", ref, "-o", plainTar, "-q"); code != 0 {
		t.Fatalf("save: %s", stderr)
	}
	plainDir := filepath.Join(tmp, "plain")
	os.Mkdir(plainDir, 0o755)
	if b, err := exec.Command("tar", "-xf", plainTar, "-C", plainDir).CombinedOutput(); err != nil {
		t.Fatalf("tar -xf: %v %s", err, b)
	}
	mustPeer(t, docker, "crane", "push", "--insecure", plainDir, reg.Host+"/crane/model:v1")
	if got := strings.TrimSpace(mustPeer(t, docker, "crane", "digest", "--insecure", reg.Host+"/crane/model:v1")); got != root {
		t.Fatalf("crane push of the saved layout: %s, want %s", got, root)
	}

	// Into a fresh local store under the recorded name, referrers included.
	run2 := binaryRunner(t, "DOCKER_CONFIG="+docker, "MODELPACK_HOME="+t.TempDir())
	if code, stdout, stderr := run2("load", tarPath); code != 0 || !strings.Contains(stdout, "Loaded "+ref) {
		t.Fatalf("load: %d %s %s", code, stdout, stderr)
	}
	if code, stdout, _ := run2("list"); code != 0 || !strings.Contains(stdout, ref) {
		t.Fatalf("list after load:\n%s", stdout)
	}
	if code, stdout, stderr := run2("load", tarPath, "--tag", "airgap/model:v9"); code != 0 || !strings.Contains(stdout, "airgap/model:v9") {
		t.Fatalf("load --tag: %d %s %s", code, stdout, stderr)
	}
	// And from that store, save again: the local store is a source too.
	again := filepath.Join(tmp, "again.tar")
	if code, _, stderr := run2("save", "airgap/model:v9", "-r", "-o", again, "-q"); code != 0 {
		t.Fatalf("save from the local store: %s", stderr)
	}
	if code, _, stderr := run2("load", again, reg.Host+"/pushed/model"); code != 0 {
		t.Fatalf("load to a registry: %s", stderr)
	}
	if got := strings.TrimSpace(mustPeer(t, docker, "crane", "digest", "--insecure", reg.Host+"/pushed/model:v9")); got != root {
		t.Fatalf("loaded to the registry: %s, want %s", got, root)
	}
	if out := mustPeer(t, docker, "oras", "discover", "--plain-http", reg.Host+"/pushed/model:v9"); !strings.Contains(out, sbomDigest) {
		t.Fatalf("the referrer did not travel through save and load:\n%s", out)
	}
	// The cosign signature (its sha256-<hex>.sig tag) travelled too: the loaded copy verifies.
	if code, stdout, stderr := run("verify", reg.Host+"/pushed/model:v9", "--key", keys+".pub", "--insecure-ignore-tlog"); code != 0 {
		t.Fatalf("verify of the loaded copy: %d %s %s", code, stdout, stderr)
	}
}

var specsV2 = specs.Versioned{SchemaVersion: 2}

type tarEntry struct {
	name     string
	body     []byte
	typeflag byte
	link     string
}

func writeTar(t *testing.T, entries []tarEntry) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "in", "model.tar")
	os.MkdirAll(filepath.Dir(p), 0o755)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, e := range entries {
		tf := e.typeflag
		if tf == 0 {
			tf = tar.TypeReg
		}
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tf, Linkname: e.link}
		if tf != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.body)
	}
	tw.Close()
	f.Close()
	return p
}

// layoutEntries is a one-file model as an OCI layout: its blobs and documents, index.json naming it hostile/m:v1.
func layoutEntries(t *testing.T, layer []byte) ([]tarEntry, ocispec.Descriptor) {
	config := []byte(`{"descriptor":{},"config":{},"modelfs":{"type":"layers","diffIds":[]}}`)
	cd := ocispec.Descriptor{MediaType: "application/vnd.cncf.model.config.v1+json", Digest: digest.FromBytes(config), Size: int64(len(config))}
	ld := ocispec.Descriptor{MediaType: "application/vnd.cncf.model.weight.v1.raw", Digest: digest.FromBytes(layer), Size: int64(len(layer)),
		Annotations: map[string]string{"org.cncf.model.filepath": "w.bin"}}
	m, _ := json.Marshal(ocispec.Manifest{Versioned: specsV2, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: "application/vnd.cncf.model.manifest.v1+json", Config: cd, Layers: []ocispec.Descriptor{ld}})
	md := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(m), Size: int64(len(m))}
	entry := md
	entry.Annotations = map[string]string{ocispec.AnnotationRefName: "v1", "io.containerd.image.name": "hostile/m:v1"}
	idx, _ := json.Marshal(ocispec.Index{Versioned: specsV2, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{entry}})
	blob := func(d digest.Digest) string { return "blobs/sha256/" + d.Encoded() }
	return []tarEntry{
		{name: "oci-layout", body: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{name: blob(cd.Digest), body: config},
		{name: blob(ld.Digest), body: layer},
		{name: blob(md.Digest), body: m},
		{name: "index.json", body: idx},
	}, ld
}

// Item (beyond the peers): load refuses a hostile tar before copying anything — an entry leaving the layout, a link,
// a name twice, a blob whose content is not its name, a manifest naming a blob the tar lacks — and tags nothing.
func TestLoadRefusesHostileTars(t *testing.T) {
	good, layer := layoutEntries(t, []byte("weights"))
	blobName := "blobs/sha256/" + layer.Digest.Encoded()
	replace := func(name string, e tarEntry) []tarEntry {
		out := append([]tarEntry(nil), good...)
		for i := range out {
			if out[i].name == name {
				out[i] = e
			}
		}
		return out
	}
	without := func(name string) []tarEntry {
		var out []tarEntry
		for _, e := range good {
			if e.name != name {
				out = append(out, e)
			}
		}
		return out
	}
	cases := map[string]struct {
		entries []tarEntry
		want    string
	}{
		"path traversal":   {append(append([]tarEntry(nil), good...), tarEntry{name: "../../escaped", body: []byte("x")}), "leaves the layout"},
		"absolute path":    {append(append([]tarEntry(nil), good...), tarEntry{name: "/tmp/escaped", body: []byte("x")}), "not a path inside the layout"},
		"symlink blob":     {replace(blobName, tarEntry{name: blobName, typeflag: tar.TypeSymlink, link: "/etc/passwd"}), "regular files only"},
		"content mismatch": {replace(blobName, tarEntry{name: blobName, body: []byte("WEIGHTS")}), "digest mismatch"},
		"missing blob":     {without(blobName), "is named but not in the tar"},
		"duplicate entry":  {append(append([]tarEntry(nil), good...), tarEntry{name: blobName, body: []byte("other")}), "twice"},
		"foreign file":     {append(append([]tarEntry(nil), good...), tarEntry{name: "run.sh", body: []byte("x")}), "not part of an OCI image layout"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			home := t.TempDir()
			run := binaryRunner(t, "MODELPACK_HOME="+home)
			p := writeTar(t, c.entries)
			code, _, stderr := run("load", p)
			if code != 1 || !strings.Contains(stderr, c.want) {
				t.Fatalf("load: exit %d, want 1 with %q: %s", code, c.want, stderr)
			}
			if _, stdout, _ := run("list", "-o", "json"); strings.TrimSpace(stdout) != "[]" {
				t.Fatalf("a refused load tagged something:\n%s", stdout)
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(filepath.Dir(p)), "escaped")); err == nil {
				t.Fatal("an entry was written outside the layout")
			}
		})
	}
	t.Run("the good tar loads", func(t *testing.T) {
		run := binaryRunner(t, "MODELPACK_HOME="+t.TempDir())
		if code, stdout, stderr := run("load", writeTar(t, good)); code != 0 || !strings.Contains(stdout, "hostile/m:v1") {
			t.Fatalf("load: %d %s %s", code, stdout, stderr)
		}
	})
}
