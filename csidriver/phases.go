package csidriver

import (
	"context"
	"log/slog"
	"time"

	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
)

// Phase logs: a debug record per CSI call and per backend step of a publish, each with its start and duration,
// so the time from the kubelet's first NodePublish to its answer can be split into resolve, signature check,
// pull (the cache logs each blob's first and last byte), view and mount. e2e/cluster/bench reads them. They are
// debug records: a node at the default level logs none of them.

// logCall records one CSI call (intercept).
func (d *Driver) logCall(method string, start time.Time, code codes.Code) {
	d.log.Debug("phase", "phase", "call", "method", method, "code", code.String(), "start", start, "duration", time.Since(start))
}

// phased is the Backend with its publish steps timed.
type phased struct {
	Backend
	log *slog.Logger
}

func (p phased) step(name, ref string, start time.Time, err error) {
	if !p.log.Enabled(context.Background(), slog.LevelDebug) {
		return // a warm publish's hot path: no record to build at the default level
	}
	args := []any{"phase", name, "reference", ref, "start", start, "duration", time.Since(start)}
	if err != nil {
		args = append(args, "error", err.Error())
	}
	p.log.Debug("phase", args...)
}

func (p phased) Resolve(ctx context.Context, ref string, creds Credentials) (digest.Digest, error) {
	start := time.Now()
	d, err := p.Backend.Resolve(ctx, ref, creds)
	p.step("resolve", ref, start, err)
	return d, err
}

func (p phased) Verify(ctx context.Context, ref string, dgst digest.Digest, creds Credentials) error {
	start := time.Now()
	err := p.Backend.Verify(ctx, ref, dgst, creds)
	p.step("verify", ref, start, err)
	return err
}

func (p phased) Pull(ctx context.Context, ref string, dgst digest.Digest, platform string, creds Credentials, progress func(Progress)) (digest.Digest, error) {
	start := time.Now()
	m, err := p.Backend.Pull(ctx, ref, dgst, platform, creds, progress)
	p.step("pull", ref, start, err)
	return m, err
}

func (p phased) Acquire(owner string, manifest digest.Digest, sel Selector) (string, error) {
	start := time.Now()
	dir, err := p.Backend.Acquire(owner, manifest, sel)
	p.step("view", manifest.String(), start, err)
	return dir, err
}
