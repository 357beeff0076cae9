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
	t, now := int64(joinFuzzT0), int64(0)
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

// joinFuzzT0 is the first event time of joinOps; the watermark starts
// 20s before it (see joinAdvance).
const joinFuzzT0 = 10_000_000

// The fuzzed joins' bounds, ms: interval, window sizes and slide, the
// session gap, allowed_lateness (all but temporal).
const (
	fuzzLower, fuzzUpper = -500, 1500
	fuzzSize, fuzzSlide  = 2000, 500
	fuzzGap              = 500
	fuzzLateness         = 700
)

// joinAdvance is where an advance by d takes a watermark at wm.
func joinAdvance(wm, d int64) int64 { return max(wm, joinFuzzT0-20_000) + d }

func joinFuzzPipeline(t testing.TB, kind, mode string) *fold.Pipeline {
	t.Helper()
	sides := map[string]*fold.Pipeline{"l": mustCompile(t, fold.Spec{Key: "k", Time: "ts", ID: "id"}), "r": mustCompile(t, fold.Spec{Key: "k", Time: "ts", ID: "id"})}
	spec := fold.JoinSpec{Type: kind, Mode: mode, Left: fold.JoinSideSpec{Pipeline: "l", Fields: []string{"v"}}, Right: fold.JoinSideSpec{Pipeline: "r", Fields: []string{"v"}}}
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	switch kind {
	case "interval":
		lower, upper := ms(fuzzLower), ms(fuzzUpper)
		spec.Lower, spec.Upper, spec.AllowedLateness = &lower, &upper, ms(fuzzLateness)
	case "window":
		spec.Size, spec.AllowedLateness = ms(fuzzSize), ms(fuzzLateness)
	case "sliding":
		spec.Type, spec.Window, spec.Size, spec.Slide, spec.AllowedLateness = "window", "sliding", ms(fuzzSize), ms(fuzzSlide), ms(fuzzLateness)
	case "session":
		spec.Type, spec.Window, spec.Gap, spec.AllowedLateness = "window", "session", ms(fuzzGap), ms(fuzzLateness)
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
			p.Advance(s, "a", joinAdvance(s.Watermark(), op.advance))
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
// twice, and an event emitted unmatched never appears in a match. Once
// every window is closed and gone, the results are those of the join
// computed in one batch (expectJoin) over the events on time.
func FuzzJoin(f *testing.F) {
	f.Add(uint8(0), uint8(0), []byte{0x00, 0, 1, 0x03, 5, 1, 0x10, 30, 1, 0x01, 2, 1})
	f.Add(uint8(1), uint8(2), []byte{0x02, 10, 1, 0x01, 3, 1, 0x13, 20, 1, 0x04, 0xf0, 1, 0x10, 100, 1})
	f.Add(uint8(2), uint8(1), []byte{0x01, 0, 1, 0x00, 5, 1, 0x10, 6, 1, 0x02, 1, 1, 0x10, 60, 1})
	// An id again at another time: another event, under another result id.
	f.Add(uint8(2), uint8(1), []byte("A00B\x010A\x010"))
	// Sliding, outer: events in overlapping windows, some late for their
	// first windows; session, inner and outer: sessions closed, reopened
	// and bridged by events within allowed_lateness.
	f.Add(uint8(8), uint8(3), []byte{0x00, 0, 1, 0x01, 3, 1, 0x10, 180, 1, 0x03, 0xfc, 1, 0x02, 8, 1, 0x10, 20, 1, 0x05, 0xfd, 1, 0x10, 100, 1})
	f.Add(uint8(9), uint8(2), []byte{0x00, 0, 1, 0x01, 6, 1, 0x10, 210, 1, 0x02, 12, 1, 0x03, 0xfa, 1, 0x10, 4, 1, 0x05, 3, 1, 0x10, 30, 1})
	// Sliding: an event whose first windows are gone joins only the others.
	f.Add(uint8(8), uint8(39), []byte("0 0000000B\x000000000A\x000"))
	// Session: l0 and r1 600 apart, two sessions, both closed and within
	// allowed_lateness when r2 between them bridges them.
	f.Add(uint8(9), uint8(5), []byte{0x00, 0, 1, 0x03, 6, 1, 0x10, 127, 1, 0x10, 84, 1, 0x05, 0xff, 1})
	f.Add(uint8(11), uint8(4), []byte{0x00, 0, 1, 0x01, 30, 1, 0x10, 230, 1, 0x03, 0xf1, 1, 0x02, 2, 1, 0x10, 10, 1, 0x07, 0x81, 1})
	pipelines := map[[2]uint8]*fold.Pipeline{}
	kinds := []struct{ kind, mode string }{{"interval", "inner"}, {"interval", "left"}, {"interval", "outer"}, {"temporal", "inner"}, {"temporal", "left"},
		{"window", "inner"}, {"window", "outer"}, {"sliding", "inner"}, {"sliding", "outer"}, {"session", "inner"}, {"session", "left"}, {"session", "outer"}}
	for i, k := range kinds {
		pipelines[[2]uint8{uint8(i), 0}] = joinFuzzPipeline(f, k.kind, k.mode)
	}
	f.Fuzz(func(t *testing.T, which, split uint8, data []byte) {
		k := kinds[which%uint8(len(kinds))]
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
			var v struct{ Left, Right *fuzzRef }
			if err := json.Unmarshal([]byte(js), &v); err != nil {
				t.Fatalf("result %s: %v", line, err)
			}
			switch {
			case v.Left != nil && v.Right != nil:
				matched[v.Left.key()], matched[v.Right.key()] = true, true
				if d := v.Right.Time.Sub(v.Left.Time); p.Join(&full).Type == "interval" && (d < -500*time.Millisecond || d > 1500*time.Millisecond) {
					t.Fatalf("match %s outside the bounds: %v", id, d)
				}
				if l, r := v.Left.Time.UnixMilli(), v.Right.Time.UnixMilli(); k.kind == "window" && l-l%fuzzSize != r-r%fuzzSize {
					t.Fatalf("match %s across windows", id)
				}
			case v.Left != nil:
				alone[v.Left.key()] = true
			default:
				alone[v.Right.key()] = true
			}
		}
		if p.Join(&full).Type != "temporal" {
			for id := range alone {
				if matched[id] {
					t.Fatalf("%s emitted unmatched and in a match:\n%s", id, strings.Join(fullOut, "\n"))
				}
			}
		}

		// Every window closed and gone: the batch computation's results.
		p.Advance(&full, "a", 2*joinFuzzT0)
		var got []string
		for _, line := range append(fullOut, outputs(t, p, &full)...) {
			got = append(got, line[:strings.Index(line, " ")])
		}
		slices.Sort(got)
		if want := expectJoin(k.kind, k.mode, ops); !slices.Equal(got, want) {
			t.Fatalf("%s %s join: results\n%s\nwant (batch)\n%s", k.mode, k.kind, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if n := full.Buffered(); n != 0 && k.kind != "temporal" { // a temporal join keeps the latest version
			t.Fatalf("%d events still buffered with every window gone", n)
		}
	})
}

// fuzzRef is an event a result shows.
type fuzzRef struct {
	ID   string
	Time time.Time
}

// key names the event: an id again at another time is another event.
func (r *fuzzRef) key() string { return fmt.Sprintf("%s@%d", r.ID, r.Time.UnixMilli()) }

// oracleEvent is an event a join took, as the oracle sees it: side, id,
// time, and the watermark it came at.
type oracleEvent struct {
	side  int
	id    string
	t, wm int64
}

// expectJoin computes the ids of the results a join of joinFuzzPipeline's
// kind and mode has emitted after ops once every window is gone, in one
// batch over the events on time, by the rules the README states and not
// by the join's code: an event is on time (interval, session) when at most
// allowed_lateness behind the watermark, (temporal) when not behind it,
// (tumbling, sliding) in each of its windows whose end plus
// allowed_lateness is after the watermark; an event again (same side, id
// and time) is nothing new. Results are named join/key/left/right, each
// side id@time or empty, and a sliding window's match adds /start-end.
func expectJoin(kind, mode string, ops []joinOp) []string {
	var evs []oracleEvent
	seen := map[oracleEvent]bool{}
	var wm int64
	for _, op := range ops {
		if op.advance > 0 {
			wm = joinAdvance(wm, op.advance)
			continue
		}
		var raw struct {
			ID string
			TS int64
		}
		if err := json.Unmarshal(op.raw, &raw); err != nil {
			panic(err)
		}
		e := oracleEvent{side: op.side, id: raw.ID, t: raw.TS}
		if seen[e] {
			continue
		}
		seen[e] = true
		e.wm = wm
		evs = append(evs, e)
	}
	// windows returns the starts of the windows of e it took part in.
	windows := func(e oracleEvent) []int64 {
		size, slide := int64(fuzzSize), int64(fuzzSlide)
		if kind == "window" {
			slide = size
		}
		var starts []int64
		for start := e.t / slide * slide; start > e.t-size; start -= slide { // times are positive
			if start+size+fuzzLateness > e.wm {
				starts = append(starts, start)
			}
		}
		return starts
	}
	var on []oracleEvent // on time
	for _, e := range evs {
		switch kind {
		case "interval", "session":
			if e.t >= e.wm-fuzzLateness {
				on = append(on, e)
			}
		case "temporal":
			if e.t >= e.wm {
				on = append(on, e)
			}
		default:
			if len(windows(e)) > 0 {
				on = append(on, e)
			}
		}
	}
	// Sessions: the events on time, both sides, by time, each within gap
	// of the one before.
	session := map[oracleEvent]int{}
	if kind == "session" {
		byTime := slices.Clone(on)
		slices.SortFunc(byTime, func(a, b oracleEvent) int { return int(a.t - b.t) })
		n := 0
		for i, e := range byTime {
			if i > 0 && e.t-byTime[i-1].t > fuzzGap {
				n++
			}
			session[e] = n
		}
	}
	ref := func(e *oracleEvent) string {
		if e == nil {
			return ""
		}
		return fmt.Sprintf("%s@%d", e.id, e.t)
	}
	var out []string
	result := func(l, r *oracleEvent, window string) {
		out = append(out, "j/a/"+ref(l)+"/"+ref(r)+window)
	}
	matched := map[oracleEvent]bool{}
	for _, l := range on {
		if l.side != 0 {
			continue
		}
		var latest *oracleEvent // temporal: the right version as of l's time
		for _, r := range on {
			if r.side != 1 {
				continue
			}
			match := false
			switch kind {
			case "interval":
				match = r.t-l.t >= fuzzLower && r.t-l.t <= fuzzUpper
			case "window":
				match = l.t/fuzzSize == r.t/fuzzSize
			case "session":
				match = session[l] == session[r]
			case "sliding":
				for _, start := range windows(l) {
					if slices.Contains(windows(r), start) {
						match = true
						result(&l, &r, fmt.Sprintf("/%d-%d", start, start+fuzzSize))
					}
				}
			case "temporal":
				if r.t <= l.t && (latest == nil || r.t > latest.t || r.t == latest.t && r.id > latest.id) {
					latest = &r
				}
			}
			if match {
				matched[l], matched[r] = true, true
				if kind != "sliding" {
					result(&l, &r, "")
				}
			}
		}
		if latest != nil {
			matched[l] = true
			result(&l, latest, "")
		}
	}
	for _, e := range on {
		switch {
		case matched[e]:
		case e.side == 0 && mode != "inner":
			result(&e, nil, "")
		case e.side == 1 && mode == "outer":
			result(nil, &e, "")
		}
	}
	slices.Sort(out)
	return out
}
