// Package signing signs model artifacts the way cosign does and decides, from a node trust policy, whether a
// model digest may be mounted. Signatures are cosign's: a `sha256-<hex>.sig` tag carrying simple-signing payloads,
// and Sigstore bundles attached through the OCI 1.1 referrers API (the cosign v3 default), so the real cosign CLI
// can produce and check everything this package does.
package signing

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"go.yaml.in/yaml/v3"

	"github.com/modelpack/modelpack/internal/errdef"
	"github.com/modelpack/modelpack/scan"
)

// Mode says what a rule does with its verdict.
type Mode string

const (
	// Enforce refuses what fails verification.
	Enforce Mode = "enforce"
	// Warn verifies, logs failures and allows anyway (to roll a policy out before enforcing it).
	Warn Mode = "warn"
	// Off skips verification.
	Off Mode = "off"
)

// Check says whether an optional Sigstore check is demanded or explicitly given up.
type Check string

const (
	// Require fails verification when the check cannot be made.
	Require Check = "require"
	// Waive skips the check; a policy has to say so, because offline keys have no transparency-log entry.
	Waive Check = "waive"
)

// PolicyFile is the YAML document of a node trust policy.
//
//	secretsDir: /etc/modelpack/secrets   # k8s://NS/NAME key refs read NS/NAME/cosign.pub below it
//	default: {mode: enforce, none: true}
//	rules:
//	- name: team-models
//	  match: ["registry.example.com/models/**"]
//	  mode: enforce
//	  keys: [/etc/modelpack/keys/team.pub, k8s://ml/cosign]
//	  transparencyLog: waive
//	- name: releases
//	  match: ["ghcr.io/acme/*"]
//	  keyless:
//	  - {issuer: https://token.actions.githubusercontent.com, subjectRegExp: "^https://github.com/acme/"}
//	  trustRoot: {trustedRoot: /etc/modelpack/trusted_root.json}
//	- name: hub-models                   # OpenSSF Model Signing over the model's files (see OMSRule)
//	  match: ["registry.example.com/hub/**"]
//	  oms: {keys: [/etc/modelpack/keys/oms.pub], certificateChains: [/etc/modelpack/oms-ca.pem]}
//	- name: scanned                      # a scan report signed by the scanner's key (see ScanAttestationRule)
//	  match: ["registry.example.com/imported/**"]
//	  keys: [/etc/modelpack/keys/team.pub]
//	  scanAttestation: {keys: [/etc/modelpack/keys/scanner.pub]}
//	  transparencyLog: waive
//	- name: prod-signed                  # only for pods in these namespaces (see namespaces.go)
//	  namespaces: [prod, "payments-*"]
//	  match: ["registry.example.com/**"]
//	  keys: [/etc/modelpack/keys/release.pub]
//
// For a pod's volume, the first rule scoped to its namespace whose pattern matches the repository applies, else
// the first unscoped rule whose pattern matches; Default applies when none does.
type PolicyFile struct {
	SecretsDir string `yaml:"secretsDir" json:"secretsDir,omitempty"`
	Default    Rule   `yaml:"default" json:"default"`
	Rules      []Rule `yaml:"rules" json:"rules,omitempty"`
}

// Rule maps repository patterns to a requirement: any one of Keys or Keyless identities, or None.
type Rule struct {
	Name string `yaml:"name" json:"name,omitempty"`
	// Match holds registry/repository globs: * stays within a path segment, ** crosses segments, and a trailing
	// /** also matches the prefix itself. docker.io is written docker.io, not index.docker.io.
	Match   []string   `yaml:"match" json:"match,omitempty"`
	Mode    Mode       `yaml:"mode" json:"mode,omitempty"`
	None    bool       `yaml:"none" json:"none,omitempty"`
	Keys    []string   `yaml:"keys" json:"keys,omitempty"`
	Keyless []Identity `yaml:"keyless" json:"keyless,omitempty"`
	// TrustRoot anchors keyless certificates and transparency-log checks.
	TrustRoot TrustRoot `yaml:"trustRoot" json:"trustRoot,omitempty"`
	// TransparencyLog defaults to require: a signature needs a Rekor entry verifiable with the trust root.
	TransparencyLog Check `yaml:"transparencyLog" json:"transparencyLog,omitempty"`
	// CertificateTransparency defaults to require for keyless identities: the certificate needs an SCT.
	CertificateTransparency Check `yaml:"certificateTransparency" json:"certificateTransparency,omitempty"`
	// OMS requires an OpenSSF Model Signing signature over the model's files as well (see OMSRule).
	OMS *OMSRule `yaml:"oms" json:"oms,omitempty"`
	// AllowCode lets the rule's models hold files the scanner (package scan) finds to be code or malformed:
	// pickles outside its allowlist, TorchScript, Keras Lambda layers, structures it cannot vouch for. False (the
	// zero value, so every rule that does not say otherwise) refuses them; see Exceptions for single files.
	AllowCode bool `yaml:"allowCode" json:"allowCode,omitempty"`
	// Exceptions allow named files of named models whatever their scan verdict.
	Exceptions []ScanException `yaml:"exceptions" json:"exceptions,omitempty"`
	// Namespaces, if set, scope the rule to volumes of pods in these namespaces (names, or globs with * and ?
	// within the name): it is considered before every unscoped rule for them and never for anyone else.
	Namespaces []string `yaml:"namespaces" json:"namespaces,omitempty"`
	// ScanAttestation requires a signed scan report for the manifest digest (see ScanAttestationRule).
	ScanAttestation *ScanAttestationRule `yaml:"scanAttestation" json:"scanAttestation,omitempty"`
}

// ScanAttestationRule requires a scan attestation (predicate type ScanPredicateType, what `modelpack scan REF
// --attest` signs) for exactly the manifest digest, signed by any one of Keys, stored as cosign stores
// attestations (the sha256-<hex>.att tag, or a Sigstore bundle referrer). Every such attestation found must
// cover every layer of the manifest, and its verdicts must pass the rule's allowCode and exceptions as a scan on
// the node would: a trusted scanner's report of code refuses the model whatever another report says. The rule's
// transparencyLog applies (modelpack attests offline: waive it). Keyless scanners are not supported.
//
//	scanAttestation: {keys: [/etc/modelpack/keys/scanner.pub, k8s://ml/scanner]}
type ScanAttestationRule struct {
	Keys []string `yaml:"keys" json:"keys,omitempty"`
}

// ScanException allows the files matching Path in the models matching Reference.
type ScanException struct {
	// Reference is a registry/repository glob as in Match, optionally pinned to one manifest with @sha256:….
	Reference string `yaml:"reference" json:"reference"`
	// Path is a glob over the file's path in the model ("*.pt", "**/training_args.bin"): * stays within a path
	// segment, ** crosses segments, and a leading **/ matches the top directory too.
	Path string `yaml:"path" json:"path"`
}

// Identity is a keyless signer: the OIDC issuer recorded in the certificate and its subject (SAN email or URI).
// Exactly one of Issuer/IssuerRegExp and one of Subject/SubjectRegExp is set.
type Identity struct {
	Issuer        string `yaml:"issuer" json:"issuer,omitempty"`
	IssuerRegExp  string `yaml:"issuerRegExp" json:"issuerRegExp,omitempty"`
	Subject       string `yaml:"subject" json:"subject,omitempty"`
	SubjectRegExp string `yaml:"subjectRegExp" json:"subjectRegExp,omitempty"`
}

// TrustRoot names trust-root files: a Sigstore trusted_root.json, or PEM files.
type TrustRoot struct {
	// TrustedRoot is a Sigstore trusted_root.json (Fulcio CAs, Rekor and CT logs).
	TrustedRoot string `yaml:"trustedRoot" json:"trustedRoot,omitempty"`
	// CertificateChain is a PEM file of Fulcio root certificates and optionally intermediates.
	CertificateChain string `yaml:"certificateChain" json:"certificateChain,omitempty"`
	// CTLogKeys are PEM public keys of certificate-transparency logs.
	CTLogKeys []string `yaml:"ctLogKeys" json:"ctLogKeys,omitempty"`
	// RekorKeys are PEM public keys of Rekor transparency logs.
	RekorKeys []string `yaml:"rekorKeys" json:"rekorKeys,omitempty"`
}

// Policy is a validated trust policy with its keys and trust roots loaded.
type Policy struct {
	source  string
	version string
	def     *rule
	rules   []*rule
}

// Version identifies the policy content, including the key and trust-root files it loaded, so a rotated key
// makes a new version.
func (p *Policy) Version() string { return p.version }

// Source is where the policy came from.
func (p *Policy) Source() string { return p.source }

// DefaultSecretsDir holds mounted Kubernetes Secrets for k8s://NAMESPACE/NAME key references, one directory per
// Secret at NAMESPACE/NAME with cosign's keys (cosign.pub, cosign.key, cosign.password). MODELPACK_SECRETS_DIR
// overrides it for the CLI.
const DefaultSecretsDir = "/etc/modelpack/secrets"

// LoadPolicy reads and validates a policy file. Errors name the line or the field and the valid values.
func LoadPolicy(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f PolicyFile
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("policy %s: empty document: a policy needs at least a default rule", path)
		}
		return nil, fmt.Errorf("policy %s: %s", path, strings.ReplaceAll(err.Error(), "yaml: unmarshal errors:\n  ", ""))
	}
	return newPolicy(f, path, data)
}

// NewPolicy validates an in-memory policy (the CLI builds one from flags).
func NewPolicy(f PolicyFile) (*Policy, error) { return newPolicy(f, "flags", nil) }

func newPolicy(f PolicyFile, source string, raw []byte) (*Policy, error) {
	h := sha256.New()
	h.Write(raw)
	l := &loader{secretsDir: f.SecretsDir, hash: h}
	if l.secretsDir == "" {
		l.secretsDir = secretsDirFromEnv()
	}
	p := &Policy{source: source}
	if len(f.Default.Match) > 0 {
		return nil, policyErr(source, "default.match", "not allowed: the default rule applies to every reference no other rule matches")
	}
	if len(f.Default.Namespaces) > 0 {
		return nil, policyErr(source, "default.namespaces", "not allowed: the default rule applies in every namespace; scope another rule with namespaces and match: [\"**\"]")
	}
	if f.Default.Name == "" {
		f.Default.Name = "default"
	}
	var err error
	if p.def, err = l.compileRule(f.Default, "default"); err != nil {
		return nil, policyErr(source, "", err.Error())
	}
	names := map[string]string{}
	for i, r := range f.Rules {
		path := fmt.Sprintf("rules[%d]", i)
		if r.Name == "" {
			r.Name = path
		}
		if prev, dup := names[r.Name]; dup {
			return nil, policyErr(source, path+".name", fmt.Sprintf("%q is already the name of %s: names must be unique so denials say which rule applied", r.Name, prev))
		}
		names[r.Name] = path
		if len(r.Match) == 0 {
			return nil, policyErr(source, path+".match", "required: at least one registry/repository pattern")
		}
		cr, err := l.compileRule(r, path)
		if err != nil {
			return nil, policyErr(source, "", err.Error())
		}
		p.rules = append(p.rules, cr)
	}
	p.version = hex.EncodeToString(h.Sum(nil))[:16]
	return p, nil
}

func policyErr(source, field, msg string) error {
	if field == "" {
		return fmt.Errorf("policy %s: %s", source, msg)
	}
	return fmt.Errorf("policy %s: %s: %s", source, field, msg)
}

// ruleFor returns the rule governing a repository ("registry/path") for a caller with no namespace.
func (p *Policy) ruleFor(repo string) *rule { return p.ruleIn("", repo) }

// rule is a compiled Rule.
type rule struct {
	name        string
	match       []*regexp.Regexp
	namespaces  []*regexp.Regexp // none: unscoped
	mode        Mode
	none        bool
	authorities []*authority
	oms         *omsRule
	allowCode   bool
	exceptions  []exception
	// scanners are the keys a scan attestation must be signed by; nil when the rule requires none.
	scanners []*authority
}

type exception struct {
	repo   *regexp.Regexp
	digest string // "" for any manifest
	path   *regexp.Regexp
}

func (l *loader) compileRule(r Rule, path string) (*rule, error) {
	cr := &rule{name: r.Name, mode: r.Mode, none: r.None, allowCode: r.AllowCode}
	if r.Name != path {
		path = fmt.Sprintf("%s (%q)", path, r.Name)
	}
	for i, e := range r.Exceptions {
		ex, err := compileException(e)
		if err != nil {
			return nil, fmt.Errorf("%s.exceptions[%d]: %v", path, i, err)
		}
		cr.exceptions = append(cr.exceptions, ex)
	}
	switch cr.mode {
	case "":
		cr.mode = Enforce
	case Enforce, Warn, Off:
	default:
		return nil, fmt.Errorf("%s.mode: %q is not valid (valid: enforce, warn, off)", path, r.Mode)
	}
	var err error
	if cr.namespaces, err = compileNamespaces(r.Namespaces, path); err != nil {
		return nil, err
	}
	for i, m := range r.Match {
		re, err := compileGlob(m)
		if err != nil {
			return nil, fmt.Errorf("%s.match[%d]: %v", path, i, err)
		}
		cr.match = append(cr.match, re)
	}
	tlog, err := checkValue(r.TransparencyLog, path+".transparencyLog")
	if err != nil {
		return nil, err
	}
	sct, err := checkValue(r.CertificateTransparency, path+".certificateTransparency")
	if err != nil {
		return nil, err
	}
	hasReq := len(r.Keys) > 0 || len(r.Keyless) > 0 || r.OMS != nil || r.ScanAttestation != nil
	switch {
	case r.None && hasReq:
		return nil, fmt.Errorf("%s: none: true cannot be combined with keys, keyless, oms or scanAttestation", path)
	case r.None || cr.mode == Off && !hasReq:
		if r.TrustRoot.TrustedRoot != "" || r.TrustRoot.CertificateChain != "" || len(r.TrustRoot.CTLogKeys)+len(r.TrustRoot.RekorKeys) > 0 || r.TransparencyLog != "" || r.CertificateTransparency != "" {
			return nil, fmt.Errorf("%s: trustRoot, transparencyLog and certificateTransparency only apply to keys or keyless", path)
		}
		return cr, nil
	case !hasReq:
		return nil, fmt.Errorf("%s: no requirement: set keys, keyless, oms, scanAttestation, or none: true (or mode: off)", path)
	}
	if r.ScanAttestation != nil && len(r.ScanAttestation.Keys) == 0 {
		return nil, fmt.Errorf("%s.scanAttestation.keys: required: at least one cosign public key (a file, env://VAR or k8s://NAMESPACE/NAME) that signs scan attestations", path)
	}
	tr, err := l.trustRoot(r.TrustRoot, path+".trustRoot")
	if err != nil {
		return nil, err
	}
	// OMS key and certificate-chain signatures have no log entry: only Sigstore signatures are held to it.
	sigstoreSigs := len(r.Keys) > 0 || len(r.Keyless) > 0 || r.OMS != nil && len(r.OMS.Keyless) > 0 || r.ScanAttestation != nil
	if tlog == Require && sigstoreSigs && !tr.hasRekor() {
		return nil, fmt.Errorf("%s.transparencyLog: require needs Rekor keys to check entries offline: set trustRoot.rekorKeys or a trustRoot.trustedRoot with Rekor logs, or waive it with transparencyLog: waive", path)
	}
	for i, k := range r.Keys {
		a, err := l.keyAuthority(k, tr, tlog)
		if err != nil {
			return nil, fmt.Errorf("%s.keys[%d]: %v", path, i, err)
		}
		cr.authorities = append(cr.authorities, a)
	}
	if len(r.Keyless) > 0 || r.OMS != nil && len(r.OMS.Keyless) > 0 {
		if !tr.hasCA() {
			return nil, fmt.Errorf("%s.trustRoot: keyless identities need trustRoot.certificateChain (Fulcio root PEM) or trustRoot.trustedRoot", path)
		}
		if sct == Require && !tr.hasCTLog() {
			return nil, fmt.Errorf("%s.certificateTransparency: require needs CT log keys: set trustRoot.ctLogKeys or a trustRoot.trustedRoot with CT logs, or waive it with certificateTransparency: waive", path)
		}
	}
	for i, id := range r.Keyless {
		a, err := keylessAuthority(id, tr, tlog, sct)
		if err != nil {
			return nil, fmt.Errorf("%s.keyless[%d]: %v", path, i, err)
		}
		cr.authorities = append(cr.authorities, a)
	}
	if r.OMS != nil {
		if cr.oms, err = l.compileOMS(*r.OMS, tr, tlog, sct, path+".oms"); err != nil {
			return nil, err
		}
	}
	if r.ScanAttestation != nil {
		for i, k := range r.ScanAttestation.Keys {
			a, err := l.keyAuthority(k, tr, tlog)
			if err != nil {
				return nil, fmt.Errorf("%s.scanAttestation.keys[%d]: %v", path, i, err)
			}
			cr.scanners = append(cr.scanners, a)
		}
	}
	return cr, nil
}

func checkValue(c Check, path string) (Check, error) {
	switch c {
	case "":
		return Require, nil
	case Require, Waive:
		return c, nil
	}
	return "", fmt.Errorf("%s: %q is not valid (valid: require, waive)", path, c)
}

// compileGlob turns a registry/repository glob into an anchored regexp.
func compileGlob(g string) (*regexp.Regexp, error) {
	if g == "" {
		return nil, errors.New("empty pattern")
	}
	if strings.ContainsAny(g, " \t@") {
		return nil, fmt.Errorf("%q: a pattern names registry/repository only, without spaces, tags or digests", g)
	}
	if strings.HasPrefix(g, "index.docker.io/") {
		g = "docker.io/" + strings.TrimPrefix(g, "index.docker.io/")
	}
	return globRegexp(g, false)
}

// globRegexp is the glob syntax of patterns and exception paths: * within a segment, ** across, a trailing /**
// matching the prefix too. With anyDepth (file paths, as gitignore reads them) a leading or inner **/ also
// matches no directory at all; repository patterns keep their meaning.
func globRegexp(g string, anyDepth bool) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(g); i++ {
		switch c := g[i]; {
		case strings.HasPrefix(g[i:], "/**") && i+3 == len(g):
			b.WriteString("(/.*)?")
			i += 2
		case anyDepth && strings.HasPrefix(g[i:], "**/") && (i == 0 || g[i-1] == '/'):
			b.WriteString("(.*/)?") // a whole segment of ** also matches no segment at all
			i += 2
		case strings.HasPrefix(g[i:], "**"):
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

func compileException(e ScanException) (exception, error) {
	var ex exception
	ref := e.Reference
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		ex.digest = ref[i+1:]
		if _, err := v1.NewHash(ex.digest); err != nil {
			return ex, fmt.Errorf("reference %q: the digest after @ is not sha256:<64 hex>: %v", e.Reference, err)
		}
		ref = ref[:i]
	}
	var err error
	if ex.repo, err = compileGlob(ref); err != nil {
		return ex, fmt.Errorf("reference: %v", err)
	}
	if e.Path == "" || strings.HasPrefix(e.Path, "/") {
		return ex, fmt.Errorf("path %q: a glob over a file's path inside the model (relative, not empty)", e.Path)
	}
	if ex.path, err = globRegexp(path.Clean(e.Path), true); err != nil {
		return ex, fmt.Errorf("path: %v", err)
	}
	return ex, nil
}

// AllowsScan decides whether file (its path inside the model: a raw layer's path, or a tar layer's, whose findings
// name their own files) of the model ref may be mounted, given its scan report: data always; code and malformed
// only under a rule with allowCode or an exception matching ref and the file. ref names the model as the node pulls it (repo@sha256:…, or repo:tag where no digest is known yet).
// A refusal wraps ErrUnsafeContent and names the rule, the file, its format and the first callable (or the
// structural fault), which is what the pod's event should say. The rule's mode governs signatures, not this.
func (p *Policy) AllowsScan(ref, file string, r scan.Report) error {
	repo, digest, err := splitRef(ref)
	if err != nil {
		return err
	}
	return p.ruleFor(repo).allowsScan(ref, repo, digest, file, r)
}

// ScanNeeded reports whether AllowsScan can refuse anything of ref: false under a rule with allowCode, so a
// node need not scan what such a rule governs.
func (p *Policy) ScanNeeded(ref string) bool {
	repo, _, err := splitRef(ref)
	return err != nil || !p.ruleFor(repo).allowCode
}

// ErrUnsafeContent is wrapped by every refusal of AllowsScan; the driver reports it as FAILED_PRECONDITION.
var ErrUnsafeContent = errdef.ErrUnsafeContent

func (r *rule) allowsScan(ref, repo, digest, file string, rep scan.Report) error {
	if why := r.scanRefusal(repo, digest, file, rep); why != "" {
		return fmt.Errorf("%w: %s: rule %q: %s", ErrUnsafeContent, ref, r.name, why)
	}
	return nil
}

// scanRefusal says why the rule refuses file (of the model repo@digest) given its report: "" when it allows it,
// else the file, its verdict and format, and the first callable or fault.
func (r *rule) scanRefusal(repo, digest, file string, rep scan.Report) string {
	if rep.Verdict == scan.Data || r.allowCode {
		return ""
	}
	excepted := func(p string) bool {
		clean := path.Clean(strings.TrimPrefix(p, "/"))
		for _, e := range r.exceptions {
			if e.repo.MatchString(repo) && (e.digest == "" || e.digest == digest) && e.path.MatchString(clean) {
				return true
			}
		}
		return false
	}
	// A tar layer's findings name the model file they are in; anything else is in the file itself.
	// The refusal names a callable when one is refused, else the first fault.
	refused := scan.Finding{Verdict: rep.Verdict, Detail: rep.Reason}
	found := false
	for _, callables := range []bool{true, false} {
		for _, f := range rep.Findings {
			p := file
			if f.File != "" {
				p = f.File
			}
			if f.Verdict == scan.Data || callables && f.Callable == "" || found || excepted(p) {
				continue
			}
			refused, found = f, true
		}
	}
	if !found && (len(rep.Findings) > 0 || excepted(file)) {
		return ""
	}
	where := file
	if refused.File != "" {
		where = refused.File
	}
	what := refused.Detail
	if refused.Member != "" {
		what = refused.Member + ": " + what
	}
	if refused.Callable != "" {
		what = "first callable " + refused.Callable
		if refused.Member != "" {
			what += " (in " + refused.Member + ")"
		}
	}
	format := rep.Format
	if refused.File != "" {
		format += " layer " + file
	}
	return fmt.Sprintf("file %q is %s (%s): %s; allow it with allowCode: true on the rule or an exception for this file",
		where, refused.Verdict, format, what)
}

// splitRef parses a reference into the repository key policy patterns name and its digest ("" for a tag).
func splitRef(ref string) (repo, digest string, err error) {
	r, err := name.ParseReference(ref, name.WeakValidation)
	if err != nil {
		return "", "", fmt.Errorf("scan policy: %q is not a reference: %w", ref, err)
	}
	if d, ok := r.(name.Digest); ok {
		digest = d.DigestStr()
	}
	return repoKey(r.Context()), digest, nil
}
