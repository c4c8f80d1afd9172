package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/signing"
)

// signFlags are what signing needs beyond the registry: the key and the signed annotations. push and pack --push
// add them with addSignFlags as --sign KEY and --sign-annotation.
type signFlags struct {
	key         string
	annotations []string
}

func (s *signFlags) signOptions(reg *remote.Transports) (signing.SignOptions, error) {
	ann := map[string]string{}
	for _, a := range s.annotations {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return signing.SignOptions{}, fmt.Errorf("annotation %q: want KEY=VALUE", a)
		}
		ann[k] = v
	}
	return signing.SignOptions{Registry: reg, Password: cosignPassword, Annotations: ann}, nil
}

// addSignFlags gives push and pack --push their --sign KEY option; call signPushed with the pushed digest.
func addSignFlags(fl *pflag.FlagSet) *signFlags {
	s := &signFlags{}
	fl.StringVar(&s.key, "sign", "", "sign the pushed digest with this cosign private key (file, env://VAR or k8s://NS/NAME)")
	fl.StringArrayVar(&s.annotations, "sign-annotation", nil, "KEY=VALUE signed into the signature payload (repeatable)")
	return s
}

// signatureJSON is a signature sign, push --sign and pack --push --sign made, as -o json shows it.
type signatureJSON struct {
	Signed string `json:"signed"` // the manifest signed, by digest
	Tag    string `json:"tag"`    // where the signature is stored, as cosign stores it
	Key    string `json:"key"`
}

func newSignatureJSON(signed, key string) *signatureJSON {
	tag := signed
	if repo, dgst, ok := strings.Cut(signed, "@"); ok {
		tag = repo + ":" + strings.Replace(dgst, ":", "-", 1) + ".sig"
	}
	return &signatureJSON{Signed: signed, Tag: tag, Key: key}
}

// signPushed signs digestRef when --sign was given, reaching the registry with the push's options; nil without.
func (s *signFlags) signPushed(ctx context.Context, digestRef string, o remote.Options) (*signatureJSON, error) {
	if s.key == "" {
		return nil, nil
	}
	reg, err := remote.NewTransports(o)
	if err != nil {
		return nil, err
	}
	opts, err := s.signOptions(reg)
	if err != nil {
		return nil, err
	}
	signed, err := signing.SignDigest(ctx, digestRef, s.key, opts)
	if err != nil {
		return nil, err
	}
	return newSignatureJSON(signed, s.key), nil
}

func signCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var sf signFlags
	var tlogUpload bool
	var format, omsDir, omsSignature string
	cmd := &cobra.Command{
		Use:   "sign REF --key KEY",
		Short: "Sign an artifact's manifest digest with a cosign key",
		Long: `Sign the manifest digest REF points at with a cosign private key. A tag is resolved once and the digest is
signed, never the tag. The signature is stored as cosign stores it: a simple-signing payload in the
sha256-<hex>.sig tag of the same repository, so cosign verify and modelpack verify both check it.

KEY is a file, env://VAR (the PEM in a variable) or k8s://NAMESPACE/NAME (a cosign key-pair Secret mounted
below $MODELPACK_SECRETS_DIR). Its password comes from COSIGN_PASSWORD or the terminal.

Nothing is uploaded to a transparency log (this is cosign sign --tlog-upload=false): verify with
--insecure-ignore-tlog, or transparencyLog: waive in a node policy.

With --format oms the model's files are signed as OpenSSF Model Signing does (model_signing sign key): an
in-toto statement listing every file with its sha256, taken from the raw layers' digests (nothing is read
again), in a Sigstore bundle attached to the manifest as an OCI referrer; the artifact's digest is unchanged.
Check it with modelpack verify --format oms, or an oms rule of the node policy. --oms DIR signs a local
model directory instead and writes DIR/model.sig, which modelpack pack then carries as a layer. REF --oms FILE
attaches a signature made elsewhere (model_signing sign over the model's directory) as that referrer, once its
statement lists exactly REF's files with their digests; it needs no key. For OMS, KEY
may also be a PEM ECDSA key (EC PRIVATE KEY or PRIVATE KEY, P-256/384/521), what model_signing signs with;
a password is asked only for an EC PRIVATE KEY that openssl ec -aes256 encrypted.`,
		Example: `  modelpack sign registry.local/models/llama3:8b --key cosign.key
  modelpack sign registry.local/models/llama3:8b --key cosign.key --format oms
  modelpack sign --oms ./llama3-8b --key cosign.key
  modelpack sign registry.local/models/llama3:8b --oms ./llama3-8b/model.sig
  cosign verify --key cosign.pub --insecure-ignore-tlog registry.local/models/llama3:8b`,
		Args: func(cmd *cobra.Command, args []string) error {
			if fi, err := os.Stat(omsDir); omsDir != "" && err == nil && fi.Mode().IsRegular() {
				if len(args) != 1 {
					return usageErr("--oms %s is a signature file: name the artifact to attach it to (modelpack sign REF --oms %s)", omsDir, omsDir)
				}
				return nil
			}
			if omsDir != "" {
				if len(args) > 0 {
					return usageErr("--oms %s signs a local directory and takes no REF; to attach a model_signing signature file to REF, give --oms FILE", omsDir)
				}
				return nil
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if omsDir != "" && len(args) == 1 {
				return attachOMS(cmd, g, &rf, omsDir, args[0], sf.key != "" || len(sf.annotations) > 0)
			}
			if omsDir != "" {
				if sf.key == "" {
					return errors.New("--key is required")
				}
				st, sig, err := signing.SignOMSDir(omsDir, omsSignature, sf.key, signing.SignOptions{Password: cosignPassword})
				if err != nil {
					return err
				}
				if g.IsJSON() {
					return PrintJSON(cmd.OutOrStdout(), struct {
						Model     string `json:"model"`
						Signature string `json:"signature"`
						Files     int    `json:"files"`
						Key       string `json:"key"`
					}{omsDir, sig, len(st.Resources), sf.key})
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "Signed %d file(s) of %s: OMS signature %s\n", len(st.Resources), omsDir, sig)
				return err
			}
			if tlogUpload {
				return errors.New("--tlog-upload=true is not supported: modelpack signs offline and stores signatures only in the registry")
			}
			if sf.key == "" {
				return errors.New("--key is required")
			}
			if _, err := registryRef(args[0]); err != nil {
				return err
			}
			ro, err := remote.NewTransports(rf.options())
			if err != nil {
				return err
			}
			opts, err := sf.signOptions(ro)
			if err != nil {
				return err
			}
			switch format {
			case "cosign":
			case "oms":
				if len(sf.annotations) > 0 {
					return errors.New("--annotations: an OMS signature has no annotations (its statement lists the model's files)")
				}
				signed, referrer, err := signing.SignOMS(cmd.Context(), args[0], sf.key, opts)
				if err != nil {
					return err
				}
				if g.IsJSON() {
					return PrintJSON(cmd.OutOrStdout(), struct {
						Reference string `json:"reference"`
						Signed    string `json:"signed"`
						Referrer  string `json:"referrer"`
						Format    string `json:"format"`
						Key       string `json:"key"`
					}{args[0], signed, referrer, "oms", sf.key})
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "Signed the files of %s (OMS signature attached as referrer %s)\n", signed, referrer)
				return err
			default:
				return usageErr("--format %q is not valid (valid: cosign, oms)", format)
			}
			signed, err := signing.SignDigest(cmd.Context(), args[0], sf.key, opts)
			if err != nil {
				return err
			}
			sig := newSignatureJSON(signed, sf.key)
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), struct {
					Reference string         `json:"reference"`
					Signature *signatureJSON `json:"signature"`
				}{args[0], sig})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "Signed %s (signature %s)\n", sig.Signed, sig.Tag)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&sf.key, "key", "", "cosign private key: file, env://VAR or k8s://NAMESPACE/NAME")
	fl.StringArrayVarP(&sf.annotations, "annotations", "a", nil, "KEY=VALUE signed into the payload (repeatable)")
	fl.StringVar(&format, "format", "cosign", "cosign: sign the manifest digest; oms: sign the model's files as OpenSSF Model Signing (a model.sig bundle attached as a referrer)")
	fl.StringVar(&omsDir, "oms", "", "DIR: sign this local model directory as OpenSSF Model Signing does (model_signing sign key), writing DIR/model.sig; "+
		"FILE with REF: attach this OMS signature (a model_signing model.sig) to REF as its referrer, after checking it lists REF's files")
	fl.StringVar(&omsSignature, "signature", "", "with --oms: where to write the signature (default DIR/model.sig)")
	fl.BoolVar(&tlogUpload, "tlog-upload", false, "upload to a transparency log (not supported: always false here)")
	rf.registerConnection(fl)
	return cmd
}

// attachOMS is sign REF --oms FILE: a model_signing signature made elsewhere, attached as the OMS referrer once
// its statement matches REF's files (signing.AttachOMS).
func attachOMS(cmd *cobra.Command, g *Globals, rf *remoteFlags, file, ref string, signerFlags bool) error {
	if signerFlags {
		return usageErr("--oms FILE attaches a signature already made: --key and --annotations do not apply")
	}
	if _, err := registryRef(ref); err != nil {
		return err
	}
	bundle, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	ro, err := remote.NewTransports(rf.options())
	if err != nil {
		return err
	}
	signed, referrer, err := signing.AttachOMS(cmd.Context(), ref, bundle, signing.SignOptions{Registry: ro})
	if err != nil {
		return err
	}
	if g.IsJSON() {
		return PrintJSON(cmd.OutOrStdout(), struct {
			Reference string `json:"reference"`
			Signed    string `json:"signed"`
			Referrer  string `json:"referrer"`
			Format    string `json:"format"`
			Signature string `json:"signature"`
		}{ref, signed, referrer, "oms", file})
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "Attached the OMS signature %s to %s (referrer %s)\n", file, signed, referrer)
	return err
}
