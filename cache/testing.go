package cache

import (
	"sync/atomic"

	digest "github.com/opencontainers/go-digest"
)

// hooks are what a test sets on one cache to see, or gate, a step of work running on the cache's own goroutines:
// each is nil (unset) in production, and atomic, since the cache's goroutines read them while the test sets them.
// A hook that must be in place before Open starts the background work is given in Options.hooks.
type hooks struct {
	// layerFlight runs once a caller has started or joined the shared extraction of a layer.
	layerFlight atomic.Pointer[func(digest.Digest)]
	// backgroundVerify receives the result of each background verification.
	backgroundVerify atomic.Pointer[func(VerifyReport, error)]
	// syncFS runs after each syncfs of the layers' file system, before the marks it allows, with the cache's root.
	syncFS atomic.Pointer[func(root string)]
	// scrub runs on the scrub's thread once it has lowered its priorities, with their result.
	scrub atomic.Pointer[func(err error)]
	// acquire runs in Acquire with the step it reached: "checked" once the manifest's blobs were checked, before
	// the reference is recorded under mu; "recorded" once it is, before the view is built.
	acquire atomic.Pointer[func(step string)]
}

// run calls the hook h holds, if any.
func run[F any](h *atomic.Pointer[F], call func(F)) {
	if f := h.Load(); f != nil {
		call(*f)
	}
}

// set installs f as the hook h holds until the test ends.
func set[F any](t interface{ Cleanup(func()) }, h *atomic.Pointer[F], f F) {
	h.Store(&f)
	t.Cleanup(func() { h.Store(nil) })
}
