package fold

import (
	"bytes"
	"encoding/json"
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
// (10000 containers, the object itself included), whatever the mix of
// objects and arrays, and accepted up to it.
func TestEachMemberDepth(t *testing.T) {
	for _, n := range []int{31, 32, 33, 9998, 9999, 10000, 100000} {
		for _, open := range []string{"[", `{"x":`} {
			closer := "]"
			if open != "[" {
				closer = "}"
			}
			b := []byte(`{"a":` + strings.Repeat(open, n) + "0" + strings.Repeat(closer, n) + `}`)
			if got, want := eachMember(b, func(_, _ []byte) {}), json.Valid(b); got != want {
				t.Errorf("%d × %s: valid = %v, encoding/json.Valid = %v", n, open, got, want)
			}
		}
	}
}

// FuzzFilterTextEq holds the filters evaluated on a field's raw value
// (textEq) to expr: for events of any shape, each gives expr's answer on
// the members decoded as filterEnv decodes them.
func FuzzFilterTextEq(f *testing.F) {
	for _, s := range []string{
		`{"type":"login_failed"}`, `{"type":"login_ok"}`, `{}`, `{"type":null}`, `{"type":1}`, `{"type":true}`,
		`{"type":["login_failed"]}`, `{"type":{"a":"login_failed"}}`, `{"type":"login\u005ffailed"}`,
		`{"type":"login_failed","type":"x"}`, "{\"type\":\"\xff\"}", `{"type":"\ud800"}`, `{"type":"\ufffd"}`,
		`{"type":""}`, `{"\u0074ype":"login_failed"}`, `{"type":"é"}`,
	} {
		f.Add([]byte(s), "login_failed")
	}
	f.Add([]byte("{\"type\":\"\xff\"}"), "\ufffd")
	f.Add([]byte(`{"type":"é"}`), "é")
	f.Add([]byte(`{"type":""}`), "")
	f.Fuzz(func(t *testing.T, raw []byte, text string) {
		if len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
			return
		}
		lit, _ := json.Marshal(text) // a JSON string is an expr string literal
		for _, src := range []string{"type == " + string(lit), string(lit) + " == type", "type != " + string(lit)} {
			w, err := compileWhere(src)
			if err != nil {
				t.Fatalf("compile %s: %v", src, err)
			}
			if w.eq == nil {
				t.Fatalf("%s is not evaluated as a textEq", src)
			}
			var vals [1][]byte
			eachMember(raw, func(name, val []byte) {
				if memberIs(name, "type") {
					vals[0] = val
				}
			})
			env := map[string]any{}
			if vals[0] != nil {
				d, err := decodeValue(vals[0])
				if err != nil {
					return // a number out of range: refused before any filter
				}
				env["type"] = d
			}
			want, err := w.match(env)
			if err != nil {
				t.Fatalf("expr %s on %q: %v", src, raw, err)
			}
			if got := w.eq.matchRaw(vals[0]); got != want {
				t.Fatalf("%s on %q: textEq says %v, expr %v", src, raw, got, want)
			}
		}
	})
}
