package csidriver

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The driver's own causes, beside the Backend's (backend.go); fail gives them their code.
var (
	// errInvalidArgument: a request field or volume attribute that kubelet, or the volume's author, must fix.
	errInvalidArgument = errors.New("invalid argument")
	// errExists: the target or volume exists with other arguments.
	errExists = errors.New("exists with other arguments")
	// errRetry: not done yet (another call on the target, a pull that goes on, a deadline drawing near): the
	// retry joins what is under way.
	errRetry = errors.New("in progress")
	// errPrecondition: the node is not in the state the call needs (content absent under pullPolicy Never, the
	// volume published elsewhere for a single writer, the cache not ready).
	errPrecondition = errors.New("precondition failed")
	// errNoVolume: no such volume, or not published at that path.
	errNoVolume = errors.New("no such volume")
	// errNode: the node failed the driver (a mount, a state write): INTERNAL, as a bug of ours is.
	errNode = errors.New("node failure")
)

// errorCodes is the table of doc.go (# Errors), in order of precedence: the first cause an error wraps decides its
// code. Anything else is INTERNAL: a bug of ours.
var errorCodes = []struct {
	cause error
	code  codes.Code
}{
	{errInvalidArgument, codes.InvalidArgument},
	{errExists, codes.AlreadyExists},
	{errRetry, codes.Aborted},
	{errPrecondition, codes.FailedPrecondition},
	{errNoVolume, codes.NotFound},
	{errNode, codes.Internal},
	{ErrInvalidReference, codes.InvalidArgument},
	{ErrUnauthorized, codes.Unauthenticated},
	{ErrDenied, codes.PermissionDenied},
	{ErrForbidden, codes.PermissionDenied},
	{ErrNoSpace, codes.ResourceExhausted},
	{ErrBadContent, codes.FailedPrecondition},
	{ErrUnsafeContent, codes.FailedPrecondition},
	{ErrUnsupported, codes.FailedPrecondition},
	{ErrNotFound, codes.NotFound},
	{ErrUnavailable, codes.Unavailable},
	{context.Canceled, codes.Aborted},
	{context.DeadlineExceeded, codes.Aborted},
}

// codeOf maps a backend error to the CSI code the spec asks for.
func codeOf(err error) codes.Code {
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	for _, row := range errorCodes {
		if errors.Is(err, row.cause) {
			return row.code
		}
	}
	return codes.Internal
}

// fail is a failure of the driver's own, of the given cause: the table decides its code, the message is format's.
func fail(cause error, format string, args ...any) error {
	return status.Errorf(codeOf(cause), format, args...)
}

// toStatus turns a backend error into a gRPC status error with a code the orchestrator can act on.
func toStatus(err error, format string, args ...any) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Errorf(codeOf(err), "%s: %v", fmt.Sprintf(format, args...), err)
}
