package csidriver

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errorCodes is the table of doc.go (# Errors) for the causes a Backend reports, in order of precedence: the
// first cause an error wraps decides its code. Anything else is INTERNAL: a bug of ours.
var errorCodes = []struct {
	cause error
	code  codes.Code
}{
	{ErrInvalidReference, codes.InvalidArgument},
	{ErrUnauthorized, codes.Unauthenticated},
	{ErrDenied, codes.PermissionDenied},
	{ErrForbidden, codes.PermissionDenied},
	{ErrNoSpace, codes.ResourceExhausted},
	{ErrBadContent, codes.FailedPrecondition},
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

// toStatus turns a backend error into a gRPC status error with a code the orchestrator can act on.
func toStatus(err error, format string, args ...any) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Errorf(codeOf(err), "%s: %v", fmt.Sprintf(format, args...), err)
}
