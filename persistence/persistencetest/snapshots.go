package persistencetest

import (
	"bytes"
	"fmt"

	"github.com/keyfold/keyfold/persistence"
)

// Checkpoint writes and overwrites snapshots, nil Data deletes one, and Get of a
// missing one wraps ErrNotFound.
func testSnapshots(e *env) {
	ep := e.claim(1).Epoch
	e.wantNoSnap(1, "a")

	e.put(1, ep, snap("a", "1"), snap("b", "2"), snap("k\x00\xff", "binary key"))
	e.wantSnap(1, "a", "1")
	e.wantSnap(1, "b", "2")
	e.wantSnap(1, "k\x00\xff", "binary key")
	e.wantNoSnap(1, "k")
	e.wantNoSnap(1, "c")

	// Overwrite one and delete another in one write.
	e.put(1, ep, snap("a", "1b"), persistence.Snapshot{Key: "b"})
	e.wantSnap(1, "a", "1b")
	e.wantNoSnap(1, "b")

	// Deleting a missing snapshot and writing nothing are fine.
	e.put(1, ep, persistence.Snapshot{Key: "missing"})
	e.put(1, ep)

	// Empty (non-nil) data is a snapshot, not a deletion.
	e.put(1, ep, persistence.Snapshot{Key: "empty", Data: []byte{}})
	e.wantSnap(1, "empty", "")

	// A megabyte round-trips.
	big := bytes.Repeat([]byte("snapshot"), 1<<17)
	e.put(1, ep, persistence.Snapshot{Key: "big", Data: big})
	e.wantSnap(1, "big", string(big))

	// Snapshots do not show in the log.
	e.wantLog(1, 0)
	e.wantState(1, 0, 0)
}

// The store keeps its own copy of what Checkpoint gets and what Get returns.
func testSnapshotsCopyData(e *env) {
	ep := e.claim(1).Epoch
	b := []byte("before")
	e.put(1, ep, persistence.Snapshot{Key: "a", Data: b})
	copy(b, "AFTER!")
	e.wantSnap(1, "a", "before")

	got, err := e.s.Get(e.ctx, 1, "a")
	if err != nil {
		e.t.Fatalf("Get: %v", err)
	}
	copy(got, "AFTER!")
	e.wantSnap(1, "a", "before")
}

// The same key in two groups is two snapshots.
func testSnapshotsIsolatedByGroup(e *env) {
	ep1 := e.claim(1).Epoch
	ep2 := e.claim(2).Epoch
	e.put(1, ep1, snap("a", "one"))
	e.wantNoSnap(2, "a")
	e.put(2, ep2, snap("a", "two"))
	e.wantSnap(1, "a", "one")
	e.wantSnap(2, "a", "two")
	e.put(2, ep2, persistence.Snapshot{Key: "a"})
	e.wantSnap(1, "a", "one")
	e.wantNoSnap(2, "a")
	e.wantNoSnap(0, "a")
	e.wantNoSnap(3, "a")
}

// A checkpoint with a stale epoch writes nothing, not even its deletions.
func testPutFenced(e *env) {
	old := e.claim(1).Epoch
	cur := e.claim(1).Epoch
	e.put(1, cur, snap("a", "1"))

	err := e.s.Checkpoint(e.ctx, 1, old, persistence.CheckpointData{Snapshots: []persistence.Snapshot{snap("a", "stale"), snap("b", "stale")}})
	e.wantFenced("Put with a stale epoch", err)
	err = e.s.Checkpoint(e.ctx, 1, old, persistence.CheckpointData{Snapshots: []persistence.Snapshot{{Key: "a"}}})
	e.wantFenced("Put of a deletion with a stale epoch", err)
	err = e.s.Checkpoint(e.ctx, 1, cur+1, persistence.CheckpointData{Snapshots: []persistence.Snapshot{snap("a", "future")}})
	e.wantFenced("Put with a future epoch", err)
	err = e.s.Checkpoint(e.ctx, 2, 0, persistence.CheckpointData{Snapshots: []persistence.Snapshot{snap("a", "unclaimed")}})
	e.wantFenced("Put to an unclaimed group", err)

	e.wantSnap(1, "a", "1")
	e.wantNoSnap(1, "b")
	e.wantNoSnap(2, "a")
}

// GetMany returns several snapshots of a group at once, nil for a missing
// one, empty (not nil) for an empty one.
func testGetMany(e *env) {
	ep := e.claim(1).Epoch
	e.put(1, ep, snap("a", "1"), snap("k\x00\xff", "binary"), persistence.Snapshot{Key: "empty", Data: []byte{}})
	e.put(2, e.claim(2).Epoch, snap("b", "other group"))
	got, err := e.s.GetMany(e.ctx, 1, []string{"a", "missing", "k\x00\xff", "empty", "b", "a"})
	if err != nil {
		e.t.Fatalf("GetMany: %v", err)
	}
	want := []string{"1", "<nil>", "binary", "", "<nil>", "1"}
	if len(got) != len(want) {
		e.t.Fatalf("GetMany returned %d values for 6 keys", len(got))
	}
	for i, w := range want {
		g := "<nil>"
		if got[i] != nil {
			g = string(got[i])
		}
		if g != w {
			e.t.Errorf("GetMany value %d = %q, want %q", i, g, w)
		}
	}
	if got, err := e.s.GetMany(e.ctx, 1, nil); err != nil || len(got) != 0 {
		e.t.Errorf("GetMany of no keys = %v, %v", got, err)
	}
}

// GetGroups returns the snapshots of keys of several groups at once: each
// group's own (a key of the same name in another group is not it), nil
// for a missing one, and nothing for a group asked no keys.
func testGetGroups(e *env) {
	e.put(1, e.claim(1).Epoch, snap("a", "1a"), snap("k\x00\xff", "binary"))
	e.put(2, e.claim(2).Epoch, snap("a", "2a"), snap("b", "2b"))
	e.put(3, e.claim(3).Epoch, persistence.Snapshot{Key: "empty", Data: []byte{}})
	reads := []persistence.GroupKeys{
		{Group: 2, Keys: []string{"b", "a", "missing"}},
		{Group: 4, Keys: nil},
		{Group: 1, Keys: []string{"a", "b", "k\x00\xff"}},
		{Group: 3, Keys: []string{"empty"}},
		{Group: 5, Keys: []string{"a"}}, // a group never claimed
	}
	got, err := e.s.GetGroups(e.ctx, reads)
	if err != nil {
		e.t.Fatalf("GetGroups: %v", err)
	}
	want := [][]string{{"2b", "2a", "<nil>"}, {}, {"1a", "<nil>", "binary"}, {""}, {"<nil>"}}
	if len(got) != len(want) {
		e.t.Fatalf("GetGroups returned %d groups' values for %d groups", len(got), len(want))
	}
	for i, w := range want {
		if len(got[i]) != len(w) {
			e.t.Errorf("GetGroups group %d: %d values for %d keys", reads[i].Group, len(got[i]), len(w))
			continue
		}
		for j := range w {
			g := "<nil>"
			if got[i][j] != nil {
				g = string(got[i][j])
			}
			if g != w[j] {
				e.t.Errorf("GetGroups group %d value %d = %q, want %q", reads[i].Group, j, g, w[j])
			}
		}
	}
	if got, err := e.s.GetGroups(e.ctx, nil); err != nil || len(got) != 0 {
		e.t.Errorf("GetGroups of no groups = %v, %v", got, err)
	}
}

// A checkpoint of thousands of snapshots (as at a million keys) writes
// every one, deletes those given nil Data, and of a key given twice keeps
// the later.
func testManySnapshots(e *env) {
	ep := e.claim(1).Epoch
	const n = 2345
	keys := make([]string, n)
	var first []persistence.Snapshot
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
		first = append(first, snap(keys[i], fmt.Sprintf("v%d", i)))
	}
	first = append(first, snap(keys[1500], "later")) // past a thousand: a later one of the same key
	e.put(1, ep, first...)
	var second []persistence.Snapshot
	for i := 0; i < n; i += 3 {
		second = append(second, persistence.Snapshot{Key: keys[i]})
	}
	second = append(second, snap(keys[1], "changed"))
	e.put(1, ep, second...)
	got, err := e.s.GetMany(e.ctx, 1, keys)
	if err != nil {
		e.t.Fatalf("GetMany: %v", err)
	}
	for i, g := range got {
		want := fmt.Sprintf("v%d", i)
		switch {
		case i%3 == 0:
			want = ""
		case i == 1:
			want = "changed"
		case i == 1500:
			want = "later"
		}
		if (want == "") != (g == nil) || string(g) != want {
			e.t.Fatalf("snapshot %s = %q, want %q (nil: deleted)", keys[i], g, want)
		}
	}
}
