package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelpack/modelpack/cas"
	"github.com/modelpack/modelpack/internal/testenv"
	"github.com/modelpack/modelpack/internal/testmodel"
)

// A shard flipped in the node cache with dd conv=notrunc (same size, mtime put back) while the driver was down is
// never mounted again, whatever the restart: after a clean restart the publish sees the shard's stamp changed and
// re-hashes it (IfNotPresent and Always); after an unclean one (SIGKILL) it re-hashes it even when the stamp
// matches (a write beneath the file system, staged by forging the stamp), although the background scrub crawls
// at 1 byte/s and so has checked nothing. Each time the shard is quarantined and fetched again, the new volume
// reads the pushed bytes, and the volumes mounted before never show the flipped ones.
func TestDriverNeverMountsFlippedBytes(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	drvCleanupMounts(t, dir)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	proxy := drvStartProxy(t, reg.Host)
	weights := randomBytes(t, 4<<20)
	testmodel.Push(t, reg.Host, "models/flip", "v1", drvModel{"model.safetensors": weights, "config.json": []byte(`{"layers":2}`)}, nil)
	shard := digestOf(weights)
	ref := proxy.Host + "/models/flip:v1"

	d := drvStartWith(t, filepath.Join(dir, "node"), []string{"--cache-scrub-rate", "1"}, proxy.Host)
	blob := filepath.Join(d.Root, "cache", "blobs", "sha256", shard.Encoded())
	var targets []string
	publish := func(policy string) string {
		t.Helper()
		vol := fmt.Sprint("vol-", len(targets))
		target := drvKubelet(t, dir, vol)
		req := testenv.PublishRequest(vol, target, map[string]string{"reference": ref, "pullPolicy": policy})
		if err := drvPublish(d.node(), req, time.Minute); err != nil {
			t.Fatalf("publish %s (%s): %v", vol, policy, err)
		}
		targets = append(targets, target)
		return target
	}
	publish("IfNotPresent")

	for i, round := range []struct {
		name, policy string
		unclean      bool
	}{
		{"clean restart", "IfNotPresent", false},
		{"clean restart", "Always", false},
		{"unclean restart, flip beneath the stamp", "IfNotPresent", true},
	} {
		if round.unclean {
			d.kill()
		} else {
			d.stop()
		}
		testenv.FlipByte(t, blob, int64(1000+i), true)
		if round.unclean {
			// What a write to the block device or bit rot looks like: the bytes change, the stamp does not.
			fi, err := os.Stat(blob)
			if err != nil {
				t.Fatal(err)
			}
			stamp := filepath.Join(d.Root, "cache", "ingest", "stamps", "sha256-"+shard.Encoded())
			if err := os.WriteFile(stamp, []byte(cas.StampOf(fi).String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		d.restart()
		gets := proxy.blobGetsOf(shard)
		target := publish(round.policy)
		if got, err := os.ReadFile(filepath.Join(target, "model.safetensors")); err != nil || !bytes.Equal(got, weights) {
			t.Fatalf("%s, %s: the new volume does not read the pushed weights (%v)", round.name, round.policy, err)
		}
		if n := proxy.blobGetsOf(shard) - gets; n != 1 {
			t.Errorf("%s, %s: the flipped shard was fetched %d times, want 1", round.name, round.policy, n)
		}
		if n := d.metric("modelpack_cache_corrupt_blobs_total", `problem="digest"`); n != 1 {
			t.Errorf("%s, %s: corrupt_blobs_total{problem=digest} = %v, want 1", round.name, round.policy, n)
		}
		if q, err := os.ReadDir(filepath.Join(d.Root, "cache", "quarantine")); err != nil || len(q) == 0 {
			t.Errorf("%s, %s: nothing quarantined (%v)", round.name, round.policy, err)
		}
		for _, old := range targets {
			if got, err := os.ReadFile(filepath.Join(old, "model.safetensors")); err == nil && !bytes.Equal(got, weights) {
				t.Fatalf("%s, %s: the volume at %s reads the flipped bytes", round.name, round.policy, old)
			}
		}
	}
	for i, target := range targets {
		drvUnpublish(t, d.node(), fmt.Sprint("vol-", i), target)
	}
}
