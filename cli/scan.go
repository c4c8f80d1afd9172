package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"oras.land/oras-go/v2/errdef"

	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/scan"
)

// scanResult is what scan prints with -o json.
type scanResult struct {
	Dir       string            `json:"dir,omitempty"`
	Reference string            `json:"reference,omitempty"`
	Files     []scan.FileReport `json:"files"`
}

func scanCmd(g *Globals) *cobra.Command {
	var rf remoteFlags
	cmd := &cobra.Command{
		Use:   "scan DIR|REF",
		Short: "Report which of a model's files run code when loaded (pickles, TorchScript, Lambda layers)",
		Long: `Report every file of a model directory, or of an artifact in the local store, with its format as its
content says (never its name) and a verdict: data (safetensors, GGUF, ONNX, JSON, text, images, a pickle naming
only the callables a state dict of tensors needs), code (any other pickle and what carries one: PyTorch ZIP and
legacy archives, joblib, NumPy object arrays, Keras Lambda layers, TorchScript) or malformed (truncated, over a
limit, read differently by different loaders, or no known format). A pickle's report names every callable it
imports. The exit code is 0 only when every file is data. Nothing is executed.

REF is looked up in the local store; a REF that names a registry and is not in the store is pulled (verified)
into a temporary store, scanned and deleted. The connection flags are those of pull.`,
		Example: `  modelpack scan ./llama-3-8b
  modelpack scan llama3:8b -o json
  modelpack scan registry.local:5000/org/llama3:8b --plain-http`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeRefs(g, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res := scanResult{}
			if st, err := os.Stat(args[0]); err == nil && st.IsDir() {
				res.Dir = args[0]
				if res.Files, err = scan.Dir(args[0]); err != nil {
					return err
				}
			} else {
				res.Reference = args[0]
				if res.Files, err = scanStored(cmd, g.Home, args[0], rf.options()); err != nil {
					return err
				}
			}
			if g.IsJSON() {
				if err := PrintJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else if err := printScan(cmd, res.Files); err != nil {
				return err
			}
			n := 0
			for _, f := range res.Files {
				if f.Verdict != scan.Data {
					n++
				}
			}
			if n > 0 {
				return fmt.Errorf("%d of %d files are code or malformed", n, len(res.Files))
			}
			return nil
		},
	}
	rf.registerConnection(cmd.Flags())
	return cmd
}

// scanStored scans the layers of an artifact in the local store at home, each blob where it lies: a raw layer is
// its file, a tar layer is scanned member by member by the scanner. A registry reference the store lacks is pulled
// into a temporary store first.
func scanStored(cmd *cobra.Command, home, ref string, opts remote.Options) ([]scan.FileReport, error) {
	store, err := layout.Open(home)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	info, err := loadArtifact(cmd.Context(), store, ref)
	if err != nil && errors.Is(err, errdef.ErrNotFound) && namesRegistry(ref) {
		tmp, err := os.MkdirTemp("", "modelpack-scan-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		parsed, err := registryRef(ref)
		if err != nil {
			return nil, err
		}
		local, err := layout.ParseReference(parsed.String())
		if err != nil {
			return nil, err
		}
		src, _, err := remote.NewRepository(parsed.String(), opts)
		if err != nil {
			return nil, err
		}
		pulled, err := layout.Open(tmp)
		if err != nil {
			return nil, err
		}
		defer pulled.Close()
		if _, err := remote.Pull(cmd.Context(), src, pulled, local, remote.TransferOptions{}); err != nil {
			return nil, err
		}
		store = pulled
		info, err = loadArtifact(cmd.Context(), store, local)
		if err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if info.Manifest == nil {
		return nil, fmt.Errorf("%s is a %s, not a manifest", ref, info.Descriptor.MediaType)
	}
	var out []scan.FileReport
	for _, l := range info.Layers {
		p := filepath.Join(store.Root(), "blobs", l.Digest.Algorithm().String(), l.Digest.Encoded())
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		name := l.Path
		if name == "" {
			name = l.Digest.String()
		}
		out = append(out, scan.FileReport{Path: name, Size: l.Size, Report: scan.File(f, l.Size)})
		f.Close()
	}
	return out, nil
}

func printScan(cmd *cobra.Command, files []scan.FileReport) error {
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PATH\tFORMAT\tVERDICT\tDETAIL")
	for _, f := range files {
		detail := f.Reason
		var callables []string
		member := ""
		for _, x := range f.Findings {
			if x.Verdict == scan.Code && x.Callable != "" && len(callables) < 5 {
				if callables == nil {
					member = strings.Trim(x.File+"/"+x.Member, "/")
				}
				callables = append(callables, x.Callable)
			}
		}
		if callables != nil {
			detail = "imports " + strings.Join(callables, ", ")
			if member != "" {
				detail = member + ": " + detail
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", f.Path, f.Format, f.Verdict, orDash(detail))
	}
	return w.Flush()
}
