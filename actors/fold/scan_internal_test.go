package fold

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// FuzzEachMember holds the scanner to encoding/json: it accepts an object
// exactly when encoding/json.Valid does, and the members it reports, the
// last of a name winning, are those encoding/json decodes.
func FuzzEachMember(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { } `, `{"a":1}`, `{"a":"\u00e9\n\"","b":[1,-2.5e+3,{"c":null}],"a":true}`,
		`{"a":01}`, `{"a":1.}`, `{"a":-}`, `{"a":1e}`, `{"a":.5}`, `{"a":+1}`, `{"a":tru}`, `{"a":truex}`,
		`{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\x01\"}", "{\"a\":\"\xff\"}", `{"a":1,}`, `{,}`, `{"a"}`,
		`{"a":[1,]}`, `{"a":[,1]}`, `{"a":{"b":1,}}`, `{"a":[]} x`, `{"a":[]}}`, `{"a":1 "b":2}`, `{"a":[}`,
		`{"a":{"b"}}`, `{"a":{1:2}}`, `{"\ud800":0}`, "{\"a\":\r\n\t[ ]}", `{"a":"`, `{"a":`, `{`,
		`{"a":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`,
		`{"a":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
		`{"a":` + strings.Repeat(`{"b":`, 40) + `0` + strings.Repeat("}", 40) + `}`,
		`{"a":"\u12`, `{"a":"\u`, `{"a":"\`, `{"a":true`, `{"a":1`, `{"a":-0}`, `{"a":-0.0e-0}`, `{"a":1e+}`,
		`{"a":0.0E+1}`, `{"a":[{},[]],"b":[[],{}],"c":[[[]],{"d":{}}]}`, `{"a":[1 2]}`, `{"a":{"b":1"c":2}}`,
		`{"a":[]`, `{"a":{}`, `{"a":[{]}`, `{"a":{[}}`, "{\"a\":\f1}", "{\"a\":1}\v",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || b[0] != '{' {
			b = append([]byte{'{'}, b...)
		}
		got := map[string][]byte{}
		valid := eachMember(b, func(name, val []byte) {
			var n string
			if err := json.Unmarshal(name, &n); err != nil {
				t.Fatalf("member name %q does not decode: %v", name, err)
			}
			got[n] = val
		})
		if want := json.Valid(b); valid != want {
			t.Fatalf("eachMember(%q) valid = %v, encoding/json.Valid = %v", b, valid, want)
		}
		if !valid {
			return
		}
		var want map[string]json.RawMessage
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("valid object %q does not decode: %v", b, err)
		}
		if len(got) != len(want) {
			t.Fatalf("eachMember(%q) found %d distinct members, encoding/json %d", b, len(got), len(want))
		}
		for n, w := range want {
			if g, ok := got[n]; !ok || !bytes.Equal(g, w) {
				t.Fatalf("eachMember(%q) member %q = %q, encoding/json %q", b, n, g, w)
			}
		}
	})
}

// TestEachMemberDepth: nesting is refused beyond encoding/json's limit
// (10000 containers, the object itself included), for objects, arrays,
// both mixed, and containers that close and open again beside each other
// (each close gives back its level), and accepted up to it.
func TestEachMemberDepth(t *testing.T) {
	nest := func(n int, open, closer string) string {
		return strings.Repeat(open, n) + "0" + strings.Repeat(closer, n)
	}
	for _, n := range []int{31, 32, 33, 9998, 9999, 10000, 100000} {
		for _, v := range []string{
			nest(n, "[", "]"),
			nest(n, `{"x":`, "}"),
			nest(n/2, `[{"x":`, "}]") + strings.Repeat(" ", n%2),
			strings.Repeat("[", n-1) + strings.Repeat("[],{},", 50) + "[[]]" + strings.Repeat("]", n-1),
		} {
			b := []byte(`{"a":` + v + `}`)
			if got, want := eachMember(b, func(_, _ []byte) {}), json.Valid(b); got != want {
				t.Errorf("%d levels (%.12s…): valid = %v, encoding/json.Valid = %v", n, v, got, want)
			}
		}
	}
}

// FuzzFilterTextEq holds the filters evaluated on a field's raw value
// (textEq) to expr: pipelines with `type == TEXT` and `type != TEXT` (alone,
// and beside a filter expr evaluates) accept, refuse and count every event,
// prepared or replayed, as the same pipelines with `!(type != TEXT)` and
// `!(type == TEXT)`, which expr evaluates.
func FuzzFilterTextEq(f *testing.F) {
	for _, s := range []string{
		`{"k":"a","type":"login_failed"}`, `{"k":"a","type":"login_ok"}`, `{"k":"a"}`, `{"k":"a","type":null}`,
		`{"k":"a","type":1}`, `{"k":"a","type":true}`, `{"k":"a","type":["login_failed"]}`,
		`{"k":"a","type":{"a":"login_failed"}}`, `{"k":"a","type":"login\u005ffailed"}`,
		`{"k":"a","type":"login_failed","type":"x"}`, "{\"k\":\"a\",\"type\":\"\xff\"}", `{"k":"a","type":"\ud800"}`,
		`{"k":"a","type":""}`, `{"k":"a","\u0074ype":"login_failed"}`, `{"k":"a","type":1e400}`,
		`{"k":"a","type":[1e400]}`, `{"k":"a","type":"login_failed","n":1e400}`, `{"k":"a","type":"login_failed","n":2}`,
		`{"k":"a","type":"login_failed","n":[1e400]}`, `[]`, `{"k":"a","type":"login_failed"`,
	} {
		f.Add([]byte(s), "login_failed")
	}
	f.Add([]byte("{\"k\":\"a\",\"type\":\"\xff\"}"), "\ufffd")
	f.Add([]byte(`{"k":"a","type":""}`), "")
	compile := func(t *testing.T, where map[string]string) *Pipeline {
		aggs := map[string]AggregateSpec{}
		for name, w := range where {
			aggs[name] = AggregateSpec{Op: "count", Where: w}
		}
		p, err := Compile("p", Spec{Key: "k", Aggregates: aggs})
		if err != nil {
			t.Fatalf("compile %v: %v", where, err)
		}
		return p
	}
	f.Fuzz(func(t *testing.T, raw []byte, text string) {
		lit, _ := json.Marshal(text) // a JSON string is an expr string literal
		eq, ne := "type == "+string(lit), string(lit)+" != type"
		byExpr := map[string]string{"eq": "!(type != " + string(lit) + ")", "ne": "!(type == " + string(lit) + ")"}
		for _, withExpr := range []bool{false, true} {
			raws := map[string]string{"eq": eq, "ne": ne}
			exprs := map[string]string{"eq": byExpr["eq"], "ne": byExpr["ne"]}
			if withExpr { // beside a filter expr evaluates (the map of members is built)
				raws["big"], exprs["big"] = "n > 1", "n > 1"
			}
			p, oracle := compile(t, raws), compile(t, exprs)
			if i := slices.IndexFunc(p.aggs, func(a aggregate) bool { return a.name == "eq" }); p.aggs[i].where.eq == nil || p.needsEnv != withExpr {
				t.Fatalf("%v: eq filter not a textEq, or needsEnv %v", raws, p.needsEnv)
			}
			ev, err := p.Prepare(raw)
			want, wantErr := oracle.Prepare(raw)
			if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
				t.Fatalf("%v on %q: Prepare err %v, expr's pipeline %v", raws, raw, err, wantErr)
			}
			if err == nil {
				compareApplied(t, p, oracle, ev, want)
			}
			compareApplied(t, p, oracle, p.Replay(raw, "a"), oracle.Replay(raw, "a"))
		}
	})
}

// compareApplied applies ev to a new state of p and want to one of oracle,
// and fails if their aggregates differ.
func compareApplied(t *testing.T, p, oracle *Pipeline, ev, want *Event) {
	t.Helper()
	var s, o State
	p.Apply(&s, ev, 1000)
	oracle.Apply(&o, want, 1000)
	got, exp := p.Aggregates(&s), oracle.Aggregates(&o)
	for name, v := range exp {
		if got[name] != v {
			t.Fatalf("%s = %v, expr's pipeline %v (event %q)", name, got[name], v, ev.Raw)
		}
	}
}

// TestNumberOutOfRangeInside: an array or object holding a number out of
// range, where a number or a key is read, is refused with encoding/json's
// message, as when the value was decoded whole.
func TestNumberOutOfRangeInside(t *testing.T) {
	p, err := Compile("p", Spec{Key: "k", ID: "id", Aggregates: map[string]AggregateSpec{"s": {Op: "sum", Field: "n"}}})
	if err != nil {
		t.Fatal(err)
	}
	for raw, want := range map[string]string{
		`{"k":"a","n":[1e400]}`:    `field "n": json: cannot unmarshal number 1e400`,
		`{"k":{"a":1e400}}`:        `field "k": key json: cannot unmarshal number 1e400`,
		`{"k":"a","id":[2,1e400]}`: `field "id": id json: cannot unmarshal number 1e400`,
		`{"k":"a","n":1e400}`:      `field "n": number 1e400 is out of range`,
		`{"k":"a","n":[1]}`:        `field "n": sum needs a number, got array`,
		`{"k":[1],"n":1}`:          `field "k": key must be a string or a number, got array`,
	} {
		if _, err := p.Prepare([]byte(raw)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Prepare(%s) = %v, want an error containing %q", raw, err, want)
		}
	}
}
