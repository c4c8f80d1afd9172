package signing

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/sigstore/cosign/v2/pkg/oci/mutate"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/cosign/v2/pkg/oci/static"
	"github.com/sigstore/cosign/v2/pkg/types"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/modelpack/modelpack/scan"
)

// dataScan is the report of a model pushModel pushed: one safetensors file.
func dataScan(layer string) ScanPredicate {
	return ScanPredicate{Scanner: "test", Files: []ScannedFile{
		NewScannedFile(layer, scan.FileReport{Path: "model.safetensors", Size: 10, Report: scan.Report{Format: "safetensors", Verdict: scan.Data}}),
	}}
}

func codeScan(layer string) ScanPredicate {
	return ScanPredicate{Scanner: "test", Files: []ScannedFile{
		NewScannedFile(layer, scan.FileReport{Path: "model.safetensors", Size: 10, Report: scan.Report{Format: "pickle", Verdict: scan.Code,
			Reason: "imports posix.system", Findings: []scan.Finding{{Verdict: scan.Code, Callable: "posix.system", Detail: "GLOBAL posix.system"}}}}),
	}}
}

func attestScan(t *testing.T, ref, key string, pred ScanPredicate, bundle bool) string {
	t.Helper()
	where, err := AttestScan(context.Background(), ref, key, pred, AttestOptions{
		SignOptions: SignOptions{Password: testPass, Registry: plainTransports(t)}, NewBundleFormat: bundle,
	})
	if err != nil {
		t.Fatal(err)
	}
	return where
}

func scanAttestationPolicy(t *testing.T, r Rule, pubs ...string) *Verifier {
	t.Helper()
	r.ScanAttestation = &ScanAttestationRule{Keys: pubs}
	r.TransparencyLog = Waive
	p, err := NewPolicy(PolicyFile{Default: r})
	if err != nil {
		t.Fatal(err)
	}
	return NewVerifier(p, plainTransports(t))
}

func wantUnsafe(t *testing.T, dec Decision, err error, reasons ...string) {
	t.Helper()
	t.Logf("refused: %v", err)
	if !errors.Is(err, ErrUnsafeContent) || errors.Is(err, ErrDenied) {
		t.Fatalf("want ErrUnsafeContent, got %v (%+v)", err, dec)
	}
	for _, r := range append(reasons, `rule "`+dec.Rule+`"`) {
		if dec.Verified || !strings.Contains(err.Error(), r) {
			t.Fatalf("want %q in %v (%+v)", r, err, dec)
		}
	}
}

func TestScanAttestation(t *testing.T) {
	host := startRegistry(t)
	dir := t.TempDir()
	scanner, scannerPub := newKeys(t, dir, "scanner")
	other, otherPub := newKeys(t, dir, "other")
	ctx := context.Background()

	for _, bundle := range []bool{false, true} {
		mode := map[bool]string{false: "att", true: "bundle"}[bundle]
		t.Run(mode, func(t *testing.T) {
			ref, layer := pushModel(t, host, "models/"+mode, "v1", "attested "+mode)
			where := attestScan(t, ref, scanner, dataScan(layer.Digest.String()), bundle)
			if bundle != !strings.HasSuffix(where, ".att") {
				t.Fatalf("stored in %s", where)
			}
			dec, err := scanAttestationPolicy(t, Rule{}, scannerPub).Verify(ctx, ref)
			if err != nil || !dec.Verified || !strings.Contains(dec.Authority, "scan attestation by key "+scannerPub) {
				t.Fatalf("%+v %v", dec, err)
			}
			// Attesting the same report again leaves one attestation in the tag.
			attestScan(t, ref, scanner, dataScan(layer.Digest.String()), bundle)
			if !bundle {
				d, _ := name.NewDigest(ref)
				c := readClient(ctx, plainTransports(t), ref)
				tag, _ := ociremote.AttestationTag(d, c.oci...)
				if atts, err := classicAttestations(tag, c); err != nil || len(atts) != 1 {
					t.Fatalf("%d attestations after attesting twice: %v", len(atts), err)
				}
			}

			dec, err = scanAttestationPolicy(t, Rule{}, otherPub).Verify(ctx, ref)
			wantUnsafe(t, dec, err, ReasonWrongKey, "a scan attestation ("+ScanPredicateType+") by key "+otherPub+" is required")

			// A trusted scanner that reports code refuses the model, whatever another report says.
			coded, codedLayer := pushModel(t, host, "models/"+mode, "v2", "code "+mode)
			attestScan(t, coded, other, dataScan(codedLayer.Digest.String()), bundle)
			attestScan(t, coded, scanner, codeScan(codedLayer.Digest.String()), bundle)
			dec, err = scanAttestationPolicy(t, Rule{}, scannerPub, otherPub).Verify(ctx, coded)
			wantUnsafe(t, dec, err, `file "model.safetensors" is code (pickle): first callable posix.system`)
			if dec, err := scanAttestationPolicy(t, Rule{AllowCode: true}, scannerPub).Verify(ctx, coded); err != nil || !dec.Verified {
				t.Fatalf("allowCode: %+v %v", dec, err)
			}
			if dec, err := scanAttestationPolicy(t, Rule{Exceptions: []ScanException{{Reference: host + "/models/" + mode, Path: "*.safetensors"}}}, scannerPub).Verify(ctx, coded); err != nil || !dec.Verified {
				t.Fatalf("exception: %+v %v", dec, err)
			}
			// A warn rule logs and allows.
			v := scanAttestationPolicy(t, Rule{Mode: Warn}, scannerPub)
			var log syncBuffer
			v.Log = slog.New(slog.NewTextHandler(&log, nil))
			if dec, err := v.Verify(ctx, coded); err != nil || dec.Verified || !strings.Contains(log.String(), "posix.system") {
				t.Fatalf("warn: %+v %v\n%s", dec, err, log.String())
			}

			// A report that leaves a layer out vouches for nothing.
			partial, _ := pushModel(t, host, "models/"+mode, "v3", "partial "+mode)
			attestScan(t, partial, scanner, dataScan("sha256:"+strings.Repeat("0", 64)), bundle)
			dec, err = scanAttestationPolicy(t, Rule{}, scannerPub).Verify(ctx, partial)
			wantUnsafe(t, dec, err, ReasonScanIncomplete, "does not report layer")
		})
	}

	t.Run("missing", func(t *testing.T) {
		ref, _ := pushModel(t, host, "models/missing", "v1", "never attested")
		sign(t, ref, scanner)
		dec, err := scanAttestationPolicy(t, Rule{}, scannerPub).Verify(ctx, ref)
		wantUnsafe(t, dec, err, ReasonNoScanAttestation, ".att nor a Sigstore bundle referrer")
	})
	t.Run("statement for another digest copied onto this one", func(t *testing.T) {
		ref, layer := pushModel(t, host, "models/copied", "v1", "attested")
		attestScan(t, ref, scanner, dataScan(layer.Digest.String()), false)
		victim, _ := pushModel(t, host, "models/copied", "v2", "unscanned")
		from, _ := name.NewDigest(ref)
		to, _ := name.NewDigest(victim)
		copyAttestations(t, from, to, nil)
		dec, err := scanAttestationPolicy(t, Rule{}, scannerPub).Verify(ctx, victim)
		wantUnsafe(t, dec, err, ReasonOtherDigest, "is about "+from.DigestStr()+", not "+to.DigestStr())
	})
	t.Run("bundle for another digest copied onto this one", func(t *testing.T) {
		ref, layer := pushModel(t, host, "models/copiedbundle", "v1", "attested")
		attestScan(t, ref, scanner, dataScan(layer.Digest.String()), true)
		victim, _ := pushModel(t, host, "models/copiedbundle", "v2", "unscanned")
		from, _ := name.NewDigest(ref)
		to, _ := name.NewDigest(victim)
		c := writeClient(ctx, plainTransports(t), ref)
		bundles, err := sigstoreBundles(from, c)
		if err != nil || len(bundles) != 1 || bundles[0].err != nil {
			t.Fatalf("bundles of %s: %v %+v", ref, err, bundles)
		}
		b, err := protojson.Marshal(bundles[0].bundle)
		if err != nil {
			t.Fatal(err)
		}
		if err := ociremote.WriteAttestationNewBundleFormat(to, b, ScanPredicateType, c.oci...); err != nil {
			t.Fatal(err)
		}
		dec, err := scanAttestationPolicy(t, Rule{}, scannerPub).Verify(ctx, victim)
		wantUnsafe(t, dec, err, ReasonOtherDigest, "is for another artifact")
	})
	t.Run("tampered predicate", func(t *testing.T) {
		ref, layer := pushModel(t, host, "models/tampered", "v1", "code")
		attestScan(t, ref, scanner, codeScan(layer.Digest.String()), false)
		victim, _ := pushModel(t, host, "models/tampered", "v2", "code too")
		d, _ := name.NewDigest(ref)
		to, _ := name.NewDigest(victim)
		// The report is rewritten to say data, for the victim's digest; the signature is left as it was.
		copyAttestations(t, d, to, func(st []byte) []byte {
			st = bytes.ReplaceAll(st, []byte(`"verdict":"code"`), []byte(`"verdict":"data"`))
			return bytes.ReplaceAll(st, []byte(strings.TrimPrefix(d.DigestStr(), "sha256:")), []byte(strings.TrimPrefix(to.DigestStr(), "sha256:")))
		})
		dec, err := scanAttestationPolicy(t, Rule{}, scannerPub).Verify(ctx, victim)
		wantUnsafe(t, dec, err, ReasonWrongKey, "altered after signing")
	})
	t.Run("a signature is not a scan", func(t *testing.T) {
		ref, _ := pushModel(t, host, "models/signedonly", "v1", "signed")
		sign(t, ref, scanner)
		dec, err := scanAttestationPolicy(t, Rule{Keys: []string{scannerPub}}, scannerPub).Verify(ctx, ref)
		wantUnsafe(t, dec, err, ReasonNoScanAttestation)
	})
}

// copyAttestations writes the attestations of from's .att tag to to's, each statement passed through edit (when
// set) with its DSSE signatures kept as they were.
func copyAttestations(t *testing.T, from, to name.Digest, edit func([]byte) []byte) {
	t.Helper()
	c := writeClient(context.Background(), plainTransports(t), from.String())
	tag, _ := ociremote.AttestationTag(from, c.oci...)
	atts, err := classicAttestations(tag, c)
	if err != nil || len(atts) == 0 {
		t.Fatalf("attestations of %s: %v", from, err)
	}
	se := ociremote.SignedUnknown(to, c.oci...)
	for _, a := range atts {
		env, err := a.Payload()
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			var e map[string]any
			if err := json.Unmarshal(env, &e); err != nil {
				t.Fatal(err)
			}
			st, _ := base64.StdEncoding.DecodeString(e["payload"].(string))
			e["payload"] = base64.StdEncoding.EncodeToString(edit(st))
			env, _ = json.Marshal(e)
		}
		att, err := static.NewAttestation(env, static.WithLayerMediaType(types.DssePayloadType),
			static.WithAnnotations(map[string]string{"predicateType": ScanPredicateType}))
		if err != nil {
			t.Fatal(err)
		}
		if se, err = mutate.AttachAttestationToEntity(se, att); err != nil {
			t.Fatal(err)
		}
	}
	if err := ociremote.WriteAttestations(to.Repository, se, c.oci...); err != nil {
		t.Fatal(err)
	}
}
