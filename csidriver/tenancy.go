package csidriver

import (
	"context"

	digest "github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/csidriver/access"
)

// The node cache is shared by every pod on the node, so content on disk is handed to a publish only when the
// access records (package access) say its caller may read it under the name it gives: the registry served that
// digest, under that host and repository, to the caller's credential (or to anyone), or the policy exempts it.
// Otherwise the registry is asked first, with the caller's credential, whether it serves the manifest and every
// blob of it (HEADs, nothing fetched: Backend.Prove), and a success is recorded. This file is that seam;
// findImage calls it.
//
// Whose credentials a pod presents: its volume's pull secret, or nothing. The node's own credentials
// (--registry-config) are the node's: its prepulls read with them, and the policy says whether what they pulled
// is open to pods (NeverVerifyPreloadedImages: yes; NeverVerifyAllowlistedImages: for allowlisted names;
// AlwaysVerify: no). Only under NeverVerify, which trusts every pod of the node alike, do pods without a pull
// secret read with the node's credentials. So a wrong secret never gets more than no secret, and no publish opens
// to a later one anything but what that later caller's own credential (or anonymity) is served.

// podCredentials are the credentials a pod's publish presents to registries under the policy.
func (d *Driver) podCredentials(creds Credentials) Credentials {
	creds.OwnOnly = d.opts.AccessPolicy.Mode != access.NeverVerify
	return creds
}

// accessKey is content as ref's registry serves it.
func accessKey(a *Attributes, dgst string) access.Key {
	return access.Key{Host: a.ref.Registry, Repository: a.ref.Repository, Digest: digest.Digest(dgst)}
}

// identify is who a publish with creds is to the registry the reference names: the volume's pull secret's
// credential for that host (by its keyed hash), or, without one, the node's credentials or none. Which of the
// latter two is decided only when a record is made (see grant): the records treat them alike.
func (d *Driver) identify(ctx context.Context, a *Attributes, creds Credentials, namespace string) (access.Identity, error) {
	material, err := d.backend.VolumeCredential(ctx, a.ref.Registry, creds)
	if err != nil {
		return access.Identity{}, toStatus(err, "pull secret for %s", a.ref.Registry)
	}
	if material == nil {
		if creds.OwnOnly {
			return access.Identity{Kind: access.Anonymous, Namespace: namespace}, nil
		}
		return access.Identity{Kind: access.Node, Namespace: namespace}, nil
	}
	return access.Identity{Kind: access.Secret, Hash: d.access.HashCredential(a.ref.Registry, material), Namespace: namespace}, nil
}

// allowed reports whether who may read k's content, which the node holds, without asking the registry.
func (d *Driver) allowed(k access.Key, who access.Identity) bool {
	return d.opts.AccessPolicy.Allows(k, d.access.Records(k), who)
}

// grant records that the registry served k to who. A caller without a pull secret for the host is recorded as
// the node's credentials or, when the node has none for it, as anonymous (the content is public).
func (d *Driver) grant(ctx context.Context, k access.Key, who access.Identity, via access.Via) error {
	if who.Kind == access.Node {
		// Either record opens the content to every caller: one is enough, and the node's docker config (maybe a
		// credential helper) need not be asked again.
		if d.access.Has(k, access.Identity{Kind: access.Node}) || d.access.Has(k, access.Identity{Kind: access.Anonymous}) {
			return nil
		}
		has, err := d.backend.NodeCredential(ctx, k.Host)
		if err != nil {
			return fail(errNode, "node credentials for %s: %v", k.Host, err)
		}
		who.Kind = access.Anonymous
		if has {
			who.Kind = access.Node
		}
	}
	if d.access.Has(k, who) {
		return nil
	}
	if err := d.access.Add(k, who, via); err != nil {
		return fail(errNode, "record access to %s: %v", k, err)
	}
	d.log.Info("access recorded", "content", k.String(), "credential", who.Kind, "namespace", who.Namespace, "via", via)
	return nil
}

// checkAccess asks k's registry, with the caller's credentials, whether it serves img (the manifest and every
// blob, HEADs only) and records the answer when it does. A refusal names the content, the credential and the
// registry's reason.
func (d *Driver) checkAccess(ctx context.Context, k access.Key, img image, creds Credentials, who access.Identity) error {
	rctx, cancel := withBudget(ctx)
	err := d.backend.Prove(rctx, k.Name(), k.Digest, digest.Digest(img.Manifest), creds)
	outOfTime := rctx.Err() != nil
	cancel()
	if err != nil {
		if outOfTime {
			return fail(errRetry, "checking access to %s did not finish before the deadline: %v", k, err)
		}
		return refusal(err, k, who)
	}
	return d.grant(ctx, k, who, access.ViaCheck)
}

// refusal is the error of a publish the registry did not confirm for content the node holds: the pod's
// FailedMount event says what was asked, for whom, and why it failed.
func refusal(err error, k access.Key, who access.Identity) error {
	return toStatus(err, "%s is on this node, but it is shared only with callers its registry serves it to, and the check for %s failed", k, who)
}
