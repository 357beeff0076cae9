package fold_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/keyfold/keyfold/actors/fold"
)

// fuzzSpec is a pipeline that exercises every op, a where filter on a
// top-level and on a nested field, an id with a short dedup window and a
// time field.
var fuzzSpec = fold.Spec{
	Key:         "user_id",
	Time:        "ts",
	ID:          "event_id",
	DedupWindow: 3 * time.Second,
	Aggregates: map[string]fold.AggregateSpec{
		"total":    {Op: "count"},
		"failed":   {Op: "count", Where: "type == 'login_failed'"},
		"big":      {Op: "sum", Field: "amount", Where: "amount > 10"},
		"amount":   {Op: "sum", Field: "amount"},
		"biggest":  {Op: "max", Field: "amount"},
		"smallest": {Op: "min", Field: "amount"},
		"country":  {Op: "last", Field: "geo.country"},
		"label":    {Op: "last", Field: "label"},
		"labels":   {Op: "distinct", Field: "label"},
		"spread":   {Op: "quantiles", Field: "amount"},
	},
	AllowedLateness: 3 * time.Second,
	Windows: map[string]fold.WindowSpec{
		"tumble":  {Type: "tumbling", Size: 10 * time.Second},
		"slide":   {Type: "sliding", Size: 20 * time.Second, Slide: 5 * time.Second, Aggregates: []string{"total", "labels", "country"}},
		"session": {Type: "session", Gap: 4 * time.Second, Aggregates: []string{"amount", "spread", "label"}},
	},
	Patterns: map[string]fold.PatternSpec{
		"brute":   {Where: "type == 'login_failed'", Count: 3, Within: 6 * time.Second},
		"ok_fail": {Sequence: []string{"type == 'login_ok'", "type == 'login_failed'", "amount > 0"}, Within: 10 * time.Second},
		"silence": {After: "type == 'login_failed'", Absent: "type == 'login_ok'", Within: 5 * time.Second},
	},
}

// fuzzLag is how far the fuzz inputs' watermark trails their newest event
// time; events go back in time by up to 4 s at a time (see fuzzInputs).
const fuzzLag = 2000

func mustCompile(tb testing.TB, spec fold.Spec) *fold.Pipeline {
	tb.Helper()
	p, err := fold.Compile("fuzz", spec)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// FuzzPrepare feeds arbitrary bytes to Prepare: it must never panic, must
// reject with a *FieldError wrapping ErrInvalidEvent, and what it accepts
// must have a key and apply and round-trip cleanly.
func FuzzPrepare(f *testing.F) {
	for _, s := range []string{
		`{"user_id": "alice", "event_id": "e1", "ts": "2024-03-01T12:00:00Z", "type": "login_failed", "amount": 12.5, "geo": {"country": "FR"}}`,
		`{"user_id": 42, "event_id": 7, "ts": 1709294400000, "amount": -1, "label": [1, {"a": null}]}`,
		`{"user_id": "a", "amount": "lots"}`,
		`{"user_id": "a", "geo": {"country": null}, "label": "\u00e9\ud800"}`,
		`{"user_id": "", "amount": 1}`,
		`{"user_id": null}`,
		`{"user_id": "a", "ts": -1}`,
		`{"user_id": "a", "ts": "yesterday"}`,
		`{"user_id": "a", "type": 1}`,
		`{"user_id": "a", "amount": 1e308, "geo": "FR"}`,
		`{"user_id": 1e400}`,
		`{"user_id": "a", "user_id": "b"}`,
		`{}`, `[]`, `null`, `"x"`, `{`, ``, "\xff\xfe", `{"user_id": "a"} trailing`,
		// keys and ids must be UTF-8 text; escaped names and nested members
		`{"user_id": "\ud800"}`, `{"user_id": "a", "event_id": "\udfff"}`, "{\"user_id\": \"\xff\"}",
		`{"user_id": "\ud83d\ude00", "event_id": "\ud83d"}`, `{"user_id": "\udc00\ud800"}`,
		`{"\u0075ser_id": "a", "geo": {"country": "x", "country": "y"}, "geo.country": "lit"}`,
		`{"user_id": "a", "amount": 1, "amount": "x"}`, `{"user_id": "a", "ts": 1e400}`,
	} {
		f.Add([]byte(s))
	}
	p := mustCompile(f, fuzzSpec)
	f.Fuzz(func(t *testing.T, raw []byte) {
		ev, err := p.Prepare(raw)
		_, batchErr := p.PrepareBatch([][]byte{raw})
		if (err == nil) != (batchErr == nil) {
			t.Fatalf("Prepare err = %v but PrepareBatch err = %v", err, batchErr)
		}
		if err != nil {
			var fe *fold.FieldError
			if !errors.As(err, &fe) || !errors.Is(err, fold.ErrInvalidEvent) {
				t.Fatalf("Prepare error %v (%T) is not a *FieldError wrapping ErrInvalidEvent", err, err)
			}
			var be *fold.BatchError
			if !errors.As(batchErr, &be) || be.Index != 0 || !errors.Is(batchErr, fold.ErrInvalidEvent) {
				t.Fatalf("PrepareBatch error %v is not a *BatchError for event 0", batchErr)
			}
			return
		}
		if ev.Key == "" {
			t.Fatalf("Prepare(%q) accepted an event with an empty key", raw)
		}
		if !utf8.ValidString(ev.Key) || !utf8.ValidString(ev.ID) {
			t.Fatalf("Prepare(%q) accepted key %q id %q: not UTF-8", raw, ev.Key, ev.ID)
		}
		compareWithNormalized(t, p, raw, ev)
		if !bytes.Equal(ev.Raw, raw) {
			t.Fatalf("Event.Raw = %q, want %q", ev.Raw, raw)
		}
		var s fold.State
		if dup := p.Apply(&s, ev, 1000); dup {
			t.Fatal("first event of a key reported as duplicate")
		}
		if p.Apply(&s, ev, 1001) != (ev.ID != "") {
			t.Fatalf("second apply of an event with id %q: duplicate should be %v", ev.ID, ev.ID != "")
		}
		if _, err := json.Marshal(p.Aggregates(&s)); err != nil {
			t.Fatalf("aggregates do not encode as JSON: %v", err)
		}
		checkRoundTrip(t, p, &s)
	})
}

// checkRoundTrip checks that s survives MarshalState → UnmarshalState and
// StateProto → StateFromProto unchanged.
func checkRoundTrip(t *testing.T, p *fold.Pipeline, s *fold.State) {
	t.Helper()
	r, _ := roundTrip(t, p, s)
	if d := stateDiff(p, s, &r); d != "" {
		t.Fatalf("state changed by MarshalState/UnmarshalState: %s", d)
	}
	r2, err := p.StateFromProto(stateProto(p, s))
	if err != nil {
		t.Fatal(err)
	}
	if d := stateDiff(p, s, &r2); d != "" {
		t.Fatalf("state changed by StateProto/StateFromProto: %s", d)
	}
}

// stateDiff describes how two states differ in seq, aggregates or
// marshalled bytes, or returns "".
func stateDiff(p *fold.Pipeline, a, b *fold.State) string {
	if a.Seq() != b.Seq() {
		return fmt.Sprintf("seq %d != %d", a.Seq(), b.Seq())
	}
	if a.Empty() != b.Empty() {
		return fmt.Sprintf("empty %v != %v", a.Empty(), b.Empty())
	}
	if aa, ab := p.Aggregates(a), p.Aggregates(b); !reflect.DeepEqual(aa, ab) {
		return fmt.Sprintf("aggregates %v != %v", aa, ab)
	}
	ba, err := p.MarshalState(a)
	if err != nil {
		return err.Error()
	}
	bb, err := p.MarshalState(b)
	if err != nil {
		return err.Error()
	}
	if !bytes.Equal(ba, bb) {
		return fmt.Sprintf("marshalled state differs:\n%v\n%v", stateProto(p, a), stateProto(p, b))
	}
	return ""
}

// fuzzInput is one logged input: an event and its processing time.
type fuzzInput struct {
	raw   []byte
	nowMs int64
}

// fuzzInputs derives a sequence of events of one key, and their processing
// times, from data: 4 bytes an event.
//
//	byte 0: bits 0-2 the id (0 and 7: none, else one of 6, so ids repeat),
//	        bit 3 amount present, bit 4 type login_failed, bit 5 geo
//	        present, bit 6 amount huge (sums overflow), bit 7 time goes back
//	byte 1: amount, a signed byte (or a label when bit 3 is clear)
//	byte 2: processing-time step, in 50 ms units (the dedup window is 3 s)
//	byte 3: bits 0-1 the country (3: null), bits 2-7 the event-time step in s
//	        (steps above 59 go back 4 s instead, so some events are late)
func fuzzInputs(data []byte) []fuzzInput {
	var out []fuzzInput
	now, evTime := int64(1_700_000_000_000), int64(1_700_000_000_000)
	countries := []string{`"FR"`, `"DE"`, `"ES"`, `null`}
	for ; len(data) >= 4; data = data[4:] {
		b0, b1, b2, b3 := data[0], data[1], data[2], data[3]
		step := int64(b2) * 50
		if b0&0x80 != 0 {
			now -= step
		} else {
			now += step
		}
		if step := int64(b3 >> 2); step > 59 {
			evTime -= 4000
		} else {
			evTime += step * 1000
		}
		ev := map[string]any{"user_id": "k", "ts": evTime}
		if id := b0 & 7; id != 0 && id != 7 {
			ev["event_id"] = fmt.Sprintf("e%d", id)
		}
		if b0&8 != 0 {
			amount := float64(int8(b1))
			if b0&0x40 != 0 {
				amount *= 1e306
			}
			ev["amount"] = amount
		} else {
			ev["label"] = int(b1) % 5
		}
		if b0&0x10 != 0 {
			ev["type"] = "login_failed"
		} else {
			ev["type"] = "login_ok"
		}
		if b0&0x20 != 0 {
			ev["geo"] = json.RawMessage(`{"country": ` + countries[b3&3] + `}`)
		}
		raw, err := json.Marshal(ev)
		if err != nil {
			panic(err)
		}
		out = append(out, fuzzInput{raw: raw, nowMs: now})
	}
	return out
}

// replay applies inputs to s in order, each after advancing the key's
// watermark to fuzzLag behind the newest event time so far, and returns the
// duplicate flags.
func replay(t *testing.T, p *fold.Pipeline, s *fold.State, inputs []fuzzInput) []bool {
	t.Helper()
	dups := make([]bool, len(inputs))
	for i, in := range inputs {
		ev, err := p.Prepare(in.raw)
		if err != nil {
			t.Fatalf("generated event %s rejected: %v", in.raw, err)
		}
		p.Advance(s, ev.Key, max(s.Watermark(), ev.Time-fuzzLag))
		dups[i] = p.Apply(s, ev, in.nowMs)
	}
	return dups
}

// outputs describes the results s emitted since they were last taken, and
// takes them.
func outputs(t *testing.T, _ *fold.Pipeline, s *fold.State) []string {
	t.Helper()
	var out []string
	for _, o := range s.TakeOutputs() {
		out = append(out, fmt.Sprintf("%s count=%d wm=%d %s supersedes=%v", o.GetId(), o.GetCount(), o.GetWatermarkMs(), o.GetValuesJson(), o.GetSupersedes()))
	}
	return out
}

// FuzzApply checks the core's two promises: replaying a snapshot plus the
// tail of the log rebuilds exactly the state of a full replay, and a replay
// is deterministic.
func FuzzApply(f *testing.F) {
	f.Add(uint8(0), []byte{})
	f.Add(uint8(1), []byte{0x09, 5, 0, 0})
	// A duplicate, then the same id after the dedup window.
	f.Add(uint8(1), []byte{0x09, 5, 1, 4, 0x09, 6, 1, 4, 0x09, 7, 80, 4})
	// A duplicate across the snapshot, and time going backwards.
	f.Add(uint8(2), []byte{0x3a, 20, 1, 5, 0x1b, 30, 1, 6, 0xba, 40, 10, 7, 0x3a, 20, 1, 5})
	// Sums that overflow to infinity, and back.
	f.Add(uint8(3), []byte{0x48, 127, 0, 0, 0x48, 127, 0, 0, 0x48, 127, 0, 0, 0x48, 0x80, 0, 0, 0x48, 0x80, 0, 0})
	// Every id, and no id.
	f.Add(uint8(128), []byte{
		0x01, 1, 1, 1, 0x02, 2, 2, 2, 0x03, 3, 3, 3, 0x04, 4, 4, 4, 0x05, 5, 5, 5, 0x06, 6, 6, 6,
		0x07, 7, 7, 7, 0x00, 8, 8, 8, 0x39, 9, 9, 9, 0x2a, 10, 10, 10, 0x1b, 11, 255, 11,
	})
	p := mustCompile(f, fuzzSpec)
	f.Fuzz(func(t *testing.T, split uint8, data []byte) {
		inputs := fuzzInputs(data)
		at := 0
		if len(inputs) > 0 {
			at = int(split) % (len(inputs) + 1)
		}

		// The full replay from the empty state.
		var full fold.State
		fullDups := replay(t, p, &full, inputs)
		fullOut := outputs(t, p, &full)

		// (a) A prefix, a snapshot, and the rest from the restored state.
		var prefix fold.State
		dups := replay(t, p, &prefix, inputs[:at])
		outs := outputs(t, p, &prefix)
		b, err := p.MarshalState(&prefix)
		if err != nil {
			t.Fatal(err)
		}
		restored, err := p.UnmarshalState(b)
		if err != nil {
			t.Fatal(err)
		}
		dups = append(dups, replay(t, p, &restored, inputs[at:])...)
		if !reflect.DeepEqual(dups, fullDups) {
			t.Fatalf("duplicates with a snapshot after %d events %v, full replay %v", at, dups, fullDups)
		}
		if outs = append(outs, outputs(t, p, &restored)...); !slices.Equal(outs, fullOut) {
			t.Fatalf("outputs with a snapshot after %d events:\n%s\nfull replay:\n%s", at, strings.Join(outs, "\n"), strings.Join(fullOut, "\n"))
		}
		if d := stateDiff(p, &full, &restored); d != "" {
			t.Fatalf("snapshot after %d of %d events, then the tail: %s", at, len(inputs), d)
		}

		// A snapshot after every event, through the proto message.
		stepwise, stepOut := snapshotEachStep(t, p, len(inputs), func(s *fold.State, i int) { replay(t, p, s, inputs[i:i+1]) })
		if d := stateDiff(p, &full, &stepwise); d != "" {
			t.Fatalf("snapshot after every event: %s", d)
		}
		if !slices.Equal(stepOut, fullOut) {
			t.Fatalf("outputs with a snapshot after every event:\n%s\nfull replay:\n%s", strings.Join(stepOut, "\n"), strings.Join(fullOut, "\n"))
		}

		// (b) The same inputs again give the same bytes.
		var again fold.State
		replay(t, p, &again, inputs)
		b1, err1 := p.MarshalState(&full)
		b2, err2 := p.MarshalState(&again)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("two replays of the same inputs differ:\n%v\n%v", stateProto(p, &full), stateProto(p, &again))
		}

		// Invariants: seq counts the applied events, as does total.
		applied := uint64(0)
		for _, d := range fullDups {
			if !d {
				applied++
			}
		}
		if full.Seq() != applied {
			t.Fatalf("seq = %d, want %d applied events", full.Seq(), applied)
		}
		if got := p.Aggregates(&full)["total"]; got != applied {
			t.Fatalf("total = %v, want %d", got, applied)
		}
		if _, err := json.Marshal(p.Aggregates(&full)); err != nil {
			t.Fatalf("aggregates do not encode as JSON: %v", err)
		}
	})
}

// snapshotEachStep applies n inputs (step applies the i-th), each time
// followed by a round trip of the state through its persisted message,
// which must change nothing; it returns the state and the results.
func snapshotEachStep(t *testing.T, p *fold.Pipeline, n int, step func(s *fold.State, i int)) (fold.State, []string) {
	t.Helper()
	var s fold.State
	var outs []string
	for i := range n {
		step(&s, i)
		outs = append(outs, outputs(t, p, &s)...)
		next, err := p.StateFromProto(stateProto(p, &s))
		if err != nil {
			t.Fatal(err)
		}
		if d := stateDiff(p, &s, &next); d != "" {
			t.Fatalf("after input %d: StateProto/StateFromProto: %s", i, d)
		}
		s = next
	}
	return s, outs
}
