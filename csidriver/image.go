package csidriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelpack/modelpack/csidriver/access"
	"github.com/modelpack/modelpack/csidriver/state"
)

// image is what a volume's reference came to on this node.
type image struct {
	Digest   string // top-level manifest or index
	Manifest string // the manifest mounted
	// release ends the publish's hold on the content (see holdImage); nil for none.
	release func()
}

// done releases img's hold, if it has one.
func (img image) done() {
	if img.release != nil {
		img.release()
	}
}

// errGone is content the cache let go between its pull and the publish's hold on it: the publish pulls again.
var errGone = errors.New("the content left the cache before it could be held")

// holdImage keeps img's content from GC for the publish, from the moment it is found until its view is acquired
// (the caller calls done): a publish never finds its model evicted under it. False: it is no longer complete.
func (d *Driver) holdImage(img image) (image, bool) {
	release, err := d.backend.Hold(digest.Digest(img.Manifest))
	if err != nil {
		return image{}, false
	}
	img.release = release
	return img, true
}

func imageKey(ref, platform string) string { return ref + "|" + platform }

// ensureImage finds or pulls the content a volume names and checks it against the node's trust policy.
func (d *Driver) ensureImage(ctx context.Context, a *Attributes, creds Credentials, namespace string, log *slog.Logger) (image, error) {
	creds = d.podCredentials(creds)
	img, verified, err := d.findImage(ctx, a, creds, namespace, log)
	for try := 0; errors.Is(err, errGone) && try < 3; try++ {
		img, verified, err = d.findImage(ctx, a, creds, namespace, log)
	}
	if errors.Is(err, errGone) {
		return image{}, fail(errRetry, "%s was evicted from the node's cache three times before it could be mounted: the cache is too small for the models in use (--cache-max-size)", a.Reference)
	}
	if err != nil {
		return image{}, err
	}
	// Content already on the node is checked too: the policy may have changed since it was pulled, and the same
	// digest may have come from a repository under another rule.
	if !verified {
		if err := d.backend.Verify(ctx, a.Reference, digest.Digest(img.Digest), creds); err != nil {
			img.done()
			return image{}, toStatus(err, "verify %s", a.Reference)
		}
	}
	// What loading the files would run, pulled just now or long ago, under the rule of this name: scanned once
	// per blob, so a warm publish looks the answer up.
	if err := d.backend.Screen(ctx, a.Reference, digest.Digest(img.Digest), digest.Digest(img.Manifest)); err != nil {
		img.done()
		return image{}, toStatus(err, "scan %s", a.Reference)
	}
	return img, nil
}

// findImage applies the pull policy: it finds the content on the node or pulls it, verifying a digest before any
// of its layers is pulled (verified reports that it did). Kubernetes' meanings: Never uses only what the node
// has; IfNotPresent asks the registry only when the node has nothing for the reference; Always asks the registry
// every time and fails if that fails, but downloads nothing the node already has. Content on the node is shared
// only as the access records allow (tenancy.go): a caller they do not vouch for is checked with the registry
// first — under Never with a manifest request for the digest the node holds, under IfNotPresent by resolving
// the reference as Always does.
func (d *Driver) findImage(ctx context.Context, a *Attributes, creds Credentials, namespace string, log *slog.Logger) (img image, verified bool, err error) {
	who, err := d.identify(ctx, a, creds, namespace)
	if err != nil {
		return image{}, false, err
	}
	local, haveLocal := d.localImage(a)
	keepLocal := false
	defer func() {
		if !keepLocal {
			local.done()
		}
	}()
	if haveLocal && a.PullPolicy != PullAlways {
		key := accessKey(a, local.Digest)
		if d.allowed(key, who) {
			keepLocal = true
			return local, false, nil
		}
		if a.PullPolicy == PullNever {
			if err := d.checkAccess(ctx, key, local, creds, who); err != nil {
				return image{}, false, err
			}
			keepLocal = true
			return local, false, nil
		}
	}
	if a.PullPolicy == PullNever {
		return image{}, false, fail(errPrecondition, "pullPolicy is Never and %s is not on this node", a.Reference)
	}
	// A registry too slow to answer within the budget gets the same ABORTED as a slow pull, in time for the
	// caller to read it.
	rctx, cancel := withBudget(ctx)
	dgst, err := d.backend.Resolve(rctx, a.Reference, creds)
	outOfTime := rctx.Err() != nil
	cancel()
	if err != nil {
		if outOfTime {
			return image{}, false, fail(errRetry, "resolving %s did not finish before the deadline: %v", a.Reference, err)
		}
		if haveLocal {
			return image{}, false, refusal(err, accessKey(a, local.Digest), who)
		}
		return image{}, false, toStatus(err, "resolve %s", a.Reference)
	}
	if err := d.backend.Verify(ctx, a.Reference, dgst, creds); err != nil {
		return image{}, false, toStatus(err, "verify %s", a.Reference)
	}
	// The registry has just served dgst's manifest under this name to this caller. Content of dgst the node holds,
	// under whatever name it came, is the caller's to read once the registry serves its blobs too, as a registry
	// mounts a blob across repositories only for a caller who may read it.
	key := accessKey(a, dgst.String())
	if img, ok := d.knownImage(dgst, a.Platform); ok {
		if err := d.checkAccess(ctx, key, img, creds, who); err != nil {
			img.done()
			return image{}, false, err
		}
		if err := d.recordImage(a.Reference, a.Platform, img); err != nil {
			img.done()
			return image{}, false, fail(errNode, "record image: %v", err)
		}
		return img, true, nil
	}
	if err := d.access.Intend(key, who); err != nil {
		return image{}, false, fail(errNode, "record pull of %s: %v", key, err)
	}
	job, joined := d.pulls.start(a.Reference, dgst, a.Platform, creds)
	if joined {
		log.Info("joining pull under way", "digest", dgst.String())
	}
	manifest, err := d.pulls.wait(ctx, job)
	if err != nil {
		if status.Code(err) != codes.Aborted {
			if aerr := d.access.Abandon(key, who); aerr != nil {
				log.Error("forget pull intent", "error", aerr.Error())
			}
		}
		return image{}, false, toStatus(err, "pull %s", a.Reference)
	}
	if err := d.grant(ctx, key, who, access.ViaPull); err != nil {
		return image{}, false, err
	}
	img, ok := d.holdImage(image{Digest: dgst.String(), Manifest: manifest.String()})
	if !ok {
		return image{}, false, errGone
	}
	return img, true, nil
}

// localImage is what the reference names on this node, if that content is complete in the cache, held (see
// holdImage): for a tag, what it last resolved to here; for a digest, that digest's content under whatever name it
// came. Whether the caller may read it under this name is the access records' to say.
func (d *Driver) localImage(a *Attributes) (image, bool) {
	if rec, ok := d.state.Snapshot().Images[imageKey(a.Reference, a.Platform)]; ok {
		if img, ok := d.holdImage(image{Digest: rec.Digest, Manifest: rec.Manifest}); ok {
			return img, true
		}
	}
	if a.IsDigest() {
		dgst, _ := a.ref.Digest()
		if img, ok := d.knownImage(dgst, a.Platform); ok {
			return img, true
		}
		if a.Platform == "" {
			if m, ok := d.backend.Local(dgst); ok {
				return d.holdImage(image{Digest: dgst.String(), Manifest: m.String()})
			}
		}
	}
	return image{}, false
}

// knownImage finds content already pulled for dgst and platform under any reference, held. Only callers the
// registry serves it to (Backend.Prove), or whom the access records vouch for, may be handed it.
func (d *Driver) knownImage(dgst digest.Digest, platform string) (image, bool) {
	for _, rec := range d.state.Snapshot().Images {
		if rec.Digest == dgst.String() && rec.Platform == platform {
			if img, ok := d.holdImage(image{Digest: rec.Digest, Manifest: rec.Manifest}); ok {
				return img, true
			}
		}
	}
	return image{}, false
}

// has reports whether a recorded manifest is still complete in the cache.
func (d *Driver) has(manifest string) bool {
	_, ok := d.backend.Local(digest.Digest(manifest))
	return ok
}

// RecordImage records, as a pull by the driver does, that ref resolved to dgst whose manifest for platform (""
// for the node's) is in the cache: content another feature pulled into the cache (prepull) then counts as present
// for pullPolicy IfNotPresent and Never. ref is normalised as volume attributes are, so its record is the one a
// publish looks up. It holds for as long as the cache keeps the manifest, whether or not the caller still wants it.
func (d *Driver) RecordImage(ref, platform string, dgst, manifest digest.Digest) error {
	r, err := normalReference(ref)
	if err != nil {
		return fmt.Errorf("reference %q: %w", ref, err)
	}
	if platform != "" && !platformRE.MatchString(platform) {
		return fmt.Errorf("platform %q is not os/arch[/variant]", platform)
	}
	for _, dg := range []digest.Digest{dgst, manifest} {
		if err := dg.Validate(); err != nil {
			return fmt.Errorf("digest %q: %w", dg, err)
		}
	}
	if err := d.recordImage(r.String(), platform, image{Digest: dgst.String(), Manifest: manifest.String()}); err != nil {
		return err
	}
	// A prepull reads with the node's credentials for no pod in particular: kubelet's preloaded images, which the
	// access policy exempts from verification or not.
	k := access.Key{Host: r.Registry, Repository: r.Repository, Digest: dgst}
	if d.access.Has(k, access.Identity{Kind: access.Prepull}) {
		return nil
	}
	return d.access.Add(k, access.Identity{Kind: access.Prepull}, access.ViaPrepull)
}

func (d *Driver) recordImage(ref, platform string, img image) error {
	return d.state.Update(func(st *state.State) error {
		st.Images[imageKey(ref, platform)] = state.Image{
			Reference: ref, Platform: platform, Digest: img.Digest, Manifest: img.Manifest, ResolvedAt: time.Now().UTC(),
		}
		return nil
	})
}

func (d *Driver) recordPullStarted(j *pullJob) {
	err := d.state.Update(func(st *state.State) error {
		st.Pulls[j.stateKey()] = state.Pull{Reference: j.ref, Platform: j.platform, Digest: j.digest.String(), StartedAt: j.started.UTC()}
		return nil
	})
	if err != nil {
		d.log.Error("record pull", "error", err.Error())
	}
}

func (d *Driver) recordPullFinished(j *pullJob) {
	err := d.state.Update(func(st *state.State) error {
		// By what it records, not its key: a record of an earlier version's key goes too.
		for k, rec := range st.Pulls {
			if rec.Reference == j.ref && rec.Platform == j.platform && rec.Digest == j.digest.String() {
				delete(st.Pulls, k)
			}
		}
		if j.err == nil {
			st.Images[imageKey(j.ref, j.platform)] = state.Image{
				Reference: j.ref, Platform: j.platform, Digest: j.digest.String(), Manifest: j.manifest.String(), ResolvedAt: time.Now().UTC(),
			}
		}
		return nil
	})
	if err != nil {
		d.log.Error("record pull", "error", err.Error())
	}
}
