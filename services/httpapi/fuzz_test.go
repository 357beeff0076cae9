package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/keyfold/keyfold/services"
)

// FuzzDecodeJSON differentially checks the array splitter against
// encoding/json: a valid JSON array splits into exactly the elements the
// standard decoder finds, and an invalid body either fails with ErrBadBody
// or yields an element that is itself invalid (so the pipeline rejects the
// batch). It never panics.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`[]`, `[{"a":1},{"b":[1,2]}]`, `{"a":1}`, ` [ {} ] `, `[{"a":`, `[1,"x",null]`, `"x"`,
		`[{}]x`, "", `[{"a":"]\"}"}, {"b":"\\"}]`, `[{},]`, `[,{}]`, `[{} {}]`, `[{"a":1}}]`,
		`[{"k":"\ud800"},{"k":"\udfff"},{"k":"\ud83d\ude00"}]`, "[{\"k\":\"\xff\"},{\"\xed\xa0\x80\":1}]", `[{}, {}, {}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		events, err := DecodeJSON(body)
		checkLimited(t, body, events, err, decodeJSON)
		trimmed := bytes.TrimSpace(body)
		var want []json.RawMessage
		validArray := len(trimmed) > 0 && trimmed[0] == '[' && json.Unmarshal(trimmed, &want) == nil
		if err != nil {
			if !errors.Is(err, ErrBadBody) {
				t.Fatalf("error %v does not wrap ErrBadBody", err)
			}
			if validArray {
				t.Fatalf("valid array %q rejected: %v", body, err)
			}
			return
		}
		if validArray {
			if len(events) != len(want) {
				t.Fatalf("%q: split into %d events, encoding/json finds %d", body, len(events), len(want))
			}
			for i := range want {
				if !bytes.Equal(events[i], want[i]) {
					t.Fatalf("%q: event %d = %q, encoding/json finds %q", body, i, events[i], want[i])
				}
			}
			return
		}
		if len(trimmed) > 0 && trimmed[0] == '{' {
			return // a single object: validated by the pipeline
		}
		for _, ev := range events {
			if !json.Valid(ev) {
				return // the pipeline rejects the batch
			}
		}
		t.Fatalf("invalid body %q split into valid events %q", body, events)
	})
}

// FuzzDecodeNDJSON: every returned line is valid JSON and no non-blank line
// is lost.
func FuzzDecodeNDJSON(f *testing.F) {
	for _, s := range []string{"{}\n{}", "{\"a\":1}\n\n\n", "x\n", "\n", "{}\r\n[1]\r\n",
		"{\"k\":\"\\ud800\"}\n{\"k\":\"\xff\"}\n{}\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		events, err := DecodeNDJSON(body)
		checkLimited(t, body, events, err, decodeNDJSON)
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

// checkLimited checks the splitter with a limit of 2 events against the
// unlimited result (events, err): the same events when there are at most
// 2, else an error wrapping services.ErrTooManyEvents (or ErrBadBody, for a
// body that is invalid anyway).
func checkLimited(t *testing.T, body []byte, events []json.RawMessage, err error, split func([]byte, int) ([]json.RawMessage, error)) {
	t.Helper()
	limited, lerr := split(body, 2)
	switch {
	case err != nil:
		if lerr == nil {
			t.Fatalf("%q: refused without a limit (%v), accepted with one", body, err)
		}
	case len(events) > 2:
		if !errors.Is(lerr, services.ErrTooManyEvents) {
			t.Fatalf("%q: %d events with a limit of 2: %v, want ErrTooManyEvents", body, len(events), lerr)
		}
	case lerr != nil || len(limited) != len(events):
		t.Fatalf("%q: %d events, with a limit of 2: %d, %v", body, len(events), len(limited), lerr)
	}
}
