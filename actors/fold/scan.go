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
		if w.eq != nil {
			w.eq.read = read(w.eq.field) // evaluated without the map of members
		} else {
			p.needsEnv = true
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
	// noFilterFields is set when a member a filter reads could not be
	// decoded during a replay: the filters then see no member.
	noFilterFields bool
}

// scanFields finds the members p reads in raw, an event, and reports
// whether raw is a JSON object (encoding/json.Valid, around spaces); f's
// members are only of use if it is. Like encoding/json decoding into a map,
// a member given twice takes its last value.
func (p *Pipeline) scanFields(raw []byte, buf *[maxStackReads][]byte) (f fields, valid bool) {
	f = fields{p: p}
	if len(p.reads) <= maxStackReads {
		f.vals = buf[:len(p.reads)]
	} else {
		f.vals = make([][]byte, len(p.reads))
	}
	obj := bytes.TrimSpace(raw)
	if len(obj) == 0 || obj[0] != '{' {
		return f, false
	}
	valid = eachMember(obj, func(name, val []byte) {
		// The name is decoded once, not once per field read; p.reads holds
		// each name once.
		inner := name[1 : len(name)-1]
		if !literal(inner) {
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
	return f, valid
}

// literal reports whether the inside of a JSON string (between its
// quotes) is its own decoding: no escape, and valid UTF-8, which is
// checked only past the ASCII that most names and values are.
func literal(inner []byte) bool {
	for i, c := range inner {
		if c == '\\' {
			return false
		}
		if c >= 0x80 {
			return bytes.IndexByte(inner[i:], '\\') < 0 && utf8.Valid(inner[i:])
		}
	}
	return true
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
// or, if a filter reads fields it does not name ($env[expr], "x" in $env),
// all of those of raw, the event. A value that cannot be decoded (a number
// out of range) is a *FieldError, whether or not a filter decodes it: if
// every filter is a textEq, none does, and the members are only checked
// (nil map), so that an event is refused or its filters see nothing just as
// when each member was decoded.
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
	var env map[string]any
	if f.p.needsEnv {
		env = envs.Get().(map[string]any)
	}
	for _, i := range f.p.envReads {
		v := f.vals[i]
		if v == nil {
			continue
		}
		if env == nil {
			if err := checkDecodes(v); err != nil {
				return nil, &FieldError{Field: f.p.reads[i], Reason: err.Error()}
			}
			continue
		}
		d, err := decodeValue(v)
		if err != nil {
			putEnv(env)
			return nil, &FieldError{Field: f.p.reads[i], Reason: err.Error()}
		}
		env[f.p.reads[i]] = d
	}
	return env, nil
}

// checkDecodes fails where decodeValue would, without decoding a string
// or a literal (which always decode).
func checkDecodes(v []byte) error {
	switch v[0] {
	case '"', 't', 'f', 'n':
		return nil
	}
	_, err := decodeValue(v)
	return err
}

// eachMember calls fn with the raw name (quotes included) and raw value of
// each member of obj, a JSON object (obj[0] == '{'), in order, and reports
// whether obj is valid JSON exactly as encoding/json.Valid says (fn may
// have been called for the members before a fault). One pass does both:
// encoding/json.Valid (a state machine called through a function per byte)
// and then a scan of the members was 40% of what preparing an event cost
// (BENCHMARKS.md, session 29). Of the well-kept validators measured, those
// several times faster than encoding/json's either accept what it refuses
// (fastjson: control characters in strings) or recurse without its depth
// limit (gjson); FuzzEachMember holds this one to encoding/json.Valid.
func eachMember(obj []byte, fn func(name, val []byte)) bool {
	i := skipWS(obj, 1) // past '{'
	if i < len(obj) && obj[i] == '}' {
		return skipWS(obj, i+1) == len(obj)
	}
	for {
		nameEnd, start := memberStart(obj, i)
		if start < 0 {
			return false
		}
		end := valueEnd(obj, start, 1)
		if end < 0 {
			return false
		}
		fn(obj[i:nameEnd], obj[start:end])
		switch i = skipWS(obj, end); {
		case i >= len(obj):
			return false
		case obj[i] == ',':
			i = skipWS(obj, i+1)
		case obj[i] == '}':
			return skipWS(obj, i+1) == len(obj)
		default:
			return false
		}
	}
}

// memberValue returns the raw value of obj's member name (the last one if
// given twice), or nil; obj is a valid JSON object.
func memberValue(obj []byte, name string) []byte {
	var v []byte
	eachMember(obj, func(n, val []byte) {
		if decodesTo(n, name) {
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

// decodesTo reports whether raw, a JSON string (quoted, a member's name
// or a value), decodes to s, without a string when it is literal.
func decodesTo(raw []byte, s string) bool {
	if inner := raw[1 : len(raw)-1]; literal(inner) {
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

// maxNestingDepth is encoding/json's: a value nested deeper is invalid.
const maxNestingDepth = 10000

// stringEnd returns the end of the JSON string at b[i] == '"', or -1 if it
// is not valid JSON (unterminated, a control character, a bad escape).
// Bytes from 0x80 up are taken as they are, as encoding/json.Valid takes
// them.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1
		case c == '\\':
			if j++; j >= len(b) {
				return -1
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(b) || !isHex(b[j+1]) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) {
					return -1
				}
				j += 4
			default:
				return -1
			}
		case c < 0x20:
			return -1
		}
	}
	return -1
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// valueEnd returns the end of the JSON value at b[i], inside depth
// containers, or -1 if it is not valid JSON.
func valueEnd(b []byte, i, depth int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '{', '[':
		return containerEnd(b, i, depth)
	}
	return scalarEnd(b, i)
}

// scalarEnd returns the end of the JSON string, number or literal at b[i],
// or -1 if there is none.
func scalarEnd(b []byte, i int) int {
	switch c := b[i]; {
	case c == '"':
		return stringEnd(b, i)
	case c == 't':
		return literalEnd(b, i, "true")
	case c == 'f':
		return literalEnd(b, i, "false")
	case c == 'n':
		return literalEnd(b, i, "null")
	case c == '-' || isDigit(c):
		return numberEnd(b, i)
	}
	return -1
}

func literalEnd(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// numberEnd returns the end of the JSON number at b[i], or -1: an optional
// minus, 0 or digits not starting with 0, an optional fraction, an optional
// exponent.
func numberEnd(b []byte, i int) int {
	j := i
	if b[j] == '-' {
		j++
	}
	switch {
	case j >= len(b) || !isDigit(b[j]):
		return -1
	case b[j] == '0':
		j++
	default:
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	if j < len(b) && b[j] == '.' {
		if j++; j >= len(b) || !isDigit(b[j]) {
			return -1
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		if j++; j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if j >= len(b) || !isDigit(b[j]) {
			return -1
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	return j
}

// containerEnd returns the end of the JSON object or array at b[i], inside
// depth containers, or -1 if it is not valid JSON (or nested deeper than
// encoding/json allows). It walks without recursion: the containers it is
// in are a stack of their opening bytes, on the goroutine's stack up to 32
// deep (an event nested deeper costs a slice, bounded by the depth limit).
func containerEnd(b []byte, i, depth int) int {
	var small [32]byte
	open := small[:0]
	for {
		// A value starts at b[i].
		if i >= len(b) {
			return -1
		}
		if c := b[i]; c == '{' || c == '[' {
			if depth++; depth > maxNestingDepth {
				return -1
			}
			open = append(open, c)
			if i = skipWS(b, i+1); i < len(b) && b[i] == c+2 { // '{'+2 is '}', '['+2 is ']': empty
				open = open[:len(open)-1]
				depth--
				i++
			} else {
				if c == '{' {
					if _, i = memberStart(b, i); i < 0 {
						return -1
					}
				}
				continue
			}
		} else if i = scalarEnd(b, i); i < 0 {
			return -1
		}
		// A value ended at b[i]: the containers it closes, then the next.
		for {
			if len(open) == 0 {
				return i
			}
			if i = skipWS(b, i); i >= len(b) {
				return -1
			}
			top := open[len(open)-1]
			if b[i] == ',' {
				i = skipWS(b, i+1)
				if top == '{' {
					if _, i = memberStart(b, i); i < 0 {
						return -1
					}
				}
				break
			}
			if b[i] != top+2 {
				return -1
			}
			open = open[:len(open)-1]
			depth--
			i++
		}
	}
}

// memberStart reads a member's name and colon at b[i] and returns where the
// name ends and where the value starts (value -1 if they are not there).
func memberStart(b []byte, i int) (nameEnd, value int) {
	if i >= len(b) || b[i] != '"' {
		return 0, -1
	}
	if nameEnd = stringEnd(b, i); nameEnd < 0 {
		return 0, -1
	}
	if i = skipWS(b, nameEnd); i >= len(b) || b[i] != ':' {
		return 0, -1
	}
	return nameEnd, skipWS(b, i+1)
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
	f, _, err := decodeNumber(v)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// decodeNumber decodes one valid raw JSON value if it is a number, as
// decodeValue would, without making it an any (8 bytes on the heap each).
func decodeNumber(v []byte) (f float64, isNum bool, err error) {
	if v[0] != '-' && !isDigit(v[0]) {
		return 0, false, nil
	}
	f, err = strconv.ParseFloat(string(v), 64)
	if err != nil {
		return 0, true, fmt.Errorf("number %s is out of range", v)
	}
	return f, true, nil
}

// looseString decodes a valid JSON string as encoding/json does: invalid
// UTF-8 and unpaired surrogates become U+FFFD.
func looseString(v []byte) string {
	if inner := v[1 : len(v)-1]; literal(inner) {
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
