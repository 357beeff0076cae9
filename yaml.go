package keyfold

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/keyfold/keyfold/actors/fold"
	"go.yaml.in/yaml/v3"
)

// ParseConfig parses a YAML configuration. Unknown keys anywhere are
// errors, each reported with its line and, inside a pipeline, the pipeline
// and entry; every problem is reported at once. The result is validated.
func ParseConfig(b []byte) (Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return Config{}, fmt.Errorf("keyfold: config: %w", err)
	}
	var c Config
	if len(doc.Content) == 0 {
		return c, errors.New("keyfold: config: empty document")
	}
	root := doc.Content[0]
	if root.Kind == yaml.AliasNode || len(doc.Content) > 1 {
		return c, errors.New("keyfold: config: want one YAML document with a mapping at the top")
	}
	errs, _ := decodeStrict(root, &c, "config")
	structural := len(errs) > 0
	// The entries with structural problems, by pipeline ("" = the whole
	// pipeline), whose validation errors would only echo them ("op is
	// required" for an aggregate whose op key had a typo).
	broken := map[string]map[string]bool{}
	// Where each pipeline and entry is, to give validation errors a line.
	lines := map[string]map[string]int{}
	if p := mappingValue(root, "pipelines"); p != nil && p.Kind == yaml.MappingNode {
		errs = append(errs, duplicateKeys(p, "pipelines")...)
		c.Pipelines = make(map[string]PipelineConfig, len(p.Content)/2)
		for i := 0; i+1 < len(p.Content); i += 2 {
			name, pn := p.Content[i].Value, p.Content[i+1]
			bad := map[string]bool{}
			lines[name] = entryLines(p.Content[i], pn)
			var spec PipelineConfig
			where := fmt.Sprintf("pipeline %q", name)
			perrs, badKeys := decodeStrict(pn, &spec, where)
			errs = append(errs, perrs...)
			for _, k := range badKeys {
				bad[k] = true
			}
			if len(badKeys) > 0 && spec.Key == "" {
				bad["key"] = true // most likely the key with a typo, already reported
			}
			spec.Aggregates = decodeEntries[AggregateConfig](pn, "aggregates", where, bad, &errs)
			spec.Windows = decodeEntries[fold.WindowSpec](pn, "windows", where, bad, &errs)
			spec.Patterns = decodeEntries[fold.PatternSpec](pn, "patterns", where, bad, &errs)
			if len(bad) > 0 {
				broken[name] = bad
				structural = true
			}
			c.Pipelines[name] = spec
		}
	}
	joinLines := map[string]map[string]int{}
	brokenJoins := map[string]bool{}
	if j := mappingValue(root, "joins"); j != nil && j.Kind == yaml.MappingNode {
		errs = append(errs, duplicateKeys(j, "joins")...)
		c.Joins = make(map[string]JoinConfig, len(j.Content)/2)
		for i := 0; i+1 < len(j.Content); i += 2 {
			name, jn := j.Content[i].Value, j.Content[i+1]
			joinLines[name] = entryLines(j.Content[i], jn)
			var spec JoinConfig
			where := fmt.Sprintf("join %q", name)
			jerrs, badKeys := decodeStrict(jn, &spec, where)
			for _, side := range []string{"left", "right"} {
				if sn := mappingValue(jn, side); sn != nil && !slices.Contains(badKeys, side) {
					serrs, sbad := decodeStrict(sn, &fold.JoinSideSpec{}, where+": "+side)
					jerrs = append(jerrs, serrs...)
					badKeys = append(badKeys, sbad...)
				}
			}
			errs = append(errs, jerrs...)
			if len(jerrs) > 0 {
				brokenJoins[name] = true
				structural = true
			}
			c.Joins[name] = spec
		}
	}
	// Validate too, so every problem is reported at once, but without the
	// echoes of structural problems.
	check := c
	check.Pipelines = maps.Clone(c.Pipelines)
	maps.DeleteFunc(check.Pipelines, func(name string, _ PipelineConfig) bool { return broken[name][""] })
	check.Joins = maps.Clone(c.Joins)
	maps.DeleteFunc(check.Joins, func(name string, _ JoinConfig) bool { return brokenJoins[name] })
	if _, err := check.compile(!structural); err != nil {
		for _, e := range flatten(err) {
			var se *fold.SpecError
			if errors.As(e, &se) {
				at := lines[se.Pipeline]
				if se.Join {
					at = joinLines[se.Pipeline]
				} else if broken[se.Pipeline][se.Entry] {
					continue
				}
				e = specErrorAt(se, at)
			}
			errs = append(errs, e)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// decodeEntries decodes the map section of pipeline node pn strictly, entry
// by entry, marking the entries with structural problems in bad (as
// "section.name") and adding the problems to errs. An absent section is nil.
func decodeEntries[T any](pn *yaml.Node, section, where string, bad map[string]bool, errs *[]error) map[string]T {
	sn := mappingValue(pn, section)
	if sn == nil || sn.Kind != yaml.MappingNode {
		return nil
	}
	*errs = append(*errs, duplicateKeys(sn, where+": "+section)...)
	entries := make(map[string]T, len(sn.Content)/2)
	for j := 0; j+1 < len(sn.Content); j += 2 {
		name := sn.Content[j].Value
		var v T
		verrs, _ := decodeStrict(sn.Content[j+1], &v, fmt.Sprintf("%s: %s.%s", where, section, name))
		if len(verrs) > 0 {
			bad[section+"."+name] = true
			*errs = append(*errs, verrs...)
		}
		entries[name] = v
	}
	return entries
}

// entryLines maps a pipeline's entries ("" for the pipeline, "key",
// "aggregates.amount", …) to their lines.
func entryLines(name, n *yaml.Node) map[string]int {
	m := map[string]int{"": name.Line}
	if n.Kind != yaml.MappingNode {
		return m
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		m[k.Value] = k.Line
		if (k.Value == "aggregates" || k.Value == "windows" || k.Value == "patterns") && v.Kind == yaml.MappingNode {
			for j := 0; j+1 < len(v.Content); j += 2 {
				m[k.Value+"."+v.Content[j].Value] = v.Content[j].Line
			}
		}
	}
	return m
}

// specError wraps a validation error with the line of its entry, in the
// same shape as the structural errors, keeping the *fold.SpecError.
type specError struct {
	se   *fold.SpecError
	line int
}

func specErrorAt(se *fold.SpecError, lines map[string]int) error {
	line, ok := lines[se.Entry]
	if !ok {
		line = lines[""]
	}
	return &specError{se: se, line: line}
}

func (e *specError) Error() string {
	where := e.se.Where()
	if e.se.Entry != "" {
		where += ": " + e.se.Entry
	}
	if e.line > 0 {
		where += fmt.Sprintf(" (line %d)", e.line)
	}
	return "keyfold: config: " + where + ": " + e.se.Problem
}

func (e *specError) Unwrap() error { return e.se }

// flatten lists the leaves of a tree of errors.Join errors.
func flatten(err error) []error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, flatten(e)...)
	}
	return out
}

// decodeStrict decodes the scalar fields of a mapping node into out (a
// pointer to a struct) and reports keys that are not among out's yaml tags.
// Map-valued fields are decoded by the caller, entry by entry, so their
// errors can name the entry.
//
// It also returns the keys that had problems ("" if the node itself is not
// a mapping).
func decodeStrict(n *yaml.Node, out any, where string) (errs []error, badKeys []string) {
	if n.Kind != yaml.MappingNode {
		return []error{fmt.Errorf("keyfold: config: %s (line %d): want a mapping, got %s", where, n.Line, kindName(n))}, []string{""}
	}
	t := reflect.TypeOf(out).Elem()
	v := reflect.ValueOf(out).Elem()
	fields := map[string]int{}
	var known []string
	for i := range t.NumField() {
		tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		fields[tag] = i
		known = append(known, tag)
	}
	slices.Sort(known)
	errs = duplicateKeys(n, where)
	bad := func(key string, err error) {
		errs = append(errs, err)
		badKeys = append(badKeys, key)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		fi, ok := fields[k.Value]
		if !ok {
			bad(k.Value, fmt.Errorf("keyfold: config: %s (line %d): unknown key %q (known: %s)",
				where, k.Line, k.Value, strings.Join(known, ", ")))
			continue
		}
		f := v.Field(fi)
		if f.Kind() == reflect.Map {
			if val.Kind != yaml.MappingNode {
				bad(k.Value, fmt.Errorf("keyfold: config: %s (line %d): %s: want a mapping, got %s", where, val.Line, k.Value, kindName(val)))
			}
			continue
		}
		if err := val.Decode(f.Addr().Interface()); err != nil {
			bad(k.Value, fmt.Errorf("keyfold: config: %s (line %d): %s: %v", where, val.Line, k.Value, yamlReason(err)))
		}
	}
	return errs, badKeys
}

// duplicateKeys reports keys given twice in a mapping: YAML forbids it, and
// silently keeping the last would hide a mistake.
func duplicateKeys(n *yaml.Node, where string) []error {
	var errs []error
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if first, dup := seen[k.Value]; dup {
			errs = append(errs, fmt.Errorf("keyfold: config: %s (line %d): key %q given twice (first on line %d)", where, k.Line, k.Value, first))
			continue
		}
		seen[k.Value] = k.Line
	}
	return errs
}

func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	default:
		return "something else"
	}
}

// yamlReason strips yaml's "yaml: unmarshal errors:\n  line N: " framing.
func yamlReason(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		s := te.Errors[0]
		if i := strings.Index(s, ": "); strings.HasPrefix(s, "line ") && i > 0 {
			s = s[i+2:]
		}
		return s
	}
	return err.Error()
}
