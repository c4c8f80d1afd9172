package csidriver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"oras.land/oras-go/v2/registry"

	"github.com/modelpack/modelpack/artifact"
	"github.com/modelpack/modelpack/artifact/archive"
)

// Volume attribute keys, as written in a pod's csi.volumeAttributes, a PV's volumeAttributes or a StorageClass's
// parameters.
const (
	AttrReference  = "reference"
	AttrPullPolicy = "pullPolicy"
	AttrFilter     = "filter"
	AttrInclude    = "include"
	AttrSubPath    = "subPath"
	AttrPlatform   = "platform"
	AttrNoExec     = "noexec"
)

// Keys kubelet and the external provisioner add; they are read, never rejected.
const (
	k8sPrefix       = "csi.storage.k8s.io/"
	keyEphemeral    = k8sPrefix + "ephemeral"
	keyPodName      = k8sPrefix + "pod.name"
	keyPodNamespace = k8sPrefix + "pod.namespace"
	keyPodUID       = k8sPrefix + "pod.uid"
)

// PullPolicy is Kubernetes' imagePullPolicy, with the same meaning for a volume's model.
type PullPolicy string

const (
	PullAlways       PullPolicy = "Always"
	PullIfNotPresent PullPolicy = "IfNotPresent"
	PullNever        PullPolicy = "Never"
)

const validAttributes = `valid keys: reference (required; a tag or digest reference such as registry.example.com/models/llama:v1 or …@sha256:…), ` +
	`pullPolicy (Always, IfNotPresent or Never; default Always for :latest or no tag, IfNotPresent otherwise), ` +
	`filter (comma list of weight, weight.config, doc, code, dataset), include (comma list of path globs), ` +
	`subPath (a directory inside the model), platform (os/arch[/variant], for multi-platform artifacts), noexec (true or false)`

var platformRE = regexp.MustCompile(`^[a-z0-9_]+/[a-z0-9_]+(/[a-z0-9_.]+)?$`)

// Attributes are a volume's validated attributes.
type Attributes struct {
	// Reference is the normalised reference (host/repository[:tag][@digest]).
	Reference  string
	ref        registry.Reference
	PullPolicy PullPolicy
	Selector   Selector
	SubPath    string
	Platform   string
	NoExec     bool
	// Given are the attributes as supplied, less the orchestrator's own keys.
	Given map[string]string
}

// ParseAttributes validates a volume context or StorageClass parameters. The error is an *AttributeError, meant
// to be returned to the caller verbatim as INVALID_ARGUMENT.
func ParseAttributes(ctx map[string]string) (*Attributes, error) {
	a := &Attributes{Given: map[string]string{}}
	keys := make([]string, 0, len(ctx))
	for k := range ctx {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := ctx[k]
		if strings.HasPrefix(k, k8sPrefix) {
			continue
		}
		a.Given[k] = v
		switch k {
		case AttrReference:
			if err := artifact.RefuseCredentials(v); err != nil {
				return nil, attrErr("%s: %v", k, err) // never repeat the value: it holds a password
			}
			ref, err := normalReference(v)
			if err != nil {
				return nil, attrErr("%s %q: %v", k, v, err)
			}
			a.ref = ref
			a.Reference = ref.String()
		case AttrPullPolicy:
			switch p := PullPolicy(v); p {
			case PullAlways, PullIfNotPresent, PullNever:
				a.PullPolicy = p
			default:
				return nil, attrErr("%s %q is not one of Always, IfNotPresent, Never", k, v)
			}
		case AttrFilter:
			for _, f := range splitList(v) {
				kind, err := artifact.ParseKind(f)
				if err != nil {
					return nil, attrErr("%s %q: %v", k, v, err)
				}
				a.Selector.Kinds = append(a.Selector.Kinds, string(kind))
			}
			if len(a.Selector.Kinds) == 0 {
				return nil, attrErr("%s is empty", k)
			}
		case AttrInclude:
			for _, g := range splitList(v) {
				if err := artifact.ValidateGlob(g); err != nil {
					return nil, attrErr("%s: %v", k, err)
				}
				a.Selector.Include = append(a.Selector.Include, g)
			}
			if len(a.Selector.Include) == 0 {
				return nil, attrErr("%s is empty", k)
			}
		case AttrSubPath:
			p, err := cleanSubPath(v)
			if err != nil {
				return nil, attrErr("%s %q: %v", k, v, err)
			}
			a.SubPath = p
		case AttrPlatform:
			if !platformRE.MatchString(v) {
				return nil, attrErr("%s %q is not os/arch[/variant]", k, v)
			}
			a.Platform = v
		case AttrNoExec:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, attrErr("%s %q is not true or false", k, v)
			}
			a.NoExec = b
		default:
			return nil, attrErr("unknown volume attribute %q", k)
		}
	}
	if a.Reference == "" {
		return nil, attrErr("volume attribute %q is required", AttrReference)
	}
	if a.PullPolicy == "" {
		a.PullPolicy = defaultPullPolicy(a.ref)
	}
	return a, nil
}

// AttributeError is an invalid volume attribute; its message lists the valid keys and values.
type AttributeError struct{ msg string }

func (e *AttributeError) Error() string { return e.msg + "; " + validAttributes }

func attrErr(format string, args ...any) error {
	return &AttributeError{msg: fmt.Sprintf(format, args...)}
}

// ParseReference parses an image reference the way Kubernetes does: a name without a registry host is on
// docker.io, and a single-component Docker Hub name is under library/.
func ParseReference(s string) (registry.Reference, error) {
	if s == "" {
		return registry.Reference{}, fmt.Errorf("empty reference")
	}
	if s != strings.TrimSpace(s) {
		return registry.Reference{}, fmt.Errorf("reference has surrounding spaces")
	}
	first, _, hasSlash := strings.Cut(s, "/")
	if !hasSlash || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		if !hasSlash {
			s = "library/" + s
		}
		s = "docker.io/" + s
	}
	ref, err := registry.ParseReference(s)
	if err != nil {
		return registry.Reference{}, err
	}
	return ref, nil
}

// normalReference is ParseReference with no tag meaning latest, as for container images: the form the driver
// keys what a reference resolved to by, so every spelling of one reference finds the same record.
func normalReference(s string) (registry.Reference, error) {
	ref, err := ParseReference(s)
	if err == nil && ref.Reference == "" {
		ref.Reference = "latest"
	}
	return ref, err
}

// defaultPullPolicy is Kubernetes': Always for :latest or no tag, IfNotPresent otherwise (a digest included).
func defaultPullPolicy(ref registry.Reference) PullPolicy {
	if ref.Reference == "" || ref.Reference == "latest" {
		return PullAlways
	}
	return PullIfNotPresent
}

// IsDigest reports whether the reference pins a digest.
func (a *Attributes) IsDigest() bool {
	_, err := a.ref.Digest()
	return err == nil
}

// Fingerprint identifies the attributes that change what is mounted, to tell a retry (same arguments) from a
// conflicting publish (ALREADY_EXISTS).
func (a *Attributes) Fingerprint(volumeID string, readonly bool, extra ...string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%t\x00", volumeID, readonly)
	keys := make([]string, 0, len(a.Given))
	for k := range a.Given {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "%s=%s\x00", k, a.Given[k])
	}
	for _, e := range extra {
		fmt.Fprintf(h, "%s\x00", e)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// cleanSubPath accepts a relative path that stays inside the model.
func cleanSubPath(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty")
	}
	if filepath.IsAbs(p) {
		return "", fmt.Errorf("must be relative")
	}
	if len(p) > archive.MaxPathBytes {
		return "", fmt.Errorf("is %d bytes long, over the limit of %d", len(p), archive.MaxPathBytes)
	}
	for _, part := range strings.Split(p, "/") {
		if len(part) > archive.MaxNameBytes {
			return "", fmt.Errorf("has a name of %d bytes, over the limit of %d", len(part), archive.MaxNameBytes)
		}
	}
	c := filepath.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("leaves the model")
	}
	if c == "." {
		return "", nil
	}
	return c, nil
}

type podNamespaceKey struct{}

// WithPodNamespace records in ctx the namespace of the pod a publish serves (csi.storage.k8s.io/pod.namespace),
// which the backend's trust policy scopes rules by.
func WithPodNamespace(ctx context.Context, namespace string) context.Context {
	return context.WithValue(ctx, podNamespaceKey{}, namespace)
}

// PodNamespace is the namespace WithPodNamespace recorded: "" for a call serving no pod (a prepull), or a publish
// whose context lacked it (podInfoOnMount off).
func PodNamespace(ctx context.Context) string {
	ns, _ := ctx.Value(podNamespaceKey{}).(string)
	return ns
}

func podOf(ctx map[string]string) (name, namespace, uid string) {
	return ctx[keyPodName], ctx[keyPodNamespace], ctx[keyPodUID]
}
