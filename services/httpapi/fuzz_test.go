package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeJSON: any body either splits into valid JSON values or fails
// with ErrBadBody; it never panics.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`[]`, `[{"a":1},{"b":[1,2]}]`, `{"a":1}`, ` [ {} ] `, `[{"a":`, `[1,"x",null]`, `"x"`, `[{}]x`, ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		events, err := DecodeJSON(body)
		if err != nil {
			if !errors.Is(err, ErrBadBody) {
				t.Fatalf("error %v does not wrap ErrBadBody", err)
			}
			return
		}
		for i, ev := range events {
			if !json.Valid(ev) {
				t.Fatalf("event %d %q is not valid JSON", i, ev)
			}
		}
	})
}

// FuzzDecodeNDJSON: every returned line is valid JSON and no non-blank line
// is lost.
func FuzzDecodeNDJSON(f *testing.F) {
	for _, s := range []string{"{}\n{}", "{\"a\":1}\n\n\n", "x\n", "\n", "{}\r\n[1]\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		events, err := DecodeNDJSON(body)
		if err != nil {
			if !errors.Is(err, ErrBadBody) {
				t.Fatalf("error %v does not wrap ErrBadBody", err)
			}
			return
		}
		lines := 0
		for _, l := range bytes.Split(body, []byte("\n")) {
			if len(bytes.TrimSpace(l)) > 0 {
				lines++
			}
		}
		if lines != len(events) {
			t.Fatalf("%d non-blank lines, %d events", lines, len(events))
		}
		for i, ev := range events {
			if !json.Valid(ev) {
				t.Fatalf("event %d %q is not valid JSON", i, ev)
			}
		}
	})
}
