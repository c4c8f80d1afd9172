package testmodel

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestGenerateShardsHaveValidHeadersAndExactSize(t *testing.T) {
	dir := t.TempDir()
	for _, size := range []int64{256, 4096, 4097, 100003, 1 << 20} {
		p := filepath.Join(dir, "s.safetensors")
		if err := WriteShard(p, size, 7); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(b)) != size {
			t.Fatalf("size %d: wrote %d bytes", size, len(b))
		}
		n := binary.LittleEndian.Uint64(b[:8])
		var h map[string]json.RawMessage
		if err := json.Unmarshal(b[8:8+n], &h); err != nil {
			t.Fatalf("size %d: header: %v", size, err)
		}
		var tensor struct {
			DataOffsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(h["layers.7.weight"], &tensor); err != nil {
			t.Fatal(err)
		}
		if got := int64(8+n) + tensor.DataOffsets[1]; got != size {
			t.Fatalf("size %d: header+data = %d", size, got)
		}
	}
}

func TestGenerateIsDeterministic(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	s := Spec{Shards: 2, ShardSize: 10000, Seed: 3, Files: 3}
	if err := Generate(a, s); err != nil {
		t.Fatal(err)
	}
	if err := Generate(b, s); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ShardName(0, 2), ShardName(1, 2), "config.json", "extra/part-00002.json"} {
		x, _ := os.ReadFile(filepath.Join(a, name))
		y, _ := os.ReadFile(filepath.Join(b, name))
		if len(x) == 0 || string(x) != string(y) {
			t.Fatalf("%s differs between runs", name)
		}
	}
	x, _ := os.ReadFile(filepath.Join(a, ShardName(0, 2)))
	y, _ := os.ReadFile(filepath.Join(a, ShardName(1, 2)))
	if string(x) == string(y) {
		t.Fatal("shards with different seeds are identical")
	}
}
