package fold

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
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
	timed bool   // Time was read from the event's time field
	steps uint64 // the pattern filters it matched
	// Erase makes the event a tombstone: applying it erases the key (see
	// Erase). Raw is empty.
	Erase bool
	// Expire makes the event an expiry check: applying it at processing
	// time now erases the key if it received no event for the pipeline's
	// ttl before now. Raw is empty.
	Expire bool

	contrib []contribution // one per aggregate of the pipeline, in order
}

// contribution is what one event adds to one aggregate.
type contribution struct {
	ok   bool    // the event contributes (field present, where matched)
	num  float64 // sum, min, max, quantiles
	last []byte  // last: the value as JSON
	str  string  // distinct: the value, as keys and ids are named
}

// Prepare decodes and validates one event, a JSON object. It returns a
// *FieldError (wrapping ErrInvalidEvent) naming the field at fault when the
// key is missing or not a string or number, when the id is empty or not a
// string or number, when a numeric aggregate's field is not a number, when
// the time field has the wrong type, or when a where filter fails on the
// event. A field that is simply absent leaves its aggregate unchanged.
func (p *Pipeline) Prepare(raw []byte) (*Event, error) {
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, &FieldError{Field: "", Reason: describeJSONError(raw, err)}
	}
	ev := &Event{Raw: raw}

	kv, ok := lookup(fields, p.keyField, p.key)
	if !ok || kv == nil {
		return nil, &FieldError{Field: p.keyField, Reason: "key field is missing"}
	}
	key, err := scalarString(kv)
	if err != nil {
		return nil, &FieldError{Field: p.keyField, Reason: "key " + err.Error()}
	}
	if err := CheckKey(key); err != nil {
		return nil, &FieldError{Field: p.keyField, Reason: err.(*FieldError).Reason}
	}
	ev.Key = key
	if err := p.prepareRest(ev, fields, true); err != nil {
		return nil, err
	}
	return ev, nil
}

// Replay rebuilds an event of key from the log for replay. It never rejects:
// the event was accepted when it was logged, and the log is the truth. If
// the pipeline changed since and part of the event no longer validates, that
// part contributes nothing, but the event still counts and its id is still
// remembered, so an acknowledged event is never lost on replay.
func (p *Pipeline) Replay(raw []byte, key string) *Event {
	ev := &Event{Raw: raw, Key: key}
	var fields map[string]any
	if json.Unmarshal(raw, &fields) != nil {
		fields = map[string]any{}
	}
	_ = p.prepareRest(ev, fields, false)
	return ev
}

// prepareRest reads the id, the time and the aggregates' contributions.
// When strict is false a field at fault is taken as absent instead.
func (p *Pipeline) prepareRest(ev *Event, fields map[string]any, strict bool) error {
	if p.idField != "" {
		if v, ok := lookup(fields, p.idField, p.id); ok && v != nil {
			id, err := scalarString(v)
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
		if v, ok := lookup(fields, p.timeField, p.time); ok && v != nil {
			t, err := eventTime(v)
			if err != nil && strict {
				return &FieldError{Field: p.timeField, Reason: err.Error()}
			}
			ev.Time, ev.timed = t, err == nil
		}
	}
	if len(p.steps) > 0 {
		mask, err := p.stepMask(fields)
		if err != nil && strict {
			return err
		}
		ev.steps = mask
	}
	ev.contrib = make([]contribution, len(p.aggs))
	for i := range p.aggs {
		c, err := p.aggs[i].contribution(fields)
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

func (a *aggregate) contribution(fields map[string]any) (contribution, error) {
	var c contribution
	if a.where != nil {
		ok, err := a.where.match(fields)
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
	v, ok := lookup(fields, a.field, a.path)
	if !ok || v == nil {
		return c, nil // absent: no contribution
	}
	switch {
	case a.op.numeric():
		f, isNum := v.(float64)
		if !isNum {
			return c, &FieldError{Field: a.field, Reason: fmt.Sprintf("%s needs a number, got %s", a.op, describe(v))}
		}
		c.num = f
	case a.op == OpDistinct:
		s, err := scalarString(v)
		if err != nil {
			return c, &FieldError{Field: a.field, Reason: "distinct value " + err.Error()}
		}
		c.str = s
	case a.op == OpLast:
		b, err := json.Marshal(v)
		if err != nil { // cannot happen for decoded JSON
			return c, &FieldError{Field: a.field, Reason: err.Error()}
		}
		c.last = b
	}
	c.ok = true
	return c, nil
}

// lookup finds a field by its literal name, else by walking its dotted path
// through nested objects.
func lookup(fields map[string]any, name string, path []string) (any, bool) {
	if v, ok := fields[name]; ok {
		return v, true
	}
	if len(path) < 2 {
		return nil, false
	}
	return walk(fields, path)
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

// scalarString renders a key or id: strings as they are, numbers in their
// shortest decimal form (42, 4.5). Integers at or beyond ±2^53 are refused: as
// float64 they would round and distinct keys or ids would collide.
func scalarString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case float64:
		if math.Abs(x) >= maxExactInt {
			return "", fmt.Errorf("number %.0f is at or beyond ±2^53 and may have lost precision: send it as a string", x)
		}
		if x == 0 {
			x = 0 // -0 and 0 name the same key
		}
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	default:
		return "", fmt.Errorf("must be a string or a number, got %s", describe(v))
	}
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
func (p *Pipeline) PrepareBatch(raws [][]byte) ([]*Event, error) {
	events := make([]*Event, len(raws))
	for i, raw := range raws {
		ev, err := p.Prepare(raw)
		if err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		events[i] = ev
	}
	return events, nil
}

// CheckKey reports, as a *FieldError (wrapping ErrInvalidEvent) without a
// field, why a string cannot name a key: it is empty or contains NUL.
func CheckKey(key string) error {
	switch {
	case key == "":
		return &FieldError{Reason: "key must not be empty"}
	case strings.ContainsRune(key, 0):
		return &FieldError{Reason: "key must not contain NUL"}
	}
	return nil
}
