package pack

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/internal/beneath"
)

// node is a file or directory found in the model directory.
type node struct {
	rel  string      // model-relative, slash-separated
	src  string      // the path read, below tree's root: the file itself, or a symlink's target in the model
	mode fs.FileMode // permission bits
	size int64       // bytes; 0 for directories
	dir  bool
	// tree is the directory src is opened from and stat what the walk saw there: a file read is that file.
	tree *tree
	stat beneath.Stat
	// remote is set for a file read from elsewhere (Options.Remote); src is then its model-relative path.
	remote *RemoteFile
}

// layerPlan is one layer to write.
type layerPlan struct {
	kind   artifact.Kind
	format artifact.Format
	path   string // org.cncf.model.filepath: the file, or the directory a tar layer holds
	dir    bool   // path names a directory
	nodes  []node // raw: the file; tar: directories and files in lexical order, paths model-relative
	size   int64  // bytes of file content read
	ruled  bool   // a rule (flag or Modelfile) chose the kind, not the file name
}

// UserError is bad input: it names the path and says what is wrong with it, in one line.
type UserError struct {
	Path   string
	Reason string
}

func (e *UserError) Error() string { return e.Path + ": " + e.Reason }

func badInput(p, format string, args ...any) error {
	return &UserError{Path: p, Reason: fmt.Sprintf(format, args...)}
}

func isHubRepoDir(name string) bool {
	for _, prefix := range []string{"models--", "datasets--", "spaces--"} {
		if strings.HasPrefix(name, prefix) && len(name) > len(prefix) {
			return true
		}
	}
	return false
}

// refuseHubCacheRoot refuses the cache directory of a whole Hub repository (models--ORG--NAME): packing it would
// pack every snapshot, every blob a second time and the refs. It names the snapshot refs/main points at.
func refuseHubCacheRoot(dir, real string) error {
	name := filepath.Base(real)
	if !isHubRepoDir(name) {
		return nil
	}
	if fi, err := os.Stat(filepath.Join(real, "snapshots")); err != nil || !fi.IsDir() {
		return nil
	}
	_, repo, _ := strings.Cut(name, "--")
	repo = strings.ReplaceAll(repo, "--", "/")
	snapshot := filepath.Join(dir, "snapshots", "COMMIT")
	if b, err := os.ReadFile(filepath.Join(real, "refs", "main")); err == nil {
		if commit := strings.TrimSpace(string(b)); commit != "" && filepath.IsLocal(commit) {
			snapshot = filepath.Join(dir, "snapshots", commit)
		}
	}
	hint := ""
	if strings.HasPrefix(name, "models--") {
		hint = fmt.Sprintf(", or the Hub's copy (modelpack pack hf://%s -t NAME:TAG)", repo)
	}
	return badInput(dir, "a Hugging Face Hub cache of %s, not a model directory: pack one snapshot (modelpack pack %s -t NAME:TAG)%s", repo, snapshot, hint)
}

// checkDir refuses a model directory that is missing or not a directory.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return badInput(dir, "no such directory")
		}
		return badInput(dir, "%v", unwrapPathError(err))
	}
	if !fi.IsDir() {
		return badInput(dir, "%s; only a model directory or a regular file can be packed", beneath.Describe(fi.Mode()))
	}
	return nil
}

func within(root, p string) bool {
	return p == root || strings.HasPrefix(p, root+string(filepath.Separator))
}

// unwrapPathError drops the path from an *fs.PathError: the caller names the path itself.
func unwrapPathError(err error) error {
	if pe, ok := err.(*fs.PathError); ok {
		return pe.Err
	}
	return err
}

// plan groups nodes into layers:
//   - A directory matched by a rule becomes one tar layer of the rule's kind holding everything below it.
//   - Every other file gets the kind of the rule matching it, or else artifact.KindOf its name.
//   - Weight files are raw layers of their own, never archived or compressed.
//   - Other files are raw layers of their own when format is raw. With a tar format, top-level files and files
//     a rule names stay raw, and the remaining files under each top-level directory are one archive of that
//     directory, whose kind is the kind most of them have.
//
// Flag rules override Modelfile rules; conflicting rules of one source, or a file claimed both on its own and as
// part of a claimed directory, are duplicate layer paths. The rules that matched nothing are returned, since they
// are usually typos.
func plan(name func(rel string) string, nodes []node, format artifact.Format, sources ...[]Rule) ([]layerPlan, []Rule, error) {
	rules := &ruleSet{sources: sources, used: map[*Rule]bool{}, name: name}
	dirFormat := format
	if dirFormat == artifact.FormatRaw || dirFormat == "" {
		dirFormat = artifact.FormatTar
	}
	var layers []layerPlan
	var claimed *layerPlan // the claimed directory being filled (nodes arrive in lexical order, parents first)
	var claimedBy *Rule
	groups := map[string]*layerPlan{}
	var groupOrder []string
	for _, n := range nodes {
		if claimed != nil && strings.HasPrefix(n.rel, claimed.path+"/") {
			r, err := rules.match(n.rel)
			if err != nil {
				return nil, nil, err
			}
			if r != nil && r.Kind != claimed.kind { // a glob of the same kind (data/** after data) agrees
				return nil, nil, badInput(name(n.rel), "duplicate layer path: it is inside %s, packed whole by %s as %s, and also matched by %s as %s", claimed.path, claimedBy.Source, claimed.kind, r.Source, r.Kind)
			}
			claimed.nodes = append(claimed.nodes, n)
			claimed.size += n.size
			continue
		}
		if claimed != nil {
			layers = append(layers, *claimed)
			claimed = nil
		}
		r, err := rules.match(n.rel)
		if err != nil {
			return nil, nil, err
		}
		if n.dir {
			if r != nil {
				f := dirFormat
				if r.Kind == artifact.KindWeight && f != artifact.FormatTar {
					f = artifact.FormatTar // weights do not compress
				}
				claimed, claimedBy = &layerPlan{kind: r.Kind, format: f, path: n.rel, dir: true, nodes: []node{n}, ruled: true}, r
			}
			continue
		}
		kind := artifact.KindOf(n.rel)
		if r != nil {
			kind = r.Kind
		}
		top, _, nested := strings.Cut(n.rel, "/")
		// A single file is raw whatever the format: archiving it gains nothing, and generic tools (oras pull)
		// would write the archive's bytes under the file's name.
		if kind == artifact.KindWeight || format == artifact.FormatRaw || format == "" || !nested || r != nil {
			layers = append(layers, layerPlan{kind: kind, format: artifact.FormatRaw, path: n.rel, nodes: []node{n}, size: n.size, ruled: r != nil})
			continue
		}
		g := groups[top]
		if g == nil {
			g = &layerPlan{format: format, path: top, dir: true}
			groups[top] = g
			groupOrder = append(groupOrder, top)
		}
		g.nodes = append(g.nodes, n)
		g.size += n.size
	}
	if claimed != nil {
		layers = append(layers, *claimed)
	}
	for _, top := range groupOrder {
		layers = append(layers, finishGroup(groups[top], nodes))
	}
	if err := orderLayers(layers, name); err != nil {
		return nil, nil, err
	}
	return layers, rules.unused(), nil
}

// ruleSet is the layer rules of several sources (flags, a Modelfile), in order of precedence.
type ruleSet struct {
	sources [][]Rule
	used    map[*Rule]bool
	name    func(rel string) string
}

// match returns the rule of the first source that has one for rel. Every source is consulted, so a rule that is
// overridden is not reported as matching nothing, and a source that contradicts itself is an error.
func (s *ruleSet) match(rel string) (*Rule, error) {
	var first *Rule
	for _, rules := range s.sources {
		var hit *Rule
		for i := range rules {
			r := &rules[i]
			if !r.Matches(rel) {
				continue
			}
			s.used[r] = true
			if hit != nil && hit.Kind != r.Kind {
				return nil, badInput(s.name(rel), "duplicate layer path: %s makes it %s and %s makes it %s", hit.Source, hit.Kind, r.Source, r.Kind)
			}
			if hit == nil {
				hit = r
			}
		}
		if first == nil {
			first = hit
		}
	}
	return first, nil
}

// unused are the rules that matched no path.
func (s *ruleSet) unused() []Rule {
	var unused []Rule
	for _, rules := range s.sources {
		for i := range rules {
			if !s.used[&rules[i]] {
				unused = append(unused, rules[i])
			}
		}
	}
	return unused
}

// finishGroup completes the archive of a top-level directory's files: its kind is its files' majority, and it
// holds the directories leading to each file, so their modes survive the round trip.
func finishGroup(g *layerPlan, nodes []node) layerPlan {
	dirs := map[string]node{}
	for _, n := range nodes {
		if n.dir {
			dirs[n.rel] = n
		}
	}
	g.kind = majorityKind(g.nodes)
	seen := map[string]bool{}
	for _, f := range slices.Clone(g.nodes) {
		for d := path.Dir(f.rel); d != "."; d = path.Dir(d) {
			if !seen[d] {
				seen[d] = true
				g.nodes = append(g.nodes, dirs[d])
			}
		}
	}
	return *g
}

// orderLayers sorts each layer's entries and the layers themselves (by kind, then path), the order that makes a
// pack reproducible, and refuses two layers of one path.
func orderLayers(layers []layerPlan, name func(rel string) string) error {
	for i := range layers {
		sort.Slice(layers[i].nodes, func(a, b int) bool { return tarName(layers[i].nodes[a]) < tarName(layers[i].nodes[b]) })
	}
	kindOrder := map[artifact.Kind]int{}
	for i, k := range artifact.Kinds {
		kindOrder[k] = i
	}
	sort.SliceStable(layers, func(a, b int) bool {
		if kindOrder[layers[a].kind] != kindOrder[layers[b].kind] {
			return kindOrder[layers[a].kind] < kindOrder[layers[b].kind]
		}
		return layers[a].path < layers[b].path
	})
	seen := map[string]bool{}
	for _, l := range layers {
		if seen[l.path] {
			return badInput(name(l.path), "duplicate layer path")
		}
		seen[l.path] = true
	}
	return nil
}

// majorityKind is the kind most files of a group have; ties go to the earlier kind in spec order.
func majorityKind(nodes []node) artifact.Kind {
	count := map[artifact.Kind]int{}
	for _, n := range nodes {
		if !n.dir {
			count[artifact.KindOf(n.rel)]++
		}
	}
	best := artifact.KindWeightConfig
	for _, k := range artifact.Kinds {
		if count[k] > count[best] {
			best = k
		}
	}
	return best
}

// tarName is a node's entry name: directories end in "/" so they sort before their contents.
func tarName(n node) string {
	if n.dir {
		return n.rel + "/"
	}
	return n.rel
}
