package fold

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Event is a validated event, reduced to what its key's state needs. It is
// immutable once prepared.
type Event struct {
	// Raw is the event exactly as received; it is what gets logged.
	Raw []byte
	// Key names the event's actor within its pipeline.
	Key string
	// ID is the idempotency id, "" if the event has none.
	ID string
	// Time is the event time in Unix milliseconds, or 0 when the pipeline
	// has no time field (ingest time is used).
	Time  int64
	steps uint64 // the pattern filters it matched
	timed bool   // Time was read from the event's time field (next to Erase and Expire: 8 bytes less)
	// Erase makes the event a tombstone: applying it erases the key (see
	// Erase). Raw is empty.
	Erase bool
	// Expire makes the event an expiry check: applying it at processing
	// time now erases the key if it received no event for the pipeline's
	// ttl before now. Raw is empty.
	Expire bool
	// Call makes the event a call of the key's handler (call.go): Raw is
	// the request, ID its id. Apply it with ApplyCall.
	Call bool

	contrib []contribution // one per aggregate of the pipeline, in order
	// indexedAt is the answer of the store's id index for ID (SetIndexed):
	// 0 if not looked up, -1 if absent, else when it was stored.
	indexedAt int64
}

// SetIndexed gives the event what the store's id index holds of its id,
// for ApplyEvent (which answered LookUp): at is the latest time the id was
// stored with under the buckets IDLookups named, 0 if under none.
func (ev *Event) SetIndexed(at int64) {
	if at <= 0 {
		at = -1
	}
	ev.indexedAt = at
}

// contribution is what one event adds to one aggregate.
type contribution struct {
	ok  bool    // the event contributes (field present, where matched)
	num float64 // sum, min, max, quantiles
	// val is, of last, the value as JSON; of distinct, the value as keys
	// and ids are named. (One field for both: every event of a batch has
	// a contribution per aggregate, BENCHMARKS.md.)
	val []byte
}

// Prepare decodes and validates one event, a JSON object. It returns a
// *FieldError (wrapping ErrInvalidEvent) naming the field at fault when the
// key is missing or not a string or number, when the key or id is not valid
// UTF-8 text (invalid bytes, an unpaired surrogate escape), when the id is
// empty or not a string or number, when a numeric aggregate's field is not
// a number, when the time field has the wrong type, or when a where filter
// fails on the event. A field that is simply absent leaves its aggregate
// unchanged. Only the members the pipeline reads are decoded (scan.go).
func (p *Pipeline) Prepare(raw []byte) (*Event, error) {
	ev := &Event{}
	if err := p.prepare(ev, raw, nil); err != nil {
		return nil, err
	}
	return ev, nil
}

// prepare fills ev from raw. contrib, if it has room for one contribution
// per aggregate, holds ev's (PrepareBatch allocates them for a whole batch).
func (p *Pipeline) prepare(ev *Event, raw []byte, contrib []contribution) error {
	if p.join != nil {
		return ErrJoinIngest
	}
	var buf [maxStackReads][]byte
	f, valid := p.scanFields(raw, &buf)
	if !valid {
		var m map[string]any
		err := json.Unmarshal(raw, &m) // for its message
		return &FieldError{Field: "", Reason: describeJSONError(raw, err)}
	}
	*ev = Event{Raw: raw}

	kv, ok := f.rawValue(p.keyRef)
	if !ok || kv[0] == 'n' {
		return &FieldError{Field: p.keyField, Reason: "key field is missing"}
	}
	key, err := scalarText(kv, true)
	if err != nil {
		return &FieldError{Field: p.keyField, Reason: "key " + err.Error()}
	}
	if err := CheckKey(key); err != nil {
		return &FieldError{Field: p.keyField, Reason: err.(*FieldError).Reason}
	}
	ev.Key = key
	return p.prepareRest(ev, &f, contrib, true)
}

// Replay rebuilds an event of key from the log for replay. It never rejects:
// the event was accepted when it was logged, and the log is the truth. If
// the pipeline changed since and part of the event no longer validates, that
// part contributes nothing, but the event still counts and its id is still
// remembered, so an acknowledged event is never lost on replay. (An id
// logged before ids had to be valid UTF-8 is read as it was then, with
// U+FFFD for what is not.)
func (p *Pipeline) Replay(raw []byte, key string) *Event {
	ev := &Event{Raw: raw, Key: key}
	var buf [maxStackReads][]byte
	f, valid := p.scanFields(raw, &buf)
	if !valid {
		f.notObject = true
		clear(f.vals) // the members before the fault are not read
	}
	_ = p.prepareRest(ev, &f, nil, false)
	return ev
}

// prepareRest reads the id, the time and the aggregates' contributions.
// When strict is false a field at fault is taken as absent instead.
func (p *Pipeline) prepareRest(ev *Event, f *fields, contrib []contribution, strict bool) error {
	if p.idField != "" {
		if v, ok := f.rawValue(p.idRef); ok && v[0] != 'n' {
			id, err := scalarText(v, strict)
			switch {
			case err != nil:
				err = &FieldError{Field: p.idField, Reason: "id " + err.Error()}
			case id == "":
				err = &FieldError{Field: p.idField, Reason: "id must not be empty (leave it out, or null, for no id)"}
			}
			if err != nil && strict {
				return err
			}
			ev.ID = id
		}
	}
	if p.timeField != "" {
		v, ok, err := f.lookup(p.timeRef)
		if ok && (v != nil || err != nil) {
			var t int64
			if err == nil {
				t, err = eventTime(v)
			}
			if err != nil && strict {
				return &FieldError{Field: p.timeField, Reason: err.Error()}
			}
			ev.Time, ev.timed = t, err == nil
		}
	}
	var env map[string]any // what the filters see
	if p.hasFilters {
		var err error
		if env, err = f.filterEnv(ev.Raw); err != nil {
			if strict {
				return err
			}
			env = map[string]any{}
			f.noFilterFields = true // what filters read is absent (textEq too)
		}
		if !p.dynamicEnv {
			defer putEnv(env)
		}
	}
	if len(p.steps) > 0 {
		mask, err := p.stepMask(f, env)
		if err != nil && strict {
			return err
		}
		ev.steps = mask
	}
	if len(contrib) < len(p.aggs) {
		contrib = make([]contribution, len(p.aggs))
	}
	ev.contrib = contrib[:len(p.aggs):len(p.aggs)]
	for i := range p.aggs {
		c, err := p.aggs[i].contribution(f, env, p.aggRefs[i])
		if err != nil {
			if strict {
				return err
			}
			c = contribution{}
		}
		ev.contrib[i] = c
	}
	return nil
}

func (a *aggregate) contribution(f *fields, env map[string]any, ref fieldRef) (contribution, error) {
	var c contribution
	if a.where != nil {
		ok, err := a.where.eval(f, env)
		if err != nil {
			return c, &FieldError{Field: "aggregates." + a.name + ".where", Reason: err.Error()}
		}
		if !ok {
			return c, nil
		}
	}
	if a.op == OpCount && a.field == "" {
		c.ok = true
		return c, nil
	}
	raw, ok := f.rawValue(ref)
	if !ok || raw[0] == 'n' {
		return c, nil // absent: no contribution
	}
	switch {
	case a.op.numeric():
		num, isNum, err := decodeNumber(raw)
		if err != nil {
			return c, &FieldError{Field: a.field, Reason: err.Error()}
		}
		if !isNum {
			v, err := decodeValue(raw)
			if err != nil { // an array or object holding a number out of range
				return c, &FieldError{Field: a.field, Reason: err.Error()}
			}
			return c, &FieldError{Field: a.field, Reason: fmt.Sprintf("%s needs a number, got %s", a.op, describe(v))}
		}
		c.num = num
	case a.op == OpDistinct:
		s, err := scalarText(raw, false)
		if err != nil {
			return c, &FieldError{Field: a.field, Reason: "distinct value " + err.Error()}
		}
		c.val = []byte(s)
	case a.op == OpLast && plainString(raw):
		c.val = raw // as encoding/json renders it; the state copies it (aggSet.setLast)
	case a.op == OpLast:
		v, err := decodeValue(raw)
		if err != nil {
			return c, &FieldError{Field: a.field, Reason: err.Error()}
		}
		b, err := json.Marshal(v) // the value as encoding/json renders it
		if err != nil {           // cannot happen for decoded JSON
			return c, &FieldError{Field: a.field, Reason: err.Error()}
		}
		c.val = b
	}
	c.ok = true
	return c, nil
}

// walk follows a path through nested objects.
func walk(fields map[string]any, path []string) (any, bool) {
	var cur any = fields
	for _, part := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// maxExactInt is the largest integer a float64 (a JSON number decoded by
// encoding/json) holds exactly.
const maxExactInt = 1 << 53

// scalarText renders a key or id from its raw JSON value: strings as they
// are, numbers in their shortest decimal form (42, 4.5). Integers at or
// beyond ±2^53 are refused: as float64 they would round and distinct keys
// or ids would collide. strict refuses strings that are not valid UTF-8
// text (see strictString); otherwise they are read as encoding/json does.
func scalarText(raw []byte, strict bool) (string, error) {
	if raw[0] == '"' {
		if strict {
			return strictString(raw)
		}
		return looseString(raw), nil
	}
	x, ok, err := decodeNumber(raw)
	if err != nil {
		return "", err
	}
	if !ok {
		v, err := decodeValue(raw)
		if err != nil { // an array or object holding a number out of range
			return "", err
		}
		return "", fmt.Errorf("must be a string or a number, got %s", describe(v))
	}
	if math.Abs(x) >= maxExactInt {
		return "", fmt.Errorf("number %.0f is at or beyond ±2^53 and may have lost precision: send it as a string", x)
	}
	if x == 0 {
		x = 0 // -0 and 0 name the same key
	}
	return strconv.FormatFloat(x, 'f', -1, 64), nil
}

// plainString reports whether raw is a JSON string of printable ASCII with
// no escape and nothing encoding/json escapes (<, > and &): rendered again
// by encoding/json it stays the same bytes, so it need not be decoded.
func plainString(raw []byte) bool {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return false
	}
	for _, c := range raw[1 : len(raw)-1] {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// eventTime reads an RFC 3339 string or a number of Unix milliseconds.
func eventTime(v any) (int64, error) {
	switch x := v.(type) {
	case string:
		t, err := time.Parse(time.RFC3339Nano, x)
		if err != nil {
			return 0, fmt.Errorf("time must be RFC 3339 or Unix milliseconds, got %q", x)
		}
		if t.UnixMilli() < 0 {
			return 0, fmt.Errorf("time before 1970 is not supported: %q", x)
		}
		return t.UnixMilli(), nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 || x > 1<<53 {
			return 0, fmt.Errorf("time in Unix milliseconds out of range: %v", x)
		}
		return int64(x), nil
	default:
		return 0, fmt.Errorf("time must be RFC 3339 or Unix milliseconds, got %s", describe(v))
	}
}

func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		if len(x) > 40 {
			x = x[:40] + "…"
		}
		return fmt.Sprintf("string %q", x)
	case bool:
		return fmt.Sprintf("bool %v", x)
	case float64:
		return fmt.Sprintf("number %v", x)
	case []any:
		return "array"
	case map[string]any:
		return "object"
	default:
		return fmt.Sprintf("%T", v)
	}
}

func describeJSONError(raw []byte, err error) string {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) > 0 && trimmed[0] != '{' {
		return "event must be a JSON object"
	}
	if err == nil {
		return "event must be a JSON object, got null"
	}
	return "invalid JSON: " + err.Error()
}

// PrepareBatch prepares every event of a batch. If any is invalid it returns
// a *BatchError for the first one, and the batch must be rejected whole.
// The batch's events and their contributions are allocated together.
func (p *Pipeline) PrepareBatch(raws [][]byte) ([]*Event, error) {
	if p.join != nil {
		return nil, fmt.Errorf("%w (join %q: pipelines %q and %q)", ErrJoinIngest, p.name, p.join.sides[0], p.join.sides[1])
	}
	n := len(p.aggs)
	slab := make([]Event, len(raws))
	contribs := make([]contribution, len(raws)*n)
	events := make([]*Event, len(raws))
	for i, raw := range raws {
		if err := p.prepare(&slab[i], raw, contribs[i*n:(i+1)*n:(i+1)*n]); err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		events[i] = &slab[i]
	}
	return events, nil
}

// CheckKey reports, as a *FieldError (wrapping ErrInvalidEvent) without a
// field, why a string cannot name a key: it is empty, contains NUL or is
// not valid UTF-8.
func CheckKey(key string) error {
	switch {
	case key == "":
		return &FieldError{Reason: "key must not be empty"}
	case strings.ContainsRune(key, 0):
		return &FieldError{Reason: "key must not contain NUL"}
	case !utf8.ValidString(key):
		return &FieldError{Reason: "key must be valid UTF-8"}
	}
	return nil
}
