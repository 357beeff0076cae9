package persistencetest

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/keyfold/keyfold/persistence"
)

// Groups of the tests that use many: both ends of the range and neighbours,
// so that a key layout mixing up groups shows.
var manyGroups = []uint32{0, 1, 2, 3, 255, 256, 65535, 1 << 31, math.MaxUint32 - 1, math.MaxUint32}

// One Append carries the records of many groups, interleaved; each group's
// get consecutive positions from 1 in slice order, and Read returns them in
// order.
func testAppendRead(e *env) {
	const perGroup = 5
	epochs := map[uint32]persistence.Epoch{}
	for _, g := range manyGroups {
		epochs[g] = e.claim(g).Epoch
	}
	var entries []persistence.Entry
	for i := range perGroup {
		for _, g := range manyGroups {
			entries = append(entries, entry(g, epochs[g], data(g, i)))
		}
	}
	pos := e.append(entries...)
	for k, en := range entries {
		if want := persistence.Position(k/len(manyGroups) + 1); pos[k] != want {
			e.t.Errorf("entry %d (group %d) got position %d, want %d", k, en.Group, pos[k], want)
		}
	}
	for _, g := range manyGroups {
		e.wantLog(g, 0, recs(g, 1, 0, perGroup-1)...)
	}

	// A second call continues each group's positions.
	entries = entries[:0]
	for _, g := range manyGroups {
		entries = append(entries, entry(g, epochs[g], data(g, perGroup)))
	}
	for k, p := range e.append(entries...) {
		if p != perGroup+1 {
			e.t.Errorf("second append: group %d got position %d, want %d", entries[k].Group, p, perGroup+1)
		}
	}
	for _, g := range manyGroups {
		e.wantLog(g, 0, recs(g, 1, 0, perGroup)...)
		e.wantState(g, 0, perGroup+1)
	}
	// A group nobody wrote to has an empty log.
	e.wantLog(4, 0)
	e.wantState(4, 0, 0)
}

// Appending nothing succeeds and returns no positions.
func testAppendEmpty(e *env) {
	for _, entries := range [][]persistence.Entry{nil, {}} {
		pos, err := e.s.Append(e.ctx, entries)
		if err != nil || len(pos) != 0 {
			e.t.Errorf("Append(%v) = %v, %v, want no positions and no error", entries, pos, err)
		}
	}
}

// The store keeps its own copy of appended data, and Read hands out data the
// caller may keep a copy of.
func testAppendCopiesData(e *env) {
	ep := e.claim(1).Epoch
	b := []byte("before")
	e.append(persistence.Entry{Group: 1, Epoch: ep, Data: b})
	copy(b, "AFTER!")
	e.wantLog(1, 0, rec{1, "before"})
}

// A record of a megabyte round-trips, and so does an empty one.
func testLargeRecord(e *env) {
	ep := e.claim(1).Epoch
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	e.append(persistence.Entry{Group: 1, Epoch: ep, Data: big}, persistence.Entry{Group: 1, Epoch: ep, Data: []byte{}})
	e.wantLog(1, 0, rec{1, string(big)}, rec{2, ""})
}

// Records of any content, appended as a host appends them (one record a
// group a call; a store may compress them: Redis format 4), read back as
// they were, after a reopen and after the next claim too.
func testRecordsOneACall(e *env) {
	rng := rand.New(rand.NewPCG(1, 2))
	noise := make([]byte, 4096) // random: does not compress
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	contents := []string{
		strings.Repeat(`{"user_id":"u17","event_id":"e-1","type":"login_ok","geo":{"country":"DE"}}`, 40),
		string(noise),
		"x",
		strings.Repeat("0123456789abcdef", 1<<16), // a megabyte that compresses to little
		"",
	}
	groups := []uint32{3, 4}
	var want = map[uint32][]rec{}
	for _, g := range groups {
		ep := e.claim(g).Epoch
		for i, c := range contents {
			c += strconv.Itoa(int(g)) // (differs by group)
			e.append(persistence.Entry{Group: g, Epoch: ep, Data: []byte(c)})
			want[g] = append(want[g], rec{persistence.Position(i + 1), c})
		}
	}
	check := func(when string) {
		e.t.Helper()
		for _, g := range groups {
			if got := e.read(g, 0); !slices.Equal(got, want[g]) {
				e.t.Errorf("%s: group %d's records differ from those appended (%d records read, want %d)", when, g, len(got), len(want[g]))
			}
		}
	}
	check("after the appends")
	e.reopen()
	check("after a reopen")
	for _, g := range groups {
		e.claim(g)
	}
	check("after the next claim")
}

// Read returns only the records after the given position.
func testReadAfter(e *env) {
	ep := e.claim(7).Epoch
	e.appendN(7, ep, 1, 10)
	e.wantLog(7, 4, recs(7, 5, 5, 10)...)
	e.wantLog(7, 9, recs(7, 10, 10, 10)...)
	e.wantLog(7, 10)
	e.wantLog(7, 1000)
	e.wantLog(7, math.MaxUint64)
}

// Read stops at fn's first error and returns it.
func testReadFnError(e *env) {
	ep := e.claim(1).Epoch
	e.appendN(1, ep, 1, 5)
	errStop := errors.New("stop here")
	calls := 0
	err := e.s.Read(e.ctx, 1, 0, func(p persistence.Position, _ []byte) error {
		calls++
		if p == 3 {
			return errStop
		}
		return nil
	})
	if !errors.Is(err, errStop) {
		e.t.Errorf("Read = %v, want fn's error", err)
	}
	if calls != 3 {
		e.t.Errorf("fn called %d times, want 3", calls)
	}
}

// Each Claim returns a larger epoch and the group's checkpoint and last
// position; groups' epochs are independent.
func testClaim(e *env) {
	st := e.claim(3)
	if st.Epoch == 0 || st.Checkpoint != 0 || st.Last != 0 {
		e.t.Errorf("first Claim = %+v, want a non-zero epoch, checkpoint 0, last 0", st)
	}
	prev := st.Epoch
	for range 3 {
		st = e.claim(3)
		if st.Epoch <= prev {
			e.t.Errorf("Claim returned epoch %d after %d, want a larger one", st.Epoch, prev)
		}
		prev = st.Epoch
	}
	e.appendN(3, st.Epoch, 1, 3)
	e.trim(3, st.Epoch, 2)
	ep := e.wantState(3, 2, 3)
	if ep <= prev {
		e.t.Errorf("Claim returned epoch %d after %d, want a larger one", ep, prev)
	}

	// Claiming another group does not fence this one.
	e.claim(4)
	e.claim(2)
	if got := e.append(entry(3, ep, data(3, 4))); got[0] != 4 {
		e.t.Errorf("append after claims of other groups got position %d, want 4", got[0])
	}
}

// An entry with a stale or unknown epoch is not appended and takes no
// position; the other groups' entries of the same call are appended.
func testAppendFenced(e *env) {
	old := e.claim(1).Epoch
	cur := e.claim(1).Epoch
	other := e.claim(2).Epoch
	e.append(entry(1, cur, "a"))

	pos, err := e.s.Append(e.ctx, []persistence.Entry{
		entry(1, old, "stale"), entry(2, other, "b"), entry(1, old, "stale too"),
	})
	e.wantFenced("Append with a stale epoch", err)
	if len(pos) != 3 || pos[0] != 0 || pos[1] != 1 || pos[2] != 0 {
		e.t.Errorf("Append with a stale epoch returned positions %v, want [0 1 0]", pos)
	}

	pos, err = e.s.Append(e.ctx, []persistence.Entry{entry(1, cur+1, "future")})
	e.wantFenced("Append with a future epoch", err)
	if len(pos) != 1 || pos[0] != 0 {
		e.t.Errorf("Append with a future epoch returned positions %v, want [0]", pos)
	}

	e.wantLog(1, 0, rec{1, "a"})
	e.wantLog(2, 0, rec{1, "b"})

	// The fenced entries took no positions.
	if got := e.append(entry(1, cur, "c")); got[0] != 2 {
		e.t.Errorf("append after fenced ones got position %d, want 2", got[0])
	}
	e.wantLog(1, 0, rec{1, "a"}, rec{2, "c"})
	e.wantState(1, 0, 2)
}

// Nobody owns a group that was never claimed: appends to it are fenced.
func testAppendUnclaimed(e *env) {
	for _, ep := range []persistence.Epoch{0, 1} {
		pos, err := e.s.Append(e.ctx, []persistence.Entry{entry(9, ep, "x")})
		e.wantFenced("Append to an unclaimed group", err)
		if len(pos) != 1 || pos[0] != 0 {
			e.t.Errorf("Append to an unclaimed group returned positions %v, want [0]", pos)
		}
	}
	e.wantLog(9, 0)
	e.wantState(9, 0, 0)
}

// A checkpoint (trim) with a stale epoch changes nothing.
func testTrimFenced(e *env) {
	old := e.claim(1).Epoch
	e.appendN(1, old, 1, 3)
	e.trim(1, old, 1)
	cur := e.claim(1).Epoch

	e.wantFenced("Trim with a stale epoch", e.s.Checkpoint(e.ctx, 1, old, persistence.CheckpointData{Through: 2}))
	e.wantFenced("Trim with a stale epoch below the checkpoint", e.s.Checkpoint(e.ctx, 1, old, persistence.CheckpointData{Through: 1}))
	e.wantFenced("Trim with a future epoch", e.s.Checkpoint(e.ctx, 1, cur+1, persistence.CheckpointData{Through: 2}))
	e.wantFenced("Trim of an unclaimed group", e.s.Checkpoint(e.ctx, 5, 0, persistence.CheckpointData{}))
	e.wantLog(1, 0, recs(1, 2, 2, 3)...)
	e.wantState(1, 1, 3)
}

// A checkpoint records its position and deletes the records at or below it, and
// only those of its group; positions continue after the trimmed ones.
func testTrim(e *env) {
	eps := map[uint32]persistence.Epoch{}
	for _, g := range []uint32{0, 1, 2} {
		eps[g] = e.claim(g).Epoch
		e.appendN(g, eps[g], 1, 10)
	}

	e.trim(1, eps[1], 4)
	e.wantLog(1, 0, recs(1, 5, 5, 10)...)
	e.wantLog(1, 6, recs(1, 7, 7, 10)...)
	if got := e.appendN(1, eps[1], 11, 1); got[0] != 11 {
		e.t.Errorf("append after a trim got position %d, want 11", got[0])
	}
	ep := e.wantState(1, 4, 11)

	// Trimming everything leaves an empty log whose positions continue.
	e.trim(1, ep, 11)
	e.wantLog(1, 0)
	ep = e.wantState(1, 11, 11)
	if got := e.appendN(1, ep, 12, 2); got[0] != 12 || got[1] != 13 {
		e.t.Errorf("append after trimming everything got positions %v, want [12 13]", got)
	}
	e.wantLog(1, 0, recs(1, 12, 12, 13)...)

	// The neighbours are untouched.
	for _, g := range []uint32{0, 2} {
		e.wantLog(g, 0, recs(g, 1, 1, 10)...)
		e.wantState(g, 0, 10)
	}
}

// A checkpoint at or below the checkpoint position changes nothing.
func testTrimBelowCheckpoint(e *env) {
	ep := e.claim(1).Epoch
	e.appendN(1, ep, 1, 6)
	e.trim(1, ep, 4)
	e.trim(1, ep, 2)
	e.trim(1, ep, 4)
	e.trim(1, ep, 0)
	e.wantLog(1, 0, recs(1, 5, 5, 6)...)
	e.wantState(1, 4, 6)
}

// Positions are never reused, also after trimming everything and reopening.
func testTrimReopen(e *env) {
	ep1 := e.claim(1).Epoch
	ep2 := e.claim(2).Epoch
	e.appendN(1, ep1, 1, 5)
	e.appendN(2, ep2, 1, 5)
	e.trim(1, ep1, 5)
	e.trim(2, ep2, 3)
	e.reopen()

	ep1 = e.wantState(1, 5, 5)
	ep2 = e.wantState(2, 3, 5)
	e.wantLog(1, 0)
	e.wantLog(2, 0, recs(2, 4, 4, 5)...)
	if got := e.appendN(1, ep1, 6, 1); got[0] != 6 {
		e.t.Errorf("append after trim and reopen got position %d, want 6", got[0])
	}
	if got := e.appendN(2, ep2, 6, 1); got[0] != 6 {
		e.t.Errorf("append after trim and reopen got position %d, want 6", got[0])
	}
	e.wantLog(1, 0, recs(1, 6, 6, 6)...)
	e.wantLog(2, 0, recs(2, 4, 4, 6)...)
}

// A checkpoint writes its snapshots and timer index entries and trims the
// log in one atomic write: a fenced one or one beyond the last position
// writes none of them.
func testCheckpointAtomic(e *env) {
	ep := e.claim(1).Epoch
	e.appendN(1, ep, 1, 5)
	e.put(1, ep, snap("gone", "x"))
	e.checkpoint(1, ep, persistence.CheckpointData{Timers: []persistence.Timer{timer("gone", t0)}})

	err := e.s.Checkpoint(e.ctx, 1, ep, persistence.CheckpointData{
		Snapshots: []persistence.Snapshot{snap("a", "too far"), {Key: "gone"}},
		Timers:    []persistence.Timer{timer("a", t0), timer("gone", 0)},
		Through:   6,
	})
	if err == nil {
		e.t.Error("Checkpoint beyond the last position succeeded")
	}
	e.wantNoSnap(1, "a")
	e.wantSnap(1, "gone", "x")
	e.wantTimers(1, map[string]int64{"gone": t0})
	old := e.wantState(1, 0, 5) // claims
	ep = e.claim(1).Epoch
	e.wantFenced("Checkpoint with a stale epoch", e.s.Checkpoint(e.ctx, 1, old, persistence.CheckpointData{
		Snapshots: []persistence.Snapshot{snap("a", "stale")},
		Timers:    []persistence.Timer{timer("a", t0)},
		Through:   3,
	}))
	e.wantNoSnap(1, "a")
	e.wantTimers(1, map[string]int64{"gone": t0})
	e.wantLog(1, 0, recs(1, 1, 1, 5)...)

	if err := e.s.Checkpoint(e.ctx, 1, ep, persistence.CheckpointData{
		Snapshots: []persistence.Snapshot{snap("a", "3"), {Key: "gone"}},
		Timers:    []persistence.Timer{timer("a", t0+3), timer("gone", 0)},
		Through:   3,
	}); err != nil {
		e.t.Fatalf("Checkpoint: %v", err)
	}
	e.wantSnap(1, "a", "3")
	e.wantNoSnap(1, "gone")
	e.wantTimers(1, map[string]int64{"a": t0 + 3})
	e.wantLog(1, 0, recs(1, 4, 4, 5)...)
	ep = e.wantState(1, 3, 5)

	// Snapshots at or below the checkpoint are still written.
	if err := e.s.Checkpoint(e.ctx, 1, ep, persistence.CheckpointData{Snapshots: []persistence.Snapshot{snap("a", "again")}, Through: 2}); err != nil {
		e.t.Fatalf("Checkpoint below the checkpoint position: %v", err)
	}
	e.wantSnap(1, "a", "again")
	e.wantState(1, 3, 5)
}
