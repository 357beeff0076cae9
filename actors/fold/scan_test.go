package fold_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/keyfold/keyfold/actors/fold"
)

// TestKeysAndIDsMustBeText: a key or id that is not valid UTF-8 text (raw
// invalid bytes, a lone or unpaired surrogate escape) is refused with a
// *FieldError naming the field. encoding/json would turn each into U+FFFD,
// so "\ud800" and "\udfff" would be one id: the second event a duplicate.
func TestKeysAndIDsMustBeText(t *testing.T) {
	p := mustCompile(t, fold.Spec{Key: "user_id", ID: "event_id", Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}})
	for _, tc := range []struct {
		raw   string
		field string // "" when accepted
		key   string
		id    string
	}{
		{`{"user_id": "\ud800"}`, "user_id", "", ""},
		{`{"user_id": "\udfff"}`, "user_id", "", ""},
		{`{"user_id": "a\ud800b"}`, "user_id", "", ""},
		{`{"user_id": "\ud800\u0041"}`, "user_id", "", ""},     // high, then not a low surrogate
		{`{"user_id": "\udc00\ud800"}`, "user_id", "", ""},     // low first
		{`{"user_id": "x\ud800"}`, "user_id", "", ""},          // high at the end
		{"{\"user_id\": \"\xff\"}", "user_id", "", ""},         // raw invalid byte
		{"{\"user_id\": \"\xed\xa0\x80\"}", "user_id", "", ""}, // a surrogate encoded as UTF-8
		{`{"user_id": "a", "event_id": "\ud800"}`, "event_id", "", ""},
		{"{\"user_id\": \"a\", \"event_id\": \"e\xc3\"}", "event_id", "", ""},
		{`{"user_id": "\ud83d\ude00", "event_id": "\u00e9\\\"\n"}`, "", "\U0001F600", "é\\\"\n"},
		{`{"user_id": "\ufffd", "event_id": "�"}`, "", "\ufffd", "\ufffd"}, // U+FFFD itself is text
		{`{"user_id": "a", "label": "\ud800"}`, "", "a", ""},               // other fields read as before
	} {
		ev, err := p.Prepare([]byte(tc.raw))
		if tc.field == "" {
			if err != nil {
				t.Errorf("Prepare(%q): %v", tc.raw, err)
			} else if ev.Key != tc.key || ev.ID != tc.id {
				t.Errorf("Prepare(%q): key %q id %q, want %q %q", tc.raw, ev.Key, ev.ID, tc.key, tc.id)
			}
			continue
		}
		var fe *fold.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, fold.ErrInvalidEvent) || !strings.Contains(fe.Reason, "UTF-8") {
			t.Errorf("Prepare(%q) = %v, want a FieldError on %q about UTF-8", tc.raw, err, tc.field)
		}
	}
	// Replay never rejects: an id logged before this check reads as it did.
	if ev := p.Replay([]byte(`{"user_id": "a", "event_id": "\ud800"}`), "a"); ev.ID != "\ufffd" {
		t.Errorf("Replay id = %q, want U+FFFD", ev.ID)
	}
}

// TestPrepareMatchesEncodingJSON: events read member by member give what
// decoding the whole event with encoding/json gave: escaped member names,
// members given twice (the last wins), literal dotted names before nested
// paths, filters on nested and on dynamically named fields.
func TestPrepareMatchesEncodingJSON(t *testing.T) {
	for _, spec := range []fold.Spec{fuzzSpec, {
		Key: "a.b", ID: "id",
		Aggregates: map[string]fold.AggregateSpec{
			"dyn":  {Op: "count", Where: `$env["ty" + "pe"] == "x"`},
			"in":   {Op: "count", Where: `"flag" in $env`},
			"last": {Op: "last", Field: "v"},
			"sum":  {Op: "sum", Field: "n.m"},
		},
	}} {
		p := mustCompile(t, spec)
		for _, raw := range []string{
			`{"a.b": "lit", "a": {"b": "nested"}, "user_id": "u", "id": 1}`,
			`{"a": {"b": "nested", "b": "again"}, "user_id": "u", "user_id": "v", "type": "x", "flag": 1, "v": {"z": 1, "y": [1.50, "\u00e9"]}, "n": {"m": 2}}`,
			`{"\u0075ser_id": "esc", "a": {"\u0062": 3}, "type": "login_failed", "amount": 20, "geo": {"country": "FR"}, "label": "\ud800x"}`,
			` { "user_id" : 7 , "a" : { "b" : -0 } , "amount" : 1e2 , "ts" : 1000 , "event_id" : "e" , "n" : { "m" : 1.5 } } `,
		} {
			ev, err := p.Prepare([]byte(raw))
			if err != nil {
				t.Fatalf("Prepare(%s): %v", raw, err)
			}
			compareWithNormalized(t, p, []byte(raw), ev)
		}
	}
}

// TestFiltersSeeUnnamedFields: a filter that reads a field it does not name
// ($env[expr], "x" in $env) sees every member of the event.
func TestFiltersSeeUnnamedFields(t *testing.T) {
	for _, where := range []string{
		`$env[lower("TYPE")] == "x"`,
		`"flag" in $env`,
		`len($env) == 3`,
		`$env["type"] == "x" && $env.flag == 1`, // named: no need for the others
	} {
		p := mustCompile(t, fold.Spec{Key: "k", Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count", Where: where}}})
		ev, err := p.Prepare([]byte(`{"k": "a", "type": "x", "flag": 1}`))
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		var s fold.State
		p.Apply(&s, ev, 1)
		if n, _ := json.Marshal(p.Aggregates(&s)["n"]); string(n) != "1" {
			t.Errorf("where %s: count %s, want 1", where, n)
		}
	}
}

// compareWithNormalized checks that ev, prepared from raw, is what the
// pipeline makes of raw decoded by encoding/json and encoded again (no
// escapes, no member twice, no space): the same key, id, time, and
// aggregates once applied.
func compareWithNormalized(t *testing.T, p *fold.Pipeline, raw []byte, ev *fold.Event) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return // e.g. 1e400 in a member the pipeline does not read
	}
	norm, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	want, err := p.Prepare(norm)
	if err != nil {
		t.Fatalf("Prepare(%s) accepted, its normalized form %s refused: %v", raw, norm, err)
	}
	if ev.Key != want.Key || ev.ID != want.ID || ev.Time != want.Time {
		t.Fatalf("Prepare(%s): key %q id %q time %d; normalized %s: %q %q %d", raw, ev.Key, ev.ID, ev.Time, norm, want.Key, want.ID, want.Time)
	}
	var a, b fold.State
	p.Apply(&a, ev, 1000)
	p.Apply(&b, want, 1000)
	if ga, gb := p.Aggregates(&a), p.Aggregates(&b); !reflect.DeepEqual(ga, gb) {
		t.Fatalf("Prepare(%s): aggregates %v; normalized %s: %v", raw, ga, norm, gb)
	}
}

// TestLastIsWhatEncodingJSONRenders: a last aggregate holds its value as
// encoding/json renders it, whether or not the value takes the path that
// copies a plain string as received.
func TestLastIsWhatEncodingJSONRenders(t *testing.T) {
	p := mustCompile(t, fold.Spec{Key: "k", Aggregates: map[string]fold.AggregateSpec{"v": {Op: "last", Field: "v"}}})
	for _, v := range []string{
		`"DE"`, `""`, `" spaced out ~ "`, `"a<b"`, `"a>b"`, `"a&b"`, `"\u0041"`, `"\/"`, `"tab\t"`,
		`"é"`, "\"\u2028\"", `"\ud83d\ude00"`, `"q\"uote"`, `"back\\slash"`, `"\u007f"`,
		`12`, `1.50`, `-0`, `1e3`, `true`, `[1, "x"]`, `{"a": "<"}`,
	} {
		ev, err := p.Prepare([]byte(`{"k": "a", "v": ` + v + `}`))
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		var s fold.State
		p.Apply(&s, ev, 1000)
		var decoded any
		if err := json.Unmarshal([]byte(v), &decoded); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(decoded)
		if got := p.Aggregates(&s)["v"]; !reflect.DeepEqual(got, json.RawMessage(want)) {
			t.Errorf("last of %s = %s, want %s", v, got, want)
		}
	}
}
