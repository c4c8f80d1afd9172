package csidriver

import (
	"errors"
	"strings"
	"testing"
)

func TestParseAttributes(t *testing.T) {
	for _, tc := range []struct {
		ref, policy  string
		wantRef      string
		wantPolicy   PullPolicy
		wantIsDigest bool
	}{
		{"registry.example.com/m/llama:v1", "", "registry.example.com/m/llama:v1", PullIfNotPresent, false},
		{"registry.example.com/m/llama:latest", "", "registry.example.com/m/llama:latest", PullAlways, false},
		{"registry.example.com/m/llama", "", "registry.example.com/m/llama:latest", PullAlways, false},
		{"registry.example.com/m/llama@sha256:" + strings.Repeat("a", 64), "", "registry.example.com/m/llama@sha256:" + strings.Repeat("a", 64), PullIfNotPresent, true},
		{"registry.example.com/m/llama:latest", "Never", "registry.example.com/m/llama:latest", PullNever, false},
		{"llama:v1", "", "docker.io/library/llama:v1", PullIfNotPresent, false},
		{"org/llama", "", "docker.io/org/llama:latest", PullAlways, false},
		{"localhost:5000/llama:v2", "Always", "localhost:5000/llama:v2", PullAlways, false},
	} {
		attrs := map[string]string{AttrReference: tc.ref, keyEphemeral: "true", keyPodName: "p"}
		if tc.policy != "" {
			attrs[AttrPullPolicy] = tc.policy
		}
		a, err := ParseAttributes(attrs)
		if err != nil {
			t.Fatalf("%s: %v", tc.ref, err)
		}
		if a.Reference != tc.wantRef || a.PullPolicy != tc.wantPolicy || a.IsDigest() != tc.wantIsDigest {
			t.Errorf("%s %q: got %s %s digest=%v, want %s %s digest=%v", tc.ref, tc.policy, a.Reference, a.PullPolicy, a.IsDigest(), tc.wantRef, tc.wantPolicy, tc.wantIsDigest)
		}
		if _, ok := a.Given[keyPodName]; ok {
			t.Error("orchestrator keys must not count as attributes")
		}
	}

	a, err := ParseAttributes(map[string]string{AttrReference: "r.example.com/m:v1", AttrFilter: "weights, config", AttrInclude: "*.json,tok/*", AttrSubPath: "./a/../b", AttrPlatform: "linux/arm64/v8", AttrNoExec: "true"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(a.Selector.Kinds, ",") != "weight,weight.config" || strings.Join(a.Selector.Include, ",") != "*.json,tok/*" ||
		a.SubPath != "b" || a.Platform != "linux/arm64/v8" || !a.NoExec {
		t.Fatalf("parsed %+v", a)
	}

	// One vocabulary: the spec's kind names and the plural spellings both select the same layers.
	for _, filter := range []string{"weight,weight.config,doc", "weights,config,docs", "Weights, configs, doc"} {
		a, err := ParseAttributes(map[string]string{AttrReference: "r.example.com/m:v1", AttrFilter: filter})
		if err != nil || strings.Join(a.Selector.Kinds, ",") != "weight,weight.config,doc" {
			t.Errorf("filter=%s: %v %v", filter, a, err)
		}
	}
	if _, err := ParseAttributes(map[string]string{AttrReference: "r.example.com/m:v1", AttrFilter: "weight,models"}); err == nil ||
		!strings.Contains(err.Error(), `unknown kind "models" (valid: weight, weight.config, doc, code, dataset`) {
		t.Errorf("filter=weight,models: %v", err)
	}

	for _, bad := range []map[string]string{
		{AttrReference: "r.example.com/m:v1", "Reference": "x"},
		{AttrReference: "r.example.com/m:v1", AttrInclude: "[a-"},
		{AttrReference: "r.example.com/m:v1", AttrPlatform: "linux"},
		{AttrReference: "r.example.com/m:v1", AttrSubPath: "/etc"},
		{AttrReference: "r.example.com/m:v1", AttrNoExec: "maybe"},
		{AttrReference: " r.example.com/m:v1"},
		{AttrFilter: "weights"},
	} {
		_, err := ParseAttributes(bad)
		var ae *AttributeError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), "valid keys: reference") {
			t.Errorf("%v: got %v, want an AttributeError listing the valid keys", bad, err)
		}
	}
}
