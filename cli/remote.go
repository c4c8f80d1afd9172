package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/pack"
	"github.com/modelpack/modelpack/artifact/remote"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote/auth"
)

// remoteFlags are the connection flags of every command that talks to a registry.
type remoteFlags struct {
	g                  *Globals // for --debug
	opts               remote.Options
	username, password string
}

func (f *remoteFlags) register(fs *pflag.FlagSet) {
	f.registerConnection(fs)
	fs.IntVar(&f.opts.Concurrency, "concurrency", remote.DefaultConcurrency(), "blobs moved at once")
}

// registerConnection adds the flags that say how to reach the registry, credentials included.
func (f *remoteFlags) registerConnection(fs *pflag.FlagSet) {
	f.registerTransport(fs)
	registerCredentials(fs, &f.username, &f.password)
}

// registerCredentials adds -u/--username and -p/--password, as oras accepts them on every registry command.
func registerCredentials(fs *pflag.FlagSet, user, password *string) {
	fs.StringVarP(user, "username", "u", "", "registry user name (default: the docker config's credentials)")
	fs.StringVarP(password, "password", "p", "", "registry password or token (with --username; flags show in ps, prefer modelpack login)")
}

// explicitCredential is the credential -u/-p give, for every host; nil without them.
func explicitCredential(user, password string) auth.CredentialFunc {
	if user == "" && password == "" {
		return nil
	}
	cred := auth.Credential{Username: user, Password: password}
	return func(context.Context, string) (auth.Credential, error) { return cred, nil }
}

// registerTransport adds the flags that say how to reach the registry: TLS, plain HTTP, mirrors.
func (f *remoteFlags) registerTransport(fs *pflag.FlagSet) {
	fs.StringVar(&f.opts.RegistryConfig, "registry-config", os.Getenv("MODELPACK_REGISTRY_CONFIG"),
		"docker config.json holding registry credentials (default: $DOCKER_CONFIG/config.json or ~/.docker/config.json)")
	fs.StringVar(&f.opts.CAFile, "ca-file", "", "PEM CA bundle to trust for the registry, besides the system roots")
	fs.StringVar(&f.opts.CertFile, "cert-file", "", "client certificate (PEM) for mutual TLS")
	fs.StringVar(&f.opts.KeyFile, "key-file", "", "client certificate key (PEM) for mutual TLS")
	fs.BoolVar(&f.opts.Insecure, "insecure", false, "skip verification of the registry's TLS certificate")
	fs.BoolVar(&f.opts.PlainHTTP, "plain-http", false, "talk plain HTTP, not HTTPS, to the registry (the default for localhost, 127.0.0.0/8 and [::1] unless --ca-file, --cert-file or --insecure is given)")
	fs.StringVar(&f.opts.HostsDir, "hosts-dir", os.Getenv("MODELPACK_HOSTS_DIR"),
		"containerd-style hosts directory configuring mirrors (<dir>/<host:port>/hosts.toml)")
}

// options returns the remote options with the user agent set.
func (f *remoteFlags) options() remote.Options {
	o := f.opts
	o.UserAgent = "modelpack/" + Version
	o.LoopbackPlainHTTP = true // as docker and containerd treat localhost, 127.0.0.0/8 and [::1]
	if f.g != nil {
		o.WrapTransport = f.g.wrapTransport()
	}
	if c := explicitCredential(f.username, f.password); c != nil {
		o.Credential = c
		o.Hints.Credentials = "check -u/--username and -p/--password; they override the credentials stored by login"
	}
	return o
}

// withDefaultTag gives a reference without tag or digest the tag "latest", as docker does.
func withDefaultTag(ref string) string {
	last := ref[strings.LastIndex(ref, "/")+1:]
	if strings.ContainsAny(last, ":@") {
		return ref
	}
	return ref + ":latest"
}

// transferUI shows the progress of a transfer on stderr — bars on a TTY, a line per blob otherwise, nothing with
// --quiet — and prints the summary on stdout.
type transferUI struct {
	g     *Globals
	verb  string // past tense: pushed, pulled, copied, fetched
	out   io.Writer
	err   io.Writer
	bars  *barRenderer
	lines *lineReporter
}

func newTransferUI(cmd *cobra.Command, g *Globals, verb string) *transferUI {
	u := &transferUI{g: g, verb: verb, out: cmd.OutOrStdout(), err: cmd.ErrOrStderr()}
	if g.ShowProgress() {
		u.bars = newBarRenderer(u.err, verb)
	}
	return u
}

// reporter is what to hand to the transfer; nil with --quiet or -o json.
func (u *transferUI) reporter() remote.Reporter {
	switch {
	case !u.g.ShowLines():
		return nil
	case u.bars != nil:
		return u.bars
	}
	if u.lines == nil {
		u.lines = newLineReporter(u.err, u.verb)
	}
	return u.lines
}

// done stops the bars and prints the result.
func (u *transferUI) done(res *remote.Result, err error) error {
	u.stop()
	if err != nil {
		return err
	}
	return u.print(transferJSON{Result: res})
}

// stop stops the bars or the periodic lines, if any; done and print may follow.
func (u *transferUI) stop() {
	if u.bars != nil {
		u.bars.stop()
		u.bars = nil
	}
	if u.lines != nil {
		u.lines.stop()
		u.lines = nil
	}
}

// transferJSON is the result of push, pull, copy, fetch and pack --push under -o json: remote.Result, the
// directory fetch wrote into, the signature push --sign made and the warnings (see warnings).
type transferJSON struct {
	*remote.Result
	Dir       string         `json:"dir,omitempty"`
	Signature *signatureJSON `json:"signature,omitempty"`
	// Attestation is the signed scan report push --attest-scan stored.
	Attestation *scanAttestationJSON `json:"attestation,omitempty"`
	Summary     *pack.Summary        `json:"summary,omitempty"` // pack --push: how the files were classified
	Warnings    []string             `json:"warnings,omitempty"`
}

// print writes the result: JSON, the digest alone with --quiet, or a summary.
func (u *transferUI) print(r transferJSON) error {
	res := r.Result
	if u.g.IsJSON() {
		return PrintJSON(u.out, r)
	}
	if u.g.Quiet {
		_, err := fmt.Fprintln(u.out, res.Descriptor.Digest)
		return err
	}
	var moved, existed, mounted int
	for _, b := range res.Blobs {
		switch b.Status {
		case remote.StatusTransferred:
			moved++
		case remote.StatusExists:
			existed++
		case remote.StatusMounted:
			mounted++
		}
	}
	rate := ""
	if res.Seconds > 0 && res.Transferred > 0 {
		rate = fmt.Sprintf(" (%s/s)", humanBytes(int64(float64(res.Transferred)/res.Seconds)))
	}
	fmt.Fprintf(u.out, "%s %s\n", capitalize(u.verb), res.Reference)
	fmt.Fprintf(u.out, "Digest: %s\n", res.Descriptor.Digest)
	summary := fmt.Sprintf("Blobs: %d %s", moved, u.verb)
	if existed > 0 {
		summary += fmt.Sprintf(", %d already present", existed)
	}
	if mounted > 0 {
		summary += fmt.Sprintf(", %d mounted", mounted)
	}
	fmt.Fprintf(u.out, "%s; %s transferred in %.1fs%s\n", summary, humanBytes(res.Transferred), res.Seconds, rate)
	if r.Signature != nil {
		fmt.Fprintf(u.out, "Signed %s (signature %s)\n", r.Signature.Signed, r.Signature.Tag)
	}
	if a := r.Attestation; a != nil {
		fmt.Fprintf(u.out, "Attested the scan of %s with %s (%s)\n", a.Subject, a.Key, a.Stored)
	}
	return nil
}

// isImageConfig reports whether an artifactType (a manifest's config media type) is a container image's.
func isImageConfig(t string) bool {
	return t == ocispec.MediaTypeImageConfig || t == "application/vnd.docker.container.image.v1+json"
}

// fillArtifactType gives a manifest descriptor the artifactType of the manifest it names (or, as OCI 1.1 says
// for manifests without one, its config's media type), reading the manifest from src.
func fillArtifactType(ctx context.Context, src content.Fetcher, d *ocispec.Descriptor) {
	if d.ArtifactType != "" || !artifact.IsManifest(d.MediaType) || artifact.CheckSize("manifest", *d) != nil {
		return
	}
	b, err := content.FetchAll(ctx, src, *d)
	if err != nil {
		return
	}
	var m ocispec.Manifest
	if json.Unmarshal(b, &m) == nil {
		if d.ArtifactType = m.ArtifactType; d.ArtifactType == "" {
			d.ArtifactType = m.Config.MediaType
		}
	}
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// blobLabel names a blob in progress lines and bars, the same way in every command: the file a layer holds when
// its annotations say, else its short digest ("(config)" added for a config blob).
func blobLabel(d ocispec.Descriptor) string {
	if name := artifact.LayerFilepath(d.Annotations); name != "" {
		return name
	}
	short := d.Digest.Encoded()
	if len(short) > 12 {
		short = short[:12]
	}
	// A config blob, not a weight.config layer: configs are JSON documents.
	if strings.Contains(d.MediaType, "config") && strings.HasSuffix(d.MediaType, "+json") {
		return short + " (config)"
	}
	return short
}

// lineReporter is progress for logs and CI (stderr not a TTY): a line when each blob starts, a line per long
// blob every interval while it moves, and a line when it is done.
type lineReporter struct {
	mu       sync.Mutex
	w        io.Writer
	verb     string
	started  map[string]time.Time
	active   map[string]*lineBlob
	interval time.Duration
	quit     chan struct{}
	wg       sync.WaitGroup
}

type lineBlob struct {
	desc ocispec.Descriptor
	n    atomic.Int64
}

// progressInterval is how often a blob still moving gets a progress line: MODELPACK_PROGRESS_INTERVAL (a Go
// duration), 10s by default.
func progressInterval() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("MODELPACK_PROGRESS_INTERVAL")); err == nil && d > 0 {
		return d
	}
	return 10 * time.Second
}

func newLineReporter(w io.Writer, verb string) *lineReporter {
	r := &lineReporter{w: w, verb: verb, started: map[string]time.Time{}, active: map[string]*lineBlob{}, interval: progressInterval(), quit: make(chan struct{})}
	r.wg.Add(1)
	go r.loop()
	return r
}

// progressive is the verb of a blob under way: "pushing", "fetching".
func progressive(verb string) string {
	if v, ok := map[string]string{"copied": "copying"}[verb]; ok {
		return v
	}
	return strings.TrimSuffix(verb, "ed") + "ing"
}

func (r *lineReporter) Start(d ocispec.Descriptor, done int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := d.Digest.String()
	if _, ok := r.active[key]; !ok {
		fmt.Fprintf(r.w, "%-8s %s  %s\n", progressive(r.verb), blobLabel(d), humanBytes(d.Size))
		r.active[key] = &lineBlob{desc: d}
		r.started[key] = time.Now()
	}
	r.active[key].n.Store(done)
}

func (r *lineReporter) Update(d ocispec.Descriptor, done int64) {
	r.mu.Lock()
	b := r.active[d.Digest.String()]
	r.mu.Unlock()
	if b != nil {
		b.n.Store(done)
	}
}

func (r *lineReporter) Finish(d ocispec.Descriptor, status remote.Status, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.active, d.Digest.String())
	if status == remote.StatusFailed && remote.Unreachable(err) {
		return // no blob failed: the registry is not there, which the command's error says once
	}
	line := fmt.Sprintf("%-8s %s  %s", verbFor(r.verb, status), blobLabel(d), humanBytes(d.Size))
	if start, ok := r.started[d.Digest.String()]; ok && status == remote.StatusTransferred {
		secs := time.Since(start).Seconds()
		if secs > 0 {
			line += fmt.Sprintf("  %.1fs  %s/s", secs, humanBytes(int64(float64(d.Size)/secs)))
		}
	}
	fmt.Fprintln(r.w, line)
}

// loop prints a progress line for every blob still moving, once an interval.
func (r *lineReporter) loop() {
	defer r.wg.Done()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-r.quit:
			return
		case <-t.C:
		}
		r.mu.Lock()
		for key, b := range r.active {
			n, size := b.n.Load(), b.desc.Size
			pct := 100.0
			if size > 0 {
				pct = 100 * float64(n) / float64(size)
			}
			line := fmt.Sprintf("%-8s %s  %s / %s (%.0f%%)", progressive(r.verb), blobLabel(b.desc), humanBytes(n), humanBytes(size), pct)
			if secs := time.Since(r.started[key]).Seconds(); secs > 0 {
				line += fmt.Sprintf("  %s/s", humanBytes(int64(float64(n)/secs)))
			}
			fmt.Fprintln(r.w, line)
		}
		r.mu.Unlock()
	}
}

func (r *lineReporter) stop() {
	close(r.quit)
	r.wg.Wait()
}

// barRenderer draws a bar per blob in flight, with throughput, redrawing the block in place; finished blobs
// scroll up as lines. Every progressbar call happens on the renderer goroutine, so reporters only store numbers.
type barRenderer struct {
	w      io.Writer
	verb   string
	mu     sync.Mutex
	active []*barState
	done   []string
	quit   chan struct{}
	wg     sync.WaitGroup
	drawn  int
	cols   int // the terminal's width; 0 when it does not say
}

// termWidth is stderr's terminal width in columns, 0 when unknown (a pty without a size).
func termWidth() int {
	w, _, err := term.GetSize(int(os.Stderr.Fd()))
	if err != nil || w <= 0 {
		return 0
	}
	return w
}

// fit cuts a line to the terminal's width: a line longer than it wraps, and the block redrawn in place then
// climbs over what it drew before, stacking fragments.
func fit(line string, cols int) string {
	if cols <= 1 {
		return line
	}
	r := []rune(line)
	if len(r) < cols {
		return line
	}
	return string(r[:cols-1])
}

type barState struct {
	desc   ocispec.Descriptor
	n      atomic.Int64
	bar    *progressbar.ProgressBar
	status remote.Status
	over   bool
}

func newBarRenderer(w io.Writer, verb string) *barRenderer {
	b := &barRenderer{w: w, verb: verb, quit: make(chan struct{}), cols: termWidth()}
	b.wg.Add(1)
	go b.loop()
	return b
}

func (b *barRenderer) find(d ocispec.Descriptor) *barState {
	for _, s := range b.active {
		if s.desc.Digest == d.Digest {
			return s
		}
	}
	return nil
}

func (b *barRenderer) Start(d ocispec.Descriptor, done int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.find(d)
	if s == nil {
		s = &barState{desc: d}
		b.active = append(b.active, s)
	}
	s.n.Store(done)
}

func (b *barRenderer) Update(d ocispec.Descriptor, done int64) {
	b.mu.Lock()
	s := b.find(d)
	b.mu.Unlock()
	if s != nil {
		s.n.Store(done)
	}
}

func (b *barRenderer) Finish(d ocispec.Descriptor, status remote.Status, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.find(d)
	if s == nil {
		s = &barState{desc: d}
		b.active = append(b.active, s)
	}
	s.status, s.over = status, true
	if status == remote.StatusTransferred {
		s.n.Store(d.Size)
	}
}

func (b *barRenderer) loop() {
	defer b.wg.Done()
	t := time.NewTicker(150 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-b.quit:
			b.draw()
			return
		case <-t.C:
			b.draw()
		}
	}
}

func (b *barRenderer) draw() {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out strings.Builder
	if b.drawn > 0 {
		fmt.Fprintf(&out, "\x1b[%dA", b.drawn)
	}
	keep := b.active[:0]
	var lines []string
	finished := 0
	for _, s := range b.active {
		if s.bar == nil {
			s.bar = progressbar.NewOptions64(max(s.desc.Size, 1),
				progressbar.OptionSetWriter(io.Discard),
				progressbar.OptionSetDescription(fmt.Sprintf("%-50.50s", blobLabel(s.desc))),
				progressbar.OptionShowCount(),
				progressbar.OptionShowBytes(true),
				progressbar.OptionSetWidth(20),
				progressbar.OptionThrottle(0),
				progressbar.OptionSetPredictTime(true),
				progressbar.OptionUseIECUnits(true),
			)
		}
		if s.over {
			fmt.Fprintf(&out, "\x1b[2K%s\n", fit(fmt.Sprintf("%-8s %s  %s", verbFor(b.verb, s.status), blobLabel(s.desc), humanBytes(s.desc.Size)), b.cols))
			finished++
			continue
		}
		_ = s.bar.Set64(s.n.Load())
		lines = append(lines, s.bar.String())
		keep = append(keep, s)
	}
	b.active = keep
	for _, l := range lines {
		fmt.Fprintf(&out, "\x1b[2K%s\n", fit(strings.TrimLeft(l, "\r"), b.cols))
	}
	// The finished lines stay; clear what is left below of the previous, taller block of bars.
	printed := finished + len(lines)
	for i := printed; i < b.drawn; i++ {
		out.WriteString("\x1b[2K\n")
	}
	if b.drawn > printed {
		fmt.Fprintf(&out, "\x1b[%dA", b.drawn-printed)
	}
	b.drawn = len(lines)
	io.WriteString(b.w, out.String())
}

func (b *barRenderer) stop() {
	close(b.quit)
	b.wg.Wait()
}

// verbFor is how a finished blob is reported: the transfer's own verb ("pushed", "pulled") unless the blob was
// skipped, mounted from another repository, or failed.
func verbFor(transferred string, status remote.Status) string {
	switch status {
	case remote.StatusExists:
		return "exists"
	case remote.StatusMounted:
		return "mounted"
	case remote.StatusFailed:
		return "failed"
	}
	return transferred
}

// printTransferPlan prints what push --dry-run or copy --dry-run found: each manifest and blob with whether the
// destination has it, and what would be sent; or the plan as JSON.
func printTransferPlan(cmd *cobra.Command, g *Globals, verb string, p *remote.Plan, warnings []string) error {
	out := cmd.OutOrStdout()
	if g.IsJSON() {
		return PrintJSON(out, struct {
			*remote.Plan
			DryRun   bool     `json:"dryRun"`
			Warnings []string `json:"warnings,omitempty"`
		}{p, true, warnings})
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ROLE\tDIGEST\tSIZE\tDESTINATION\tNAME")
	sending := 0
	for _, it := range p.Items {
		state := "would send"
		switch {
		case it.Exists:
			state = "exists"
		case it.MountFrom != "":
			state = "would mount from " + it.MountFrom
		default:
			sending++
		}
		name := it.Annotations[ocispec.AnnotationTitle]
		if it.Tag != "" {
			name = "tag " + it.Tag
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", it.Role, it.Digest, humanBytes(it.Size), state, name)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	tag := "the tag would be created"
	switch {
	case p.TagDigest == p.Root.Digest:
		tag = "the tag already names it"
	case p.TagDigest != "":
		tag = "the tag would move from " + p.TagDigest.String()
	case strings.Contains(p.Reference, "@"):
		tag = "no tag"
	}
	_, err := fmt.Fprintf(out, "dry run: %s %s (%s): %d of %d manifests and blobs to send, %s; %s; nothing was sent\n",
		verb, p.Reference, p.Root.Digest, sending, len(p.Items), humanBytes(p.Send), tag)
	return err
}
