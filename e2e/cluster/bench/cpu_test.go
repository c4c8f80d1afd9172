//go:build cluster

package main

import (
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	// The name may hold spaces and parentheses; the fields after the last ')' are counted from the state.
	line := "4242 (runc:[2:INIT]) S 2 4242 4242 0 -1 4194560 100 0 0 0 150 50 30 20 20 0 1 0 100 0 0\n"
	p, ok := parseStat([]byte(line))
	if !ok || p.group != "containerd, shims, runc" || p.secs != 2.5 {
		t.Fatalf("parseStat = %+v, %v; want the runc group and (150+50+30+20)/100 s", p, ok)
	}
	p, ok = parseStat([]byte("7 (kworker/0:1H (events)) I 2 0 0 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 5 0 0\n"))
	if !ok || p.group != kernelThreads || p.secs != 0.07 {
		t.Fatalf("kernel thread: parseStat = %+v, %v", p, ok)
	}
	if _, ok := parseStat([]byte("9 (cut")); ok {
		t.Fatal("a truncated stat parsed")
	}
	self, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := parseStat(self); !ok {
		t.Fatalf("this process's stat did not parse: %q", self)
	}
}

func TestWindowChargesGrowthBetweenBoundingSamples(t *testing.T) {
	proc := func(group string, secs float64) sampledProc { return sampledProc{group: group, secs: secs} }
	s := &cpuSampler{samples: []cpuSample{
		{up: 10.0, busy: 100, procs: map[int]sampledProc{1: proc("kubelet", 5)}},
		{up: 10.1, busy: 100.1, procs: map[int]sampledProc{1: proc("kubelet", 5.1), 2: proc("registry", 1)}},
		{up: 10.2, busy: 100.3, procs: map[int]sampledProc{1: proc("kubelet", 5.2), 2: proc("registry", 1.1), 3: proc("kubelet", 0.05)}},
		{up: 10.3, busy: 100.6, procs: map[int]sampledProc{1: proc("kubelet", 5.4)}},
	}}
	// From 10.15 (last sample at or before: 10.1) to 10.2 (first at or after: 10.2).
	length, busy, by := s.window(10.15, 10.2)
	if !near(length, 0.1) || !near(busy, 0.2) || !near(by["kubelet"], 0.15) || !near(by["registry"], 0.1) {
		t.Fatalf("window = %v s, busy %v, %v; want 0.1 s, 0.2, kubelet 0.1 + 0.05 (born inside), registry 0.1", length, busy, by)
	}
	if length, _, by := s.window(10.3, 10.3); length != 0 || by != nil {
		t.Fatalf("an empty window charged %v s: %v", length, by)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestClockMarks(t *testing.T) {
	if start, done, ok := clockMarks("start 12.50\nnoise\ndone 14.25\n"); !ok || start != 12.5 || done != 14.25 {
		t.Fatalf("clockMarks = %v, %v, %v", start, done, ok)
	}
	if _, _, ok := clockMarks("start 12.50\n"); ok {
		t.Fatal("marks without done accepted")
	}
}
