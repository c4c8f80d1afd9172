package csidriver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelpack/modelpack/csidriver/access"
	"github.com/modelpack/modelpack/internal/testenv"
)

const privateRef = "registry.example.com/models/private:v1"

// tenants is a node with a private model and its callers, each a pull secret the fake registry knows (or not).
type tenants struct {
	t      *testing.T
	dir    string
	b      *fakeBackend
	d      *Driver
	node   csi.NodeClient
	stop   func()
	pod    int
	digest string
}

var (
	secretA       = `{"auths":{"registry.example.com":{"auth":"YTpwYXNzd29yZC1h"}}}`
	secretB       = `{"auths":{"registry.example.com":{"auth":"YjpwYXNzd29yZC1i"}}}`
	secretWrong   = `{"auths":{"registry.example.com":{"auth":"YTp3cm9uZw=="}}}`
	secretBanned  = `{"auths":{"registry.example.com":{"auth":"YzpiYW5uZWQ="}}}`
	secretRotated = `{"auths":{"registry.example.com":{"auth":"YTpwYXNzd29yZC1hMg=="}}}`
)

func newTenants(t *testing.T, set func(*Options)) *tenants {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cleanupMounts(t, dir)
	b := newFakeBackend(filepath.Join(dir, "cache"))
	tn := &tenants{t: t, dir: dir, b: b}
	tn.digest = b.push(privateRef, "private").String()
	b.push("registry.example.com/models/other:v1", "other")
	b.acl = map[string][]string{"registry.example.com/models/private": {secretA, secretB, secretBanned}}
	b.forbid = map[string]bool{secretBanned: true}
	b.unreachable = map[string]bool{"attacker.invalid": true}
	tn.start(set)
	return tn
}

func (tn *tenants) start(set func(*Options)) {
	if set == nil {
		set = func(*Options) {}
	}
	rd, sock := startDriverWith(tn.t, tn.dir, tn.b, set)
	tn.d, tn.node, tn.stop = rd.d, nodeClient(tn.t, sock), rd.stop
}

// recordPrepull is what the prepull API does after its pull (with the node's credentials) of the private model.
func (tn *tenants) recordPrepull(t *testing.T) {
	t.Helper()
	d := digest.Digest(tn.digest)
	if _, err := tn.b.Pull(context.Background(), privateRef, d, "", Credentials{}, func(Progress) {}); err != nil {
		t.Fatal(err)
	}
	if err := tn.d.RecordImage(privateRef, "", d, d); err != nil {
		t.Fatal(err)
	}
}

// publish mounts ref for a new pod with the given pull policy and secret, reads it, and unpublishes it.
func (tn *tenants) publish(ref, policy, secret string) error {
	tn.t.Helper()
	tn.pod++
	target := podTarget(tn.t, tn.dir, fmt.Sprint("pod-", tn.pod))
	attrs := map[string]string{AttrReference: ref, keyPodNamespace: fmt.Sprint("ns-", tn.pod)}
	if policy != "" {
		attrs[AttrPullPolicy] = policy
	}
	req := testenv.PublishRequest(fmt.Sprint("vol-", tn.pod), target, attrs)
	if secret != "" {
		req.Secrets = map[string]string{dockerConfigKey: secret}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := tn.node.NodePublishVolume(ctx, req); err != nil {
		if isMounted(tn.t, target) {
			tn.t.Fatalf("a refused publish left %s mounted", target)
		}
		return err
	}
	if _, err := os.ReadFile(filepath.Join(target, "model.safetensors")); err != nil {
		tn.t.Fatal(err)
	}
	if _, err := tn.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: target}); err != nil {
		tn.t.Fatal(err)
	}
	return nil
}

func (tn *tenants) must(ref, policy, secret string) {
	tn.t.Helper()
	if err := tn.publish(ref, policy, secret); err != nil {
		tn.t.Fatalf("%s (%s): %v", ref, policy, err)
	}
}

func (tn *tenants) refused(ref, policy, secret string, code codes.Code, contains string) {
	tn.t.Helper()
	err := tn.publish(ref, policy, secret)
	if status.Code(err) != code {
		tn.t.Fatalf("%s (%s): got %v, want %v", ref, policy, err, code)
	}
	wantCode(tn.t, err, code, contains)
}

// Every caller of content the node holds is one the registry serves it to: the first tenant pulls it; no, wrong
// and forbidden credentials are refused under every pull policy, by tag and by digest, with nothing mounted;
// another tenant with valid credentials is let in after one manifest request and no pull; the same digest named
// under another repository or an unreachable host is never served from the node.
func TestCachedContentOnlyForCallersTheRegistryServes(t *testing.T) {
	tn := newTenants(t, nil)
	byDigest := "registry.example.com/models/private@" + tn.digest
	tn.must(privateRef, "IfNotPresent", secretA)
	if n := tn.b.pulls.Load(); n != 1 {
		t.Fatalf("%d pulls, want 1", n)
	}
	for _, ref := range []string{privateRef, byDigest} {
		for _, policy := range []string{"IfNotPresent", "Never", "Always"} {
			tn.refused(ref, policy, "", codes.Unauthenticated, "no pull secret for this registry")
			tn.refused(ref, policy, secretWrong, codes.Unauthenticated, "ns-")
			tn.refused(ref, policy, secretBanned, codes.PermissionDenied, "")
		}
	}
	// The refusal for content on the node says so, and why.
	tn.refused(privateRef, "Never", "", codes.Unauthenticated, "is on this node, but it is shared only with callers its registry serves it to")

	// A second tenant with its own valid credentials: one manifest request each time it is not on record, no pull.
	before := tn.b.resolves.Load()
	tn.must(byDigest, "Never", secretB)
	if n := tn.b.resolves.Load() - before; n != 1 {
		t.Fatalf("the second tenant's first publish made %d registry requests, want 1 manifest check", n)
	}
	before = tn.b.resolves.Load()
	for _, ref := range []string{privateRef, byDigest} {
		tn.must(ref, "IfNotPresent", secretB)
		tn.must(ref, "Never", secretB)
		tn.must(ref, "IfNotPresent", secretA)
	}
	if n := tn.b.resolves.Load() - before; n != 0 {
		t.Fatalf("warm publishes of recorded tenants asked the registry %d times", n)
	}
	tn.must(privateRef, "Always", secretB)
	if n := tn.b.pulls.Load(); n != 1 {
		t.Fatalf("%d pulls, want the first tenant's only", n)
	}

	// The same digest under another name: that registry must serve it, whoever asks.
	for _, policy := range []string{"IfNotPresent", "Never", "Always"} {
		tn.refused("registry.example.com/models/other@"+tn.digest, policy, secretA, codes.NotFound, "")
		tn.refused("attacker.invalid/models/private@"+tn.digest, policy, secretA, codes.Unavailable, "")
		tn.refused("attacker.invalid/models/private@"+tn.digest, policy, "", codes.Unavailable, "")
	}
}

// The records survive a restart: recorded tenants publish without asking the registry, others are still checked.
// A rotated credential matches no record and is checked (and recorded) once.
func TestAccessRecordsSurviveRestartAndRotation(t *testing.T) {
	tn := newTenants(t, nil)
	tn.must(privateRef, "IfNotPresent", secretA)
	tn.stop()
	tn.start(nil)
	before := tn.b.resolves.Load()
	tn.must(privateRef, "Never", secretA)
	if n := tn.b.resolves.Load() - before; n != 0 {
		t.Fatalf("a recorded tenant asked the registry %d times after a restart", n)
	}
	tn.refused(privateRef, "Never", "", codes.Unauthenticated, "")

	// The registry now knows the tenant by its new password only.
	tn.b.mu.Lock()
	tn.b.acl["registry.example.com/models/private"] = []string{secretRotated}
	tn.b.mu.Unlock()
	before = tn.b.resolves.Load()
	tn.must(privateRef, "Never", secretRotated)
	tn.must(privateRef, "Never", secretRotated)
	if n := tn.b.resolves.Load() - before; n != 1 {
		t.Fatalf("a rotated credential made %d registry requests, want one check then none", n)
	}
	tn.refused(privateRef, "Always", secretA, codes.Unauthenticated, "")
}

// Prepulled content (the node's credentials, for no pod in particular) is exempt by default and checked per
// caller under AlwaysVerify; the allowlist exempts the names it matches only.
func TestPrepulledContentFollowsTheVerificationPolicy(t *testing.T) {
	for _, tc := range []struct {
		mode      access.Mode
		allowlist []string
		anyoneMay bool
	}{
		{access.NeverVerifyPreloadedImages, nil, true},
		{access.AlwaysVerify, nil, false},
		{access.NeverVerifyAllowlistedImages, []string{"registry.example.com/models/*"}, true},
		{access.NeverVerifyAllowlistedImages, []string{"registry.example.com/public/*"}, false},
		{access.NeverVerify, nil, true},
	} {
		t.Run(fmt.Sprint(tc.mode, tc.allowlist), func(t *testing.T) {
			p, err := access.NewPolicy(string(tc.mode), tc.allowlist)
			if err != nil {
				t.Fatal(err)
			}
			tn := newTenants(t, func(o *Options) { o.AccessPolicy = p })
			tn.recordPrepull(t)
			before := tn.b.resolves.Load()
			err = tn.publish(privateRef, "IfNotPresent", "")
			if tc.anyoneMay {
				if err != nil || tn.b.resolves.Load() != before {
					t.Fatalf("prepulled content: %v, %d registry requests; want it mounted without any", err, tn.b.resolves.Load()-before)
				}
				return
			}
			wantCode(t, err, codes.Unauthenticated, "")
			tn.must(privateRef, "Never", secretA)
			if n := tn.b.pulls.Load(); n != 1 {
				t.Fatalf("%d pulls, want the prepull's only", n)
			}
		})
	}
}

// A pull cut short by the driver stopping leaves an intent, never a record: after the restart the pull resumes
// with the node's credentials and completes, yet neither a caller without a secret nor the tenant that started
// it gets the content without the registry's word.
func TestInterruptedPullGrantsNothing(t *testing.T) {
	tn := newTenants(t, nil)
	tn.b.gate = make(chan struct{})
	target := podTarget(t, tn.dir, "cut")
	req := testenv.PublishRequest("cut", target, map[string]string{AttrReference: privateRef})
	req.Secrets = map[string]string{dockerConfigKey: secretA}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := tn.node.NodePublishVolume(ctx, req)
	cancel()
	wantCode(t, err, codes.Aborted, "in progress")
	tn.stop()
	close(tn.b.gate)
	tn.start(nil)
	tn.d.Wait()
	if n := tn.b.pulls.Load(); n != 2 {
		t.Fatalf("%d pulls, want the interrupted one and its resumption", n)
	}
	tn.refused(privateRef, "Never", "", codes.Unauthenticated, "")
	before := tn.b.resolves.Load()
	tn.must(privateRef, "Never", secretA)
	if n := tn.b.resolves.Load() - before; n != 1 {
		t.Fatalf("the tenant's publish after the restart made %d registry requests, want 1 check", n)
	}
}
