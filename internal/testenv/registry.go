package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// RegistryOptions configure a test registry.
type RegistryOptions struct {
	// Htpasswd, if set, is the content of an htpasswd file (bcrypt) and turns on basic auth.
	Htpasswd string
	// CertFile and KeyFile, if set, serve TLS.
	CertFile, KeyFile string
	// Dir, if set, is the storage root (so a restarted registry keeps its content); a temp dir otherwise.
	Dir string
	// Addr, if set, is the listen address (to restart on the same port).
	Addr string
	// AccessLog writes every request to LogPath (combined log format), for tests that count what was served.
	AccessLog bool
	// ProxyRemoteURL, if set, makes the registry a pull-through cache of that registry (distribution's proxy mode).
	ProxyRemoteURL string
	// NoDelete turns deletes off (storage.delete.enabled: false, distribution's default): DELETE answers 405
	// UNSUPPORTED.
	NoDelete bool
}

// Registry is a running distribution registry (v3.1.2) on loopback.
type Registry struct {
	Host string // host:port
	Dir  string // storage root
	// LogPath is the registry's log (its access log too with RegistryOptions.AccessLog).
	LogPath string
	cmd     *exec.Cmd
	opts    RegistryOptions
	t       testing.TB
}

// StartRegistry starts a real registry on a free 127.0.0.1 port with filesystem storage, stopped at test end.
func StartRegistry(t testing.TB, opts RegistryOptions) *Registry {
	t.Helper()
	bin := Tool(t, "registry")
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Addr == "" {
		opts.Addr = FreeAddr(t)
	}
	r, err := LaunchRegistry(bin, t.TempDir(), opts)
	if r != nil {
		r.t = t
		t.Cleanup(r.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// LaunchRegistry starts the registry binary bin with its configuration and log in cfgDir, and waits until it
// answers; opts.Dir and opts.Addr must be set. It is StartRegistry for programs that are not tests (the
// benchmarks), so both run the same registry: the caller stops it. Restart is for tests only.
func LaunchRegistry(bin, cfgDir string, opts RegistryOptions) (*Registry, error) {
	r := &Registry{Host: opts.Addr, Dir: opts.Dir, opts: opts}
	var auth, tlsCfg string
	if opts.Htpasswd != "" {
		p := filepath.Join(cfgDir, "htpasswd")
		if err := os.WriteFile(p, []byte(opts.Htpasswd), 0o600); err != nil {
			return nil, err
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: test\n    path: %s\n", p)
	}
	if opts.CertFile != "" {
		tlsCfg = fmt.Sprintf("  tls:\n    certificate: %s\n    key: %s\n", opts.CertFile, opts.KeyFile)
	}
	if opts.ProxyRemoteURL != "" {
		auth += fmt.Sprintf("proxy:\n  remoteurl: %s\n", opts.ProxyRemoteURL)
	}
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: error
  accesslog:
    disabled: %t
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: %t
http:
  addr: %s
%s%s`, !opts.AccessLog, opts.Dir, !opts.NoDelete, opts.Addr, tlsCfg, auth)
	cfgPath := filepath.Join(cfgDir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	r.cmd = exec.Command(bin, "serve", cfgPath)
	r.cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	r.LogPath = filepath.Join(cfgDir, "registry.log")
	logf, err := os.Create(r.LogPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own descriptor
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	if err := r.waitReady(); err != nil {
		return r, err
	}
	return r, nil
}

func (r *Registry) waitReady() error {
	scheme := "http"
	client := &http.Client{Timeout: time.Second}
	if r.opts.CertFile != "" {
		scheme = "https"
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := client.Get(scheme + "://" + r.Host + "/v2/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(r.LogPath)
	return fmt.Errorf("registry on %s did not start: %s", r.Host, log)
}

// Stop kills the registry; its storage stays for Restart.
func (r *Registry) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
		r.cmd = nil
	}
}

// Restart starts the registry again on the same address and storage.
func (r *Registry) Restart() {
	r.Stop()
	n := StartRegistry(r.t, r.opts)
	r.cmd = n.cmd
	n.cmd = nil
}

// BlobPath is where the registry stores a blob on disk (to corrupt it in tests).
func (r *Registry) BlobPath(digest string) string {
	alg, hex, _ := strings.Cut(digest, ":")
	return filepath.Join(r.Dir, "docker", "registry", "v2", "blobs", alg, hex[:2], hex, "data")
}

// FreeAddr returns a free 127.0.0.1:port.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// CertPool returns a pool holding the PEM certificate at path.
func CertPool(t testing.TB, path string) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", path)
	}
	return p
}
