package persistencetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/keyfold/keyfold/persistence"
)

// lookupIDs looks ids up in g's id index, failing the test on an error.
func (e *env) lookupIDs(g uint32, ls ...persistence.IDLookup) []int64 {
	e.t.Helper()
	at, err := e.s.LookupIDs(e.ctx, g, ls)
	if err != nil {
		e.t.Fatalf("LookupIDs(%d): %v", g, err)
	}
	if len(at) != len(ls) {
		e.t.Fatalf("LookupIDs(%d) returned %d times for %d look-ups", g, len(at), len(ls))
	}
	return at
}

// wantIDs checks the times LookupIDs returns.
func (e *env) wantIDs(g uint32, ls []persistence.IDLookup, want ...int64) {
	e.t.Helper()
	if got := e.lookupIDs(g, ls...); !slices.Equal(got, want) {
		e.t.Errorf("LookupIDs(%d, %v) = %v, want %v", g, ls, got, want)
	}
}

// storedID is an id the store keeps until a checkpoint drops it (t0 is in
// the past: an id that expired at t0 plus a day could be gone already).
func storedID(bucket int64, key, id string, at int64) persistence.StoredID {
	return persistence.StoredID{Bucket: bucket, Key: key, ID: id, At: at}
}

func idLookup(bucket int64, key, id string) persistence.IDLookup {
	return persistence.IDLookup{Bucket: bucket, Key: key, ID: id}
}

// A checkpoint stores ids in the group's index, each under its bucket and
// key: a look-up finds one only under the same three (a key and an id that
// concatenate alike are apart), in its own group, after a reopen too; an
// id stored again keeps the later time.
func testIDIndex(e *env) {
	ep1, ep2 := e.claim(1).Epoch, e.claim(2).Epoch
	e.wantIDs(1, []persistence.IDLookup{idLookup(0, "a", "x")}, 0)
	e.checkpoint(1, ep1, persistence.CheckpointData{IDs: []persistence.StoredID{
		storedID(0, "a", "x", t0),
		storedID(0, "a", "bc", t0+1),
		storedID(5, "ab", "c", t0+2),
		storedID(7, "k\x00\xff", "id\x00", t0+3),
		storedID(1<<40, "a", "far", t0+4),
		// Kept at least until it expires, an hour from now.
		{Bucket: 9, Key: "a", ID: "expires", At: t0 + 6, Expires: time.Now().Add(time.Hour).UnixMilli()},
	}})
	e.checkpoint(2, ep2, persistence.CheckpointData{IDs: []persistence.StoredID{storedID(0, "a", "other group", t0+5)}})
	ls := []persistence.IDLookup{
		idLookup(0, "a", "x"),
		idLookup(0, "a", "bc"),
		idLookup(0, "ab", "c"), // another key's id of another bucket
		idLookup(5, "ab", "c"),
		idLookup(5, "a", "bc"), // a key and an id that concatenate alike
		idLookup(7, "k\x00\xff", "id\x00"),
		idLookup(7, "k\x00\xff", "id"),
		idLookup(1<<40, "a", "far"),
		idLookup(0, "a", "other group"),
		idLookup(0, "a", "x"), // twice
		idLookup(9, "a", "expires"),
	}
	want := []int64{t0, t0 + 1, 0, t0 + 2, 0, t0 + 3, 0, t0 + 4, 0, t0, t0 + 6}
	e.wantIDs(1, ls, want...)
	e.wantIDs(2, []persistence.IDLookup{idLookup(0, "a", "other group"), idLookup(0, "a", "x")}, t0+5, 0)
	e.wantIDs(3, []persistence.IDLookup{idLookup(0, "a", "x")}, 0)
	e.wantIDs(1, nil)

	e.checkpoint(1, ep1, persistence.CheckpointData{IDs: []persistence.StoredID{storedID(0, "a", "x", t0+10)}})
	want[0], want[9] = t0+10, t0+10
	e.wantIDs(1, ls, want...)
	e.reopen()
	e.wantIDs(1, ls, want...)
}

// DropIDsBefore deletes the group's ids in the buckets below it, in that
// group only, before the checkpoint's ids are stored; later checkpoints
// store into the buckets left as before.
func testIDsDropBefore(e *env) {
	ep1, ep2 := e.claim(1).Epoch, e.claim(2).Epoch
	var ids []persistence.StoredID
	for b := range int64(6) {
		ids = append(ids, storedID(b, "k", "id", t0+b), storedID(b, "j", "id", t0+b))
	}
	e.checkpoint(1, ep1, persistence.CheckpointData{IDs: ids})
	e.checkpoint(2, ep2, persistence.CheckpointData{IDs: ids})
	e.checkpoint(1, ep1, persistence.CheckpointData{DropIDsBefore: 3, IDs: []persistence.StoredID{storedID(6, "k", "new", t0+6)}})
	var ls []persistence.IDLookup
	for b := range int64(7) {
		ls = append(ls, idLookup(b, "k", "id"), idLookup(b, "j", "id"))
	}
	ls = append(ls, idLookup(6, "k", "new"))
	e.wantIDs(1, ls, 0, 0, 0, 0, 0, 0, t0+3, t0+3, t0+4, t0+4, t0+5, t0+5, 0, 0, t0+6)
	e.wantIDs(2, ls, t0, t0, t0+1, t0+1, t0+2, t0+2, t0+3, t0+3, t0+4, t0+4, t0+5, t0+5, 0, 0, 0)

	// A bucket dropped can take ids again; dropping below a bucket that
	// holds none changes nothing.
	e.checkpoint(1, ep1, persistence.CheckpointData{IDs: []persistence.StoredID{storedID(1, "k", "id", t0+20)}})
	e.checkpoint(1, ep1, persistence.CheckpointData{DropIDsBefore: 1})
	e.reopen()
	e.wantIDs(1, ls, 0, 0, t0+20, 0, 0, 0, t0+3, t0+3, t0+4, t0+4, t0+5, t0+5, 0, 0, t0+6)

	// An id stored below an earlier drop goes with the next drop below it
	// (a store must not take its last drop as where the group's ids start).
	e.checkpoint(1, ep1, persistence.CheckpointData{DropIDsBefore: 6})
	e.checkpoint(1, ep1, persistence.CheckpointData{IDs: []persistence.StoredID{storedID(2, "k", "late", t0+30)}})
	e.wantIDs(1, []persistence.IDLookup{idLookup(2, "k", "late")}, t0+30)
	e.checkpoint(1, ep1, persistence.CheckpointData{DropIDsBefore: 6})
	e.wantIDs(1, []persistence.IDLookup{idLookup(2, "k", "late"), idLookup(6, "k", "new"), idLookup(5, "j", "id")}, 0, t0+6, 0)
	e.wantIDs(2, []persistence.IDLookup{idLookup(5, "j", "id")}, t0+5)
}

// A checkpoint that fails (fenced, or through a position beyond the last)
// stores no id and drops none; ids out of range are refused, and so is a
// look-up of a negative bucket.
func testIDsAtomic(e *env) {
	old := e.claim(1).Epoch
	cur := e.claim(1).Epoch
	e.checkpoint(1, cur, persistence.CheckpointData{IDs: []persistence.StoredID{storedID(0, "k", "kept", t0)}})
	ls := []persistence.IDLookup{idLookup(0, "k", "kept"), idLookup(1, "k", "stale"), idLookup(1, "k", "beyond"), idLookup(1, "k", "bad")}

	err := e.s.Checkpoint(e.ctx, 1, old, persistence.CheckpointData{DropIDsBefore: 1, IDs: []persistence.StoredID{storedID(1, "k", "stale", t0)}})
	e.wantFenced("Checkpoint of ids with a stale epoch", err)
	if err := e.s.Checkpoint(e.ctx, 1, cur, persistence.CheckpointData{Through: 1, DropIDsBefore: 1, IDs: []persistence.StoredID{storedID(1, "k", "beyond", t0)}}); err == nil {
		e.t.Errorf("Checkpoint through a position beyond the last = nil, want an error")
	}
	for _, bad := range []persistence.CheckpointData{
		{IDs: []persistence.StoredID{storedID(1, "k", "bad", t0), storedID(-1, "k", "negative", t0)}},
		{IDs: []persistence.StoredID{storedID(1, "k", "bad", t0), {Bucket: 1, Key: "k", ID: "no time"}}},
		{DropIDsBefore: -1, IDs: []persistence.StoredID{storedID(1, "k", "bad", t0)}},
		{DropIDsBefore: -1},
		{Snapshots: []persistence.Snapshot{snap("bad", "1")}, IDs: []persistence.StoredID{storedID(-1, "k", "negative", t0)}},
		{Outputs: []persistence.Output{{Pipeline: "bad", Data: []byte("1")}}, IDs: []persistence.StoredID{storedID(-1, "k", "negative", t0)}},
	} {
		if err := e.s.Checkpoint(e.ctx, 1, cur, bad); err == nil {
			e.t.Errorf("Checkpoint(%+v) = nil, want an error", bad)
		}
	}
	e.wantIDs(1, ls, t0, 0, 0, 0)
	e.wantNoSnap(1, "bad")
	if got, err := e.s.ReadOutputs(e.ctx, "bad", "", 10); err != nil || len(got) != 0 {
		e.t.Errorf("outputs of a refused checkpoint = %v, %v; want none", got, err)
	}
	if _, err := e.s.LookupIDs(e.ctx, 1, []persistence.IDLookup{idLookup(-1, "k", "kept")}); err == nil {
		e.t.Errorf("LookupIDs of bucket -1 = nil error, want one")
	}
}

// A store without an id index refuses a checkpoint with ids or a drop of
// them, and writes nothing of it.
func testNoIDIndex(e *env) {
	ep := e.claim(1).Epoch
	for _, d := range []persistence.CheckpointData{
		{Snapshots: []persistence.Snapshot{snap("a", "1")}, IDs: []persistence.StoredID{storedID(0, "a", "x", t0)}},
		{Snapshots: []persistence.Snapshot{snap("a", "1")}, DropIDsBefore: 1},
	} {
		if err := e.s.Checkpoint(e.ctx, 1, ep, d); err == nil {
			e.t.Errorf("Checkpoint(%+v) = nil, want an error: the store has no id index", d)
		}
	}
	e.wantNoSnap(1, "a")
}

// Drops find a group's ids in whatever buckets hold them, however sparse
// the buckets and the groups in them are, and leave every other group's:
// checked against a model over random ids and drops.
func testIDsDropSparse(e *env) {
	rng := rand.New(rand.NewPCG(1, 2))
	groups := []uint32{0, 1, 2, 3, 200}
	epochs := map[uint32]persistence.Epoch{}
	for _, g := range groups {
		epochs[g] = e.claim(g).Epoch
	}
	type id struct {
		group  uint32
		bucket int64
		key    string
	}
	held := map[id]int64{}
	for round := range 30 {
		// A few ids in random buckets of random groups.
		for range 1 + rng.IntN(6) {
			i := id{groups[rng.IntN(len(groups))], int64(rng.IntN(30)), fmt.Sprint("k", rng.IntN(3))}
			at := t0 + int64(round*1000+1+rng.IntN(999))
			e.checkpoint(i.group, epochs[i.group], persistence.CheckpointData{IDs: []persistence.StoredID{storedID(i.bucket, i.key, "x", at)}})
			held[i] = at
		}
		// One group's dropped below a random bucket.
		g, before := groups[rng.IntN(len(groups))], int64(1+rng.IntN(30))
		e.checkpoint(g, epochs[g], persistence.CheckpointData{DropIDsBefore: before})
		for i := range held {
			if i.group == g && i.bucket < before {
				delete(held, i)
			}
		}
		for _, g := range groups {
			var ls []persistence.IDLookup
			var want []int64
			for b := range int64(30) {
				for k := range 3 {
					i := id{g, b, fmt.Sprint("k", k)}
					ls = append(ls, idLookup(b, i.key, "x"))
					want = append(want, held[i])
				}
			}
			if got := e.lookupIDs(g, ls...); !slices.Equal(got, want) {
				e.t.Fatalf("round %d, group %d: LookupIDs = %v, want %v", round, g, got, want)
			}
		}
	}
}
