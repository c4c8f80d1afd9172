package csidriver

import (
	"context"
	"errors"
	"time"

	"github.com/modelpack/modelpack/internal/readahead"
)

// DefaultReadaheadWait is how long a volume's readahead waits before it reads, and is dropped if the pod opens a
// file of the volume meanwhile: a pod that reads at once (the cluster bench's) opens it about half a second after
// the mount and reads it as fast as the node can, and one still importing its code after this finds its weights
// read ahead when it opens them.
const DefaultReadaheadWait = 3 * time.Second

// startReadahead has the files of a volume just mounted read into the page cache in the background, so the
// pod's first reads, a second or more later, find them in memory; it does nothing while source is being read.
func (d *Driver) startReadahead(source string) {
	if d.ahead != nil && source != "" {
		d.ahead.Start(source)
	}
}

// stopReadahead stops the readahead of source once no volume mounts it any more.
func (d *Driver) stopReadahead(source string) {
	if d.ahead == nil || source == "" {
		return
	}
	for _, v := range d.state.Snapshot().Volumes {
		if v.Source == source {
			return
		}
	}
	d.ahead.Stop(source)
}

func (d *Driver) readaheadDone(r readahead.Result) {
	d.m.readaheadBytes.Add(float64(r.Uncached))
	d.m.readaheadSkipped.Add(float64(r.SkippedBytes))
	if r.Opened {
		d.log.Info("readahead dropped: the pod reads the volume itself", "view", r.Dir, "waited", r.Waited)
		return
	}
	args := []any{"view", r.Dir, "files", r.Files, "bytes", r.Bytes, "uncachedBytes", r.Uncached, "skippedFiles", r.Skipped,
		"skippedBytes", r.SkippedBytes, "budget", r.Budget, "duration", r.Duration, "waited", r.Waited}
	if r.WaitErr != nil {
		args = append(args, "waitError", r.WaitErr.Error())
	}
	switch {
	case r.Err == nil:
		d.log.Info("readahead done", args...)
	case errors.Is(r.Err, context.Canceled):
		d.log.Info("readahead stopped", args...)
	default:
		d.log.Warn("readahead incomplete", append(args, "error", r.Err.Error())...)
	}
}
