package csidriver

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	humanize "github.com/dustin/go-humanize"
	digest "github.com/opencontainers/go-digest"
)

// pullJob is one pull running under the driver's lifetime. Every publish that needs the same content from the same
// source (repository and credentials) waits on the same job, so a kubelet retry after ABORTED joins the pull
// instead of starting over. Publishes of one digest from different sources run their own jobs, which the cache
// joins into one download fed by every source (cache.Pull): a job never waits on a source its caller did not name.
type pullJob struct {
	key      string
	ref      string
	digest   digest.Digest
	platform string
	started  time.Time
	done     chan struct{}
	progress atomic.Pointer[Progress]
	// manifest and err are set before done is closed.
	manifest digest.Digest
	err      error
}

// stateKey is the job's record in the persisted state: its key without the credentials' hash, which stays in
// memory.
func (j *pullJob) stateKey() string { return j.digest.String() + "|" + j.platform + "|" + j.ref }

func (j *pullJob) describe() string {
	p := j.progress.Load()
	elapsed := time.Since(j.started).Round(time.Second)
	if p == nil || p.TotalBytes == 0 {
		return fmt.Sprintf("pull of %s (%s) in progress for %s", j.ref, j.digest, elapsed)
	}
	msg := fmt.Sprintf("pull of %s (%s) in progress for %s: %s of %s (%.0f%%)",
		j.ref, j.digest, elapsed, humanize.IBytes(uint64(p.DoneBytes)), humanize.IBytes(uint64(p.TotalBytes)), 100*float64(p.DoneBytes)/float64(p.TotalBytes))
	if p.TotalLayers > 0 {
		msg += fmt.Sprintf(", %d/%d layers", p.DoneLayers, p.TotalLayers)
	}
	return msg
}

// puller runs and joins pulls.
type puller struct {
	ctx     context.Context
	backend Backend
	log     *slog.Logger
	m       *metrics
	// started and finished persist the pull so a restarted driver resumes it and records the image it produced.
	started  func(j *pullJob)
	finished func(j *pullJob)

	mu   sync.Mutex
	jobs map[string]*pullJob
	wg   sync.WaitGroup
}

// pullKey names the pull of dgst for platform from ref's repository with creds. The credentials are hashed so a
// caller with other (or no) credentials never waits on, or is answered by, a pull it could not have made.
func pullKey(ref string, dgst digest.Digest, platform string, creds Credentials) string {
	repo := ref
	if r, err := ParseReference(ref); err == nil {
		repo = r.Registry + "/" + r.Repository
	}
	return dgst.String() + "|" + platform + "|" + repo + "|" + creds.Key()
}

// start returns the running pull of dgst for platform from ref's source, starting one if there is none; joined
// tells which.
func (p *puller) start(ref string, dgst digest.Digest, platform string, creds Credentials) (job *pullJob, joined bool) {
	key := pullKey(ref, dgst, platform, creds)
	p.mu.Lock()
	defer p.mu.Unlock()
	if j, ok := p.jobs[key]; ok {
		return j, true
	}
	j := &pullJob{key: key, ref: ref, digest: dgst, platform: platform, started: time.Now(), done: make(chan struct{})}
	p.jobs[key] = j
	p.wg.Add(1)
	p.m.pullsInFlight.Inc()
	if p.started != nil {
		p.started(j)
	}
	go p.run(j, creds)
	return j, false
}

func (p *puller) run(j *pullJob, creds Credentials) {
	defer p.wg.Done()
	log := p.log.With("reference", j.ref, "digest", j.digest.String(), "platform", j.platform)
	log.Info("pull started")
	var (
		mu       sync.Mutex
		lastDone int64
	)
	manifest, err := p.backend.Pull(p.ctx, j.ref, j.digest, j.platform, creds, func(pr Progress) {
		mu.Lock()
		defer mu.Unlock()
		if d := pr.DoneBytes - lastDone; d > 0 {
			p.m.pullBytes.Add(float64(d))
			lastDone = pr.DoneBytes
		}
		j.progress.Store(&pr)
	})
	j.manifest, j.err = manifest, err
	elapsed := time.Since(j.started)
	p.m.pullDuration.Observe(elapsed.Seconds())
	p.m.pullsInFlight.Dec()
	if err != nil {
		code := codeOf(err)
		p.m.pulls.WithLabelValues(code.String()).Inc()
		p.m.pullErrors.WithLabelValues(code.String()).Inc()
		log.Warn("pull failed", "code", code.String(), "error", err.Error(), "duration", elapsed)
	} else {
		p.m.pulls.WithLabelValues("ok").Inc()
		log.Info("pull finished", "manifest", manifest.String(), "duration", elapsed)
	}
	// A driver shutting down leaves the pull recorded so the next one resumes it.
	if p.finished != nil && !(err != nil && p.ctx.Err() != nil) {
		p.finished(j)
	}
	p.mu.Lock()
	delete(p.jobs, j.key)
	p.mu.Unlock()
	close(j.done)
}

// wait waits for the job until ctx's deadline draws near, then gives up with ABORTED and the progress; the pull
// goes on. A call without a deadline waits for the pull to end.
func (p *puller) wait(ctx context.Context, j *pullJob) (digest.Digest, error) {
	bctx, cancel := withBudget(ctx)
	defer cancel()
	select {
	case <-j.done:
		return j.manifest, j.err
	case <-bctx.Done():
	}
	return "", fail(errRetry, "%s; the pull continues in the background and a retry will join it", j.describe())
}

// withBudget bounds ctx by the wait budget of its deadline.
func withBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, waitBudget(time.Until(dl)))
}

// waitBudget keeps a margin before the caller's deadline for the answer to reach it in time and, when the pull
// ends just before the budget does, for the view and the mount: a quarter of the time left but at least a second
// (or half of a shorter deadline), and at most 5 s (kubelet allows about 2 minutes).
func waitBudget(left time.Duration) time.Duration {
	margin := min(max(left/4, min(left/2, time.Second)), 5*time.Second)
	return max(left-margin, 0)
}

// inFlight is the number of running pulls.
func (p *puller) inFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.jobs)
}
