package csidriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// Every cause of the table maps to its code, also wrapped; an unknown error is INTERNAL; and the table in
// doc.go and the README names every code the driver returns.
func TestErrorTableMapsEveryCause(t *testing.T) {
	want := map[error]codes.Code{
		errInvalidArgument:       codes.InvalidArgument,
		errExists:                codes.AlreadyExists,
		errRetry:                 codes.Aborted,
		errPrecondition:          codes.FailedPrecondition,
		errNoVolume:              codes.NotFound,
		errNode:                  codes.Internal,
		ErrInvalidReference:      codes.InvalidArgument,
		ErrUnauthorized:          codes.Unauthenticated,
		ErrDenied:                codes.PermissionDenied,
		ErrForbidden:             codes.PermissionDenied,
		ErrNoSpace:               codes.ResourceExhausted,
		ErrBadContent:            codes.FailedPrecondition,
		ErrUnsafeContent:         codes.FailedPrecondition,
		ErrUnsupported:           codes.FailedPrecondition,
		ErrNotFound:              codes.NotFound,
		ErrUnavailable:           codes.Unavailable,
		context.Canceled:         codes.Aborted,
		context.DeadlineExceeded: codes.Aborted,
	}
	if len(want) != len(errorCodes) {
		t.Errorf("the table has %d rows, the test knows %d", len(errorCodes), len(want))
	}
	for cause, code := range want {
		if got := codeOf(fmt.Errorf("pull x: %w", cause)); got != code {
			t.Errorf("%v → %v, want %v", cause, got, code)
		}
	}
	// A hostile layer that is also a refused manifest is still the content's fault, never a bug of ours.
	if got := codeOf(fmt.Errorf("%w: %w", ErrUnsupported, ErrBadContent)); got != codes.FailedPrecondition {
		t.Errorf("bad content in an unsupported manifest → %v", got)
	}
	if got := codeOf(errors.New("a bug")); got != codes.Internal {
		t.Errorf("an unknown error → %v, want INTERNAL", got)
	}
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, code := range []codes.Code{codes.InvalidArgument, codes.AlreadyExists, codes.Aborted, codes.FailedPrecondition,
		codes.NotFound, codes.Unavailable, codes.Unauthenticated, codes.PermissionDenied, codes.ResourceExhausted, codes.Internal} {
		name := strings.ToUpper(strings.Join(splitCamel(code.String()), "_"))
		if !strings.Contains(string(doc), "//\t"+name+" ") {
			t.Errorf("doc.go's error table lacks %s", name)
		}
		if !strings.Contains(string(readme), "| "+name+" ") && !strings.Contains(string(readme), "| `"+name+"` ") {
			t.Errorf("docs/operations.md's error table lacks %s", name)
		}
	}
}

// splitCamel splits "FailedPrecondition" into "Failed", "Precondition".
func splitCamel(s string) []string {
	var out []string
	start := 0
	for i := 1; i < len(s); i++ {
		if s[i] >= 'A' && s[i] <= 'Z' {
			out = append(out, s[start:i])
			start = i
		}
	}
	return append(out, s[start:])
}
