package csidriver

import (
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// testHooks let tests stage what production cannot be asked to do on cue.
type testHooks struct {
	// killedAt stands for the driver being killed at a step of a publish ("staged", "acquired", "mounted"): when
	// it returns true the publish stops there and undoes nothing, as after a SIGKILL.
	killedAt atomic.Pointer[func(step string) bool]
	// readaheadAt, if set, is called by each readahead before it reads anything: a test holds one there.
	readaheadAt atomic.Pointer[func(dir string)]
}

// errKilled is what a publish stopped by killedAt returns.
var errKilled = status.Error(codes.Unavailable, "driver killed (test)")

func (d *Driver) killed(step string) bool {
	f := d.hooks.killedAt.Load()
	return f != nil && (*f)(step)
}

func (d *Driver) readaheadGate(dir string) {
	if f := d.hooks.readaheadAt.Load(); f != nil {
		(*f)(dir)
	}
}
