package persistencetest

import (
	"errors"
	"slices"
	"time"

	"github.com/keyfold/keyfold/persistence"
)

// Pipeline names: "p" and "p1" would share a key prefix in a naive layout;
// the third has a hash tag, a separator and a NUL in it.
const (
	pipeA = "p"
	pipeB = "p1"
	pipeC = "x{y}:z/\x00"
)

func out(pipeline, data string) persistence.Output {
	return persistence.Output{Pipeline: pipeline, Data: []byte(data)}
}

// readOutputs reads one page, failing the test on an error.
func (e *env) readOutputs(pipeline, after string, limit int) []persistence.OutputEntry {
	e.t.Helper()
	got, err := e.s.ReadOutputs(e.ctx, pipeline, after, limit)
	if err != nil {
		e.t.Fatalf("ReadOutputs(%q, after %q, %d): %v", pipeline, after, limit, err)
	}
	if len(got) > limit {
		e.t.Fatalf("ReadOutputs(%q, after %q, %d) returned %d entries", pipeline, after, limit, len(got))
	}
	return got
}

// outputs reads the pipeline's entries after a cursor, in pages of 2 until
// an empty one, and checks that their cursors are distinct and their times
// in order.
func (e *env) outputs(pipeline, after string) []persistence.OutputEntry {
	e.t.Helper()
	var all []persistence.OutputEntry
	seen := map[string]bool{}
	for {
		page := e.readOutputs(pipeline, after, 2)
		if len(page) == 0 {
			return all
		}
		for _, o := range page {
			if seen[o.Cursor] {
				e.t.Fatalf("ReadOutputs(%q) returned cursor %q twice", pipeline, o.Cursor)
			}
			seen[o.Cursor] = true
			if n := len(all); n > 0 && o.Time.Before(all[n-1].Time) {
				e.t.Errorf("ReadOutputs(%q): entry %q at %v after one at %v", pipeline, o.Data, o.Time, all[n-1].Time)
			}
			all = append(all, o)
		}
		after = page[len(page)-1].Cursor
	}
}

func datas(es []persistence.OutputEntry) []string {
	ds := make([]string, len(es))
	for i, o := range es {
		ds[i] = string(o.Data)
	}
	return ds
}

// wantOutputs checks the data of the pipeline's entries after a cursor.
func (e *env) wantOutputs(pipeline, after string, want ...string) []persistence.OutputEntry {
	e.t.Helper()
	got := e.outputs(pipeline, after)
	if d := datas(got); !slices.Equal(d, want) {
		e.t.Errorf("outputs of %q after %q = %q, want %q", pipeline, after, d, want)
	}
	return got
}

// waitPastMs waits until the clock is past the millisecond of t.
func waitPastMs(t time.Time) {
	for ms := t.UnixMilli(); time.Now().UnixMilli() <= ms; {
		time.Sleep(time.Millisecond)
	}
}

// Checkpoints append outputs to their pipelines, each pipeline's in order;
// ReadOutputs pages through them from "" or any cursor; pipelines are
// apart; entries have the time they were appended.
func testOutputs(e *env) {
	start := time.Now()
	ep1, ep2 := e.claim(1).Epoch, e.claim(2).Epoch
	e.wantOutputs(pipeA, "")

	e.checkpoint(1, ep1, persistence.CheckpointData{Outputs: []persistence.Output{
		out(pipeA, "a1"), out(pipeA, "a2"), out(pipeB, "b1"), out(pipeA, "a3"),
	}})
	e.checkpoint(2, ep2, persistence.CheckpointData{Outputs: []persistence.Output{
		out(pipeB, "b2"), out(pipeA, "a4"), out(pipeC, "c1"), {Pipeline: pipeA},
	}})
	e.appendN(1, ep1, 1, 1)
	e.checkpoint(1, ep1, persistence.CheckpointData{
		Snapshots: []persistence.Snapshot{snap("k", "v")},
		Timers:    []persistence.Timer{timer("k", t0)},
		Outputs:   []persistence.Output{out(pipeA, "a5")},
		Through:   1,
	})
	end := time.Now()

	as := e.wantOutputs(pipeA, "", "a1", "a2", "a3", "a4", "", "a5")
	e.wantOutputs(pipeB, "", "b1", "b2")
	e.wantOutputs(pipeC, "", "c1")
	e.wantOutputs("missing", "")
	e.wantSnap(1, "k", "v")
	e.wantTimers(1, map[string]int64{"k": t0})
	for _, o := range as {
		if o.Time.Before(start.Truncate(time.Millisecond)) || o.Time.After(end) {
			e.t.Errorf("entry %q has time %v, not between %v and %v", o.Data, o.Time, start, end)
		}
	}
	if len(as) != 6 {
		return
	}

	// One at a time, from each cursor in turn.
	after := ""
	for _, want := range as {
		page := e.readOutputs(pipeA, after, 1)
		if len(page) != 1 || page[0].Cursor != want.Cursor || string(page[0].Data) != string(want.Data) {
			e.t.Fatalf("ReadOutputs(%q, after %q, 1) = %v, want [%v]", pipeA, after, page, want)
		}
		after = page[0].Cursor
	}
	if page := e.readOutputs(pipeA, after, 1); len(page) != 0 {
		e.t.Errorf("ReadOutputs after the last cursor = %v, want none", page)
	}
	// From the middle, more than there is, and one page of all.
	if d := datas(e.readOutputs(pipeA, as[2].Cursor, 2)); !slices.Equal(d, []string{"a4", ""}) {
		e.t.Errorf("ReadOutputs(%q, after a3, 2) = %q, want [a4 \"\"]", pipeA, d)
	}
	if d := datas(e.readOutputs(pipeA, as[3].Cursor, 100)); !slices.Equal(d, []string{"", "a5"}) {
		e.t.Errorf("ReadOutputs(%q, after a4, 100) = %q, want [\"\" a5]", pipeA, d)
	}
	if got := e.readOutputs(pipeA, "", 100); len(got) != 6 {
		e.t.Errorf("ReadOutputs(%q, \"\", 100) returned %d entries, want 6", pipeA, len(got))
	}
	// A cursor of another pipeline's entry is no error.
	if _, err := e.s.ReadOutputs(e.ctx, pipeB, as[0].Cursor, 10); err != nil {
		e.t.Errorf("ReadOutputs(%q) with a cursor of %q: %v", pipeB, pipeA, err)
	}
}

// The store keeps its own copy of the outputs it appends and returns.
func testOutputsCopyData(e *env) {
	ep := e.claim(1).Epoch
	b := []byte("before")
	e.checkpoint(1, ep, persistence.CheckpointData{Outputs: []persistence.Output{{Pipeline: pipeA, Data: b}}})
	copy(b, "AFTER!")
	got := e.wantOutputs(pipeA, "", "before")
	if len(got) == 1 {
		copy(got[0].Data, "AFTER!")
	}
	e.wantOutputs(pipeA, "", "before")
}

// Outputs and their cursors survive a reopen, and later outputs come after
// the cursors from before it.
func testOutputsReopen(e *env) {
	ep := e.claim(1).Epoch
	e.checkpoint(1, ep, persistence.CheckpointData{Outputs: []persistence.Output{out(pipeA, "a1"), out(pipeB, "b1"), out(pipeA, "a2")}})
	before := e.wantOutputs(pipeA, "", "a1", "a2")
	b := e.wantOutputs(pipeB, "", "b1")
	if len(before) != 2 || len(b) != 1 {
		return
	}

	e.reopen()
	after := e.wantOutputs(pipeA, "", "a1", "a2")
	for i := range after {
		if after[i].Cursor != before[i].Cursor || !after[i].Time.Equal(before[i].Time) {
			e.t.Errorf("entry %d after the reopen = %q at %v, before it %q at %v",
				i, after[i].Cursor, after[i].Time, before[i].Cursor, before[i].Time)
		}
	}
	ep = e.claim(1).Epoch
	e.checkpoint(1, ep, persistence.CheckpointData{Outputs: []persistence.Output{out(pipeA, "a3"), out(pipeB, "b2")}})
	e.wantOutputs(pipeA, before[1].Cursor, "a3")
	e.wantOutputs(pipeA, before[0].Cursor, "a2", "a3")
	e.wantOutputs(pipeB, b[0].Cursor, "b2")
}

// A cursor the store cannot parse is an error wrapping ErrBadCursor, for a
// pipeline with entries or without.
func testOutputsBadCursor(e *env) {
	ep := e.claim(1).Epoch
	e.checkpoint(1, ep, persistence.CheckpointData{Outputs: []persistence.Output{out(pipeA, "a1")}})
	for _, c := range []string{"garbage", "-", "-1", "1-x", "x-1", "1-2-3", " 1", "1 ", "+1", "1.5", "0x10", "99999999999999999999999"} {
		for _, p := range []string{pipeA, "missing"} {
			got, err := e.s.ReadOutputs(e.ctx, p, c, 10)
			if !errors.Is(err, persistence.ErrBadCursor) {
				e.t.Errorf("ReadOutputs(%q, after %q) = %v, %v; want an error wrapping ErrBadCursor", p, c, got, err)
			}
		}
	}
}

// ReadOutputs wants a positive limit.
func testOutputsBadLimit(e *env) {
	ep := e.claim(1).Epoch
	e.checkpoint(1, ep, persistence.CheckpointData{Outputs: []persistence.Output{out(pipeA, "a1")}})
	for _, limit := range []int{0, -1} {
		if got, err := e.s.ReadOutputs(e.ctx, pipeA, "", limit); err == nil {
			e.t.Errorf("ReadOutputs(limit %d) = %v, nil; want an error", limit, got)
		}
	}
}

// TrimOutputs deletes the entries appended before a time and counts them;
// the cursor of a trimmed entry still resumes with the oldest entries left
// after it; other pipelines keep theirs.
func testOutputsTrim(e *env) {
	ep := e.claim(1).Epoch
	e.checkpoint(1, ep, persistence.CheckpointData{Outputs: []persistence.Output{out(pipeA, "a1"), out(pipeA, "a2"), out(pipeB, "b1")}})
	old := e.wantOutputs(pipeA, "", "a1", "a2")
	if len(old) != 2 {
		return
	}
	waitPastMs(old[1].Time)
	cut := time.Now()
	waitPastMs(cut)
	e.checkpoint(1, ep, persistence.CheckpointData{Outputs: []persistence.Output{out(pipeA, "a3"), out(pipeA, "a4")}})

	trim := func(p string, before time.Time, want int) {
		e.t.Helper()
		if n, err := e.s.TrimOutputs(e.ctx, p, before); err != nil || n != want {
			e.t.Errorf("TrimOutputs(%q, %v) = %d, %v; want %d", p, before, n, err, want)
		}
	}
	trim(pipeA, cut, 2)
	e.wantOutputs(pipeA, "", "a3", "a4")
	e.wantOutputs(pipeA, old[0].Cursor, "a3", "a4")
	if d := datas(e.readOutputs(pipeA, old[1].Cursor, 1)); !slices.Equal(d, []string{"a3"}) {
		e.t.Errorf("ReadOutputs after a trimmed cursor, limit 1 = %q, want [a3]", d)
	}
	e.wantOutputs(pipeB, "", "b1")
	trim(pipeA, cut, 0)
	trim(pipeA, time.UnixMilli(0), 0)
	trim("missing", time.Now(), 0)
	e.wantOutputs(pipeA, "", "a3", "a4")
}

// After a trim of every entry, and a reopen, new entries still come after
// the old cursors: cursors are never reused.
func testOutputsTrimAllReopen(e *env) {
	ep := e.claim(1).Epoch
	e.checkpoint(1, ep, persistence.CheckpointData{Outputs: []persistence.Output{out(pipeA, "a1"), out(pipeA, "a2")}})
	old := e.wantOutputs(pipeA, "", "a1", "a2")
	if len(old) != 2 {
		return
	}
	if n, err := e.s.TrimOutputs(e.ctx, pipeA, time.Now().Add(time.Hour)); err != nil || n != 2 {
		e.t.Errorf("TrimOutputs of everything = %d, %v; want 2", n, err)
	}
	e.wantOutputs(pipeA, "")
	e.reopen()
	e.wantOutputs(pipeA, "")
	ep = e.claim(1).Epoch
	e.checkpoint(1, ep, persistence.CheckpointData{Outputs: []persistence.Output{out(pipeA, "a3")}})
	e.wantOutputs(pipeA, old[1].Cursor, "a3")
	e.wantOutputs(pipeA, old[0].Cursor, "a3")
	e.wantOutputs(pipeA, "", "a3")
}

// A checkpoint that fails appends none of its outputs, where the store
// appends them atomically with the rest; where it appends them at least once
// (Harness.OutputsAtLeastOnce), a failed checkpoint may have appended them,
// whole and in order, and a later one appends its own after them.
func testOutputsAtomic(e *env) {
	old := e.claim(1).Epoch
	cur := e.claim(1).Epoch
	e.appendN(1, cur, 1, 2)
	stale := []persistence.Output{out(pipeA, "stale"), out(pipeB, "stale")}
	e.wantFenced("Checkpoint of outputs with a stale epoch",
		e.s.Checkpoint(e.ctx, 1, old, persistence.CheckpointData{Outputs: stale}))
	e.wantFenced("Checkpoint of outputs of an unclaimed group",
		e.s.Checkpoint(e.ctx, 5, 0, persistence.CheckpointData{Outputs: stale}))
	if err := e.s.Checkpoint(e.ctx, 1, cur, persistence.CheckpointData{Outputs: stale, Through: 3}); err == nil {
		e.t.Error("Checkpoint of outputs beyond the last position succeeded")
	}
	if !e.h.OutputsAtLeastOnce {
		e.wantOutputs(pipeA, "")
		e.wantOutputs(pipeB, "")
	}
	e.checkpoint(1, cur, persistence.CheckpointData{Outputs: []persistence.Output{out(pipeA, "ok")}, Through: 2})
	if !e.h.OutputsAtLeastOnce {
		e.wantOutputs(pipeA, "", "ok")
		e.wantOutputs(pipeB, "")
		return
	}
	// At least once: each failed call appended all its outputs or none.
	a, b := datas(e.outputs(pipeA, "")), datas(e.outputs(pipeB, ""))
	if len(a) == 0 || a[len(a)-1] != "ok" || len(a) > 4 || len(b) > 3 {
		e.t.Errorf("outputs after failed checkpoints and one that succeeded: %q and %q", a, b)
	}
	for _, d := range append(a[:max(len(a)-1, 0)], b...) {
		if d != "stale" {
			e.t.Errorf("an output %q that no checkpoint carried", d)
		}
	}
}

// testAppendOutputs: AppendOutputs appends to the same logs as checkpoints,
// in order, durably, without a claimed group.
func testAppendOutputs(e *env) {
	if err := e.s.AppendOutputs(e.ctx, nil); err != nil {
		e.t.Fatalf("AppendOutputs(nil): %v", err)
	}
	if err := e.s.AppendOutputs(e.ctx, []persistence.Output{out(pipeA, "a1"), out(pipeB, "b1"), out(pipeA, "a2")}); err != nil {
		e.t.Fatal(err)
	}
	ep := e.claim(1).Epoch
	e.checkpoint(1, ep, persistence.CheckpointData{Outputs: []persistence.Output{out(pipeA, "a3")}})
	if err := e.s.AppendOutputs(e.ctx, []persistence.Output{out(pipeA, "a4")}); err != nil {
		e.t.Fatal(err)
	}
	e.reopen()
	e.wantOutputs(pipeA, "", "a1", "a2", "a3", "a4")
	e.wantOutputs(pipeB, "", "b1")
}

// testOutputsCursorPastEnd: a cursor past the last entry ever appended to a
// pipeline (here, another pipeline's cursor on an empty one) is refused: a
// reader holding it would skip the entries to come.
func testOutputsCursorPastEnd(e *env) {
	if err := e.s.AppendOutputs(e.ctx, []persistence.Output{out(pipeA, "a1"), out(pipeA, "a2")}); err != nil {
		e.t.Fatal(err)
	}
	as := e.wantOutputs(pipeA, "", "a1", "a2")
	if len(as) != 2 {
		return
	}
	if page := e.readOutputs(pipeA, as[1].Cursor, 10); len(page) != 0 { // the last one: nothing newer yet
		e.t.Errorf("after the last cursor: %v", page)
	}
	if _, err := e.s.ReadOutputs(e.ctx, pipeB, as[1].Cursor, 10); !errors.Is(err, persistence.ErrBadCursor) {
		e.t.Errorf("ReadOutputs(%q, a cursor past its end) = %v, want ErrBadCursor", pipeB, err)
	}
}
