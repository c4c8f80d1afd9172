package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"oras.land/oras-go/v2/errdef"

	"github.com/modelpack/modelpack/artifact/hf"
	"github.com/modelpack/modelpack/artifact/layout"
	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/scan"
	"github.com/modelpack/modelpack/signing"
)

// scanResult is what scan prints with -o json.
type scanResult struct {
	Dir       string        `json:"dir,omitempty"`
	Reference string        `json:"reference,omitempty"`
	Policy    string        `json:"policy,omitempty"`
	Files     []scannedFile `json:"files"`
	// Attestation is the signed scan report --attest stored.
	Attestation *scanAttestationJSON `json:"attestation,omitempty"`
}

// scanAttestationJSON says what --attest signed and where it is stored.
type scanAttestationJSON struct {
	Subject       string `json:"subject"` // the manifest scanned and attested, by digest
	PredicateType string `json:"predicateType"`
	Stored        string `json:"stored"` // the .att tag, or the bundle referrer
	Key           string `json:"key"`
}

// scannedFile is a file's report and, under --policy, why the policy refuses it.
type scannedFile struct {
	scan.FileReport
	Refused string `json:"refused,omitempty"`
}

func scanCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var policyFile, reference, attestKey string
	var attest, newBundle bool
	cmd := &cobra.Command{
		Use:   "scan DIR|FILE|REF|hf://ORG/NAME[@REVISION]",
		Short: "Report which of a model's files run code when loaded (pickles, TorchScript, Lambda layers)",
		Long: `Report every file of a model directory (or one file), or of an artifact in the local store, with its
format as its content says (never its name) and a verdict: data (safetensors, GGUF, ONNX, JSON, text, images,
a pickle naming only the callables a state dict of tensors needs), code (any other pickle and what carries one:
PyTorch ZIP and legacy archives, joblib, NumPy object arrays, Keras Lambda layers, TorchScript) or malformed
(truncated, over a limit, read differently by different loaders, or no known format). A pickle's report names
every callable it imports. The exit code is 0 only when every file is data. Nothing is executed.

REF is looked up in the local store; a REF that names a registry and is not in the store is pulled (verified)
into a temporary store, scanned and deleted. The connection flags are those of pull. An hf:// model is scanned
on the Hub (HF_ENDPOINT, HF_TOKEN) with range reads: safetensors cost their headers, not a download.

With --policy, a node trust policy decides instead, as the node does: a code or malformed file is refused unless
the rule matching the model has allowCode: true or an exception for the file; the exit code is 0 when nothing is
refused. A directory is judged as the model --reference names.

With --attest --key KEY, REF names a registry artifact: its tag is resolved once, that manifest digest is
scanned, and the report is signed and attached to it as cosign attests (cosign attest --tlog-upload=false): an
in-toto Statement v1 about the manifest digest, predicate type ` + signing.ScanPredicateType + `, in a DSSE
envelope stored in the sha256-<hex>.att tag, or as a Sigstore bundle referrer with --new-bundle-format (which
also makes cosign verify look only at bundles for that digest). It is attested whatever the verdicts, and
the exit code stays as above. cosign verify-attestation --key KEY.pub --type ` + signing.ScanPredicateType + `
--insecure-ignore-tlog checks it; a trust-policy rule requires it with scanAttestation: {keys: [...]}. Keyless
attestation is not supported. KEY is a file, env://VAR or k8s://NAMESPACE/NAME; its password comes from
COSIGN_PASSWORD or the terminal.`,
		Example: `  modelpack scan ./llama-3-8b
  modelpack scan llama3:8b -o json
  modelpack scan registry.local:5000/org/llama3:8b --plain-http
  modelpack scan hf://Qwen/Qwen2.5-0.5B-Instruct
  modelpack scan ./bert --policy policy.yaml --reference registry.local:5000/org/bert:v1
  modelpack scan registry.local:5000/org/bert:v1 --attest --key cosign.key`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeRefs(g, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case attest && attestKey == "":
				return usageErr("--attest needs --key: the cosign private key that signs the scan report (keyless attestation is not supported)")
			case !attest && (attestKey != "" || newBundle):
				return usageErr("--key and --new-bundle-format sign a scan report: add --attest")
			}
			var policy *signing.Policy
			if policyFile != "" {
				var err error
				if policy, err = signing.LoadPolicy(policyFile); err != nil {
					return err
				}
			}
			res := scanResult{Policy: policyFile}
			var files []scan.FileReport
			model := reference
			if attest {
				var err error
				if res.Attestation, files, err = scanAndAttest(cmd, g, args[0], attestKey, newBundle, rf.options()); err != nil {
					return err
				}
				res.Reference, model = res.Attestation.Subject, res.Attestation.Subject
			} else if st, err := os.Stat(args[0]); err == nil && (st.IsDir() || st.Mode().IsRegular()) {
				if policy != nil && reference == "" {
					return fmt.Errorf("--policy judges a directory as a model reference: name it with --reference REGISTRY/REPOSITORY[:TAG|@DIGEST]")
				}
				res.Dir = args[0]
				if files, err = scan.Dir(args[0]); err != nil {
					return err
				}
			} else if hf.IsReference(args[0]) {
				if policy != nil && reference == "" {
					return fmt.Errorf("--policy judges a Hub model as a model reference: name it with --reference REGISTRY/REPOSITORY[:TAG|@DIGEST]")
				}
				res.Reference = args[0]
				if files, err = scanHub(cmd.Context(), g, args[0]); err != nil {
					return err
				}
			} else {
				res.Reference, model = args[0], args[0]
				if files, _, err = scanStored(cmd, g.Home, args[0], rf.options()); err != nil {
					return err
				}
			}
			refused := 0
			for _, f := range files {
				sf := scannedFile{FileReport: f}
				switch {
				case policy != nil:
					if err := policy.AllowsScan(model, f.Path, f.Report); err != nil {
						sf.Refused = err.Error()
						refused++
					}
				case f.Verdict != scan.Data:
					refused++
				}
				res.Files = append(res.Files, sf)
			}
			if g.IsJSON() {
				if err := PrintJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else if err := printScan(cmd, res.Files, policy != nil); err != nil {
				return err
			} else if a := res.Attestation; a != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "Attested the scan of %s with %s (%s)\n", a.Subject, a.Key, a.Stored)
			}
			switch {
			case refused > 0 && policy != nil:
				return fmt.Errorf("%d of %d files are refused by %s", refused, len(files), policyFile)
			case refused > 0:
				return fmt.Errorf("%d of %d files are code or malformed", refused, len(files))
			}
			return nil
		},
	}
	rf.registerConnection(cmd.Flags())
	cmd.Flags().StringVar(&policyFile, "policy", "", "judge the files with this node trust policy (allowCode, exceptions) instead of refusing every code or malformed file")
	cmd.Flags().StringVar(&reference, "reference", "", "with --policy and a directory: the model reference the policy's rules and exceptions match")
	cmd.Flags().BoolVar(&attest, "attest", false, "sign the scan report of the registry artifact REF and attach it as a cosign attestation (needs --key)")
	cmd.Flags().StringVar(&attestKey, "key", "", "with --attest: cosign private key (file, env://VAR or k8s://NAMESPACE/NAME)")
	cmd.Flags().BoolVar(&newBundle, "new-bundle-format", false, "with --attest: store a Sigstore bundle referrer instead of the sha256-<hex>.att tag, as cosign attest --new-bundle-format")
	return cmd
}

// scanAndAttest resolves the registry artifact ref to its manifest digest once, scans that digest's layers and
// signs the report as a scan attestation of the digest.
func scanAndAttest(cmd *cobra.Command, g *Globals, ref, key string, newBundle bool, o remote.Options) (*scanAttestationJSON, []scan.FileReport, error) {
	if !namesRegistry(ref) {
		return nil, nil, usageErr("--attest signs the scan of a registry artifact: %q names no registry (REGISTRY/REPOSITORY[:TAG|@DIGEST])", ref)
	}
	parsed, err := registryRef(ref)
	if err != nil {
		return nil, nil, err
	}
	digestRef, err := resolveDigest(cmd.Context(), parsed, o)
	if err != nil {
		return nil, nil, err
	}
	files, layers, err := scanStored(cmd, g.Home, digestRef, o)
	if err != nil {
		return nil, nil, err
	}
	att, err := attestReports(cmd.Context(), digestRef, key, files, layers, newBundle, o)
	return att, files, err
}

// attestReports signs the scan reports of the layers (files[i] is the report of the layer with digest layers[i])
// of the manifest digestRef as its scan attestation, with the cosign key.
func attestReports(ctx context.Context, digestRef, key string, files []scan.FileReport, layers []string, newBundle bool, o remote.Options) (*scanAttestationJSON, error) {
	pred := signing.ScanPredicate{Scanner: "modelpack " + Version}
	for i, f := range files {
		pred.Files = append(pred.Files, signing.NewScannedFile(layers[i], f))
	}
	reg, err := remote.NewTransports(o)
	if err != nil {
		return nil, err
	}
	stored, err := signing.AttestScan(ctx, digestRef, key, pred, signing.AttestOptions{
		SignOptions: signing.SignOptions{Registry: reg, Password: cosignPassword}, NewBundleFormat: newBundle,
	})
	if err != nil {
		return nil, err
	}
	return &scanAttestationJSON{Subject: digestRef, PredicateType: signing.ScanPredicateType, Stored: stored, Key: key}, nil
}

// scanStored scans the layers of an artifact in the local store at home, each blob where it lies: a raw layer is
// its file, a tar layer is scanned member by member by the scanner. A registry reference the store lacks is pulled
// into a temporary store first.
func scanStored(cmd *cobra.Command, home, ref string, opts remote.Options) ([]scan.FileReport, []string, error) {
	store, err := layout.Open(home)
	if err != nil {
		return nil, nil, err
	}
	defer store.Close()
	info, err := loadArtifact(cmd.Context(), store, ref)
	if err != nil && errors.Is(err, errdef.ErrNotFound) && namesRegistry(ref) {
		tmp, err := os.MkdirTemp("", "modelpack-scan-")
		if err != nil {
			return nil, nil, err
		}
		defer os.RemoveAll(tmp)
		parsed, err := registryRef(ref)
		if err != nil {
			return nil, nil, err
		}
		local, err := layout.ParseReference(parsed.String())
		if err != nil {
			return nil, nil, err
		}
		src, _, err := remote.NewRepository(parsed.String(), opts)
		if err != nil {
			return nil, nil, err
		}
		pulled, err := layout.Open(tmp)
		if err != nil {
			return nil, nil, err
		}
		defer pulled.Close()
		if _, err := remote.Pull(cmd.Context(), src, pulled, local, remote.TransferOptions{}); err != nil {
			return nil, nil, err
		}
		store = pulled
		info, err = loadArtifact(cmd.Context(), store, local)
		if err != nil {
			return nil, nil, err
		}
	} else if err != nil {
		return nil, nil, err
	}
	files, err := scanLayers(store, ref, info)
	if err != nil {
		return nil, nil, err
	}
	layers := make([]string, len(info.Layers))
	for i, l := range info.Layers {
		layers[i] = l.Digest.String()
	}
	return files, layers, nil
}

// scanLayers scans each layer of info where its blob lies in store.
func scanLayers(store *layout.Store, ref string, info *artifactInfo) ([]scan.FileReport, error) {
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

// scanHub scans every file of a Hugging Face Hub model where it lies, with range reads: safetensors cost their
// header, not their download.
func scanHub(ctx context.Context, g *Globals, s string) ([]scan.FileReport, error) {
	ref, err := hf.ParseReference(s)
	if err != nil {
		return nil, err
	}
	if hf.Offline() {
		dir, _, err := hf.LocalSnapshotDir(hf.CacheDir(), ref)
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("HF_HUB_OFFLINE is set, so %s is not read from the Hub: scan the cached snapshot through a copy with its links followed (cp -rL %s DIR && modelpack scan DIR), or unset HF_HUB_OFFLINE", ref, dir)
	}
	client, err := g.hubClient()
	if err != nil {
		return nil, err
	}
	info, err := client.Info(ctx, ref)
	if err != nil {
		return nil, err
	}
	entries, err := client.Tree(ctx, ref.Repo, info.SHA)
	if err != nil {
		return nil, err
	}
	var out []scan.FileReport
	for _, e := range entries {
		if e.Type != "file" {
			continue
		}
		ra := client.ReaderAt(ctx, ref.Repo, info.SHA, e.Path, e.Size)
		out = append(out, scan.FileReport{Path: e.Path, Size: e.Size, Report: scan.File(ra, e.Size)})
		ra.Close()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func printScan(cmd *cobra.Command, files []scannedFile, withPolicy bool) error {
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	if withPolicy {
		fmt.Fprintln(w, "PATH\tFORMAT\tVERDICT\tPOLICY\tDETAIL")
	} else {
		fmt.Fprintln(w, "PATH\tFORMAT\tVERDICT\tDETAIL")
	}
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
		if withPolicy {
			verdict := "allowed"
			if f.Refused != "" {
				verdict = "refused"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", f.Path, f.Format, f.Verdict, verdict, orDash(detail))
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", f.Path, f.Format, f.Verdict, orDash(detail))
	}
	return w.Flush()
}
