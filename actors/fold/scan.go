package fold

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// Events are read field by field: a pipeline reads a few top-level members
// of each event (its key, id and time, its aggregates' fields, the fields
// its filters name), so Prepare scans the event's bytes once, keeps where
// each of those members' values lies, and decodes only them, when they are
// used. Decoding the whole event into a map[string]any cost 60-85 times
// the event's size in garbage for small events (BENCHMARKS.md, issue 13).
//
// A value is decoded exactly as encoding/json decodes it into an any
// (float64, string, bool, nil, map[string]any, []any), so a pipeline sees
// the same values as before, with one exception on purpose: keys and ids
// must be valid UTF-8 without unpaired surrogate escapes (see strictString),
// where encoding/json would replace them by U+FFFD and merge distinct ones.

// fieldRef is where a field the pipeline reads is found: as a top-level
// member of its literal name, else by its dotted path from a top-level
// member (the order lookup uses).
type fieldRef struct {
	lit  int      // index in Pipeline.reads of the literal name
	top  int      // index of the path's first part, -1 if the name has no dot
	rest []string // the path after its first part
}

// indexFields lists the top-level members the pipeline reads and where each
// of its fields is found. Compile calls it once everything else is compiled.
func (p *Pipeline) indexFields() {
	index := map[string]int{}
	read := func(name string) int {
		if i, ok := index[name]; ok {
			return i
		}
		index[name] = len(p.reads)
		p.reads = append(p.reads, name)
		return len(p.reads) - 1
	}
	ref := func(name string, path []string) fieldRef {
		r := fieldRef{lit: read(name), top: -1}
		if len(path) >= 2 {
			r.top, r.rest = read(path[0]), path[1:]
		}
		return r
	}
	p.keyRef = ref(p.keyField, p.key)
	if p.idField != "" {
		p.idRef = ref(p.idField, p.id)
	}
	if p.timeField != "" {
		p.timeRef = ref(p.timeField, p.time)
	}
	p.aggRefs = make([]fieldRef, len(p.aggs))
	filters := p.steps
	for i, a := range p.aggs {
		if a.field != "" {
			p.aggRefs[i] = ref(a.field, a.path)
		}
		if a.where != nil {
			filters = append(filters[:len(filters):len(filters)], a.where)
		}
	}
	seen := map[int]bool{}
	for _, w := range filters {
		if w == nil {
			continue
		}
		if w.dynamic {
			p.dynamicEnv = true
		}
		for _, path := range w.paths {
			if i := read(path[0]); !seen[i] {
				seen[i] = true
				p.envReads = append(p.envReads, i)
			}
		}
	}
	p.hasFilters = len(filters) > 0
}

// maxStackReads is how many read members an event's scan keeps without
// allocating.
const maxStackReads = 16

// fields are the members of one event that its pipeline reads.
type fields struct {
	p    *Pipeline
	vals [][]byte // by index in p.reads: the member's raw value, nil if absent
	// notObject is set when replaying an event that is not a JSON object.
	// (Neither the event nor what filters see are kept here: escape
	// analysis would move vals' array to the heap with them.)
	notObject bool
}

// scanFields finds the members p reads in raw, a valid JSON object. Like
// encoding/json decoding into a map, a member given twice takes its last
// value.
func (p *Pipeline) scanFields(raw []byte, buf *[maxStackReads][]byte) fields {
	f := fields{p: p}
	if len(p.reads) <= maxStackReads {
		f.vals = buf[:len(p.reads)]
	} else {
		f.vals = make([][]byte, len(p.reads))
	}
	eachMember(raw, func(name, val []byte) {
		// The name is decoded once, not once per field read; p.reads holds
		// each name once.
		inner := name[1 : len(name)-1]
		if bytes.IndexByte(inner, '\\') >= 0 || !utf8.Valid(inner) {
			d, ok := decodeName(name)
			if !ok {
				return
			}
			inner = d
		}
		for i, r := range p.reads {
			if string(inner) == r {
				f.vals[i] = val
				break
			}
		}
	})
	return f
}

// raw returns the raw JSON value of a field, and whether it is present.
func (f *fields) rawValue(r fieldRef) ([]byte, bool) {
	if v := f.vals[r.lit]; v != nil {
		return v, true
	}
	if r.top < 0 {
		return nil, false
	}
	v := f.vals[r.top]
	for _, part := range r.rest {
		if v == nil || v[0] != '{' {
			return nil, false
		}
		v = memberValue(v, part)
	}
	return v, v != nil
}

// lookup returns a field's decoded value, and whether it is present.
func (f *fields) lookup(r fieldRef) (any, bool, error) {
	v, ok := f.rawValue(r)
	if !ok {
		return nil, false, nil
	}
	d, err := decodeValue(v)
	return d, true, err
}

// envs are the maps filterEnv fills, reused: a map per event was a tenth of
// the bytes an ingest allocated (BENCHMARKS.md). Return one with putEnv
// once the filters ran; nothing keeps a reference to it or its values.
var envs = sync.Pool{New: func() any { return make(map[string]any, 4) }}

// putEnv returns a map of filterEnv's to the pool.
func putEnv(env map[string]any) {
	if env != nil && len(env) <= 64 { // a very large one is left to the GC
		clear(env)
		envs.Put(env)
	}
}

// filterEnv is what where filters evaluate: the members they name, decoded;
// or, if a filter reads fields it does not name ($env[expr]), all of those
// of raw, the event. A value that cannot be decoded (a number out of range)
// is a *FieldError.
func (f *fields) filterEnv(raw []byte) (map[string]any, error) {
	if f.p.dynamicEnv {
		env := map[string]any{}
		if !f.notObject {
			if err := json.Unmarshal(raw, &env); err != nil {
				return nil, &FieldError{Reason: "invalid JSON: " + err.Error()}
			}
		}
		return env, nil
	}
	env := envs.Get().(map[string]any)
	for _, i := range f.p.envReads {
		if v := f.vals[i]; v != nil {
			d, err := decodeValue(v)
			if err != nil {
				return nil, &FieldError{Field: f.p.reads[i], Reason: err.Error()}
			}
			env[f.p.reads[i]] = d
		}
	}
	return env, nil
}

// eachMember calls fn with the raw name (quotes included) and raw value of
// each member of obj, a valid JSON object.
func eachMember(obj []byte, fn func(name, val []byte)) {
	i := skipWS(obj, 0) + 1 // past '{'
	for {
		i = skipWS(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return // '}'
		}
		nameEnd := stringEnd(obj, i)
		name := obj[i:nameEnd]
		i = skipWS(obj, nameEnd) + 1 // past ':'
		i = skipWS(obj, i)
		end := valueEnd(obj, i)
		fn(name, obj[i:end])
		i = skipWS(obj, end)
		if i < len(obj) && obj[i] == ',' {
			i++
		}
	}
}

// memberValue returns the raw value of obj's member name (the last one if
// given twice), or nil.
func memberValue(obj []byte, name string) []byte {
	var v []byte
	eachMember(obj, func(n, val []byte) {
		if memberIs(n, name) {
			v = val
		}
	})
	return v
}

// decodeName decodes a quoted member name that has escapes or invalid
// bytes (which decode to U+FFFD, as encoding/json does).
func decodeName(raw []byte) ([]byte, bool) {
	var name string
	if json.Unmarshal(raw, &name) != nil {
		return nil, false
	}
	return []byte(name), true
}

// memberIs reports whether the raw member name (quoted) decodes to s.
func memberIs(raw []byte, s string) bool {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner) == s
	}
	var name string
	if json.Unmarshal(raw, &name) != nil {
		return false
	}
	return name == s
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the end of the valid JSON string at b[i] == '"'.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// valueEnd returns the end of the valid JSON value at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j
}

// decodeValue decodes one valid raw JSON value as encoding/json decodes it
// into an any.
func decodeValue(v []byte) (any, error) {
	switch v[0] {
	case '"':
		return looseString(v), nil
	case 't':
		return true, nil
	case 'f':
		return false, nil
	case 'n':
		return nil, nil
	case '{', '[':
		var x any
		if err := json.Unmarshal(v, &x); err != nil {
			return nil, err
		}
		return x, nil
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil {
		return nil, fmt.Errorf("number %s is out of range", v)
	}
	return f, nil
}

// looseString decodes a valid JSON string as encoding/json does: invalid
// UTF-8 and unpaired surrogates become U+FFFD.
func looseString(v []byte) string {
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner)
	}
	var s string
	_ = json.Unmarshal(v, &s) // valid JSON: cannot fail
	return s
}

// errNotText rejects a string that does not name one text unambiguously.
var errNotText = errors.New("must be valid UTF-8 text: invalid UTF-8 or an unpaired surrogate escape (\\ud800-\\udfff) would be replaced by U+FFFD and merge distinct values")

// strictString decodes a valid JSON string, refusing invalid UTF-8 and
// unpaired UTF-16 surrogate escapes.
func strictString(v []byte) (string, error) {
	inner := v[1 : len(v)-1]
	if !utf8.Valid(inner) {
		return "", errNotText
	}
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner), nil
	}
	var sb strings.Builder
	sb.Grow(len(inner))
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		if c != '\\' {
			sb.WriteByte(c)
			continue
		}
		i++
		switch inner[i] {
		case 'b':
			sb.WriteByte('\b')
		case 'f':
			sb.WriteByte('\f')
		case 'n':
			sb.WriteByte('\n')
		case 'r':
			sb.WriteByte('\r')
		case 't':
			sb.WriteByte('\t')
		case 'u':
			r := hex4(inner[i+1 : i+5])
			i += 4
			if utf16.IsSurrogate(r) {
				// A high surrogate followed by a low one is one rune;
				// anything else is unpaired.
				if r >= 0xdc00 || i+6 >= len(inner) || inner[i+1] != '\\' || inner[i+2] != 'u' {
					return "", errNotText
				}
				r2 := hex4(inner[i+3 : i+7])
				if r2 < 0xdc00 || r2 > 0xdfff {
					return "", errNotText
				}
				r = utf16.DecodeRune(r, r2)
				i += 6
			}
			sb.WriteRune(r)
		default: // '"', '\\', '/'
			sb.WriteByte(inner[i])
		}
	}
	return sb.String(), nil
}

// hex4 reads four hex digits (valid JSON guarantees them).
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}
