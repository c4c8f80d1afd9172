// Package cli is the modelpack command tree. It parses flags and prints results; the work happens in the
// packages it calls.
package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/hf"
	"github.com/modelpack/modelpack/internal/httplog"
)

// Version is set at build time with -ldflags "-X github.com/modelpack/modelpack/cli.Version=…".
var Version = "dev"

// Revision is the commit the binary was built from, set by make build (-X …cli.Revision=…, "-dirty" appended for
// uncommitted changes); Go's build info gives it otherwise.
var Revision = ""

// commands are the constructors of the subcommands, in the order of the workflow: make a model, move it, trust it,
// serve it on nodes, then the tools around it. (cobra lists them sorted in help.)
var commands = []func(*Globals) *cobra.Command{
	packCmd, listCmd, inspectCmd, tagCmd, rmCmd, pruneCmd, unpackCmd,
	loginCmd, logoutCmd, pushCmd, pullCmd, fetchCmd, copyCmd, tagsCmd, deleteCmd, diffCmd,
	attachCmd, discoverCmd, saveCmd, loadCmd,
	keyCmd, signCmd, verifyCmd, scanCmd,
	csiDriverCmd, prepullCmd, cacheCmd,
	versionCmd,
}

// Globals are the flags every command shares.
type Globals struct {
	Home   string // local store root ($MODELPACK_HOME)
	Output string // table or json
	Quiet  bool
	Debug  bool // print every registry and Hub request and answer on stderr

	httpLog *httplog.Logger // --debug's, made once the flags are parsed
	warned  *warnings       // what the command said beside its result (newWarnings), for the error document too
	// interrupted is the line a transfer prints on Ctrl-C: what it keeps and how to resume (onInterrupt).
	interrupted string
}

// onInterrupt sets what the command says if SIGINT or SIGTERM stops it: after "interrupted: ", what is kept and
// the command that resumes.
func (g *Globals) onInterrupt(format string, a ...any) { g.interrupted = fmt.Sprintf(format, a...) }

// wrapTransport is what wraps the HTTP transports of registries and the Hub: nil, or with --debug the logger.
func (g *Globals) wrapTransport() func(http.RoundTripper) http.RoundTripper {
	if g.httpLog == nil {
		return nil
	}
	return g.httpLog.Wrap
}

// hubClient is the Hub's client configured from the environment (hf.FromEnv), logged under --debug.
func (g *Globals) hubClient() (*hf.Client, error) {
	c, err := hf.FromEnv()
	if err != nil {
		return nil, err
	}
	if w := g.wrapTransport(); w != nil {
		c.WrapTransport(w)
	}
	return c, nil
}

// NewRoot builds the command tree.
func NewRoot() *cobra.Command {
	root, _ := newRoot()
	return root
}

func newRoot() (*cobra.Command, *Globals) {
	g := &Globals{}
	root := &cobra.Command{
		Use:           "modelpack",
		Short:         "Pack, sign, move and mount AI models as OCI artifacts (CNCF ModelPack)",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			// Before anything can echo it: a reference with a password is refused without being repeated.
			for _, a := range args {
				if err := artifact.RefuseCredentials(a); err != nil {
					return asUsage(err)
				}
			}
			if g.Debug {
				g.httpLog = httplog.New(cmd.ErrOrStderr())
			}
			return validateOutput(g.Output)
		},
	}
	root.PersistentFlags().StringVar(&g.Home, "home", defaultHome(), "local store directory (env MODELPACK_HOME)")
	root.PersistentFlags().StringVarP(&g.Output, "output", "o", "table", "output format: table or json")
	root.PersistentFlags().BoolVarP(&g.Quiet, "quiet", "q", false, "print no progress")
	root.PersistentFlags().BoolVar(&g.Debug, "debug", false, "print every registry and Hugging Face Hub request and answer on stderr (method, URL, status, headers with credentials redacted, timings)")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))
	for _, c := range commands {
		root.AddCommand(c(g))
	}
	markUsage(root)
	return root, g
}

// Main runs the CLI and returns the process exit code.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal kills at once, should winding down hang
	}()
	return Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
}

// wantsJSON reports whether args ask for -o json, for the errors cobra returns before it has parsed that flag (an
// unknown command, or a bad flag before it): they are JSON documents too. A "--" ends the flags.
func wantsJSON(args []string) bool {
	for i, a := range args {
		switch {
		case a == "--":
			return false
		case a == "-o" || a == "--output":
			if i+1 < len(args) && args[i+1] == "json" {
				return true
			}
		case a == "-ojson" || a == "-o=json" || a == "--output=json":
			return true
		}
	}
	return false
}

// Run executes the command line args and returns the exit code: 0, 1 for a failure, 2 for a command line that
// cannot be run (usage.go), 130 when ctx was cancelled
// (SIGINT or SIGTERM). Under -o json an error is printed as {"error": {"message": …, "warnings": […]}} on stderr,
// with the warnings the command gave before it failed.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root, g := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	code := exitCode(err)
	msg := err.Error()
	if ctx.Err() != nil {
		// Transfers keep what they verified (partial blobs resume with HTTP Range), so the next run continues.
		code, msg = exitInterrupted, "interrupted; run again to resume"
		if g.interrupted != "" {
			msg = "interrupted: " + g.interrupted
		}
	}
	if f := root.PersistentFlags().Lookup("output"); (f != nil && f.Value.String() == "json") || wantsJSON(args) {
		_ = PrintJSON(stderr, errorJSON{Error: errorBody{Message: msg, Warnings: g.warned.all()}})
		return code
	}
	fmt.Fprintln(stderr, "Error:", msg)
	return code
}

// errorJSON is how every command reports a failure under -o json (see docs/json.md).
type errorJSON struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Message  string   `json:"message"`
	Warnings []string `json:"warnings,omitempty"` // said before the failure; printed on stderr as they came without -o json
}

func validateOutput(o string) error {
	switch o {
	case "table", "json":
		return nil
	}
	return usageErr("invalid --output %q (valid: table, json)", o)
}

func defaultHome() string {
	if h := os.Getenv("MODELPACK_HOME"); h != "" {
		return h
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "modelpack")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ".modelpack"
	}
	return filepath.Join(home, ".local", "share", "modelpack")
}

// IsJSON reports whether -o json was asked for.
func (g *Globals) IsJSON() bool { return g.Output == "json" }

// PrintJSON writes v as indented JSON.
func PrintJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// ShowProgress reports whether progress bars belong on stderr: a TTY, not --quiet, not -o json.
func (g *Globals) ShowProgress() bool {
	return g.ShowLines() && term.IsTerminal(int(os.Stderr.Fd()))
}

// ShowLines reports whether progress belongs on stderr at all: not with --quiet, and not with -o json, whose
// reader wants one JSON document and nothing else.
func (g *Globals) ShowLines() bool { return !g.Quiet && !g.IsJSON() }

func versionCmd(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Example: `  modelpack version -o json`,
		Short:   "Print the modelpack version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := struct {
				Version  string `json:"version"`
				Revision string `json:"revision,omitempty"`
				Time     string `json:"revisionTime,omitempty"`
				Modified bool   `json:"modified,omitempty"`
				Go       string `json:"go"`
			}{Version: Version, Revision: strings.TrimSuffix(Revision, "-dirty"), Modified: strings.HasSuffix(Revision, "-dirty")}
			if bi, ok := debug.ReadBuildInfo(); ok {
				v.Go = bi.GoVersion
				// Without make's -X, the module version is what go install …@VERSION resolved (v0.3.0) or, for a
				// go build in a checkout, the pseudo-version Go derives from the commit; "(devel)" says neither.
				if Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
					v.Version = strings.TrimSuffix(bi.Main.Version, "+dirty")
				}
				// Go stamps the commit a binary was built from (go build in a git checkout).
				for _, s := range bi.Settings {
					switch s.Key {
					case "vcs.revision":
						if v.Revision == "" {
							v.Revision = s.Value
						}
					case "vcs.time":
						v.Time = s.Value
					case "vcs.modified":
						v.Modified = v.Modified || s.Value == "true"
					}
				}
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), v)
			}
			if v.Revision != "" {
				rev := v.Revision[:min(12, len(v.Revision))]
				if v.Modified {
					rev += "-dirty"
				}
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "modelpack %s (commit %s, %s)\n", v.Version, rev, v.Go)
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "modelpack %s (%s)\n", v.Version, v.Go)
			return err
		},
	}
}
