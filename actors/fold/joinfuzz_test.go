package fold_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
)

// joinOp is one input of a join's key: an event of a side, or an advance of
// the watermark.
type joinOp struct {
	side    int
	raw     []byte
	advance int64 // > 0: advance the watermark by this much instead
	nowMs   int64
}

// joinOps derives a join key's inputs from data, 3 bytes an input:
//
//	byte 0: bit 0 the side, bits 1-3 the id (ids repeat: duplicates),
//	        bit 4 an advance instead of an event
//	byte 1: the event time, a signed step from the last one in 100 ms
//	        (or the advance, in 100 ms)
//	byte 2: the processing-time step in 10 ms
func joinOps(data []byte) []joinOp {
	var ops []joinOp
	t, now := int64(10_000_000), int64(0)
	for i := 0; i+3 <= len(data) && len(ops) < 64; i += 3 {
		b0, step := data[i], int64(int8(data[i+1]))*100
		now += int64(data[i+2]) * 10
		if b0&0x10 != 0 {
			ops = append(ops, joinOp{advance: max(step, -step) + 1, nowMs: now})
			continue
		}
		t += step
		side := int(b0 & 1)
		id := fmt.Sprintf("%c%d", "lr"[side], b0>>1&7)
		raw, _ := json.Marshal(map[string]any{"k": "a", "id": id, "ts": t, "v": i})
		ops = append(ops, joinOp{side: side, raw: raw, nowMs: now})
	}
	return ops
}

func joinFuzzPipeline(t testing.TB, kind, mode string) *fold.Pipeline {
	t.Helper()
	sides := map[string]*fold.Pipeline{"l": mustCompile(t, fold.Spec{Key: "k", Time: "ts", ID: "id"}), "r": mustCompile(t, fold.Spec{Key: "k", Time: "ts", ID: "id"})}
	spec := fold.JoinSpec{Type: kind, Mode: mode, Left: fold.JoinSideSpec{Pipeline: "l", Fields: []string{"v"}}, Right: fold.JoinSideSpec{Pipeline: "r", Fields: []string{"v"}}}
	switch kind {
	case "interval":
		lower, upper := -500*time.Millisecond, 1500*time.Millisecond
		spec.Lower, spec.Upper, spec.AllowedLateness = &lower, &upper, 700*time.Millisecond
	case "window":
		spec.Size, spec.AllowedLateness = 2*time.Second, 700*time.Millisecond
	}
	p, err := fold.CompileJoin("j", spec, sides)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func applyJoinOps(t *testing.T, p *fold.Pipeline, s *fold.State, ops []joinOp) {
	t.Helper()
	sides := map[int]*fold.Pipeline{0: mustCompile(t, fold.Spec{Key: "k", Time: "ts", ID: "id"}), 1: mustCompile(t, fold.Spec{Key: "k", Time: "ts", ID: "id"})}
	for _, op := range ops {
		if op.advance > 0 {
			p.Advance(s, "a", s.Watermark()+op.advance)
			continue
		}
		ev, err := sides[op.side].Prepare(op.raw)
		if err != nil {
			t.Fatalf("generated event %s rejected: %v", op.raw, err)
		}
		p.ApplySide(s, op.side, ev, op.nowMs)
	}
}

// FuzzJoin checks a join's key as FuzzApply checks a pipeline's: a snapshot
// plus the tail rebuilds the state of a full replay, with the same results;
// a snapshot after every input changes nothing; and the results keep the
// join's promises: an interval match is within the bounds, no id is emitted
// twice, and an event emitted unmatched never appears in a match.
func FuzzJoin(f *testing.F) {
	f.Add(uint8(0), uint8(0), []byte{0x00, 0, 1, 0x03, 5, 1, 0x10, 30, 1, 0x01, 2, 1})
	f.Add(uint8(1), uint8(2), []byte{0x02, 10, 1, 0x01, 3, 1, 0x13, 20, 1, 0x04, 0xf0, 1, 0x10, 100, 1})
	f.Add(uint8(2), uint8(1), []byte{0x01, 0, 1, 0x00, 5, 1, 0x10, 6, 1, 0x02, 1, 1, 0x10, 60, 1})
	// An id again at another time: another event, under another result id.
	f.Add(uint8(2), uint8(1), []byte("A00B\x010A\x010"))
	pipelines := map[[2]uint8]*fold.Pipeline{}
	kinds := []struct{ kind, mode string }{{"interval", "inner"}, {"interval", "left"}, {"interval", "outer"}, {"temporal", "inner"}, {"temporal", "left"},
		{"window", "inner"}, {"window", "outer"}}
	for i, k := range kinds {
		pipelines[[2]uint8{uint8(i), 0}] = joinFuzzPipeline(f, k.kind, k.mode)
	}
	f.Fuzz(func(t *testing.T, which, split uint8, data []byte) {
		p := pipelines[[2]uint8{which % uint8(len(kinds)), 0}]
		ops := joinOps(data)
		at := int(split) % (len(ops) + 1)

		var full fold.State
		applyJoinOps(t, p, &full, ops)
		fullOut := outputs(t, p, &full)

		var prefix fold.State
		applyJoinOps(t, p, &prefix, ops[:at])
		outs := outputs(t, p, &prefix)
		restored, _ := roundTrip(t, p, &prefix)
		applyJoinOps(t, p, &restored, ops[at:])
		if outs = append(outs, outputs(t, p, &restored)...); !slices.Equal(outs, fullOut) {
			t.Fatalf("results with a snapshot after %d inputs:\n%s\nfull replay:\n%s", at, strings.Join(outs, "\n"), strings.Join(fullOut, "\n"))
		}
		if d := stateDiff(p, &full, &restored); d != "" {
			t.Fatalf("snapshot after %d of %d inputs, then the tail: %s", at, len(ops), d)
		}
		_, stepOut := snapshotEachStep(t, p, len(ops), func(s *fold.State, i int) { applyJoinOps(t, p, s, ops[i:i+1]) })
		if !slices.Equal(stepOut, fullOut) {
			t.Fatalf("results with a snapshot after every input:\n%s\nfull replay:\n%s", strings.Join(stepOut, "\n"), strings.Join(fullOut, "\n"))
		}

		// The promises, over the results of the full replay.
		seen := map[string]bool{}
		matched, alone := map[string]bool{}, map[string]bool{}
		for _, line := range fullOut {
			id, rest, _ := strings.Cut(line, " ")
			if seen[id] {
				t.Fatalf("result %s emitted twice", id)
			}
			seen[id] = true
			js := rest[strings.Index(rest, "{") : strings.LastIndex(rest, "}")+1]
			var v struct {
				Left, Right *struct {
					ID   string
					Time time.Time
				}
			}
			if err := json.Unmarshal([]byte(js), &v); err != nil {
				t.Fatalf("result %s: %v", line, err)
			}
			switch {
			case v.Left != nil && v.Right != nil:
				matched[v.Left.ID], matched[v.Right.ID] = true, true
				if d := v.Right.Time.Sub(v.Left.Time); p.Join(&full).Type == "interval" && (d < -500*time.Millisecond || d > 1500*time.Millisecond) {
					t.Fatalf("match %s outside the bounds: %v", id, d)
				}
				if l, r := v.Left.Time.UnixMilli(), v.Right.Time.UnixMilli(); p.Join(&full).Type == "window" && l-l%2000 != r-r%2000 {
					t.Fatalf("match %s across windows", id)
				}
			case v.Left != nil:
				alone[v.Left.ID] = true
			default:
				alone[v.Right.ID] = true
			}
		}
		if p.Join(&full).Type != "temporal" {
			for id := range alone {
				if matched[id] {
					t.Fatalf("%s emitted unmatched and in a match:\n%s", id, strings.Join(fullOut, "\n"))
				}
			}
		}
	})
}
