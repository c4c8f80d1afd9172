//go:build cluster

package main

import (
	"fmt"
	"os"
	"testing"
)

// abort is what a fatal harness call panics with; run recovers it after teardown.
type abort struct{ msg string }

// tb lets the bench use the harness, which is written for tests: a failure panics with abort (run tears the
// cluster down and exits 1), cleanups run at teardown, newest first. Methods the harness does not call are left
// to the nil embedded TB.
type tb struct {
	testing.TB
	scratch  string
	cleanups []func()
}

func (t *tb) Helper()                        {}
func (t *tb) Name() string                   { return "bench" }
func (t *tb) Failed() bool                   { return false }
func (t *tb) Fatal(args ...any)              { panic(abort{fmt.Sprint(args...)}) }
func (t *tb) Fatalf(format string, a ...any) { panic(abort{fmt.Sprintf(format, a...)}) }
func (t *tb) Skip(args ...any)               { t.Fatal(args...) }
func (t *tb) Skipf(format string, a ...any)  { t.Fatalf(format, a...) }
func (t *tb) Errorf(format string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...) }
func (t *tb) Logf(format string, a ...any)   { fmt.Fprintf(os.Stderr, format+"\n", a...) }
func (t *tb) Cleanup(f func())               { t.cleanups = append(t.cleanups, f) }
func (t *tb) TempDir() string {
	d, err := os.MkdirTemp(t.scratch, "t")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// runCleanups runs the registered cleanups, newest first, each even when an earlier one failed.
func (t *tb) runCleanups() {
	for len(t.cleanups) > 0 {
		f := t.cleanups[len(t.cleanups)-1]
		t.cleanups = t.cleanups[:len(t.cleanups)-1]
		func() {
			defer func() {
				if r := recover(); r != nil {
					fmt.Fprintf(os.Stderr, "bench: cleanup: %v\n", r)
				}
			}()
			f()
		}()
	}
}
