package actors_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// Keys the store has no snapshot of are not read: after their groups were
// checkpointed, a key never seen activates with no store read, and a key
// that left memory after its checkpoint (from memory or the spill, with no
// snapshot cache to find it in) is read and comes back whole: in the same
// run (the filter the checkpoints add to) and after a restart (the filter
// they stored).
func TestNewKeysAreNotRead(t *testing.T) {
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	cfg := spillConfig(96 << 10) // 4 groups, 5 active keys, no cache
	hs := start(t, fs, cfg)
	const keys = 300
	for i := range keys {
		hs.ingest(event(fmt.Sprintf("k%d", i), "x", i))
	}
	eventually(t, "keys to spill", func() bool { return hs.host.Stats().SpilledKeys >= keys/2 })
	if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := hs.host.Stats(); st.SpilledKeys != 0 || st.CachedKeys != 0 || st.ResidentKeys+st.ActiveKeys > keys/2 {
		t.Fatalf("stats %+v: want most keys out of memory, none spilled or cached", st)
	}
	checkStored := func(hs *harness, seq uint64) {
		t.Helper()
		before := fs.Calls(faultstore.OpGet)
		for i := range keys {
			k := fmt.Sprintf("k%d", i)
			if r := hs.ingest(event(k, "x", 1000)); r.Duplicates != 1 {
				t.Fatalf("%s: retried id not recognised: %+v", k, r)
			}
			if v := hs.query(k); v.Seq != seq || v.Aggregates["sum"] != float64(i) {
				t.Fatalf("%s = %+v, want seq %d, sum %d", k, v, seq, i)
			}
		}
		if fs.Calls(faultstore.OpGet) == before {
			t.Fatal("keys that left memory came back without a store read")
		}
	}
	checkNew := func(hs *harness, round int) {
		t.Helper()
		before, known := fs.Calls(faultstore.OpGet), hs.host.Stats().NewKeys
		for i := range 200 {
			k := fmt.Sprintf("new%d-%d", round, i)
			hs.ingest(event(k, "n", 7))
			if v := hs.query(k); v.Seq != 1 || v.Aggregates["sum"] != float64(7) {
				t.Fatalf("%s = %+v", k, v)
			}
		}
		// (A key of the 300 stored may be held by the filter: one in a
		// couple of hundred.)
		if n := fs.Calls(faultstore.OpGet) - before; n > 10 {
			t.Errorf("200 keys never stored took %d store reads", n)
		}
		if st := hs.host.Stats(); st.NewKeys-known < 190 || st.FilterBytes == 0 {
			t.Errorf("stats %+v: want 200 keys known new (NewKeys), a filter (FilterBytes)", st)
		}
	}
	checkNew(hs, 0)
	checkStored(hs, 1)
	if err := hs.shutdown(); err != nil { // checkpoints the new keys
		t.Fatal(err)
	}

	hs = start(t, fs, cfg)
	checkNew(hs, 1)
	checkStored(hs, 1)
	for i := range 200 { // the first run's new keys are stored now
		k := fmt.Sprintf("new0-%d", i)
		if v := hs.query(k); v.Seq != 1 || v.Aggregates["sum"] != float64(7) {
			t.Fatalf("%s after a restart = %+v", k, v)
		}
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}

	// A store whose groups were checkpointed with no filter (by an older
	// keyfold), or whose filter does not decode: every key not in memory
	// is read, as before, and nothing is lost.
	for _, filter := range [][]byte{nil, {0xff}} {
		t.Run(fmt.Sprintf("filter=%x", filter), func(t *testing.T) {
			ctx := context.Background()
			for g := range uint32(cfg.Groups) {
				st, err := fs.Claim(ctx, g)
				if err != nil {
					t.Fatal(err)
				}
				d := persistence.CheckpointData{Snapshots: []persistence.Snapshot{{Key: actors.StoredKeysKey, Data: filter}}}
				if err := fs.Checkpoint(ctx, g, st.Epoch, d); err != nil {
					t.Fatal(err)
				}
			}
			hs := start(t, fs, cfg)
			defer hs.shutdown()
			before := fs.Calls(faultstore.OpGet)
			hs.ingest(event("never-seen", "n", 1))
			if fs.Calls(faultstore.OpGet) == before {
				t.Error("a key was taken to be new with no filter to say so")
			}
			checkStored(hs, 1)
		})
	}
}

// A keyfold without the filter (an older one: a rolling upgrade, or a
// downgrade and an upgrade again) stores keys without adding them to the
// filter: the next take-over by one with the filter does not use the
// filter it left, and the keys stored meanwhile are read, not taken to be
// new.
func TestKeysStoredWithoutTheFilterAreRead(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	cfg := actors.Config{Groups: 4}
	run := func(prefix string, setup ...func(*actors.Host)) {
		t.Helper()
		hs := start(t, fs, cfg, setup...)
		for i := range 100 {
			hs.ingest(event(fmt.Sprintf("%s%d", prefix, i), "x", i))
		}
		if err := hs.shutdown(); err != nil { // checkpoints them
			t.Fatal(err)
		}
	}
	run("a")
	run("b", actors.WithoutStoredKeysFilter)
	hs := start(t, fs, cfg)
	defer hs.shutdown()
	for _, prefix := range []string{"a", "b"} {
		for i := range 100 {
			k := fmt.Sprintf("%s%d", prefix, i)
			if r := hs.ingest(event(k, "x", 1000)); r.Duplicates != 1 {
				t.Fatalf("%s: its id is forgotten (read as a new key): %+v", k, r)
			}
			if v := hs.query(k); v.Seq != 1 || v.Aggregates["sum"] != float64(i) {
				t.Fatalf("%s = %+v", k, v)
			}
		}
	}
	if st := hs.host.Stats(); st.FilterBytes != 0 {
		t.Errorf("stats %+v: want no filter in use", st)
	}
}

// The filter's layers written a few at a time, by checkpoints that each
// wrote only the layers they changed (one of them failing, its keys
// replayed and written by the next), add up in the store to a filter that
// holds every key stored.
func TestFilterWrittenInPartsHoldsEveryKey(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	cfg := actors.Config{Groups: 1}
	const perRound = 1500 // 4,500 keys: the layers of 1k, 2k and 4k keys
	ingestRound := func(hs *harness, round int) {
		t.Helper()
		for b := 0; b < perRound; b += 100 {
			var evs [][]byte
			for i := b; i < b+100; i++ {
				evs = append(evs, event(fmt.Sprintf("r%d-%d", round, i), "x", i))
			}
			hs.ingest(evs...)
		}
	}
	hs := start(t, fs, cfg)
	ingestRound(hs, 1)
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	hs = start(t, fs, cfg)
	ingestRound(hs, 2)
	if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
		t.Fatal(err)
	}
	ingestRound(hs, 3)
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: fmt.Errorf("injected")})
	_ = hs.shutdown() // its checkpoint fails: round 3 is only in the log
	fs.Reset()
	hs = start(t, fs, cfg) // replays round 3
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	hs = start(t, fs, cfg)
	defer hs.shutdown()
	for round := 1; round <= 3; round++ {
		for b := 0; b < perRound; b += 100 {
			var evs [][]byte
			for i := b; i < b+100; i++ {
				evs = append(evs, event(fmt.Sprintf("r%d-%d", round, i), "x", 0))
			}
			if r := hs.ingest(evs...); r.Duplicates != 100 {
				t.Fatalf("round %d, keys %d to %d: %d of 100 retried ids recognised", round, b, b+99, r.Duplicates)
			}
		}
	}
	if st := hs.host.Stats(); st.FilterBytes == 0 || st.NewKeys != 0 {
		t.Errorf("stats %+v: want a filter, no key taken to be new", st)
	}
}
