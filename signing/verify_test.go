package signing

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote"

	mpremote "github.com/modelpack/modelpack/artifact/remote"
	"github.com/modelpack/modelpack/signing/signingtest"
)

func registryOf(t *testing.T, v *Verifier) *prometheus.Registry {
	t.Helper()
	r := prometheus.NewRegistry()
	if err := r.Register(v.Collector()); err != nil {
		t.Fatal(err)
	}
	return r
}

// syncBuffer is a log sink read while the watcher writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func writeTrustedRoot(t *testing.T, dir string, ca *signingtest.CA) string {
	t.Helper()
	tr, err := root.NewTrustedRoot(root.TrustedRootMediaType01,
		[]root.CertificateAuthority{&root.FulcioCertificateAuthority{Root: ca.Root, Intermediates: []*x509.Certificate{ca.Intermediate}, URI: "https://fulcio.test"}},
		nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tr.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, dir, "trusted_root.json", string(b))
}

func writePub(t *testing.T, dir, file string, pub crypto.PublicKey) string {
	t.Helper()
	b, err := cryptoutils.MarshalPublicKeyToPEM(pub)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, dir, file, string(b))
}

func sign(t *testing.T, ref, key string) string {
	t.Helper()
	d, err := SignDigest(context.Background(), ref, key, SignOptions{Password: testPass, Registry: plainTransports(t)})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func wantDenied(t *testing.T, dec Decision, err error, reason string) {
	t.Helper()
	t.Logf("denied: %v", err)
	if !errors.Is(err, ErrDenied) {
		t.Fatalf("want ErrDenied (%s), got %v (%+v)", reason, err, dec)
	}
	if dec.Verified || !strings.Contains(dec.Reason, reason) || !strings.Contains(err.Error(), reason) || !strings.Contains(err.Error(), `rule "`+dec.Rule+`"`) {
		t.Fatalf("want reason %q naming the rule, got %v (%+v)", reason, err, dec)
	}
}

func TestVerifyKeySignatures(t *testing.T) {
	host := startRegistry(t)
	dir := t.TempDir()
	key, pub := newKeys(t, dir, "team")
	otherKey, otherPub := newKeys(t, dir, "other")
	ctx := context.Background()

	signed, layer := pushModel(t, host, "models/llama", "v1", "llama")
	unsigned, _ := pushModel(t, host, "models/llama", "v2", "llama-2")
	if got := sign(t, host+"/models/llama:v1", key); got != signed {
		t.Fatalf("signed %s, want the digest %s", got, signed)
	}
	// Signing again with the same key keeps one signature (cosign's dupe detection).
	sign(t, signed, key)
	sd, _ := name.NewDigest(signed)
	sigs, err := classicSignatures(sd, readClient(ctx, plainTransports(t), signed))
	if err != nil || len(sigs) != 1 {
		t.Fatalf("%d signatures after signing twice (%v)", len(sigs), err)
	}

	tr := &countingTransport{}
	v := NewVerifier(keyPolicy(t, Enforce, pub), transports(t, tr.options()))

	t.Run("verified", func(t *testing.T) {
		dec, err := v.Verify(ctx, signed)
		if err != nil || !dec.Verified || dec.Authority != "key "+pub || dec.Rule != "default" {
			t.Fatalf("%+v %v", dec, err)
		}
		if tr.contains(layer.Digest.Encoded()) {
			t.Fatalf("verification read a model layer: %v", tr.reset())
		}
		// Cached: the second check makes no request.
		tr.reset()
		if dec, err := v.Verify(ctx, signed); err != nil || !dec.Verified {
			t.Fatal(dec, err)
		}
		if reqs := tr.reset(); len(reqs) != 0 {
			t.Fatalf("cached verdict still requested %v", reqs)
		}
	})
	t.Run("unsigned", func(t *testing.T) {
		dec, err := v.Verify(ctx, unsigned)
		wantDenied(t, dec, err, ReasonNoSignature)
	})
	t.Run("tag only", func(t *testing.T) {
		if _, err := v.Verify(ctx, host+"/models/llama:v1"); err == nil || errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), "not a digest reference") {
			t.Fatalf("a tag must be refused as input: %v", err)
		}
	})
	t.Run("other key", func(t *testing.T) {
		ov := NewVerifier(keyPolicy(t, Enforce, otherPub), plainTransports(t))
		dec, err := ov.Verify(ctx, signed)
		wantDenied(t, dec, err, ReasonWrongKey)
		// Either of two keys is enough.
		any := NewVerifier(keyPolicy(t, Enforce, otherPub, pub), plainTransports(t))
		if dec, err := any.Verify(ctx, signed); err != nil || !dec.Verified {
			t.Fatal(dec, err)
		}
	})
	t.Run("signed by another key only", func(t *testing.T) {
		m, _ := pushModel(t, host, "models/other", "v1", "other")
		sign(t, m, otherKey)
		dec, err := NewVerifier(keyPolicy(t, Enforce, pub), plainTransports(t)).Verify(ctx, m)
		wantDenied(t, dec, err, ReasonWrongKey)
	})
	t.Run("tag moved to an unsigned digest", func(t *testing.T) {
		m1, _ := pushModel(t, host, "models/moving", "prod", "m1")
		sign(t, host+"/models/moving:prod", key)
		m2, _ := pushModel(t, host, "models/moving", "prod", "m2")
		if m1 == m2 {
			t.Fatalf("both pushes made %s", m1)
		}
		dec, err := v.Verify(ctx, m2)
		wantDenied(t, dec, err, ReasonNoSignature)
		if dec, err := v.Verify(ctx, m1); err != nil || !dec.Verified {
			t.Fatal("the signed digest stays verified", dec, err)
		}
	})
	t.Run("signature copied to another digest", func(t *testing.T) {
		victim, _ := pushModel(t, host, "models/llama", "v3", "llama-3")
		copySignatures(t, signed, victim)
		dec, err := v.Verify(ctx, victim)
		wantDenied(t, dec, err, ReasonOtherDigest)
		if !strings.Contains(dec.Reason, strings.SplitN(signed, "@", 2)[1]) {
			t.Fatalf("reason should name the digest the signature is for: %s", dec.Reason)
		}
	})
	t.Run("warn", func(t *testing.T) {
		var logs bytes.Buffer
		wv := NewVerifier(keyPolicy(t, Warn, pub), plainTransports(t))
		wv.Log = slog.New(slog.NewTextHandler(&logs, nil))
		dec, err := wv.Verify(ctx, unsigned)
		if err != nil || dec.Verified || dec.Mode != Warn || !strings.Contains(dec.Reason, ReasonNoSignature) {
			t.Fatalf("%+v %v", dec, err)
		}
		if !strings.Contains(logs.String(), "allowed by a warn rule") || !strings.Contains(logs.String(), unsigned) {
			t.Fatalf("warn not logged: %s", logs.String())
		}
		if got := testutil.ToFloat64(wv.results.WithLabelValues("warned")); got != 1 {
			t.Fatalf("warned counter %v", got)
		}
	})
	t.Run("off and none make no request", func(t *testing.T) {
		for _, r := range []Rule{{Mode: Off}, {None: true}} {
			p, err := NewPolicy(PolicyFile{Default: r})
			if err != nil {
				t.Fatal(err)
			}
			ctr := &countingTransport{}
			dec, err := NewVerifier(p, transports(t, ctr.options())).Verify(ctx, unsigned)
			if err != nil || dec.Verified || len(ctr.reset()) != 0 {
				t.Fatalf("%+v %v", dec, err)
			}
		}
	})
	t.Run("registry down is an error, not a denial", func(t *testing.T) {
		dead := strings.Replace(signed, host, "127.0.0.1:1", 1)
		dec, err := NewVerifier(keyPolicy(t, Enforce, pub), plainTransports(t)).Verify(ctx, dead)
		if err == nil || errors.Is(err, ErrDenied) || dec.Verified {
			t.Fatalf("%+v %v", dec, err)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		if got := testutil.ToFloat64(v.results.WithLabelValues("verified")); got < 3 {
			t.Fatalf("verified counter %v", got)
		}
		if got := testutil.ToFloat64(v.results.WithLabelValues("denied")); got < 3 {
			t.Fatalf("denied counter %v", got)
		}
		if n, err := testutil.GatherAndCount(registryOf(t, v), "modelpack_signature_verifications_total"); err != nil || n != 5 {
			t.Fatalf("%d series (%v)", n, err)
		}
	})
}

// copySignatures puts the signature manifest of from under the signature tag of to, as an attacker replaying a
// valid signature would.
func copySignatures(t *testing.T, from, to string) {
	t.Helper()
	f, _ := name.NewDigest(from)
	d, _ := name.NewDigest(to)
	src, _ := ociremote.SignatureTag(f)
	dst, _ := ociremote.SignatureTag(d)
	repo, err := remote.NewRepository(f.Context().Name())
	if err != nil {
		t.Fatal(err)
	}
	repo.PlainHTTP = true
	ctx := context.Background()
	store := memory.New()
	desc, err := oras.Copy(ctx, repo, src.TagStr(), store, src.TagStr(), oras.DefaultCopyOptions)
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Tag(ctx, desc, dst.TagStr()); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyKeyless(t *testing.T) {
	host := startRegistry(t)
	dir := t.TempDir()
	ca := signingtest.NewCA(t, "test fulcio")
	rogue := signingtest.NewCA(t, "rogue")
	const issuer = "https://oidc.example.com"
	policy := func(id Identity) *Policy {
		p, err := NewPolicy(PolicyFile{Default: Rule{
			Keyless: []Identity{id}, TrustRoot: TrustRoot{CertificateChain: writeFile(t, dir, "root.pem", string(ca.RootPEM()))},
			TransparencyLog: Waive, CertificateTransparency: Waive,
		}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ctx := context.Background()
	ref, _ := pushModel(t, host, "models/keyless", "v1", "keyless")
	leaf, leafKey := ca.Leaf(t, "alice@example.com", issuer)
	signKeyless(t, ref, ca, leaf, leafKey)

	t.Run("identity match", func(t *testing.T) {
		for _, id := range []Identity{
			{Issuer: issuer, Subject: "alice@example.com"},
			{IssuerRegExp: `^https://oidc\.example\.com$`, SubjectRegExp: `@example\.com$`},
		} {
			dec, err := NewVerifier(policy(id), plainTransports(t)).Verify(ctx, ref)
			if err != nil || !dec.Verified || !strings.Contains(dec.Authority, "keyless") {
				t.Fatalf("%+v: %+v %v", id, dec, err)
			}
		}
	})
	t.Run("identity mismatch", func(t *testing.T) {
		for _, id := range []Identity{
			{Issuer: issuer, Subject: "mallory@example.com"},
			{Issuer: "https://other-issuer.example.com", Subject: "alice@example.com"},
		} {
			dec, err := NewVerifier(policy(id), plainTransports(t)).Verify(ctx, ref)
			wantDenied(t, dec, err, ReasonIdentity)
		}
	})
	t.Run("certificate from another CA", func(t *testing.T) {
		m, _ := pushModel(t, host, "models/keyless", "v2", "rogue")
		l, k := rogue.Leaf(t, "alice@example.com", issuer)
		signKeyless(t, m, rogue, l, k)
		dec, err := NewVerifier(policy(Identity{Issuer: issuer, Subject: "alice@example.com"}), plainTransports(t)).Verify(ctx, m)
		wantDenied(t, dec, err, ReasonUntrusted)
	})
	t.Run("key signature under a keyless rule", func(t *testing.T) {
		m, _ := pushModel(t, host, "models/keyless", "v3", "keyed")
		key, _ := newKeys(t, dir, "k")
		sign(t, m, key)
		dec, err := NewVerifier(policy(Identity{Issuer: issuer, Subject: "alice@example.com"}), plainTransports(t)).Verify(ctx, m)
		wantDenied(t, dec, err, ReasonIdentity)
	})
	t.Run("trusted_root.json", func(t *testing.T) {
		tr := writeTrustedRoot(t, dir, ca)
		p, err := NewPolicy(PolicyFile{Default: Rule{
			Keyless: []Identity{{Issuer: issuer, Subject: "alice@example.com"}}, TrustRoot: TrustRoot{TrustedRoot: tr},
			TransparencyLog: Waive, CertificateTransparency: Waive,
		}})
		if err != nil {
			t.Fatal(err)
		}
		if dec, err := NewVerifier(p, plainTransports(t)).Verify(ctx, ref); err != nil || !dec.Verified {
			t.Fatal(dec, err)
		}
	})
	t.Run("transparency log required", func(t *testing.T) {
		rekor := signingtest.NewKey(t)
		p, err := NewPolicy(PolicyFile{Default: Rule{
			Keyless:                 []Identity{{Issuer: issuer, Subject: "alice@example.com"}},
			TrustRoot:               TrustRoot{CertificateChain: filepath.Join(dir, "root.pem"), RekorKeys: []string{writePub(t, dir, "rekor.pub", &rekor.PublicKey)}},
			CertificateTransparency: Waive,
		}})
		if err != nil {
			t.Fatal(err)
		}
		dec, err := NewVerifier(p, plainTransports(t)).Verify(ctx, ref)
		wantDenied(t, dec, err, ReasonTlog)
		if !strings.Contains(dec.Reason, "offline") {
			t.Fatalf("reason should say the log entry is missing: %s", dec.Reason)
		}
	})
}

func TestVerifyCredentials(t *testing.T) {
	host, good := startPrivateRegistry(t)
	key, pub := newKeys(t, t.TempDir(), "k")
	ref := pushPrivateModel(t, host, "models/private", good, "private")
	ctx := context.Background()
	if _, err := SignDigest(ctx, ref, key, SignOptions{Password: testPass, Registry: plainTransports(t)}); err == nil {
		t.Fatal("signed without credentials")
	}
	if _, err := SignDigest(ctx, ref, key, SignOptions{Password: testPass, Registry: transports(t, mpremote.Options{PlainHTTP: true, Credential: good})}); err != nil {
		t.Fatal(err)
	}
	anon := NewVerifier(keyPolicy(t, Enforce, pub), plainTransports(t))
	if dec, err := anon.Verify(ctx, ref); err == nil || errors.Is(err, ErrDenied) || dec.Verified {
		t.Fatalf("anonymous check of a private repository: %+v %v", dec, err)
	}
	// The driver passes each volume's pull secret with the call.
	if dec, err := anon.Verify(mpremote.WithCredential(ctx, good), ref); err != nil || !dec.Verified {
		t.Fatal(dec, err)
	}
	if dec, err := NewVerifier(keyPolicy(t, Enforce, pub), transports(t, mpremote.Options{PlainHTTP: true, Credential: good})).Verify(ctx, ref); err != nil || !dec.Verified {
		t.Fatal(dec, err)
	}
}

func TestVerifyWatchPolicy(t *testing.T) {
	host := startRegistry(t)
	dir := t.TempDir()
	key, pub := newKeys(t, dir, "k")
	_, otherPub := newKeys(t, dir, "o")
	ref, _ := pushModel(t, host, "models/w", "v1", "w")
	sign(t, ref, key)
	path := writeFile(t, dir, "policy.yaml", "default:\n  keys: ["+pub+"]\n  transparencyLog: waive\n")
	p, err := LoadPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	v := NewVerifier(p, plainTransports(t))
	v.Log = slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go v.WatchPolicy(ctx, path, 20*time.Millisecond)

	if dec, err := v.Verify(ctx, ref); err != nil || !dec.Verified {
		t.Fatal(dec, err)
	}
	// An invalid policy is logged and the last good one stays.
	old := v.Policy().Version()
	writeFile(t, dir, "policy.yaml", "default:\n  mode: enforcing\n")
	waitFor(t, func() bool { return strings.Contains(logs.String(), "invalid policy, keeping the previous one") })
	if v.Policy().Version() != old {
		t.Fatal("invalid policy replaced the good one")
	}
	if !strings.Contains(logs.String(), `default.mode: \"enforcing\" is not valid`) {
		t.Fatalf("log does not say why: %s", logs.String())
	}
	if dec, err := v.Verify(ctx, ref); err != nil || !dec.Verified {
		t.Fatal(dec, err)
	}

	// A valid change takes effect, and the cached verdict of the old policy does not leak into it.
	writeFile(t, dir, "policy.yaml", "default:\n  keys: ["+otherPub+"]\n  transparencyLog: waive\n")
	waitFor(t, func() bool { return v.Policy().Version() != old })
	dec, err := v.Verify(ctx, ref)
	wantDenied(t, dec, err, ReasonWrongKey)
	if !strings.Contains(logs.String(), "policy reloaded") {
		t.Fatalf("reload not logged: %s", logs.String())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestVerifyOutlivesCallerDeadline(t *testing.T) {
	host := startRegistry(t)
	dir := t.TempDir()
	key, pub := newKeys(t, dir, "k")
	ref, _ := pushModel(t, host, "models/slow", "v1", "slow")
	sign(t, ref, key)
	tr := &countingTransport{delay: 150 * time.Millisecond}
	v := NewVerifier(keyPolicy(t, Enforce, pub), transports(t, tr.options()))

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := v.Verify(ctx, ref); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrDenied) {
		t.Fatalf("want the caller's deadline, got %v", err)
	}
	// The retry joins the check still under way (or finds its verdict) instead of starting over.
	if dec, err := v.Verify(context.Background(), ref); err != nil || !dec.Verified {
		t.Fatal(dec, err)
	}
	first := len(tr.reset())
	v2 := NewVerifier(keyPolicy(t, Enforce, pub), transports(t, tr.options()))
	if dec, err := v2.Verify(context.Background(), ref); err != nil || !dec.Verified {
		t.Fatal(dec, err)
	}
	if one := len(tr.reset()); first != one {
		t.Fatalf("two calls made %d requests, one check makes %d", first, one)
	}
}
