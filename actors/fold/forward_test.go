package fold_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/keyfold/keyfold/actors/fold"
)

// forwardEvents are events of fuzzSpec: with and without id, time and
// fields, matching pattern filters or not, and one whose last values make
// its encoding larger than itself (sent without it).
func forwardEvents() [][]byte {
	big := strings.Repeat("x", 300)
	return [][]byte{
		[]byte(`{"user_id":"alice","event_id":"e1","ts":1700000000000,"type":"login_failed","amount":12.5,"geo":{"country":"DE"},"label":"a"}`),
		[]byte(`{"user_id":"alice","type":"login_ok"}`),
		[]byte(`{"user_id":42,"event_id":7,"ts":"2024-03-01T12:00:00.5Z","amount":-3,"label":7,"geo":{"country":[1,{"a":null}]}}`),
		[]byte(`{"user_id":"b\u00e9","event_id":"\u00e9t\u00e9","amount":0}`),
		[]byte(`{"user_id":"carol","label":"` + big + `","geo":{"country":"` + big + `"}}`),
		[]byte(`{"user_id":"dave","event_id":null,"ts":null,"amount":null}`),
	}
}

// forward encodes events as a forwarding member does.
func forward(p *fold.Pipeline, events []*fold.Event) (raws [][]byte, keys []string, prepared []byte) {
	for _, ev := range events {
		raws, keys = append(raws, ev.Raw), append(keys, ev.Key)
		prepared = p.AppendPrepared(prepared, ev)
	}
	return raws, keys, prepared
}

// TestForwardedIsPrepared: an owner rebuilds from a forwarded share exactly
// the events the sender prepared, those sent without their encoding too.
func TestForwardedIsPrepared(t *testing.T) {
	// A field added to Event must travel too: add it to the encoding
	// (forward.go) and to forwardEvents, then here. (Call is not encoded:
	// a call travels by the Cluster service's Call, never in a batch; nor
	// is what the owner's store answered for the id, indexedAt.)
	if n := reflect.TypeFor[fold.Event]().NumField(); n != 11 {
		t.Fatalf("fold.Event has %d fields: does AppendPrepared encode the new one?", n)
	}
	p := mustCompile(t, fuzzSpec)
	want, err := p.PrepareBatch(forwardEvents())
	if err != nil {
		t.Fatal(err)
	}
	raws, keys, prepared := forward(p, want)
	if l, _ := binary.Uvarint(prepared); l == 0 {
		t.Fatal("the first event was sent without its encoding")
	}
	got, err := p.Forwarded(raws, keys, prepared)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		for i := range want {
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Errorf("event %d: forwarded %+v, prepared %+v", i, *got[i], *want[i])
			}
		}
	}
	// The large one went without its encoding: a share stays within twice
	// its events' bytes.
	size := 0
	for _, r := range raws {
		size += len(r)
	}
	if len(prepared) > size {
		t.Errorf("prepared %d bytes for %d bytes of events", len(prepared), size)
	}
	if p.Fingerprint() == 0 || p.Fingerprint() == mustCompile(t, fold.Spec{Key: "user_id"}).Fingerprint() {
		t.Errorf("fingerprint %x", p.Fingerprint())
	}
	if p.Fingerprint() != mustCompile(t, fuzzSpec).Fingerprint() {
		t.Error("the same spec compiled twice has two fingerprints")
	}
}

// TestForwardedRefuses: an encoding that is not well formed, or holds what
// Prepare could not have produced, refuses the share; so does a key that
// cannot name one, and an event sent without its encoding that does not
// validate or has another key.
func TestForwardedRefuses(t *testing.T) {
	p := mustCompile(t, fuzzSpec)
	events, err := p.PrepareBatch(forwardEvents()[:1])
	if err != nil {
		t.Fatal(err)
	}
	raws, keys, prepared := forward(p, events)
	enc := prepared[1:] // the first event's, without its length
	framed := func(enc []byte) []byte { return append(binary.AppendUvarint(nil, uint64(len(enc))), enc...) }
	// The encoding of the first event: id "e1", timed, steps, then the
	// aggregates (sorted: amount, big, biggest, country, failed, label,
	// labels, smallest, spread, total).
	idEnd := 1 + len("e1")
	nan := binary.LittleEndian.AppendUint64(nil, math.Float64bits(math.NaN()))
	for _, c := range []struct {
		name     string
		keys     []string
		raws     [][]byte
		prepared []byte
	}{
		{"truncated", keys, raws, framed(enc[:len(enc)-1])},
		{"leftover inside", keys, raws, framed(append(enc[:len(enc):len(enc)], 0))},
		{"leftover after", keys, raws, append(prepared[:len(prepared):len(prepared)], 0)},
		{"length past the end", keys, raws, append([]byte{0xff, 0x01}, enc...)},
		{"fewer keys", nil, raws, prepared},
		{"empty key", []string{""}, raws, prepared},
		{"key with NUL", []string{"a\x00b"}, raws, prepared},
		{"id not UTF-8", keys, raws, framed(append([]byte{2, 0xff, 0xfe}, enc[idEnd:]...))},
		{"unknown flag", keys, raws, framed(append(append([]byte(nil), enc[:idEnd]...), append([]byte{4}, enc[idEnd+1:]...)...))},
		{"time out of range", keys, raws, framed(append(append([]byte(nil), enc[:idEnd]...), binary.AppendUvarint([]byte{1}, 1<<54)...))},
		{"a filter it does not have", keys, raws, framed(append(append([]byte(nil), enc[:idEnd]...), binary.AppendUvarint([]byte{2}, 1<<40)...))},
		{"NaN", keys, raws, framed(append(append(append([]byte(nil), enc[:idEnd]...), 0, 1), nan...))},
		{"invalid without its encoding", []string{"x"}, [][]byte{[]byte(`{"user_id":"x","amount":"ten"}`)}, []byte{0}},
		{"another key without its encoding", []string{"y"}, [][]byte{[]byte(`{"user_id":"x"}`)}, []byte{0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := p.Forwarded(c.raws, c.keys, c.prepared)
			if !errors.Is(err, fold.ErrInvalidEvent) {
				t.Fatalf("Forwarded: %v, want an error wrapping ErrInvalidEvent", err)
			}
		})
	}
}

// FuzzForwarded: no encoding makes Forwarded panic, and what it accepts
// has the pipeline's aggregates.
func FuzzForwarded(f *testing.F) {
	p := mustCompile(f, fuzzSpec)
	events, err := p.PrepareBatch(forwardEvents())
	if err != nil {
		f.Fatal(err)
	}
	for _, ev := range events {
		f.Add(ev.Key, p.AppendPrepared(nil, ev))
	}
	f.Fuzz(func(t *testing.T, key string, prepared []byte) {
		raw := fmt.Appendf(nil, `{"user_id":%q}`, key)
		evs, err := p.Forwarded([][]byte{raw}, []string{key}, prepared)
		if err != nil {
			return
		}
		if len(evs) != 1 || evs[0].Key != key {
			t.Fatalf("accepted %+v for key %q", evs, key)
		}
	})
}
