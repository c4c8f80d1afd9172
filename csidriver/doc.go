// Package csidriver is a CSI node plugin that mounts models (OCI artifacts) read-only into pods with the
// semantics of Kubernetes' native image volumes. It translates CSI calls into calls on a Backend — the node cache
// and the registry transport (package cachebackend) — and keeps what it published in a persisted state
// (package state), so it survives being killed.
//
// The layout follows kubernetes-csi/csi-driver-host-path: identityserver.go, nodeserver.go, controllerserver.go
// and server.go, which serves them over a unix socket.
//
// # Volumes
//
// Inline volumes (csi.storage.k8s.io/ephemeral=true), static PVs and dynamically provisioned PVCs (the controller
// turns StorageClass parameters into the volume context and provisions nothing) take the same attributes:
//
//	reference   required: host/repository:tag or …@sha256:… (a name without a host is on docker.io)
//	pullPolicy  Always | IfNotPresent | Never; default Always for :latest or no tag, IfNotPresent otherwise
//	filter      comma list of weights, config, docs, code, dataset: a partial view of those layer kinds
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
// ABORTED with the progress, and the retry joins the same pull.
//
// # Errors
//
//	INVALID_ARGUMENT     missing field, unknown or bad attribute, bad reference, subPath not in the model
//	ALREADY_EXISTS       the target is published with other arguments
//	ABORTED              the pull continues in the background, or another call on the target is running
//	FAILED_PRECONDITION  pullPolicy Never and absent; content the node cannot mount
//	NOT_FOUND            no such manifest (or platform in the index)
//	UNAVAILABLE          registry unreachable
//	UNAUTHENTICATED      no or wrong credentials, or a pull secret that is not a docker config
//	PERMISSION_DENIED    the registry or the signature policy refused
//	RESOURCE_EXHAUSTED   the node cache's disk is full
//
// Credentials come from the nodePublishSecretRef (a kubernetes.io/dockerconfigjson secret), then the node's
// docker config and credential helpers; mirrors come from a containerd-style hosts directory. Secrets are never
// logged or persisted.
//
// # Restarts
//
// On start, and then periodically, the driver reconciles its state with the node: volumes whose pod directory
// vanished are unmounted and released, publishes and unpublishes cut short are finished, broken mounts
// (not mounted, ENOTCONN, a vanished view) are rebuilt, holds on views no volume accounts for are released, and
// pulls that were running resume from their partial downloads.
package csidriver
