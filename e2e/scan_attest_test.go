package e2e

// Scan attestations from outside the process: `modelpack scan REF --attest` signs the scan report as cosign
// attests, the real cosign CLI (v2.6.5) accepts it with verify-attestation, `modelpack verify` and the node
// driver require it under a scanAttestation rule, and every way of faking one (another key, another digest's
// statement, an edited report, none at all) is refused naming what was required.

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/modelpack/modelpack/internal/testmodel"
)

const scanPredicateType = "https://modelpack.dev/scan/v1"

// in is e for the subtest t, so its failures fail t.
func (e *sigEnv) in(t *testing.T) *sigEnv {
	c := *e
	c.t = t
	return &c
}

// pushFiles pushes a ModelPack artifact of files and returns repo@digest.
func (e *sigEnv) pushFiles(repo, tag string, files drvModel) string {
	e.t.Helper()
	return e.host + "/" + repo + "@" + testmodel.Push(e.t, e.host, repo, tag, files, nil).String()
}

// attTag is where cosign keeps the attestations of repo@digest.
func attTag(ref string) string {
	repo, dgst, _ := strings.Cut(ref, "@")
	return repo + ":" + strings.Replace(dgst, ":", "-", 1) + ".att"
}

// writePolicy writes a trust policy whose rule for the registry requires a scan attestation by pubs.
func (e *sigEnv) writePolicy(file string, extra string, pubs ...string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, file)
	y := fmt.Sprintf(`default: {none: true}
rules:
- name: scanned
  match: ["%s/**"]
  scanAttestation: {keys: [%s]}
  transparencyLog: waive
%s`, e.host, strings.Join(pubs, ", "), extra)
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// attestedStatement returns the in-toto statement cosign verify-attestation printed (its first line).
func attestedStatement(t *testing.T, out string) map[string]any {
	t.Helper()
	var env struct {
		PayloadType string `json:"payloadType"`
		Payload     string `json:"payload"`
	}
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(line), &env); err != nil || env.PayloadType != "application/vnd.in-toto+json" {
		t.Fatalf("cosign verify-attestation printed %q: %v", out, err)
	}
	st, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(st, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestScanAttestCosignVerifiesAndPolicyRequires(t *testing.T) {
	e := newSigEnv(t)
	e.must(e.cosign, "generate-key-pair", "--output-key-prefix", "scanner")
	e.must(e.mp, "key", "generate", "--output-key-prefix", "other")
	// cosign needs a trusted root for bundles even when it checks only a key: an empty one does.
	trustedRoot := filepath.Join(e.dir, "trusted_root.json")
	os.WriteFile(trustedRoot, []byte(`{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}`), 0o644)
	ok := vector(t, "ok.safetensors")
	policy := e.writePolicy("policy.yaml", "", "scanner.pub")

	for _, mode := range []string{"att", "bundle"} {
		t.Run(mode, func(t *testing.T) {
			e := e.in(t)
			var extra, cosignExtra []string
			if mode == "bundle" {
				extra, cosignExtra = []string{"--new-bundle-format"}, []string{"--trusted-root", trustedRoot}
			}
			ref := e.pushFiles("models/"+mode, "v1", drvModel{"model.safetensors": ok})
			tagRef := e.host + "/models/" + mode + ":v1"
			out := e.must(e.mp, append([]string{"scan", tagRef, "--plain-http", "--attest", "--key", "scanner.key", "-o", "json"}, extra...)...)
			var res struct {
				Attestation struct{ Subject, PredicateType, Stored string }
			}
			if err := json.Unmarshal([]byte(out), &res); err != nil || res.Attestation.Subject != ref || res.Attestation.PredicateType != scanPredicateType {
				t.Fatalf("scan --attest printed %s: %v", out, err)
			}
			tags := e.must(e.oras, "repo", "tags", "--plain-http", e.host+"/models/"+mode)
			if hasAtt := strings.Contains(tags, ".att"); hasAtt != (mode == "att") {
				t.Fatalf("%s: tags %s", mode, tags)
			}

			// The real cosign accepts it as it accepts its own attestations.
			verified := e.must(e.cosign, append([]string{"verify-attestation", "--key", "scanner.pub", "--type", scanPredicateType,
				"--insecure-ignore-tlog", "--allow-http-registry", tagRef}, cosignExtra...)...)
			st := attestedStatement(t, verified)
			subj := st["subject"].([]any)[0].(map[string]any)["digest"].(map[string]any)["sha256"]
			if st["_type"] != "https://in-toto.io/Statement/v1" || st["predicateType"] != scanPredicateType || "sha256:"+subj.(string) != ref[strings.Index(ref, "@")+1:] {
				t.Fatalf("statement %v", st)
			}
			file := st["predicate"].(map[string]any)["files"].([]any)[0].(map[string]any)
			if file["path"] != "model.safetensors" || file["format"] != "safetensors" || file["verdict"] != "data" || !strings.HasPrefix(file["layer"].(string), "sha256:") {
				t.Fatalf("predicate file %v", file)
			}
			e.mustFail("", e.cosign, append([]string{"verify-attestation", "--key", "other.pub", "--type", scanPredicateType,
				"--insecure-ignore-tlog", "--allow-http-registry", tagRef}, cosignExtra...)...)

			out = e.must(e.mp, "verify", "--plain-http", "--policy", policy, tagRef)
			if !strings.Contains(out, "scan attestation by key scanner.pub") {
				t.Fatalf("verify printed %s", out)
			}
			// A scan attestation is no signature, in either store, even by the signing key.
			e.mustFail("is not verified by the key given with --key (scanner.pub)", e.mp, "verify", "--plain-http", "--key", "scanner.pub", "--insecure-ignore-tlog", tagRef)
			e.mustFail("wrong key: a scan attestation ("+scanPredicateType+") by key other.pub is required",
				e.mp, "verify", "--plain-http", "--policy", e.writePolicy("other.yaml", "", "other.pub"), tagRef)

			// A model whose pickle calls os.system is attested as code (scan still exits 1), and refused for it.
			evil := e.pushFiles("models/"+mode, "evil", drvModel{"model.safetensors": ok, "pytorch_model.bin": vector(t, "evil_torch.pt")})
			e.mustFail("1 of 2 files are code or malformed", e.mp, append([]string{"scan", evil, "--plain-http", "--attest", "--key", "scanner.key"}, extra...)...)
			e.mustFail(`the scan attestation by key scanner.pub`, e.mp, "verify", "--plain-http", "--policy", policy, evil)
			e.mustFail(`says file "pytorch_model.bin" is code (pytorch-zip): first callable posix.system`, e.mp, "verify", "--plain-http", "--policy", policy, evil)
			e.must(e.mp, "verify", "--plain-http", "--policy", e.writePolicy("allow.yaml", "  allowCode: true\n", "scanner.pub"), evil)

			// copy -r carries the attestation: cosign and the policy accept the copy.
			other := e.host + "/promoted/" + mode
			e.must(e.mp, "copy", "-r", "--plain-http", tagRef, other+":v1")
			e.must(e.cosign, append([]string{"verify-attestation", "--key", "scanner.pub", "--type", scanPredicateType,
				"--insecure-ignore-tlog", "--allow-http-registry", other + ":v1"}, cosignExtra...)...)
			e.must(e.mp, "verify", "--plain-http", "--policy", policy, other+":v1")
			e.must(e.mp, "copy", "--plain-http", tagRef, e.host+"/bare/"+mode+":v1")
			e.mustFail("no scan attestation", e.mp, "verify", "--plain-http", "--policy", policy, e.host+"/bare/"+mode+":v1")
		})
	}

	t.Run("missing", func(t *testing.T) {
		e := e.in(t)
		ref := e.pushFiles("models/never", "v1", drvModel{"model.safetensors": ok})
		e.mustFail("no scan attestation: a scan attestation ("+scanPredicateType+") by key scanner.pub is required", e.mp, "verify", "--plain-http", "--policy", policy, ref)
	})
	t.Run("another digest's statement", func(t *testing.T) {
		e := e.in(t)
		scanned := e.pushFiles("models/copied", "scanned", drvModel{"model.safetensors": ok})
		e.must(e.mp, "scan", scanned, "--plain-http", "--attest", "--key", "scanner.key")
		victim := e.pushFiles("models/copied", "victim", drvModel{"model.safetensors": ok, "pytorch_model.bin": vector(t, "evil_torch.pt")})
		// The attestation manifest, signatures and all, tagged as the victim's.
		e.must(e.oras, "tag", "--plain-http", attTag(scanned), attTag(victim)[strings.LastIndex(attTag(victim), ":")+1:])
		e.mustFail("no matching attestations", e.cosign, "verify-attestation", "--key", "scanner.pub", "--type", scanPredicateType,
			"--insecure-ignore-tlog", "--allow-http-registry", victim)
		e.mustFail("signature for another digest: a scan attestation ("+scanPredicateType+") by key scanner.pub is required", e.mp, "verify", "--plain-http", "--policy", policy, victim)
		e.mustFail("is about "+scanned[strings.Index(scanned, "@")+1:], e.mp, "verify", "--plain-http", "--policy", policy, victim)
	})
	t.Run("tampered predicate", func(t *testing.T) {
		e := e.in(t)
		evil := e.pushFiles("models/tampered", "v1", drvModel{"model.safetensors": ok, "pytorch_model.bin": vector(t, "evil_torch.pt")})
		e.mustFail("code or malformed", e.mp, "scan", evil, "--plain-http", "--attest", "--key", "scanner.key")
		e.tamperAttestation(attTag(evil), func(st string) string { return strings.ReplaceAll(st, `"verdict":"code"`, `"verdict":"data"`) })
		e.mustFail("no matching attestations", e.cosign, "verify-attestation", "--key", "scanner.pub", "--type", scanPredicateType,
			"--insecure-ignore-tlog", "--allow-http-registry", evil)
		e.mustFail("wrong key: a scan attestation ("+scanPredicateType+") by key scanner.pub is required: an attestation does not verify with key scanner.pub (made with another key, or altered after signing)",
			e.mp, "verify", "--plain-http", "--policy", policy, evil)
	})
	t.Run("flags", func(t *testing.T) {
		e := e.in(t)
		e.mustFail("--attest needs --key", e.mp, "scan", e.host+"/models/att:v1", "--plain-http", "--attest")
		e.mustFail("add --attest", e.mp, "scan", e.host+"/models/att:v1", "--plain-http", "--key", "scanner.key")
		e.mustFail("names no registry", e.mp, "scan", e.dir, "--attest", "--key", "scanner.key")
	})
}

// tamperAttestation rewrites the statement in the DSSE envelope of the attestation at tag with edit, keeping its
// signature, and stores the result under the same tag, as an attacker with push access to the repository could.
func (e *sigEnv) tamperAttestation(tag string, edit func(string) string) {
	e.t.Helper()
	repo := tag[:strings.LastIndex(tag, ":")]
	var m map[string]any
	if err := json.Unmarshal([]byte(e.must(e.oras, "manifest", "fetch", "--plain-http", tag)), &m); err != nil {
		e.t.Fatal(err)
	}
	layer := m["layers"].([]any)[0].(map[string]any)
	envFile := filepath.Join(e.dir, "envelope.json")
	e.must(e.oras, "blob", "fetch", "--plain-http", "--output", envFile, repo+"@"+layer["digest"].(string))
	raw, _ := os.ReadFile(envFile)
	var env map[string]any
	if err := json.Unmarshal(raw, &env); err != nil {
		e.t.Fatal(err)
	}
	st, _ := base64.StdEncoding.DecodeString(env["payload"].(string))
	edited := edit(string(st))
	if edited == string(st) {
		e.t.Fatal("the edit changed nothing")
	}
	env["payload"] = base64.StdEncoding.EncodeToString([]byte(edited))
	raw, _ = json.Marshal(env)
	os.WriteFile(envFile, raw, 0o644)
	sum := sha256.Sum256(raw)
	dgst := "sha256:" + hex.EncodeToString(sum[:])
	e.must(e.oras, "blob", "push", "--plain-http", repo+"@"+dgst, envFile)
	layer["digest"], layer["size"] = dgst, len(raw)
	mb, _ := json.Marshal(m)
	mf := filepath.Join(e.dir, "att-manifest.json")
	os.WriteFile(mf, mb, 0o644)
	e.must(e.oras, "manifest", "push", "--plain-http", tag, mf)
}

// The node driver under a scanAttestation rule: an attested model mounts; one with no attestation, one attested
// by another key, and one attested as code are refused with FAILED_PRECONDITION naming what was required, and
// nothing is mounted.
func TestDriverRequiresScanAttestation(t *testing.T) {
	e := newSigEnv(t)
	e.must(e.cosign, "generate-key-pair", "--output-key-prefix", "scanner")
	e.must(e.mp, "key", "generate", "--output-key-prefix", "other")
	ok := vector(t, "ok.safetensors")
	attested := e.pushFiles("models/attested", "v1", drvModel{"model.safetensors": ok})
	e.must(e.mp, "scan", attested, "--plain-http", "--attest", "--key", "scanner.key")
	bundled := e.pushFiles("models/bundled", "v1", drvModel{"model.safetensors": ok})
	e.must(e.mp, "scan", bundled, "--plain-http", "--attest", "--key", "scanner.key", "--new-bundle-format")
	e.pushFiles("models/unattested", "v1", drvModel{"model.safetensors": ok})
	otherKey := e.pushFiles("models/otherkey", "v1", drvModel{"model.safetensors": ok})
	e.must(e.mp, "scan", otherKey, "--plain-http", "--attest", "--key", "other.key")
	evil := e.pushFiles("models/evil", "v1", drvModel{"model.safetensors": ok, "pytorch_model.bin": vector(t, "evil_torch.pt")})
	e.mustFail("code or malformed", e.mp, "scan", evil, "--plain-http", "--attest", "--key", "scanner.key")

	policy := e.writePolicy("policy.yaml", "", filepath.Join(e.dir, "scanner.pub"))
	root := t.TempDir()
	drvCleanupMounts(t, root)
	d := drvStartWith(t, filepath.Join(root, "node"), []string{"--policy", policy}, e.host)
	v := &drvVolumes{t: t, dir: root, node: d.node(), want: string(ok)}
	v.must(e.host+"/models/attested:v1", "IfNotPresent", nil)
	v.must(e.host+"/models/bundled:v1", "IfNotPresent", nil)
	required := "a scan attestation (" + scanPredicateType + ") by key " + filepath.Join(e.dir, "scanner.pub") + " is required"
	for repo, says := range map[string][]string{
		"models/unattested": {"no scan attestation", required},
		"models/otherkey":   {"wrong key", required},
		"models/evil":       {`rule "scanned"`, `says file "pytorch_model.bin" is code (pytorch-zip): first callable posix.system`},
	} {
		for _, pull := range []string{"IfNotPresent", "Always"} {
			err := v.publish(e.host+"/"+repo+":v1", pull, nil)
			for _, s := range says {
				drvWantCode(t, err, codes.FailedPrecondition, s)
			}
		}
	}
}

// TestPushAttestsTheScan: `push --sign KEY --attest-scan` signs the pushed digest and its scan report (the scan
// push already makes to warn of code, one per layer) with the same key, as modelpack scan --attest would: the real
// cosign verify-attestation accepts it and a policy requiring it passes. --attest-scan without --sign is a usage
// error, before anything is sent.
func TestPushAttestsTheScan(t *testing.T) {
	e := newSigEnv(t)
	e.must(e.cosign, "generate-key-pair", "--output-key-prefix", "scanner")
	home := filepath.Join(e.dir, "home")
	model := filepath.Join(e.dir, "model")
	os.MkdirAll(model, 0o755)
	os.WriteFile(filepath.Join(model, "model.safetensors"), vector(t, "ok.safetensors"), 0o644)
	os.WriteFile(filepath.Join(model, "config.json"), []byte(`{"arch":"tiny"}`), 0o644)
	tagRef := e.host + "/models/pushed:v1"
	e.must(e.mp, "--home", home, "pack", model, "-t", tagRef)
	if _, stderr, err := e.run(e.mp, "--home", home, "push", tagRef, "--plain-http", "--attest-scan"); err == nil || !strings.Contains(stderr, "--attest-scan signs the scan report with the --sign key") {
		t.Fatalf("push --attest-scan without --sign: %v\n%s", err, stderr)
	}
	if tags, _, _ := e.run(e.oras, "repo", "tags", "--plain-http", e.host+"/models/pushed"); strings.TrimSpace(tags) != "" {
		t.Fatalf("a refused push left tags %q", tags)
	}
	out := e.must(e.mp, "--home", home, "push", tagRef, "--plain-http", "--sign", "scanner.key", "--attest-scan", "-o", "json")
	var res struct {
		Signature   struct{ Signed string }
		Attestation struct{ Subject, PredicateType string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Attestation.Subject == "" || res.Attestation.Subject != res.Signature.Signed || res.Attestation.PredicateType != scanPredicateType {
		t.Fatalf("push --sign --attest-scan printed %s: %v", out, err)
	}
	verified := e.must(e.cosign, "verify-attestation", "--key", "scanner.pub", "--type", scanPredicateType, "--insecure-ignore-tlog", "--allow-http-registry", tagRef)
	files := attestedStatement(t, verified)["predicate"].(map[string]any)["files"].([]any)
	if len(files) != 2 {
		t.Fatalf("the attested report has %d files, want one per layer (2): %v", len(files), files)
	}
	e.must(e.cosign, "verify", "--key", "scanner.pub", "--insecure-ignore-tlog", "--allow-http-registry", tagRef)
	e.must(e.mp, "verify", "--plain-http", "--policy", e.writePolicy("policy.yaml", "", "scanner.pub"), tagRef)
}
