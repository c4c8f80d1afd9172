package pack

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/modelpack/modelpack/artifact"
)

// inferModel fills what the files say about the model: config.format from the weight files (the format holding
// most bytes), paramSize and precision from their safetensors or GGUF headers, architecture, family and
// quantization from config.json or GGUF metadata.
func inferModel(ctx context.Context, dir string, layers []layerPlan, warn func(string)) artifact.Model {
	var m artifact.Model
	bytesByFormat := map[string]int64{}
	for _, l := range layers {
		if l.kind == artifact.KindWeight && l.format == artifact.FormatRaw {
			if f := weightFormats[strings.ToLower(path.Ext(l.path))]; f != "" {
				bytesByFormat[f] += l.size
			}
		}
	}
	formats := make([]string, 0, len(bytesByFormat))
	for f := range bytesByFormat {
		formats = append(formats, f)
	}
	sort.Slice(formats, func(i, j int) bool {
		if bytesByFormat[formats[i]] != bytesByFormat[formats[j]] {
			return bytesByFormat[formats[i]] > bytesByFormat[formats[j]]
		}
		return formats[i] < formats[j]
	})
	if len(formats) > 0 {
		m.Config.Format = formats[0]
	}

	total := &weightInfo{}
	complete := m.Config.Format == "safetensors" || m.Config.Format == "gguf"
	counted := map[string]bool{} // a file reached through a symlink too is counted once
	for _, l := range layers {
		if l.kind != artifact.KindWeight || l.format != artifact.FormatRaw || weightFormats[strings.ToLower(path.Ext(l.path))] != m.Config.Format {
			continue
		}
		n := l.nodes[0]
		key := n.src
		if n.remote != nil {
			key = n.remote.Digest.String()
		}
		if counted[key] {
			continue
		}
		counted[key] = true
		info, err := readWeightHeader(ctx, n)
		if err != nil || info == nil {
			complete = false
			if err != nil && warn != nil {
				warn(filepath.Join(dir, filepath.FromSlash(l.path)) + ": cannot read " + m.Config.Format + " header, parameter count not inferred: " + err.Error())
			}
			continue
		}
		for p, c := range info.byPrecision {
			if total.add(p, c) != nil {
				complete = false
			}
		}
		if total.family == "" {
			total.family = info.family
		}
		if total.name == "" {
			total.name = info.name
		}
		if total.quantization == "" {
			total.quantization = info.quantization
		}
	}
	if complete && total.params > 0 {
		m.Config.ParamSize = FormatParamSize(total.params)
	}
	if complete {
		switch p := dominant(total.byPrecision); {
		case p == "mixed" || isPrecision(p):
			m.Config.Precision = p
		case p != "" && total.quantization == "":
			total.quantization = p // a GGML block type such as Q8_0
		}
	}
	m.Config.Quantization = total.quantization
	m.Descriptor.Family = total.family
	m.Descriptor.Name = total.name
	if m.Config.Format == "gguf" && total.family != "" {
		m.Config.Architecture = "transformer" // every GGUF architecture llama.cpp runs is a transformer variant
	}

	if data, err := readSmall(ctx, layers, "config.json"); err == nil {
		hf, err := parseHFConfig(data)
		if err != nil {
			if warn != nil {
				warn(filepath.Join(dir, "config.json") + ": not JSON, model family not inferred: " + err.Error())
			}
			return m
		}
		if a := hf.architecture(); a != "" {
			m.Config.Architecture = a
		}
		if hf.ModelType != "" {
			m.Descriptor.Family = hf.ModelType
		}
		if m.Config.Precision == "" || m.Config.Precision == "mixed" {
			if p := hf.precision(); p != "" {
				m.Config.Precision = p
			}
		}
		if hf.Quantization != nil && hf.Quantization.QuantMethod != "" {
			m.Config.Quantization = hf.Quantization.QuantMethod
		}
	}
	return m
}

// isPrecision reports whether p names a plain number type (bfloat16, int8, …) rather than a quantized block format.
func isPrecision(p string) bool {
	for _, v := range safetensorsDtypes {
		if v == p {
			return true
		}
	}
	return false
}

func applyModelfile(m *artifact.Model, mf *Modelfile) {
	set(&m.Descriptor.Name, mf.Name)
	set(&m.Descriptor.Family, mf.Family)
	set(&m.Config.Architecture, mf.Arch)
	set(&m.Config.Format, mf.Format)
	set(&m.Config.ParamSize, mf.ParamSize)
	set(&m.Config.Precision, mf.Precision)
	set(&m.Config.Quantization, mf.Quantization)
}

func applyOverrides(m *artifact.Model, o Options) {
	d, c := o.Descriptor, o.Config
	set(&m.Descriptor.Vendor, d.Vendor)
	set(&m.Descriptor.Family, d.Family)
	set(&m.Descriptor.Name, d.Name)
	set(&m.Descriptor.Version, d.Version)
	set(&m.Descriptor.Title, d.Title)
	set(&m.Descriptor.Description, d.Description)
	set(&m.Descriptor.DocURL, d.DocURL)
	set(&m.Descriptor.SourceURL, d.SourceURL)
	set(&m.Descriptor.Revision, d.Revision)
	if len(d.Authors) > 0 {
		m.Descriptor.Authors = d.Authors
	}
	if len(d.Licenses) > 0 {
		m.Descriptor.Licenses = d.Licenses
	}
	if len(d.DatasetsURL) > 0 {
		m.Descriptor.DatasetsURL = d.DatasetsURL
	}
	set(&m.Config.Architecture, c.Architecture)
	set(&m.Config.Format, c.Format)
	set(&m.Config.ParamSize, c.ParamSize)
	set(&m.Config.Precision, c.Precision)
	set(&m.Config.Quantization, c.Quantization)
	if c.Capabilities != nil {
		m.Config.Capabilities = c.Capabilities
	}
}

func set(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

// maxSmallFile bounds what readSmall reads: a config.json is a few KiB.
const maxSmallFile = 16 << 20

// readSmall reads the model file at rel as the pack reads it (from the tree, the file the walk listed), or fails
// with fs.ErrNotExist if the model has none.
func readSmall(ctx context.Context, layers []layerPlan, rel string) ([]byte, error) {
	for _, l := range layers {
		for _, n := range l.nodes {
			if n.rel != rel || n.dir {
				continue
			}
			if n.size > maxSmallFile {
				return nil, fmt.Errorf("%s: %d bytes, over the %d read for inference", rel, n.size, maxSmallFile)
			}
			rc, err := n.open(ctx, nil)
			if err != nil {
				return nil, err
			}
			defer rc.Close()
			return io.ReadAll(rc)
		}
	}
	return nil, fs.ErrNotExist
}
