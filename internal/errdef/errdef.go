// Package errdef holds the causes every layer of modelpack reports (cas, cache, artifact/remote, signing, csidriver), so
// errors.Is gives one answer whichever layer wrapped an error. Each package re-exports the ones it returns.
package errdef

import "errors"

var (
	// ErrNotFound: no such manifest, blob or cache entry.
	ErrNotFound = errors.New("not found")
	// ErrSizeMismatch: a source holds, or sent, a different number of bytes than the descriptor declares. The
	// descriptor (or the source) lies; asking again gives the same answer.
	ErrSizeMismatch = errors.New("size mismatch")
	// ErrDigestMismatch: the bytes do not hash to their digest.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrIncomplete: a transfer stopped short (a dropped connection, a cancelled pull). What arrived is kept and
	// the next attempt resumes it.
	ErrIncomplete = errors.New("incomplete transfer, will resume")
	// ErrUnauthorized: no credentials, or credentials the registry rejects.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden: the credentials lack permission.
	ErrForbidden = errors.New("access denied")
	// ErrUnavailable: the registry cannot be reached, stalls or fails on its side.
	ErrUnavailable = errors.New("registry unavailable")
	// ErrTooLarge: content over the limits modelpack reads it within: a document (manifest, index, referrers list,
	// signature manifest, config) over artifact.MaxManifestBytes and its siblings, or an archive over
	// archive.Limits. The content's fault.
	ErrTooLarge = errors.New("too large")
	// ErrNoSpace: the disk is full.
	ErrNoSpace = errors.New("no space left on device")
	// ErrDenied: the node's trust policy refused the artifact (unsigned, or signed by no one it trusts).
	ErrDenied = errors.New("denied by policy")
	// ErrUnsafeContent: a file whose loading runs code the file chooses (a pickle outside the scanner's allowlist,
	// TorchScript, a Keras Lambda), or that the scanner cannot vouch for (malformed), under a trust-policy rule
	// that does not allow it. The content's fault; kubelet gets FAILED_PRECONDITION.
	ErrUnsafeContent = errors.New("unsafe model content")
	// ErrUnsupported: content the node cannot serve (a media type, manifest shape or digest algorithm it does not
	// know): the content's fault, not the registry's or the node's.
	ErrUnsupported = errors.New("unsupported")
)
