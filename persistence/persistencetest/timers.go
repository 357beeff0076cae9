package persistencetest

import (
	"errors"
	"maps"

	"github.com/keyfold/keyfold/persistence"
)

// t0 is a realistic due time: 2026-01-01 in Unix ms.
const t0 = 1767225600000

// checkpoint checkpoints g, failing the test on an error.
func (e *env) checkpoint(g uint32, ep persistence.Epoch, d persistence.CheckpointData) {
	e.t.Helper()
	if err := e.s.Checkpoint(e.ctx, g, ep, d); err != nil {
		e.t.Fatalf("Checkpoint(%d, epoch %d): %v", g, ep, err)
	}
}

// timers returns g's timer index, failing the test if a key shows twice.
func (e *env) timers(g uint32) map[string]int64 {
	e.t.Helper()
	got := map[string]int64{}
	err := e.s.Timers(e.ctx, g, func(key string, due int64) error {
		if prev, dup := got[key]; dup {
			e.t.Errorf("Timers(%d) gave key %q twice: due %d and %d", g, key, prev, due)
		}
		got[key] = due
		return nil
	})
	if err != nil {
		e.t.Fatalf("Timers(%d): %v", g, err)
	}
	return got
}

// wantTimers checks g's timer index.
func (e *env) wantTimers(g uint32, want map[string]int64) {
	e.t.Helper()
	if want == nil {
		want = map[string]int64{}
	}
	if got := e.timers(g); !maps.Equal(got, want) {
		e.t.Errorf("Timers(%d) = %v, want %v", g, got, want)
	}
}

func timer(key string, due int64) persistence.Timer { return persistence.Timer{Key: key, Due: due} }

// Checkpoints set, update and remove (Due 0) timer index entries, in order
// (of two entries for a key the later wins), with snapshots and a trim in
// the same checkpoint; groups have their own index, and it survives a
// reopen.
func testTimersIndex(e *env) {
	ep1, ep2 := e.claim(1).Epoch, e.claim(2).Epoch
	e.wantTimers(1, nil)

	e.checkpoint(1, ep1, persistence.CheckpointData{Timers: []persistence.Timer{
		timer("a", t0), timer("b", t0+200), timer("k\x00\xff", t0+300),
	}})
	e.wantTimers(1, map[string]int64{"a": t0, "b": t0 + 200, "k\x00\xff": t0 + 300})

	// Update one, remove one and a missing one, set one twice, set and
	// remove one.
	e.checkpoint(1, ep1, persistence.CheckpointData{Timers: []persistence.Timer{
		timer("b", t0+250), timer("a", 0), timer("missing", 0),
		timer("c", t0+2), timer("c", t0+1), timer("d", t0), timer("d", 0),
	}})
	want1 := map[string]int64{"b": t0 + 250, "c": t0 + 1, "k\x00\xff": t0 + 300}
	e.wantTimers(1, want1)

	// The same key in another group is another entry.
	e.checkpoint(2, ep2, persistence.CheckpointData{Timers: []persistence.Timer{timer("b", 7)}})
	e.wantTimers(2, map[string]int64{"b": 7})
	e.wantTimers(1, want1)
	e.wantTimers(0, nil)
	e.wantTimers(3, nil)

	// With snapshots and a trim, in one checkpoint.
	e.appendN(1, ep1, 1, 2)
	e.checkpoint(1, ep1, persistence.CheckpointData{
		Snapshots: []persistence.Snapshot{snap("e", "E")},
		Timers:    []persistence.Timer{timer("e", t0+900)},
		Through:   2,
	})
	want1["e"] = t0 + 900
	e.wantTimers(1, want1)
	e.wantSnap(1, "e", "E")

	e.reopen()
	e.wantTimers(1, want1)
	e.wantTimers(2, map[string]int64{"b": 7})
	e.wantState(1, 2, 2)

	// A new owner changes them.
	ep := e.claim(1).Epoch
	e.checkpoint(1, ep, persistence.CheckpointData{Timers: []persistence.Timer{timer("b", 0), timer("c", t0+5)}})
	e.wantTimers(1, map[string]int64{"c": t0 + 5, "e": t0 + 900, "k\x00\xff": t0 + 300})
}

// A checkpoint with a stale epoch changes no timer index entry, as one
// beyond the last position does not.
func testTimersFenced(e *env) {
	old := e.claim(1).Epoch
	cur := e.claim(1).Epoch
	e.checkpoint(1, cur, persistence.CheckpointData{Timers: []persistence.Timer{timer("a", t0), timer("b", t0+1)}})
	want := map[string]int64{"a": t0, "b": t0 + 1}

	stale := []persistence.Timer{timer("a", 0), timer("b", t0+5), timer("c", t0)}
	e.wantFenced("Checkpoint of timers with a stale epoch",
		e.s.Checkpoint(e.ctx, 1, old, persistence.CheckpointData{Timers: stale}))
	e.wantFenced("Checkpoint of timers with a future epoch",
		e.s.Checkpoint(e.ctx, 1, cur+1, persistence.CheckpointData{Timers: stale}))
	e.wantFenced("Checkpoint of timers of an unclaimed group",
		e.s.Checkpoint(e.ctx, 5, 0, persistence.CheckpointData{Timers: stale}))
	if err := e.s.Checkpoint(e.ctx, 1, cur, persistence.CheckpointData{Timers: stale, Through: 1}); err == nil {
		e.t.Error("Checkpoint of timers beyond the last position succeeded")
	}
	e.wantTimers(1, want)
	e.wantTimers(5, nil)
}

// Timers stops at fn's first error and returns it.
func testTimersFnError(e *env) {
	ep := e.claim(1).Epoch
	e.checkpoint(1, ep, persistence.CheckpointData{Timers: []persistence.Timer{timer("a", t0), timer("b", t0), timer("c", t0)}})
	errStop := errors.New("stop")
	calls := 0
	err := e.s.Timers(e.ctx, 1, func(string, int64) error {
		calls++
		return errStop
	})
	if !errors.Is(err, errStop) || calls != 1 {
		e.t.Errorf("Timers with fn failing = %v after %d calls, want fn's error after 1", err, calls)
	}
}
