// Package csidriver is a CSI node plugin that mounts models (OCI artifacts) read-only into pods with the
// semantics of Kubernetes' native image volumes. It translates CSI calls into calls on a Backend — the node cache
// and the registry transport (package cachebackend, which serves prepull too) — and keeps what it published in a
// persisted state (package state), so it survives being killed.
//
// The layout follows kubernetes-csi/csi-driver-host-path: identityserver.go, nodeserver.go, controllerserver.go
// hold the RPCs and server.go serves them over a unix socket. Behind the node RPCs: attributes.go and
// credentials.go read a request's volume context and pull secret; image.go finds or pulls what a reference names
// (the pull policy) and records it; puller.go runs and joins the pulls; tenancy.go decides who may read content
// already on the node; volumes.go records volumes and mounts them (targets.go guards target paths, mounter.go
// does the bind mounts); recovery.go reconciles the state with the node; errorcodes.go is the table below.
// readahead.go has a volume's files read into the page cache as soon as it is mounted (package readahead), since
// its pod reads them only after its sandbox and container start. phases.go logs the timing of each call and
// publish step (debug level; the pod-start bench reads it). testing.go holds the hooks tests use to stage a
// killed driver.
//
// # Volumes
//
// Inline volumes (csi.storage.k8s.io/ephemeral=true), static PVs and dynamically provisioned PVCs (the controller
// turns StorageClass parameters into the volume context and provisions nothing) take the same attributes:
//
//	reference   required: host/repository:tag or …@sha256:… (a name without a host is on docker.io)
//	pullPolicy  Always | IfNotPresent | Never; default Always for :latest or no tag, IfNotPresent otherwise
//	filter      comma list of weight, weight.config, doc, code, dataset (or weights, config, docs): a partial view of those layer kinds
//	include     comma list of path globs: a partial view of those files
//	subPath     a directory inside the model to mount instead of its root
//	platform    os/arch[/variant], the manifest to mount from a multi-platform index
//	noexec      true to mount noexec as well
//
// Keys under csi.storage.k8s.io/ (kubelet's pod information) are read, never rejected; any other key is
// INVALID_ARGUMENT with the list above. Every mount is a bind mount of the cache's shared view, remounted
// read-only, nosuid and nodev: N pods of one model and selector share one view and one copy on disk.
//
// # Pulls and deadlines
//
// Never mounts only what the node has (FAILED_PRECONDITION otherwise); IfNotPresent asks the registry only when
// the node has nothing for the reference (content prepulled under it counts: see Driver.RecordImage); Always
// resolves the reference every time, fails if the registry cannot be asked, and downloads only what the node
// lacks. Pulls run under the driver's lifetime: when the caller's deadline draws near NodePublishVolume returns
// ABORTED with the progress, and the retry joins the same pull. A pull is one per digest, platform, repository and
// credentials: publishes of the same digest from other sources run their own, which share one download in the cache
// served by whichever source delivers, so none waits on a registry its volume did not name.
//
// # Errors
//
// Every failure maps to one code (errorCodes in errorcodes.go implements this table, for the Backend's causes and
// the driver's own; INTERNAL is left for bugs of the driver and for the node failing under it: a mount or a state
// write that fails):
//
//	INVALID_ARGUMENT     missing field, unknown or bad attribute, bad reference (one carrying credentials is
//	                     refused without being repeated), subPath not in the model or over the path limits,
//	                     a target that is a symbolic link or has one among its parents, or lies in or over
//	                     the driver's own directories
//	                     → fix the volume's attributes
//	ALREADY_EXISTS       the target is published with other arguments → unpublish it first
//	ABORTED              the pull continues in the background, or another call on the target is running
//	                     → nothing: kubelet retries and joins the pull
//	FAILED_PRECONDITION  pullPolicy Never and absent → prepull it, or allow pulls;
//	                     a model file the scan rules refuse (code, malformed; named with its format and first
//	                     callable) → republish it as safetensors, or allowCode / an exception in the rule;
//	                     content the node cannot mount (unknown media type, a manifest, signature manifest or
//	                     referrers list over artifact's document limits, a layer over the extract limits
//	                     --max-extract-bytes / --max-extract-ratio) → republish it, or raise the limits;
//	                     hostile or corrupt content (bytes that do not match their digest or size, a malformed
//	                     manifest or a negative size, a tar entry escaping the model, a link escape, a device
//	                     node, a file at the model root, a name over 255 or a path over 3072 bytes, one path
//	                     claimed by two layers of a model, a redirect to a loopback or link-local address)
//	                     → republish the artifact, or fix the registry; the bytes were dropped
//	NOT_FOUND            no such manifest (or platform in the index), also in the repository a volume names for
//	                     content the node holds under another → fix the reference or platform
//	UNAVAILABLE          registry unreachable, stalled (no byte for the idle timeout, bounded retries), TLS
//	                     not trusted, a hosts.toml never valid → check the registry; trust its CA with
//	                     --ca-file or --hosts-dir, list plain-HTTP registries in --plain-http-registries
//	UNAUTHENTICATED      no or wrong credentials (the registry's 401, also when it is asked to confirm content
//	                     the node holds), or a pull secret that is not a docker config → fix the
//	                     nodePublishSecretRef or the node's docker config
//	PERMISSION_DENIED    the registry (403, likewise) or the signature policy refused → grant access, or sign
//	                     the artifact as the policy requires
//	RESOURCE_EXHAUSTED   the node cache's disk is full → free space or lower --cache-max-size
//	INTERNAL             a bug of the driver, or the node failing a mount or a state write → report it
//
// Credentials come from the nodePublishSecretRef (a kubernetes.io/dockerconfigjson secret), then the node's
// docker config and credential helpers; mirrors come from a containerd-style hosts directory. Secrets are never
// logged or persisted.
//
// # Tenants
//
// The cache is shared, models are not (tenancy.go, package access): content on the node is mounted for a volume
// only when its registry served that digest, under the host and repository the volume names, to the volume's
// credential (its pull secret's, by a keyed hash; the node's; or none, for public content), or when
// Options.AccessPolicy (kubelet's imagePullCredentialsVerificationPolicy) exempts prepulled content. Any other
// volume is checked with the registry first, with its own credentials and a manifest request; the registry's
// refusal is the volume's error, with the codes above, and nothing is mounted.
//
// # Restarts
//
// On start, and then periodically, the driver reconciles its state with the node: volumes whose pod directory
// vanished are unmounted and released, publishes and unpublishes cut short are finished, broken mounts
// (not mounted, ENOTCONN, a vanished view) are rebuilt, holds on views no volume accounts for are released, and
// pulls that were running resume from their partial downloads.
package csidriver
