package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/spf13/cobra"
)

// warnings are what a command says beside its result: a pack with no weights, a pull of a container image, a
// warn-mode signature failure, a cache repaired on open. Under -o json they are kept for the result's "warnings"
// array, so that stdout holds one document and stderr nothing; otherwise each is printed on stderr as it comes.
type warnings struct {
	mu   sync.Mutex
	w    io.Writer // nil under -o json
	list []string
}

// newWarnings returns the command's warnings, one per run: Run puts what they kept in the error document when the
// command fails.
func newWarnings(cmd *cobra.Command, g *Globals) *warnings {
	if g.warned == nil {
		g.warned = &warnings{}
		if !g.IsJSON() {
			g.warned.w = cmd.ErrOrStderr()
		}
	}
	return g.warned
}

// add prints msg as "warning: msg" on stderr, or keeps it for the JSON result.
func (ws *warnings) add(msg string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.w != nil {
		fmt.Fprintln(ws.w, "warning:", msg)
		return
	}
	ws.list = append(ws.list, msg)
}

// all is what was kept for the JSON result; nil (the field omitted) when nothing was said or without -o json.
func (ws *warnings) all() []string {
	if ws == nil {
		return nil
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.list
}

// logger is for the packages a command calls that log (the cache, the signature verifier): each record at level or
// above becomes one warning, "message key=value …".
func (ws *warnings) logger(level slog.Level) *slog.Logger {
	return slog.New(&warningHandler{ws: ws, level: level})
}

type warningHandler struct {
	ws    *warnings
	level slog.Level
	attrs []slog.Attr
}

func (h *warningHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *warningHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	write := func(a slog.Attr) bool {
		if a.Equal(slog.Attr{}) {
			return true
		}
		v := a.Value.Resolve().String()
		if v == "" || strings.ContainsAny(v, " \"=") {
			v = strconv.Quote(v)
		}
		fmt.Fprintf(&b, " %s=%s", a.Key, v)
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	h.ws.add(b.String())
	return nil
}

func (h *warningHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &warningHandler{ws: h.ws, level: h.level, attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], as...)}
}

// WithGroup keeps the handler as it is: the keys these packages log are not grouped.
func (h *warningHandler) WithGroup(string) slog.Handler { return h }
