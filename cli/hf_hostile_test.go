package cli

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelpack/modelpack/internal/testenv/hubserver"
)

const hubToken = "hf_HoStIlEtOkEn0123456789"

// hostileHub serves a gated copy of the small model, and runs the built binary against it with the token in
// HF_TOKEN (or, with viaFile, in the file HF_TOKEN_PATH names) and the given environment.
func hostileHub(t *testing.T, tls bool) (*hubserver.Server, func(viaFile bool, args ...string) (int, string, string)) {
	t.Helper()
	repo, _ := hubRepo(t, "acme/gated")
	repo.Token = hubToken
	var s *hubserver.Server
	env := []string{"HF_HOME=" + t.TempDir(), "HF_TOKEN_PATH="}
	if tls {
		var ca string
		s, ca = hubserver.StartTLS(t, repo)
		env = append(env, "SSL_CERT_FILE="+ca)
	} else {
		s = hubserver.Start(t, repo)
	}
	env = append(env, "HF_ENDPOINT="+s.URL)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(hubToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withToken := append(append([]string{}, env...), "HF_TOKEN="+hubToken)
	withFile := append(append([]string{}, env...), "HF_TOKEN=", "HF_TOKEN_PATH="+tokenFile)
	runToken, runFile := binaryRunner(t, withToken...), binaryRunner(t, withFile...)
	return s, func(viaFile bool, args ...string) (int, string, string) {
		t.Helper()
		if viaFile {
			return runFile(args...)
		}
		return runToken(args...)
	}
}

// tokenOnlyToTheHub fails the test if a request away from the Hub's origin (the download host, the other origin)
// carried the token, or a request to the Hub lacked it, or the token is in the output.
func tokenOnlyToTheHub(t *testing.T, s *hubserver.Server, output string) {
	t.Helper()
	for _, r := range s.Requests() {
		if r.Host != "hub" && r.Auth != "" {
			t.Errorf("%s %s (%s, another origin) received Authorization %q", r.Method, r.Path, r.Host, r.Auth)
		}
		if r.Host == "hub" && r.Auth != "Bearer "+hubToken {
			t.Errorf("%s %s (the Hub) received Authorization %q", r.Method, r.Path, r.Auth)
		}
	}
	if strings.Contains(output, hubToken) {
		t.Errorf("the token is in the output:\n%s", output)
	}
}

// nothingTagged fails the test if a pack tagged ...:bad or ...:huge in home.
func nothingTagged(t *testing.T, run func(bool, ...string) (int, string, string), home string) {
	t.Helper()
	if _, out, _ := run(false, "--home", home, "ls"); strings.Contains(out, ":bad") || strings.Contains(out, ":huge") || strings.Contains(out, "clash") {
		t.Errorf("something was tagged:\n%s", out)
	}
}

// Issue 31 §3. A hostile Hub (HF_ENDPOINT) redirects a weight's resolve to the node itself: another port of
// loopback (a kubelet's /pods, a metadata path), [::1], a DNS name resolving to loopback, the metadata address
// 169.254.169.254, with 302, 307 and 308. The real binary refuses each connection before a byte is sent, naming
// the address, tags nothing, and the token never leaves the Hub. The download host LFS files normally redirect to
// (another origin) is still read, without the token.
func TestPackHFHostileRedirects(t *testing.T) {
	s, run := hostileHub(t, false)
	home := t.TempDir()

	// The CDN redirect works without the token; the token reaches the Hub only, from HF_TOKEN and HF_TOKEN_PATH.
	for _, viaFile := range []bool{false, true} {
		code, out, stderr := run(viaFile, "--home", home, "pack", "hf://acme/gated", "-t", "gated:ok")
		if code != 0 {
			t.Fatalf("pack (token file %v): exit %d\n%s", viaFile, code, stderr)
		}
		tokenOnlyToTheHub(t, s, out+stderr)
	}
	downloads := 0
	for _, r := range s.Requests() {
		if r.Host == "download" {
			downloads++
		}
	}
	if downloads == 0 {
		t.Fatal("no LFS file was read from the download host")
	}

	trap := hubserver.StartTrap(t, "127.0.0.1:0")
	trap6 := hubserver.StartTrap(t, "[::1]:0")
	trapPort := strings.TrimPrefix(trap.URL, "http://127.0.0.1:")
	for name, c := range map[string]struct {
		redirect hubserver.Redirect
		addr     string // named in the error
	}{
		"302 to another loopback port":         {hubserver.Redirect{Location: trap.URL + "/latest/meta-data/iam/security-credentials/"}, "127.0.0.1:" + trapPort},
		"307 to a kubelet's /pods":             {hubserver.Redirect{Status: 307, Location: trap.URL + "/pods"}, "127.0.0.1:" + trapPort},
		"308 to [::1]":                         {hubserver.Redirect{Status: 308, Location: trap6.URL + "/pods"}, strings.TrimPrefix(trap6.URL, "http://")},
		"a DNS name resolving to loopback":     {hubserver.Redirect{Location: "http://localhost:" + trapPort + "/pods"}, "localhost:" + trapPort},
		"the metadata service 169.254.169.254": {hubserver.Redirect{Location: "http://169.254.169.254/latest/meta-data/iam/security-credentials/"}, "169.254.169.254:80"},
	} {
		t.Run(name, func(t *testing.T) {
			s.Redirect[hubShard] = c.redirect
			defer delete(s.Redirect, hubShard)
			// A store without the weight: one that holds it would not read it.
			h := t.TempDir()
			code, out, stderr := run(false, "--home", h, "pack", "hf://acme/gated", "-t", "gated:bad")
			nothingTagged(t, run, h)
			if code == 0 || !strings.Contains(stderr, "refused") || !strings.Contains(stderr, c.addr) || !strings.Contains(stderr, hubShard) {
				t.Fatalf("pack redirected to %s: exit %d\n%s", c.redirect.Location, code, stderr)
			}
			tokenOnlyToTheHub(t, s, out+stderr)
		})
	}
	if n := len(trap.Requests()) + len(trap6.Requests()); n != 0 {
		t.Errorf("the loopback traps received %d requests: %+v %+v", n, trap.Requests(), trap6.Requests())
	}
}

// A hostile Hub's next page, or a weight's redirect, leads to another origin (the Hub's own socket under another
// name, reachable), which answers 429 twice: every request there, retries included, goes without the token, from
// HF_TOKEN or HF_TOKEN_PATH, with 302, 307 or 308.
func TestPackHFTokenStaysWithTheHub(t *testing.T) {
	s, run := hostileHub(t, false)
	s.RetryAfter = "0"
	other := func() (n int) {
		for _, r := range s.Requests() {
			if r.Host == "other" {
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		name    string
		viaFile bool
		set     func()
	}{
		{"next page", false, func() { s.PageSize, s.NextPage = 3, s.OtherURL }},
		{"next page, HF_TOKEN_PATH", true, func() { s.PageSize, s.NextPage = 3, s.OtherURL }},
		{"302", false, func() {
			s.Redirect[hubShard] = hubserver.Redirect{Location: s.OtherURL + "/acme/gated/resolve/main/" + hubShard}
		}},
		{"307", true, func() {
			s.Redirect[hubShard] = hubserver.Redirect{Status: 307, Location: s.OtherURL + "/acme/gated/resolve/main/" + hubShard}
		}},
		{"308", false, func() {
			s.Redirect["config.json"] = hubserver.Redirect{Status: 308, Location: s.OtherURL + "/acme/gated/resolve/main/config.json"}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s.PageSize, s.NextPage, s.Redirect, s.OtherRateLimit = 0, "", map[string]hubserver.Redirect{}, 2
			c.set()
			before := other()
			code, out, stderr := run(c.viaFile, "--home", t.TempDir(), "pack", "hf://acme/gated", "-t", "gated:bad")
			// Without the token the other origin refuses the gated repository: the pack fails.
			if code == 0 || !strings.Contains(stderr, "401") || !strings.Contains(stderr, "where the Hub sent it and the token is not sent") {
				t.Errorf("pack: exit %d\n%s", code, stderr)
			}
			if n := other() - before; n < 3 {
				t.Errorf("the other origin received %d requests, want at least 3 (two 429 answers waited out, then a 401)", n)
			}
			tokenOnlyToTheHub(t, s, out+stderr)
		})
	}
}

// Over HTTPS, a redirect or a next page to plain HTTP on the same host is another origin, and refused outright:
// no request goes out in the clear. The download host (https, another name) is read without the token.
func TestPackHFRefusesPlainHTTPAfterHTTPS(t *testing.T) {
	s, run := hostileHub(t, true)
	if code, out, stderr := run(false, "--home", t.TempDir(), "pack", "hf://acme/gated", "-t", "gated:ok"); code != 0 {
		t.Fatalf("pack over https: exit %d\n%s", code, stderr)
	} else {
		tokenOnlyToTheHub(t, s, out+stderr)
	}
	u, _ := url.Parse(s.URL)
	plain := "http://" + u.Host
	for name, set := range map[string]func(){
		"redirect": func() {
			s.Redirect[hubShard] = hubserver.Redirect{Status: 307, Location: plain + "/acme/gated/resolve/main/" + hubShard}
		},
		"next page": func() { s.PageSize, s.NextPage = 3, plain },
	} {
		t.Run(name, func(t *testing.T) {
			s.PageSize, s.NextPage, s.Redirect = 0, "", map[string]hubserver.Redirect{}
			set()
			before := len(s.Requests())
			start := time.Now()
			code, out, stderr := run(false, "--home", t.TempDir(), "pack", "hf://acme/gated", "-t", "gated:bad")
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("the refusal took %s: retried", took)
			}
			if code == 0 || !strings.Contains(stderr, "plain HTTP after HTTPS") || !strings.Contains(stderr, plain) {
				t.Fatalf("pack: exit %d\n%s", code, stderr)
			}
			for _, r := range s.Requests()[before:] {
				if r.Host == "other" || (r.Host == "download" && strings.HasSuffix(r.Path, s.SHA256("acme/gated", hubShard)) && name == "redirect") {
					t.Errorf("%s %s reached %s", r.Method, r.Path, r.Host)
				}
			}
			tokenOnlyToTheHub(t, s, out+stderr)
		})
	}
}

// Issue 31 §7. A listing with a file cfg and a file cfg/w.safetensors is refused before anything is downloaded,
// naming both (unpack would refuse the artifact); so is a file whose claimed size (1 TiB) cannot fit: refused
// before any allocation, naming the file, its size and the free space, with nothing left in the store.
func TestPackHFRefusesImpossibleListings(t *testing.T) {
	s, run := hostileHub(t, false)
	repo, _ := hubRepo(t, "acme/clash")
	repo.Files["cfg"] = []byte("{}")
	repo.Files["cfg/w.safetensors"] = repo.Files[hubShard]
	s.Add(repo)
	home := t.TempDir()
	code, _, stderr := run(false, "--home", home, "pack", "hf://acme/clash", "-t", "clash:v1")
	if code == 0 || !strings.Contains(stderr, `"cfg"`) || !strings.Contains(stderr, `"cfg/w.safetensors"`) {
		t.Fatalf("pack of a listing with cfg and cfg/w.safetensors: exit %d\n%s", code, stderr)
	}
	for _, r := range s.Requests() {
		if strings.Contains(r.Path, "/resolve/") || r.Host == "download" {
			t.Errorf("%s %s was asked for after a listing to refuse", r.Method, r.Path)
		}
	}

	s.ClaimSize[hubShard] = 1 << 40
	code, _, stderr = run(false, "--home", home, "pack", "hf://acme/gated", "-t", "gated:huge")
	if code == 0 || !strings.Contains(stderr, hubShard) || !strings.Contains(stderr, "1.0 TiB") || !strings.Contains(stderr, "free") {
		t.Fatalf("pack of a 1 TiB claim: exit %d\n%s", code, stderr)
	}
	for _, r := range s.Requests() {
		if strings.Contains(r.Path, "/resolve/") || r.Host == "download" {
			t.Errorf("%s %s was asked for after a listing to refuse", r.Method, r.Path)
		}
	}
	partials, _ := filepath.Glob(filepath.Join(home, "ingest", "*.partial"))
	blobs, _ := os.ReadDir(filepath.Join(home, "blobs", "sha256"))
	if len(partials)+len(blobs) > 0 {
		t.Errorf("the refused pack left partials %v and %d blobs", partials, len(blobs))
	}
	nothingTagged(t, run, home)
}
