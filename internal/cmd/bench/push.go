package main

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/bcrypt"

	"github.com/modelpack/modelpack/internal/bench"
	"github.com/modelpack/modelpack/internal/testenv"
)

// benchPush: `modelpack push` against `oras push` of the benchmark model, and `modelpack copy` against `oras cp`
// of it from the plain registry, into a registry with basic auth, side by side, medians of RUNS (3) rounds whose
// tool order rotates. The registry is distribution with htpasswd at bcrypt cost 10 (Go's default, what
// `htpasswd -B` and most guides give): it checks the password on every request, so what a push costs grows with
// its number of requests, which the registry without auth does not show.
//
// Every push goes to a new repository of an emptied registry, so every blob is uploaded and the disk holds one
// copy at a time. BENCH_BASELINE_BIN: another modelpack binary whose push is measured in the same rounds.
func benchPush(e *env) error {
	runs := envInt("RUNS", 3)
	scratch, _, err := e.scratch("bench-push")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)

	reg, docker, err := authRegistry(scratch)
	if err != nil {
		return err
	}
	defer reg.Stop()
	// The plain registry (the copies' source) needs no credentials; the authenticated one reads them from here.
	creds := "DOCKER_CONFIG=" + docker
	store := "MODELPACK_HOME=" + filepath.Join(scratch, "store")
	if err := run1(exec.Command("modelpack", "pack", e.modelDir, "-t", "bench/push:v1", "-q"), store); err != nil {
		return err
	}
	files, err := orasFiles(e.modelDir)
	if err != nil {
		return err
	}

	// Each measurement starts from an empty registry and a settled disk.
	empty := func() { fresh(filepath.Join(reg.Dir, "docker")) }
	var mpPush, orasPush, mpCopy, orasCopy []float64
	round := 0
	measure := func(into *[]float64, cmd func(repo string) *exec.Cmd, env ...string) func() error {
		return func() error {
			empty()
			s, err := timed(cmd(fmt.Sprintf("%s/bench/r%d-%d", reg.Host, round, len(*into))), env...)
			*into = append(*into, s)
			return err
		}
	}
	tools := []func() error{
		measure(&mpPush, func(repo string) *exec.Cmd {
			return exec.Command("modelpack", "push", "--plain-http", "-q", "--from", "bench/push:v1", repo+":v1")
		}, store, creds),
		measure(&orasPush, func(repo string) *exec.Cmd {
			cmd := exec.Command("oras", append([]string{"push", "--plain-http", "--artifact-type", "application/vnd.cncf.model.manifest.v1+json", repo + ":v1"}, files...)...)
			cmd.Dir, cmd.Stdout = e.modelDir, io.Discard
			return cmd
		}, creds),
		measure(&mpCopy, func(repo string) *exec.Cmd {
			return exec.Command("modelpack", "copy", "--plain-http", "-q", e.ref, repo+":v1")
		}, store, creds),
		measure(&orasCopy, func(repo string) *exec.Cmd {
			cmd := exec.Command("oras", "cp", "--from-plain-http", "--to-plain-http", e.ref, repo+":v1")
			cmd.Stdout = io.Discard
			return cmd
		}, creds),
	}
	var basePush []float64
	if baseline := os.Getenv("BENCH_BASELINE_BIN"); baseline != "" {
		tools = append(tools, measure(&basePush, func(repo string) *exec.Cmd {
			return exec.Command(baseline, "push", "--plain-http", "-q", "--from", "bench/push:v1", repo+":v1")
		}, store, creds))
	}
	for round = 1; round <= runs; round++ {
		if err := bench.Rotate(round, tools...); err != nil {
			return err
		}
	}
	empty()

	mp, or, mc, oc := bench.Median(mpPush), bench.Median(orasPush), bench.Median(mpCopy), bench.Median(orasCopy)
	s := bench.Secs
	fmt.Printf("push to a registry with basic auth (htpasswd, bcrypt cost %d; %s model, medians of %d; ratios > 1 mean modelpack is faster)\n",
		bcrypt.DefaultCost, e.size, runs)
	fmt.Println(bench.Line("push vs oras push (basic auth)", fmt.Sprintf("modelpack %ss, oras %ss", s(mp), s(or)), or/mp, "%.2f", ">=", 1.1, "x"))
	fmt.Println(bench.Line("copy vs oras cp (basic auth dst)", fmt.Sprintf("modelpack %ss, oras %ss", s(mc), s(oc)), oc/mc, "%.2f", ">=", 1.1, "x"))
	if len(basePush) > 0 {
		bp := bench.Median(basePush)
		fmt.Printf("baseline %s: push %ss (oras / baseline %sx; runs %s)\n", os.Getenv("BENCH_BASELINE_BIN"), s(bp), bench.Ratio(or, bp), bench.Runs(basePush))
	}
	fmt.Printf("runs: push %s | oras push %s | copy %s | oras cp %s\n", bench.Runs(mpPush), bench.Runs(orasPush), bench.Runs(mpCopy), bench.Runs(orasCopy))
	return nil
}

// authRegistry starts a registry under dir whose htpasswd entry is hashed at bcrypt's default cost, and writes a
// docker config holding its credentials; it returns the registry and that config's directory.
func authRegistry(dir string) (*testenv.Registry, string, error) {
	user, pass := "bench", rand.Text()
	hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.DefaultCost)
	if err != nil {
		return nil, "", err
	}
	bin, err := exec.LookPath("registry")
	if err != nil {
		return nil, "", fmt.Errorf("registry not installed: run `make tools`")
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	data := filepath.Join(dir, "registry")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, "", err
	}
	reg, err := testenv.LaunchRegistry(bin, dir, testenv.RegistryOptions{Dir: data, Addr: addr, Htpasswd: user + ":" + string(hash) + "\n"})
	if err != nil {
		if reg != nil {
			reg.Stop()
		}
		return nil, "", err
	}
	docker := filepath.Join(dir, "docker")
	cfg, _ := json.Marshal(map[string]any{"auths": map[string]any{addr: map[string]string{
		"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))}}})
	if err := os.MkdirAll(docker, 0o700); err == nil {
		err = os.WriteFile(filepath.Join(docker, "config.json"), cfg, 0o600)
	}
	if err != nil {
		reg.Stop()
		return nil, "", err
	}
	return reg, docker, nil
}

// orasFiles lists the model's files as `oras push` arguments, each with the media type modelpack gives it.
func orasFiles(dir string) ([]string, error) {
	files, err := modelFiles(dir)
	if err != nil {
		return nil, err
	}
	for i, f := range files {
		if strings.HasSuffix(f, ".safetensors") {
			files[i] = f + ":application/vnd.cncf.model.weight.v1.raw"
		} else {
			files[i] = f + ":application/vnd.cncf.model.weight.config.v1.raw"
		}
	}
	return files, nil
}
