package fleet

import (
	"fmt"
	"slices"

	dto "github.com/prometheus/client_model/go"
)

// Dialect reads one engine family's metric names. vLLM, SGLang and TensorRT-LLM name the same facts
// differently; routing sees only EngineMetrics.
type Dialect interface {
	// Name is the engine name a policy's pools[].engine gives to select this dialect.
	Name() string
	// Read turns one scrape's metric families into what routing needs.
	Read(fams map[string]*dto.MetricFamily) EngineMetrics
}

// dialects is the registry, and the one place engine names live: policy validation, the policy JSON Schema
// and the scraper all read it, so an engine is added here (with its dialect_<name>.go) and nowhere else.
// The order is the one error messages and the schema list.
var dialects = []Dialect{vllm{}, sglang{}, trtllm{}}

// Dialects returns every registered dialect, in registry order (a copy: callers cannot change the registry).
func Dialects() []Dialect { return slices.Clone(dialects) }

// EngineNames returns the engine names a policy may give pools[].engine, in registry order, so validation and
// the JSON Schema accept exactly the engines the scraper can read.
func EngineNames() []string {
	names := make([]string, len(dialects))
	for i, d := range dialects {
		names[i] = d.Name()
	}
	return names
}

// DialectFor returns the dialect of a policy engine name, matched exactly. The bool is false for a name no
// dialect has: reading one engine's metrics with another's names would see an idle engine, so there is no
// fall-back.
func DialectFor(engine string) (Dialect, bool) {
	for _, d := range dialects {
		if d.Name() == engine {
			return d, true
		}
	}
	return nil, false
}

// MustDialect is DialectFor for engine names written in code (tests, benchmarks): it panics on an unknown one.
// Names from a policy go through DialectFor, after validation.
func MustDialect(engine string) Dialect {
	d, ok := DialectFor(engine)
	if !ok {
		panic(fmt.Sprintf("fleet: no dialect for engine %q (known: %v)", engine, EngineNames()))
	}
	return d
}

func first(fams map[string]*dto.MetricFamily, names ...string) (*dto.Metric, bool) {
	for _, n := range names {
		if f := fams[n]; f != nil && len(f.GetMetric()) > 0 {
			return f.GetMetric()[0], true
		}
	}
	return nil, false
}

// sum adds every series of the first family present (engines with several model or engine labels).
func sum(fams map[string]*dto.MetricFamily, names ...string) float64 {
	for _, n := range names {
		if f := fams[n]; f != nil {
			total := 0.0
			for _, m := range f.GetMetric() {
				total += Value(m)
			}
			return total
		}
	}
	return 0
}

// tokenCounter is a token counter's sum over its series, 0 when the engine exports none or a value no counter
// of tokens takes (negative, not finite, 2^53 or more, where a float64 no longer counts single tokens): the
// relay's wire and the picker trust it as such.
func tokenCounter(fams map[string]*dto.MetricFamily, name string) float64 {
	v := sum(fams, name)
	if !(v >= 0 && v <= MaxTokenCount) {
		return 0
	}
	return v
}

// MaxTokenCount is the largest token count a float64 holds to the token, 2^53 − 1: the bound on an engine's
// token counters wherever they are read (here and on the relay's wire).
const MaxTokenCount = 1<<53 - 1

// Value is a sample's value, whatever its type (gauge, counter, untyped): engines and gateways export the
// same facts under different types.
func Value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// Label is a sample's label value, "" when it has none of that name.
func Label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// buildVersion reads the version label of an info gauge. Stock engines do not all export one; deployments
// that need the rollout's engineVersion gate add it (a sidecar, an image label exporter).
func buildVersion(f map[string]*dto.MetricFamily, name string) string {
	if m, ok := first(f, name); ok {
		return Label(m, "version")
	}
	return ""
}
