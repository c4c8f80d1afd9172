package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes, as POSIX tools and oras/crane use them: a command line that cannot be run exits 2, before any work
// is done; a run that failed exits 1; an interrupted one 130 (docs/usage.md).
const (
	exitFailure     = 1
	exitUsage       = 2
	exitInterrupted = 130
)

// usageError is a command line modelpack cannot run as given: an unknown flag or command, missing or extra
// arguments, a flag value that is not one of its values.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usageErr is a usage error with a message like fmt.Errorf's.
func usageErr(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// asUsage marks err as a usage error.
func asUsage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// cobraUsage are the beginnings of the errors cobra returns for a command line it cannot run, which it gives as
// plain errors: an unknown command, required or mutually exclusive flags.
var cobraUsage = []string{"unknown command ", "required flag(s) ", "if any flags in the group ", "at least one of the flags in the group "}

// exitCode is the process exit code for err.
func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return exitUsage
	}
	for _, p := range cobraUsage {
		if strings.HasPrefix(err.Error(), p) {
			return exitUsage
		}
	}
	return exitFailure
}

// markUsage makes every command's flag and argument errors usage errors: its flag parser's (unknown flag, bad
// value) and its Args validator's (missing or extra arguments).
func markUsage(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return asUsage(err) })
	if args := cmd.Args; args != nil {
		cmd.Args = func(c *cobra.Command, a []string) error { return asUsage(args(c, a)) }
	}
	for _, c := range cmd.Commands() {
		markUsage(c)
	}
}
