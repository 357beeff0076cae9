package actors

import (
	"fmt"
	"slices"

	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func decodeRecord(data []byte) (*keyfoldv1.LogRecord, error) {
	var rec keyfoldv1.LogRecord
	if err := proto.Unmarshal(data, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// appendRecord appends one group's share of a commit to dst, as a
// keyfold.v1.LogRecord, byte for byte as proto.Marshal would (record_test.go
// compares them), straight from the commit's batches: building the
// messages first cost an Input per event and a KeyInputs per key, a tenth
// of the bytes allocated per event at a million keys (BENCHMARKS.md).
//
// A join's key that only takes its sides' events (derived) is not listed,
// and a listed one (a timer of it was due) lists none of them: they are
// logged under their sides (deriveJoins).
func appendRecord(dst []byte, keys []*keyBatch, wms []*keyfoldv1.Watermark) ([]byte, error) {
	size := 0
	sizes := make([]int, len(keys)) // each listed key's KeyInputs, measured once
	for i, kb := range keys {
		if !listed(kb) {
			continue
		}
		sizes[i] = keyInputsSize(kb)
		size += 1 + protowire.SizeVarint(uint64(sizes[i])) + sizes[i]
	}
	wmData := make([][]byte, len(wms))
	for i, w := range wms {
		var err error
		if wmData[i], err = proto.Marshal(w); err != nil {
			return nil, err
		}
		size += 1 + protowire.SizeBytes(len(wmData[i]))
	}
	start := len(dst)
	b := slices.Grow(dst, size)
	for i, kb := range keys {
		if !listed(kb) {
			continue
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizes[i]))
		b = appendStringField(b, 1, kb.id.pipeline)
		b = appendStringField(b, 2, kb.id.key)
		for _, s := range kb.msg.segs {
			if s.derived {
				continue
			}
			for _, ev := range s.events {
				b = protowire.AppendTag(b, 3, protowire.BytesType)
				b = protowire.AppendVarint(b, uint64(inputSize(ev, s.nowMs)))
				b = appendInput(b, ev, s.nowMs)
			}
		}
	}
	for _, d := range wmData {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, d)
	}
	if len(b)-start != size {
		// The lengths written before their messages come from the same
		// measures: a record not of its measured size would not decode.
		return nil, fmt.Errorf("record of %d bytes measured as %d", len(b)-start, size)
	}
	return b, nil
}

// listed reports whether the record lists the key: every key but a join's
// that only takes its sides' events.
func listed(kb *keyBatch) bool { return !kb.derived || kb.fire }

// keyInputsSize is the encoded size of a key's keyfold.v1.KeyInputs.
func keyInputsSize(kb *keyBatch) int {
	n := stringFieldSize(kb.id.pipeline) + stringFieldSize(kb.id.key)
	for _, s := range kb.msg.segs {
		if s.derived {
			continue
		}
		for _, ev := range s.events {
			m := inputSize(ev, s.nowMs)
			n += 1 + protowire.SizeVarint(uint64(m)) + m
		}
	}
	return n
}

// inputSize is the encoded size of an event's keyfold.v1.Input.
func inputSize(ev *fold.Event, nowMs int64) int {
	n := 0
	if len(ev.Raw) > 0 {
		n = 1 + protowire.SizeBytes(len(ev.Raw))
	}
	if nowMs != 0 {
		n += 1 + protowire.SizeVarint(uint64(nowMs))
	}
	if ev.Erase {
		n += 2
	}
	if ev.Expire {
		n += 2
	}
	if ev.Call {
		n += 2 + stringFieldSize(ev.ID) // a call's id is not in its request
	}
	return n
}

func appendInput(b []byte, ev *fold.Event, nowMs int64) []byte {
	if len(ev.Raw) > 0 {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, ev.Raw)
	}
	if nowMs != 0 {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(nowMs))
	}
	if ev.Erase {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	if ev.Expire {
		b = protowire.AppendTag(b, 4, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	if ev.Call {
		b = protowire.AppendTag(b, 5, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
		b = appendStringField(b, 6, ev.ID)
	}
	return b
}

// stringFieldSize is the encoded size of a proto3 string or bytes field
// (nothing when empty).
func stringFieldSize(s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}
