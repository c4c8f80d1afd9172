// Command bench is `make bench`: it generates the benchmark model once (4 shards of BENCH_MODEL_SIZE, 512MiB by
// default: 2 GiB), starts a real local registry, pushes the model, then runs each area's benchmark side by side
// with its peer (oras, curl) and prints ratios; push runs against a second registry with basic auth (htpasswd,
// bcrypt cost 10). Absolute times drift on shared machines; read the ratios.
//
//	go run ./internal/cmd/bench [AREA...]     # areas: pack transport push cache flush publish driver prepull scan cluster fleet
//
// With no arguments it runs BENCH_ONLY (comma-separated) or every area. Other settings, all optional:
// BENCH_WORK (scratch, /var/tmp/modelpack-bench), BENCH_MODEL_SIZE (shard size of the model: a smaller model for a
// quick run), RUNS (rounds of every area), PREPULL_N, WARM_N, GC_BLOBS, BENCH_BASELINE_BIN (an older modelpack measured in
// the same rounds, for transport and driver), MODELPACK and ORAS (the binaries pack compares), DRIVER_LOG_LEVEL.
// flush, publish, driver and prepull need root (the page cache dropped, mounts). cluster runs e2e/cluster/bench (its own cluster);
// fleet runs e2e/fleet's BenchmarkFleet (simulated nodes, Kraken, a capped registry link; BENCH_FLEET_* settings).
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	humanize "github.com/dustin/go-humanize"

	"github.com/modelpack/modelpack/internal/bench"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// areas in the order they run; cluster is dispatched separately (its own cluster and program).
type area struct {
	name string
	run  func(*env) error
}

var areas = []area{
	{"pack", benchPack},
	{"transport", benchTransport},
	{"push", benchPush},
	{"cache", benchCache},
	{"flush", benchFlush},
	{"publish", benchPublish},
	{"driver", benchDriver},
	{"prepull", benchPrepull},
	{"scan", benchScan},
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	selected := args
	if len(selected) == 0 && os.Getenv("BENCH_ONLY") != "" {
		selected = strings.Split(os.Getenv("BENCH_ONLY"), ",")
	}
	known := []string{"cluster", "fleet"}
	for _, a := range areas {
		known = append(known, a.name)
	}
	for _, s := range selected {
		if !slices.Contains(known, s) {
			return fmt.Errorf("unknown area %q: valid areas are %s", s, strings.Join(known, ", "))
		}
	}
	want := func(name string) bool { return len(selected) == 0 || slices.Contains(selected, name) }

	root := testenv.RepoRoot()
	if err := os.Chdir(root); err != nil {
		return err
	}
	os.Setenv("PATH", filepath.Join(root, "bin", "tools")+":"+filepath.Join(root, "bin")+":"+os.Getenv("PATH"))
	e, err := setup(slices.ContainsFunc(areas, func(a area) bool { return want(a.name) }))
	if err != nil {
		return err
	}
	if e != nil {
		defer e.close()
		for _, a := range areas {
			if !want(a.name) {
				continue
			}
			fmt.Println("==", a.name)
			if err := a.run(e); err != nil {
				return fmt.Errorf("%s: %w", a.name, err)
			}
			fmt.Println()
		}
	}
	if want("cluster") {
		fmt.Println("== cluster")
		if e != nil {
			os.Setenv("MODEL_DIR", e.modelDir)
		}
		if err := benchCluster(); err != nil {
			return err
		}
	}
	if want("fleet") {
		fmt.Println("== fleet")
		return benchFleet()
	}
	return nil
}

// env is what every area runs against: the model directory, a registry holding it at ref, and scratch space.
type env struct {
	work     string
	modelDir string
	registry *testenv.Registry
	ref      string
	// size is the model's total size, as the headers print it.
	size string
}

// setup generates the model once, starts the registry and pushes the model; nil when no area needs them.
func setup(needed bool) (_ *env, err error) {
	if !needed {
		return nil, nil
	}
	work := envOr("BENCH_WORK", "/var/tmp/modelpack-bench")
	shardSize := envOr("BENCH_MODEL_SIZE", "512MiB")
	n, err := humanize.ParseBytes(shardSize)
	if err != nil {
		return nil, fmt.Errorf("BENCH_MODEL_SIZE %q: %w (write a size such as 512MiB or 8MiB)", shardSize, err)
	}
	e := &env{work: work, modelDir: filepath.Join(work, "model")}
	if shardSize != "512MiB" { // the 2 GiB model keeps its place (e2e/cluster/bench reads it there too)
		e.modelDir = filepath.Join(work, "model-"+shardSize)
	}
	if err := bench.Model(e.modelDir, testmodel.Spec{Shards: 4, ShardSize: int64(n), Seed: 1}); err != nil {
		return nil, err
	}
	if e.size, err = dirSize(e.modelDir); err != nil {
		return nil, err
	}
	regDir := filepath.Join(work, "registry")
	os.RemoveAll(regDir)
	if err := os.MkdirAll(filepath.Join(regDir, "data"), 0o755); err != nil {
		return nil, err
	}
	bin, err := exec.LookPath("registry")
	if err != nil {
		return nil, fmt.Errorf("registry not installed: run `make tools`")
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	e.registry, err = testenv.LaunchRegistry(bin, regDir, testenv.RegistryOptions{Dir: filepath.Join(regDir, "data"), Addr: addr})
	if e.registry != nil {
		defer func() {
			if err != nil {
				e.registry.Stop()
			}
		}()
	}
	if err != nil {
		return nil, err
	}
	// No tool finds stray credentials: every child reads an empty docker config.
	docker := filepath.Join(work, "docker")
	if err = os.MkdirAll(docker, 0o755); err != nil {
		return nil, err
	}
	if err = os.WriteFile(filepath.Join(docker, "config.json"), []byte(`{"auths":{}}`), 0o600); err != nil {
		return nil, err
	}
	os.Setenv("DOCKER_CONFIG", docker)
	e.ref = e.registry.Host + "/bench/model:v1"
	if err = e.push(e.modelDir, e.ref); err != nil {
		return nil, err
	}
	fmt.Printf("benchmark model (%s) pushed to %s\n\n", e.size, e.ref)
	return e, nil
}

func (e *env) close() { e.registry.Stop() }

// scratch gives an area an empty directory of its own under the work directory (the area removes it when done)
// and the benchmark model's manifest, whose blobs the peers download.
func (e *env) scratch(name string) (string, blobsOf, error) {
	dir := filepath.Join(e.work, name)
	fresh(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", blobsOf{}, err
	}
	blobs, err := manifestOf(e.ref)
	return dir, blobs, err
}

// push packs dir and pushes it to ref, from a seed store of its own.
func (e *env) push(dir, ref string) error {
	return run1(exec.Command("modelpack", "pack", dir, "-t", ref, "--push", "--plain-http", "-q"), "MODELPACK_HOME="+filepath.Join(e.work, "home-seed"))
}

// benchCluster runs the pod-start benchmark on the real cluster, a program of its own (it needs the cluster tag and
// starts its own cluster); BENCH_* settings reach it through the environment.
func benchCluster() error {
	cmd := exec.Command("go", "run", "-tags", "cluster", "./e2e/cluster/bench")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// benchFleet runs e2e/fleet's BenchmarkFleet: its own registry, Kraken and simulated nodes (the fleet tag).
func benchFleet() error {
	cmd := exec.Command("go", "test", "-tags", "fleet", "-run", "^$", "-bench", "^BenchmarkFleet$", "-benchtime", "1x", "-timeout", "60m", "./e2e/fleet/")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
