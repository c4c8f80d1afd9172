package hf

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// TestHubPatternsMatchHuggingfaceHub checks --include/--exclude for hf:// against testdata/hubglob.json, which
// huggingface_hub's own filter_repo_objects wrote (testdata/hubglob.py; the commit is in the file's "source").
func TestHubPatternsMatchHuggingfaceHub(t *testing.T) {
	raw, err := os.ReadFile("testdata/hubglob.json")
	if err != nil {
		t.Fatal(err)
	}
	var data struct {
		Source string
		Paths  []string
		Table  []struct {
			Pattern       string
			Allow, Ignore []string
		}
	}
	if err := json.Unmarshal(raw, &data); err != nil {
		t.Fatal(err)
	}
	if len(data.Table) < 30 {
		t.Fatalf("table has %d rows", len(data.Table))
	}
	for _, row := range data.Table {
		var allow, ignore []string
		for _, p := range data.Paths {
			if selected(p, Options{Include: []string{row.Pattern}}) {
				allow = append(allow, p)
			}
			if selected(p, Options{Exclude: []string{row.Pattern}}) {
				ignore = append(ignore, p)
			}
		}
		if !slices.Equal(allow, row.Allow) && !(len(allow) == 0 && len(row.Allow) == 0) {
			t.Errorf("--include %q keeps %q; huggingface_hub (%s) keeps %q", row.Pattern, allow, data.Source, row.Allow)
		}
		if !slices.Equal(ignore, row.Ignore) && !(len(ignore) == 0 && len(row.Ignore) == 0) {
			t.Errorf("--exclude %q keeps %q; huggingface_hub (%s) keeps %q", row.Pattern, ignore, data.Source, row.Ignore)
		}
	}
}

// FuzzHubPattern: no pattern or path makes the matcher panic or loop.
func FuzzHubPattern(f *testing.F) {
	f.Add("extra/[!a-c].txt", "extra/d.txt")
	f.Add("[", "[")
	f.Add("*a*b*c", "xaybzc/")
	f.Fuzz(func(t *testing.T, pattern, name string) {
		_ = hubMatch(pattern, name)
		if hubMatch("*", name) != true {
			t.Fatalf("* does not match %q", name)
		}
	})
}
