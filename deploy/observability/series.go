package observability

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// rulesYAML is rules.yaml: the Prometheus rule groups.
//
//go:embed rules.yaml
var rulesYAML []byte

// dashboardJSON is dashboard.json: the Grafana dashboard.
//
//go:embed dashboard.json
var dashboardJSON []byte

// ruleFile is the layout of a Prometheus rule file, decoded strictly so that a misspelt key fails.
type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval,omitempty"`
	Rules    []rule `yaml:"rules"`
}

type rule struct {
	Record      string            `yaml:"record,omitempty"`
	Alert       string            `yaml:"alert,omitempty"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

func parseRules(data []byte) (ruleFile, error) {
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		return ruleFile{}, fmt.Errorf("rules.yaml: %w", err)
	}
	return rf, nil
}

// recordingRules maps each recording rule rules.yaml defines to its expression.
func recordingRules(rf ruleFile) map[string]string {
	rec := map[string]string{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				rec[r.Record] = r.Expr
			}
		}
	}
	return rec
}

// RuleSeries returns the metric names the expressions of rules.yaml read, deduplicated and sorted, leaving out the
// recording rules rules.yaml itself defines: every name returned must be exported by infergate.
func RuleSeries() ([]string, error) {
	rf, err := parseRules(rulesYAML)
	if err != nil {
		return nil, err
	}
	rec := recordingRules(rf)
	set := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			names, err := metricNames(r.Expr)
			if err != nil {
				return nil, fmt.Errorf("rules.yaml group %s rule %s%s: %w", g.Name, r.Record, r.Alert, err)
			}
			for _, n := range names {
				if _, ok := rec[n]; !ok {
					set[n] = true
				}
			}
		}
	}
	return sortedKeys(set), nil
}

// DashboardSeries returns the metric names the dashboard's queries (panel targets and template variables) read,
// deduplicated and sorted. A recording rule of rules.yaml that the dashboard reads is replaced by the series its
// expression reads, so that every name returned must be exported by infergate itself.
func DashboardSeries() ([]string, error) {
	rf, err := parseRules(rulesYAML)
	if err != nil {
		return nil, err
	}
	rec := recordingRules(rf)
	exprs, err := dashboardExprs(dashboardJSON)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, e := range exprs {
		names, err := metricNames(e.Expr)
		if err != nil {
			return nil, fmt.Errorf("dashboard %s: %w", e.Where, err)
		}
		if err := resolve(names, rec, set, 0); err != nil {
			return nil, fmt.Errorf("dashboard %s: %w", e.Where, err)
		}
	}
	return sortedKeys(set), nil
}

// Query is one PromQL expression of the dashboard, with where it is (panel title, target) and the title alone.
type Query struct {
	Panel, Where, Expr string
}

// DashboardQueries returns every panel target's expression, so a test can ask a real Prometheus the dashboard's
// own questions. Grafana's variables are left in ($tier, $model, $__rate_interval, $__range).
func DashboardQueries() ([]Query, error) {
	exprs, err := dashboardExprs(dashboardJSON)
	if err != nil {
		return nil, err
	}
	var out []Query
	for _, e := range exprs {
		if e.panel != "" {
			out = append(out, Query{Panel: e.panel, Where: e.Where, Expr: e.Expr})
		}
	}
	return out, nil
}

// resolve adds names to set, replacing recording rules by the series their expressions read.
func resolve(names []string, rec map[string]string, set map[string]bool, depth int) error {
	if depth > 10 {
		return fmt.Errorf("recording rules nest too deeply (a cycle?)")
	}
	for _, n := range names {
		expr, ok := rec[n]
		if !ok {
			set[n] = true
			continue
		}
		inner, err := metricNames(expr)
		if err != nil {
			return fmt.Errorf("recording rule %s: %w", n, err)
		}
		if err := resolve(inner, rec, set, depth+1); err != nil {
			return err
		}
	}
	return nil
}

func sortedKeys(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// dashExpr is one PromQL expression of the dashboard and where it is (for messages).
type dashExpr struct {
	Where string
	Expr  string
	panel string // the panel's title; "" for a template variable
}

// dashboard is the part of a Grafana dashboard model that holds queries.
type dashboard struct {
	Panels     []dashPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type dashPanel struct {
	ID      int         `json:"id"`
	Title   string      `json:"title"`
	Type    string      `json:"type"`
	Panels  []dashPanel `json:"panels"` // a collapsed row's panels
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// labelValues is Grafana's label_values(selector, label) variable query.
var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)

// dashboardExprs returns every PromQL expression of a dashboard: panel targets (rows included) and the selectors
// of label_values template variables.
func dashboardExprs(data []byte) ([]dashExpr, error) {
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("dashboard.json: %w", err)
	}
	var out []dashExpr
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out = append(out, dashExpr{Where: fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, t.RefID), Expr: t.Expr, panel: p.Title})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		// The query is a string in old dashboards and {"query": "..."} in new ones.
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var obj struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				return nil, fmt.Errorf("dashboard.json variable %s: query: %w", v.Name, err)
			}
			q = obj.Query
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			return nil, fmt.Errorf("dashboard.json variable %s: want label_values(selector, label), got %q", v.Name, q)
		}
		out = append(out, dashExpr{Where: "variable " + v.Name, Expr: m[1]})
	}
	return out, nil
}

// promqlFunctions are the function names of PromQL (Prometheus 2.42, case-sensitive) and its aggregation operators:
// an identifier followed by "(" must be one of them (or an aggregation operator in another case, or a keyword).
var promqlFunctions = setOf(
	// aggregation operators
	"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
	// functions
	"abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "avg_over_time", "ceil",
	"changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time", "day_of_month", "day_of_week",
	"day_of_year", "days_in_month", "deg", "delta", "deriv", "exp", "floor", "histogram_quantile", "holt_winters",
	"hour", "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2",
	"max_over_time", "min_over_time", "minute", "month", "pi", "predict_linear", "present_over_time",
	"quantile_over_time", "rad", "rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_desc",
	"sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector",
	"year",
	// @ modifier
	"start", "end",
)

// aggregations are PromQL's aggregation operators (case-insensitive), which may take by/without before "(".
var aggregations = setOf("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
	"topk", "quantile")

// aggregationClause reports whether s starts with "by" or "without" followed by "(".
func aggregationClause(s string) bool {
	for _, kw := range []string{"by", "without"} {
		if len(s) > len(kw) && strings.EqualFold(s[:len(kw)], kw) && !isIdentChar(s[len(kw)]) {
			return strings.HasPrefix(strings.TrimLeft(s[len(kw):], " \t\r\n"), "(")
		}
	}
	return false
}

// promqlKeywords are PromQL's keywords (case-insensitive): never metric names.
var promqlKeywords = setOf("by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
	"unless", "offset", "atan2", "inf", "nan")

// groupingKeywords take a parenthesised list of label names.
var groupingKeywords = setOf("by", "without", "on", "ignoring", "group_left", "group_right")

func setOf(s ...string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, v := range s {
		m[v] = true
	}
	return m
}

var (
	// Grafana variables: $name, ${name}, ${name:format}, [[name]].
	grafanaVar = regexp.MustCompile(`\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\]`)
	// Label matchers (strings already blanked, so no brace can hide inside one).
	matchers = regexp.MustCompile(`\{[^{}]*\}`)
	// Range, subquery and offset brackets.
	brackets = regexp.MustCompile(`\[[^\[\]]*\]`)
	// A grouping keyword and its label list.
	grouping = regexp.MustCompile(`(?i)\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
)

// metricNames returns, in order of first appearance, the metric names a PromQL expression selects. It is a
// tokeniser, not a parser: string literals, Grafana variables, label matchers, range brackets and the label lists
// of by/without/on/ignoring/group_left/group_right are blanked, numbers and durations skipped, and every remaining
// identifier is a metric name unless it is a keyword or is followed by "(" (then it must be a known function or
// aggregation, which catches typos in function names). Selecting by {__name__=...} is refused: it would hide the
// name from this check.
func metricNames(expr string) ([]string, error) {
	s, err := blankStrings(expr)
	if err != nil {
		return nil, err
	}
	if strings.Contains(s, "__name__") {
		return nil, fmt.Errorf("selecting by __name__ is not supported: %q", expr)
	}
	s = grafanaVar.ReplaceAllString(s, "")
	s = matchers.ReplaceAllString(s, "{}")
	s = brackets.ReplaceAllString(s, "[]")
	if strings.ContainsAny(strings.NewReplacer("{}", "", "[]", "").Replace(s), "{}[]") {
		return nil, fmt.Errorf("unbalanced braces or brackets in %q", expr)
	}
	s = grouping.ReplaceAllString(s, "$1 ()")

	var names []string
	seen := map[string]bool{}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case isDigit(c) || (c == '.' && i+1 < len(s) && isDigit(s[i+1])):
			// A number (1, 0.8, 1e6, 0x1f) or a duration (5m, 1h30m): letters that follow belong to it.
			for i < len(s) && (isIdentChar(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			ident := s[i:j]
			k := j
			for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r') {
				k++
			}
			lower := strings.ToLower(ident)
			switch {
			case k < len(s) && s[k] == '(':
				if !promqlFunctions[ident] && !aggregations[lower] && !groupingKeywords[lower] {
					return nil, fmt.Errorf("unknown function %q in %q", ident, expr)
				}
			case aggregationClause(s[k:]):
				// sum by (...) (...): an aggregation operator with its clause before the parenthesis.
				if !aggregations[lower] {
					return nil, fmt.Errorf("%q is not an aggregation operator, in %q", ident, expr)
				}
			case promqlKeywords[lower]:
			default:
				if !seen[ident] {
					seen[ident] = true
					names = append(names, ident)
				}
			}
			i = j
		default:
			i++
		}
	}
	return names, nil
}

// blankStrings replaces every PromQL string literal ("…", '…' with escapes, `…` raw) by "".
func blankStrings(expr string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(expr); i++ {
		q := expr[i]
		if q != '"' && q != '\'' && q != '`' {
			b.WriteByte(q)
			continue
		}
		j := i + 1
		for ; j < len(expr) && expr[j] != q; j++ {
			if expr[j] == '\\' && q != '`' {
				j++
			}
		}
		if j >= len(expr) {
			return "", fmt.Errorf("unterminated string in %q", expr)
		}
		b.WriteString(`""`)
		i = j
	}
	return b.String(), nil
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isIdentChar(c byte) bool  { return isIdentStart(c) || isDigit(c) }
