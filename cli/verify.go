package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"oras.land/oras-go/v2/registry"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/signing"
	"github.com/modelpack/modelpack/signing/oms"
)

type verifyFlags struct {
	keys                     []string
	identity, identityRegexp string
	issuer, issuerRegexp     string
	trustedRoot, chain       string
	ctlogKeys, rekorKeys     []string
	ignoreTlog, ignoreSCT    bool
	policy, namespace        string
	format                   string
	omsDir, omsSignature     string
	omsIgnore                []string
}

// given says, in the user's words, what the flags ask the signature to be made by: "the key given with --key
// (cosign.pub)". It names the rule the flags make, so refusals and results speak of it, not of a policy.
func (f *verifyFlags) given() string {
	var parts []string
	switch len(f.keys) {
	case 0:
	case 1:
		parts = append(parts, "the key given with --key ("+f.keys[0]+")")
	default:
		parts = append(parts, "the keys given with --key ("+strings.Join(f.keys, ", ")+")")
	}
	if f.chain != "" && f.format == "oms" {
		parts = append(parts, "the certificate chain given with --certificate-chain ("+f.chain+")")
	}
	var who []string
	for _, w := range []struct{ flag, v string }{
		{"--certificate-identity", f.identity}, {"--certificate-identity-regexp", f.identityRegexp},
		{"--certificate-oidc-issuer", f.issuer}, {"--certificate-oidc-issuer-regexp", f.issuerRegexp},
	} {
		if w.v != "" {
			who = append(who, w.flag+" "+w.v)
		}
	}
	if len(who) > 0 {
		parts = append(parts, "the identity given with "+strings.Join(who, " and "))
	}
	if len(parts) == 0 {
		return "the flags given"
	}
	return strings.Join(parts, " or ")
}

// omsRule turns the flags into a rule requiring an OMS signature: --key ECDSA public keys, --certificate-chain
// PKI roots (model_signing verify certificate), or a keyless identity checked against --trusted-root
// (model_signing verify sigstore --trust_config).
func (f *verifyFlags) omsRule() (signing.Rule, error) {
	o := &signing.OMSRule{Keys: f.keys}
	if f.chain != "" {
		o.CertificateChains = []string{f.chain}
	}
	r := signing.Rule{Name: f.given(), Mode: signing.Enforce, OMS: o, TransparencyLog: signing.Waive, CertificateTransparency: signing.Waive}
	keyless := f.identity != "" || f.identityRegexp != "" || f.issuer != "" || f.issuerRegexp != ""
	if keyless {
		o.Keyless = []signing.Identity{{Subject: f.identity, SubjectRegExp: f.identityRegexp, Issuer: f.issuer, IssuerRegExp: f.issuerRegexp}}
		if f.trustedRoot == "" {
			return r, errors.New("keyless OMS signatures need --trusted-root (a Sigstore trusted_root.json: Fulcio CAs, Rekor and CT logs)")
		}
		r.TrustRoot = signing.TrustRoot{TrustedRoot: f.trustedRoot}
		if !f.ignoreTlog {
			r.TransparencyLog = signing.Require
		}
		if !f.ignoreSCT {
			r.CertificateTransparency = signing.Require
		}
	}
	if len(f.keys) == 0 && f.chain == "" && !keyless {
		return r, errors.New("--format oms: give --key (ECDSA public key), --certificate-chain (root CA PEM), or --certificate-identity and --certificate-oidc-issuer with --trusted-root, or --policy")
	}
	return r, nil
}

// rule turns the cosign-style flags into the one rule the command checks against.
func (f *verifyFlags) rule() (signing.Rule, error) {
	r := signing.Rule{Name: f.given(), Mode: signing.Enforce, Keys: f.keys, TrustRoot: signing.TrustRoot{
		TrustedRoot: f.trustedRoot, CertificateChain: f.chain, CTLogKeys: f.ctlogKeys, RekorKeys: f.rekorKeys,
	}}
	keyless := f.identity != "" || f.identityRegexp != "" || f.issuer != "" || f.issuerRegexp != ""
	if keyless {
		r.Keyless = []signing.Identity{{Subject: f.identity, SubjectRegExp: f.identityRegexp, Issuer: f.issuer, IssuerRegExp: f.issuerRegexp}}
	}
	if len(f.keys) == 0 && !keyless {
		return r, errors.New("give --key, or --certificate-identity[-regexp] and --certificate-oidc-issuer[-regexp], or --policy")
	}
	if f.ignoreTlog {
		r.TransparencyLog = signing.Waive
	} else if f.trustedRoot == "" && len(f.rekorKeys) == 0 {
		return r, errors.New("a transparency-log entry is required, as with cosign verify: give --rekor-public-key or --trusted-root to check it offline, or --insecure-ignore-tlog (signatures from modelpack sign have none)")
	}
	if f.ignoreSCT || !keyless {
		r.CertificateTransparency = signing.Waive
	}
	return r, nil
}

func verifyCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	f := &verifyFlags{}
	cmd := &cobra.Command{
		Use:   "verify REF (--key PUB | --certificate-identity ID --certificate-oidc-issuer URL | --policy FILE)",
		Short: "Verify an artifact's cosign signature or Sigstore bundle",
		Long: `Verify that the manifest digest REF points at is signed: by one of the --key public keys, or keyless by a
certificate whose identity and OIDC issuer match, chaining to the trust root given as files (--trusted-root, or
--certificate-chain with --ctlog-public-key and --rekor-public-key). A tag is resolved once and the digest is
checked. cosign signatures (the sha256-<hex>.sig tag) and Sigstore bundles attached as OCI 1.1 referrers (the
cosign v3 default) are both accepted.

Transparency-log entries are required unless --insecure-ignore-tlog, as with cosign; signatures made by
modelpack sign have none. With --policy, REF is checked as the node driver checks it, against that policy;
--namespace NS checks it as for a pod in NS (rules scoped to NS first).

With --format oms, REF must carry an OpenSSF Model Signing signature over its files: the model.sig layer that
packing an OMS-signed directory keeps, or a referrer from modelpack sign --format oms. It must verify with a
--key (ECDSA public key), chain to a --certificate-chain root CA, or be keyless for the identity, against
--trusted-root. Every file it lists must be a raw layer with that digest, and every layer but model.sig must
be listed; the check reads the manifest and the signature only (raw layers are named by their file's sha256).
--oms DIR checks a model directory as model_signing verify does.`,
		Example: `  modelpack verify registry.local/models/llama3:8b --key cosign.pub --insecure-ignore-tlog
  modelpack verify REF --certificate-identity alice@example.com --certificate-oidc-issuer https://accounts.example.com \
    --certificate-chain fulcio-chain.pem --insecure-ignore-tlog --insecure-ignore-sct
  modelpack verify REF --policy /etc/modelpack/policy.yaml
  modelpack verify REF --format oms --key oms.pub
  modelpack verify --oms ./model --certificate-chain ca-cert.pem --ignore-paths ignore-me`,
		Args: func(cmd *cobra.Command, args []string) error {
			if f.omsDir != "" {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			switch f.format {
			case "cosign", "oms":
			default:
				return usageErr("--format %q is not valid (valid: cosign, oms)", f.format)
			}
			if f.omsDir != "" {
				return verifyOMSDir(cmd, g, f)
			}
			parsed, err := registryRef(args[0])
			if err != nil {
				return err
			}
			var p *signing.Policy
			if f.policy != "" {
				p, err = signing.LoadPolicy(f.policy)
			} else {
				var r signing.Rule
				if f.format == "oms" {
					r, err = f.omsRule()
				} else {
					r, err = f.rule()
				}
				if err != nil {
					return err
				}
				p, err = signing.NewPolicy(signing.PolicyFile{Default: r})
			}
			if err != nil {
				return err
			}
			o := rf.options()
			ref, err := resolveDigest(cmd.Context(), parsed, o)
			if err != nil {
				return err
			}
			ro, err := remote.NewTransports(o)
			if err != nil {
				return err
			}
			v := signing.NewVerifier(p, ro)
			// The refusal is the command's error; only warn-rule failures are worth a warning here.
			ws := newWarnings(cmd, g)
			v.Log = ws.logger(slog.LevelWarn)
			if f.namespace != "" && f.policy == "" {
				return usageErr("--namespace chooses among a --policy's rules scoped to namespaces: give --policy")
			}
			dec, err := v.VerifyIn(cmd.Context(), f.namespace, ref)
			if errors.Is(err, signing.ErrDenied) && f.policy == "" {
				// No policy was named: say what the user gave, not the rule the flags were made into.
				return fmt.Errorf("%s is not verified by %s: %s", dec.Ref, dec.Rule, dec.Reason)
			}
			if err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), verifyJSON{Reference: dec.Ref, Rule: dec.Rule, Mode: string(dec.Mode), Verified: dec.Verified, Authority: dec.Authority, Reason: dec.Reason, Warnings: ws.all()})
			}
			if dec.Verified && f.policy == "" {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "Verified %s by %s (%s)\n", dec.Ref, dec.Authority, dec.Rule)
			} else if dec.Verified {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "Verified %s by %s (rule %q)\n", dec.Ref, dec.Authority, dec.Rule)
			} else {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "Allowed %s unverified by rule %q (%s): %s\n", dec.Ref, dec.Rule, dec.Mode, dec.Reason)
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&f.keys, "key", nil, "cosign public key: file, env://VAR or k8s://NAMESPACE/NAME (repeatable: any of them)")
	fl.StringVar(&f.identity, "certificate-identity", "", "keyless: the certificate's SAN (email or URI)")
	fl.StringVar(&f.identityRegexp, "certificate-identity-regexp", "", "keyless: a regexp the certificate's SAN matches")
	fl.StringVar(&f.issuer, "certificate-oidc-issuer", "", "keyless: the OIDC issuer recorded in the certificate")
	fl.StringVar(&f.issuerRegexp, "certificate-oidc-issuer-regexp", "", "keyless: a regexp the OIDC issuer matches")
	fl.StringVar(&f.trustedRoot, "trusted-root", "", "Sigstore trusted_root.json (Fulcio CAs, Rekor and CT logs)")
	fl.StringVar(&f.chain, "certificate-chain", "", "PEM Fulcio root certificate(s) and intermediates")
	fl.StringArrayVar(&f.ctlogKeys, "ctlog-public-key", envList("SIGSTORE_CT_LOG_PUBLIC_KEY_FILE"), "PEM public key of a CT log (repeatable; env SIGSTORE_CT_LOG_PUBLIC_KEY_FILE)")
	fl.StringArrayVar(&f.rekorKeys, "rekor-public-key", envList("SIGSTORE_REKOR_PUBLIC_KEY"), "PEM public key of a Rekor log (repeatable; env SIGSTORE_REKOR_PUBLIC_KEY)")
	fl.BoolVar(&f.ignoreTlog, "insecure-ignore-tlog", false, "do not require a transparency-log entry")
	fl.BoolVar(&f.ignoreSCT, "insecure-ignore-sct", false, "keyless: do not require a certificate-transparency SCT")
	fl.StringVar(&f.policy, "policy", "", "check against this node trust policy instead of the flags above")
	fl.StringVar(&f.namespace, "namespace", "", "with --policy: check as for a pod in this namespace (its namespace-scoped rules first); none: the unscoped rules, as for a prepull")
	fl.StringVar(&f.format, "format", "cosign", "signature to check: cosign (the manifest digest's) or oms (OpenSSF Model Signing over the model's files)")
	fl.StringVar(&f.omsDir, "oms", "", "check the OMS signature of this local model directory (or single file) instead of REF")
	fl.StringVar(&f.omsSignature, "signature", "", "with --oms: the signature file (default DIR/model.sig)")
	fl.StringArrayVar(&f.omsIgnore, "ignore-paths", nil, "with --oms: a path of the model (relative to it) left out of the check, as model_signing's --ignore-paths (repeatable)")
	cmd.MarkFlagsMutuallyExclusive("certificate-identity", "certificate-identity-regexp")
	cmd.MarkFlagsMutuallyExclusive("certificate-oidc-issuer", "certificate-oidc-issuer-regexp")
	cmd.MarkFlagsMutuallyExclusive("oms", "policy")
	for _, fl := range []string{"key", "certificate-identity", "certificate-identity-regexp", "certificate-oidc-issuer", "certificate-oidc-issuer-regexp"} {
		cmd.MarkFlagsMutuallyExclusive("policy", fl)
	}
	rf.registerConnection(fl)
	return cmd
}

// resolveDigest names ref by digest, resolving a tag once as the node driver does: through the hosts.toml mirrors
// allowed to resolve, then the origin, with no API ping first, so an origin that hangs costs nothing when a mirror
// answers. A digest reference is taken as it is.
func resolveDigest(ctx context.Context, ref registry.Reference, o remote.Options) (string, error) {
	if _, err := ref.Digest(); err == nil {
		return ref.String(), nil
	}
	repo, _, err := remote.NewRepository(ref.String(), o)
	if err != nil {
		return "", err
	}
	desc, err := repo.Resolve(ctx, ref.Reference)
	if err != nil {
		return "", err
	}
	ref.Reference = desc.Digest.String()
	return ref.String(), nil
}

// verifyJSON is verify's result: signing.Decision with "reference" named as every other command names it.
type verifyJSON struct {
	Reference string   `json:"reference"`
	Rule      string   `json:"rule"`
	Mode      string   `json:"mode"`
	Verified  bool     `json:"verified"`
	Authority string   `json:"authority,omitempty"`
	Reason    string   `json:"reason,omitempty"`
	Warnings  []string `json:"warnings,omitempty"`
}

// envList seeds a repeatable flag from a cosign environment variable.
func envList(name string) []string {
	if v := os.Getenv(name); v != "" {
		return []string{v}
	}
	return nil
}

// verifyOMSDir checks a model directory against its OMS signature file, as `model_signing verify` does.
func verifyOMSDir(cmd *cobra.Command, g *Globals, f *verifyFlags) error {
	r, err := f.omsRule()
	if err != nil {
		return err
	}
	v, sigFile, err := signing.OMSVerifier(r)
	if err != nil {
		return err
	}
	sig := f.omsSignature
	if sig == "" {
		if fi, err := os.Stat(f.omsDir); err == nil && !fi.IsDir() {
			return errors.New("--oms names a single file: give its --signature")
		}
		sig = filepath.Join(f.omsDir, sigFile)
	}
	st, err := oms.VerifyDir(f.omsDir, sig, v, f.omsIgnore)
	if err != nil {
		return fmt.Errorf("%s: %w", f.omsDir, err)
	}
	if g.IsJSON() {
		return PrintJSON(cmd.OutOrStdout(), struct {
			Model     string `json:"model"`
			Signature string `json:"signature"`
			Verified  bool   `json:"verified"`
			Authority string `json:"authority"`
			Files     int    `json:"files"`
		}{f.omsDir, sig, true, v.String(), len(st.Resources)})
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "Verified %s: %d file(s) match the OMS signature %s by %s\n", f.omsDir, len(st.Resources), sig, v)
	return err
}
