package capacity

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Workload is what `infergate plan` sizes the fleet for: per model, its architecture, precision and load.
type Workload struct {
	// GPUMemoryUtilization is vLLM's --gpu-memory-utilization: the share of each GPU's memory the engine takes
	// (default 0.9).
	GPUMemoryUtilization float64 `yaml:"gpuMemoryUtilization"`
	// Headroom is the share of each replica's capacity kept free for bursts (default 0.2).
	Headroom float64 `yaml:"headroom"`
	// WarmPoolMinimum is the fewest replicas a pool keeps, at any load (default 2, never below 2).
	WarmPoolMinimum int `yaml:"warmPoolMinimum"`
	// StepOverhead is the engine's fixed CPU cost per step (default 1ms; vLLM 1-2 ms, TensorRT-LLM 0.5).
	StepOverhead time.Duration `yaml:"stepOverhead"`
	Models       []ModelLoad   `yaml:"models"`
}

// ModelLoad is one model's part of the workload.
type ModelLoad struct {
	// Model is the policy's name (or an alias) of the model.
	Model             string     `yaml:"model"`
	Architecture      ArchSource `yaml:"architecture"`
	Weights           Dtype      `yaml:"weights"` // bf16 (default), fp8, int4
	KVCache           Dtype      `yaml:"kvCache"` // bf16 (default), fp8
	RequestsPerSecond float64    `yaml:"requestsPerSecond"`
	InputTokens       Lengths    `yaml:"inputTokens"`
	OutputTokens      Lengths    `yaml:"outputTokens"`
	// PrefixHitRate is the share of prompt tokens found in the prefix cache (0..1): prefill work saved.
	PrefixHitRate float64 `yaml:"prefixHitRate"`
	// SLO overrides the policy's spec.slo for the model.
	SLO struct {
		TTFT time.Duration `yaml:"ttft"`
		TPOT time.Duration `yaml:"tpot"`
	} `yaml:"slo"`
}

// ArchSource names an architecture: a preset, or a Hugging Face config.json (relative to the workload file)
// with the published parameter counts when the shapes cannot give them.
type ArchSource struct {
	Preset           string  `yaml:"preset"`
	Config           string  `yaml:"config"`
	Parameters       float64 `yaml:"parameters"`
	ActiveParameters float64 `yaml:"activeParameters"`
}

// Lengths are a token-length distribution: its mean and its 95th percentile (default: the mean).
type Lengths struct {
	Mean float64 `yaml:"mean"`
	P95  float64 `yaml:"p95"`
}

// Workload defaults.
const (
	DefaultGPUMemoryUtilization = 0.9
	DefaultHeadroom             = 0.2
	MinWarmPool                 = 2
	DefaultStepOverhead         = time.Millisecond
	maxTokens                   = 1 << 24
	maxWorkloadBytes            = 1 << 20
)

// readAtMost reads a file the operator named, refusing one larger than limit without reading past it: a
// device or a pipe ("/dev/zero") must not grow the process until it is killed.
func readAtMost(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: over %d bytes", path, limit)
	}
	return b, nil
}

// LoadWorkload reads and checks a workload file; every problem is reported with its line.
func LoadWorkload(path string) (*Workload, map[string]Architecture, error) {
	b, err := readAtMost(path, maxWorkloadBytes)
	if err != nil {
		return nil, nil, err
	}
	w, err := ParseWorkload(path, b)
	if err != nil {
		return nil, nil, err
	}
	archs := map[string]Architecture{}
	var problems []string
	for i, m := range w.Models {
		a, err := m.Architecture.resolve(filepath.Dir(path))
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: models[%d].architecture: %v", path, i, err))
			continue
		}
		archs[m.Model] = a
	}
	if len(problems) > 0 {
		return nil, nil, errors.New(strings.Join(problems, "\n"))
	}
	return w, archs, nil
}

func (s ArchSource) resolve(dir string) (Architecture, error) {
	switch {
	case s.Preset != "" && s.Config != "":
		return Architecture{}, errors.New("name a preset or a config, not both")
	case s.Preset != "":
		a, ok := Presets[s.Preset]
		if !ok {
			return Architecture{}, fmt.Errorf("unknown preset %q (one of %s)", s.Preset, strings.Join(PresetNames(), ", "))
		}
		if s.Parameters > 0 {
			a.Parameters = s.Parameters
		}
		if s.ActiveParameters > 0 {
			a.ActiveParameters = s.ActiveParameters
		}
		return a, nil
	case s.Config != "":
		path := s.Config
		if !filepath.IsAbs(path) {
			path = filepath.Join(dir, path)
		}
		b, err := readAtMost(path, maxConfigBytes)
		if err != nil {
			return Architecture{}, err
		}
		return ParseHFConfig(filepath.Base(s.Config), b, s.Parameters, s.ActiveParameters)
	}
	return Architecture{}, errors.New("name a preset or a Hugging Face config.json")
}

// ParseWorkload decodes a workload strictly (unknown fields are errors), applies defaults and checks ranges.
func ParseWorkload(name string, b []byte) (*Workload, error) {
	if len(b) > maxWorkloadBytes {
		return nil, fmt.Errorf("%s: over %d bytes", name, maxWorkloadBytes)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var w Workload
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var problems []string
	bad := func(path []any, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", name, lineOf(&root, path), pathString(path), fmt.Sprintf(format, args...)))
	}
	if w.GPUMemoryUtilization == 0 {
		w.GPUMemoryUtilization = DefaultGPUMemoryUtilization
	}
	if u := w.GPUMemoryUtilization; u <= 0 || u > 1 {
		bad([]any{"gpuMemoryUtilization"}, "must be above 0 and at most 1, got %v", u)
	}
	if w.Headroom == 0 {
		w.Headroom = DefaultHeadroom
	}
	if w.Headroom < 0 || w.Headroom >= 1 {
		bad([]any{"headroom"}, "must be at least 0 and below 1, got %v", w.Headroom)
	}
	if w.WarmPoolMinimum < 0 {
		bad([]any{"warmPoolMinimum"}, "must not be negative, got %d", w.WarmPoolMinimum)
	}
	w.WarmPoolMinimum = max(w.WarmPoolMinimum, MinWarmPool)
	if w.StepOverhead == 0 {
		w.StepOverhead = DefaultStepOverhead
	}
	if w.StepOverhead < 0 || w.StepOverhead > time.Second {
		bad([]any{"stepOverhead"}, "must be between 0 and 1s, got %v", w.StepOverhead)
	}
	if len(w.Models) == 0 {
		bad([]any{"models"}, "at least one model is required")
	}
	seen := map[string]bool{}
	for i := range w.Models {
		m := &w.Models[i]
		at := func(f ...any) []any { return append([]any{"models", i}, f...) }
		if m.Model == "" {
			bad(at("model"), "required")
		} else if seen[m.Model] {
			bad(at("model"), "%q is listed twice", m.Model)
		}
		seen[m.Model] = true
		if _, err := m.Weights.kvBytes(); err != nil && m.Weights != INT4 {
			bad(at("weights"), "must be bf16, fp8 or int4, got %q", m.Weights)
		}
		if _, err := m.KVCache.kvBytes(); err != nil {
			bad(at("kvCache"), "must be bf16 or fp8, got %q", m.KVCache)
		}
		if q := m.RequestsPerSecond; q <= 0 || q > 1e7 {
			bad(at("requestsPerSecond"), "must be above 0 and at most 1e7, got %v", q)
		}
		for _, l := range []struct {
			field string
			v     *Lengths
		}{{"inputTokens", &m.InputTokens}, {"outputTokens", &m.OutputTokens}} {
			if l.v.P95 == 0 {
				l.v.P95 = l.v.Mean
			}
			if l.v.Mean < 1 || l.v.Mean > maxTokens {
				bad(at(l.field, "mean"), "must be between 1 and %d, got %v", maxTokens, l.v.Mean)
			} else if l.v.P95 < l.v.Mean || l.v.P95 > maxTokens {
				bad(at(l.field, "p95"), "must be between the mean and %d, got %v", maxTokens, l.v.P95)
			}
		}
		if h := m.PrefixHitRate; h < 0 || h >= 1 {
			bad(at("prefixHitRate"), "must be at least 0 and below 1, got %v", h)
		}
		if m.SLO.TTFT < 0 || m.SLO.TPOT < 0 {
			bad(at("slo"), "targets must not be negative")
		}
		if p := m.Architecture.Parameters; p < 0 || p > 1e14 || m.Architecture.ActiveParameters < 0 || m.Architecture.ActiveParameters > p && p > 0 {
			bad(at("architecture", "parameters"), "parameters must be between 0 and 1e14, activeParameters at most parameters")
		}
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "\n"))
	}
	return &w, nil
}

// lineOf finds the line of a path (map keys and sequence indexes) in a YAML document, or the nearest parent's.
func lineOf(root *yaml.Node, path []any) int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	for _, p := range path {
		var next *yaml.Node
		switch k := p.(type) {
		case string:
			if n.Kind == yaml.MappingNode {
				for j := 0; j+1 < len(n.Content); j += 2 {
					if n.Content[j].Value == k {
						line, next = n.Content[j].Line, n.Content[j+1]
					}
				}
			}
		case int:
			if n.Kind == yaml.SequenceNode && k < len(n.Content) {
				next = n.Content[k]
				line = next.Line
			}
		}
		if next == nil {
			return line
		}
		n = next
	}
	return line
}

func pathString(path []any) string {
	var b strings.Builder
	for _, p := range path {
		switch k := p.(type) {
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(k)
		case int:
			fmt.Fprintf(&b, "[%d]", k)
		}
	}
	return b.String()
}
