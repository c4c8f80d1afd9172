package cache

import (
	"sync/atomic"

	digest "github.com/opencontainers/go-digest"
)

// The hooks tests set to see, or gate, a step of work running on the cache's own goroutines; nil (unset) in
// production.

// layerFlightHook, if set (tests), runs once a caller has started or joined the shared extraction of a layer.
var layerFlightHook func(digest.Digest)

// backgroundVerifyHook, if set (tests), receives the result of each background verification.
var backgroundVerifyHook func(VerifyReport, error)

// syncFSHook, if set (tests), runs after each syncfs of the layers' file system, before the marks it allows, with
// the cache's root.
var syncFSHook atomic.Pointer[func(root string)]

// scrubHook, if set (tests), runs on the scrub's thread once it has lowered its priorities, with their result.
var scrubHook func(err error)

// acquireHook, if set (tests), runs in Acquire with the step it reached: "checked" once the manifest's blobs were
// checked, before the reference is recorded under mu; "recorded" once it is, before the view is built.
var acquireHook func(step string)
