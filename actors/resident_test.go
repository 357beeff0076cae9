package actors_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// Passivated keys stay in memory without an actor: their next events and
// queries read nothing from the store, and find their state, remembered ids
// included.
func TestResidentKeysNeedNoStoreRead(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	hs := start(t, fs, actors.Config{Groups: 4, MaxActive: 5, IdleTimeout: time.Hour, CheckpointInterval: 5 * time.Millisecond})
	defer hs.shutdown()
	const keys = 100
	ingestAndPark(t, hs, keys, 5)
	reads := fs.Calls(faultstore.OpGet)
	for i := range keys {
		k := fmt.Sprintf("k%d", i)
		if v := hs.query(k); v.Seq != 1 || v.Aggregates["sum"] != float64(i) {
			t.Fatalf("%s resident = %+v", k, v)
		}
		if r := hs.ingest(event(k, "x", 1000)); r.Duplicates != 1 {
			t.Fatalf("%s: retried id not recognised after passivation: %+v", k, r)
		}
		hs.ingest(event(k, "y", 1))
	}
	if n := fs.Calls(faultstore.OpGet) - reads; n != 0 {
		t.Errorf("%d store reads for keys in the resident tier, want 0", n)
	}
	st := hs.host.Stats()
	if st.Unparked < keys-5 || st.ResidentBytes <= 0 {
		t.Errorf("stats %+v: want about %d activations from the resident tier and its bytes", st, keys)
	}
	for i := range keys {
		if v := hs.query(fmt.Sprintf("k%d", i)); v.Seq != 2 || v.Aggregates["sum"] != float64(i+1) {
			t.Fatalf("k%d = %+v", i, v)
		}
	}
}

// The resident tier keeps within MaxMemory: the least recently parked clean
// keys leave memory, and come back from the store whole. Dirty keys park
// too and stay until a checkpoint: the budget is exceeded by at most them.
func TestResidentKeysStayWithinBudget(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	const budget = 8 << 10 // a few dozen keys
	hs := start(t, fs, actors.Config{Groups: 4, MaxActive: 5, IdleTimeout: time.Hour, CheckpointInterval: 5 * time.Millisecond,
		MaxMemory: 5*actors.ActiveKeyBytes + budget})
	defer hs.shutdown()
	const keys = 300
	for i := range keys {
		hs.ingest(event(fmt.Sprintf("k%d", i), "x", i))
		// A key of this pipeline is charged well under 1 KiB.
		if st := hs.host.Stats(); st.ResidentBytes > budget+int64(st.DirtyKeys)<<10 {
			t.Fatalf("resident tier holds %d bytes with %d dirty keys, budget %d", st.ResidentBytes, st.DirtyKeys, budget)
		}
	}
	eventually(t, "keys to be passivated, checkpointed and evicted", func() bool {
		st := hs.host.Stats()
		return st.ActiveKeys <= 5 && st.DirtyKeys == 0 && st.ResidentBytes <= budget
	})
	st := hs.host.Stats()
	if st.ResidentKeys == 0 || st.ResidentKeys >= keys-5 || st.ResidentBytes > budget {
		t.Fatalf("%d keys resident in %d bytes: want some, not all, within %d bytes", st.ResidentKeys, st.ResidentBytes, budget)
	}
	reads := fs.Calls(faultstore.OpGet)
	for i := range keys {
		k := fmt.Sprintf("k%d", i)
		if r := hs.ingest(event(k, "x", 1000)); r.Duplicates != 1 {
			t.Fatalf("%s: retried id not recognised: %+v", k, r)
		}
		if v := hs.query(k); v.Seq != 1 || v.Aggregates["sum"] != float64(i) {
			t.Fatalf("%s = %+v", k, v)
		}
	}
	if fs.Calls(faultstore.OpGet) == reads {
		t.Error("no key was read back from the store: none left memory")
	}
	if err := actors.CheckRegistry(hs.host); err != nil {
		t.Fatal(err)
	}
}

// Keys parked in an incarnation of their group leave with it: a host that
// abandons its groups and takes them over again serves what its log and
// snapshots say, not what it held, and holds nothing of the old incarnation.
func TestResidentKeysLeaveWithTheirGroup(t *testing.T) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{Groups: 4, MaxActive: 2, IdleTimeout: time.Hour, CheckpointInterval: 5 * time.Millisecond})
	defer hs.shutdown()
	for i := range 20 {
		hs.ingest(event(fmt.Sprintf("k%d", i), "x", i))
	}
	eventually(t, "keys to be parked", func() bool { return hs.host.Stats().ResidentKeys >= 15 })
	groups := hs.host.Abandon(errors.New("test: lease lapsed"))
	if st := hs.host.Stats(); st.ResidentKeys != 0 || st.ResidentBytes != 0 {
		t.Fatalf("after abandoning every group: %d keys resident (%d bytes), want none", st.ResidentKeys, st.ResidentBytes)
	}
	if err := actors.CheckRegistry(hs.host); err != nil {
		t.Fatal(err)
	}
	if err := hs.host.SetOwned(context.Background(), groups); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the groups to be served again", func() bool { return hs.host.Stats().GroupsUnavailable == 0 })
	for i := range 20 {
		v, err := hs.host.Query(context.Background(), "p", fmt.Sprintf("k%d", i))
		if err != nil || v.Seq != 1 || v.Aggregates["sum"] != float64(i) {
			t.Errorf("k%d after the take-over = %+v %v (stats %+v)", i, v, err, hs.host.Stats())
		}
	}
}

// A group that was never checkpointed has no snapshots, and while none of
// its keys left memory a key it does not hold is new: activating it reads
// nothing. Once its groups were checkpointed (here by a restart), keys not
// in memory are read again, and found.
func TestNewKeysOfNewGroupsNeedNoRead(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	hs := start(t, fs, actors.Config{Groups: 4})
	raws := make([][]byte, 400)
	for i := range raws {
		raws[i] = event(fmt.Sprintf("k%d", i), fmt.Sprint(i), i)
	}
	reads := fs.Calls(faultstore.OpGet)
	hs.ingest(raws...)
	if _, err := hs.host.Query(context.Background(), "p", "ghost"); !errors.Is(err, actors.ErrNotFound) {
		t.Fatalf("query of a key never written: %v", err)
	}
	if n := fs.Calls(faultstore.OpGet) - reads; n != 0 {
		t.Errorf("%d store reads activating 401 keys of groups never checkpointed, want 0", n)
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}

	hs = start(t, fs, actors.Config{Groups: 4})
	defer hs.shutdown()
	reads = fs.Calls(faultstore.OpGet)
	if r := hs.ingest(raws[:100]...); r.Duplicates != 100 {
		t.Errorf("after a restart: %d of 100 resent events recognised as duplicates", r.Duplicates)
	}
	if v := hs.query("k7"); v.Seq != 1 || v.Aggregates["sum"] != float64(7) {
		t.Errorf("k7 after a restart = %+v", v)
	}
	if fs.Calls(faultstore.OpGet) == reads {
		t.Error("no store read for keys of checkpointed groups")
	}
}

// Dirty keys passivate without a checkpoint: they park with their unsaved
// state, take their next events and queries without a store read, and are
// snapshotted where they are parked: after the final checkpoint a new host
// finds every key whole with nothing left to replay. (That they stay in
// memory beyond the budget until clean: TestResidentKeysStayWithinBudget.)
func TestDirtyKeysParkUntilCheckpointed(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	cfg := actors.Config{Groups: 4, MaxActive: 5, IdleTimeout: time.Hour, CheckpointInterval: time.Hour}
	hs := start(t, fs, cfg)
	const keys = 100
	ingestAndPark(t, hs, keys, 5)
	if st := hs.host.Stats(); st.Checkpoints != 0 || st.DirtyKeys != keys {
		t.Fatalf("stats %+v: want no checkpoint and every key dirty", st)
	}
	reads := fs.Calls(faultstore.OpGet)
	sendAgain(t, hs, keys, "a dirty passivation")
	if n := fs.Calls(faultstore.OpGet) - reads; n != 0 {
		t.Errorf("%d store reads for dirty keys in memory, want 0", n)
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}

	hs = start(t, fs, cfg)
	defer hs.shutdown()
	if st := hs.host.Stats(); st.Replayed != 0 {
		t.Errorf("%d records replayed after a clean shutdown, want 0", st.Replayed)
	}
	for i := range keys {
		if v := hs.query(fmt.Sprintf("k%d", i)); v.Seq != 2 || v.Aggregates["sum"] != float64(i+1) {
			t.Fatalf("k%d after restart = %+v", i, v)
		}
	}
}

// sendAgain sends keys k0... (each of which applied one event, id "x" of
// value i) their id "x" again, which must be a duplicate after what they
// went through (after), and a new event of 1, then checks their state.
func sendAgain(t *testing.T, hs *harness, keys int, after string) {
	t.Helper()
	for i := range keys {
		k := fmt.Sprintf("k%d", i)
		if r := hs.ingest(event(k, "x", 1000)); r.Duplicates != 1 {
			t.Fatalf("%s: retried id not recognised after %s: %+v", k, after, r)
		}
		hs.ingest(event(k, "y", 1))
		if v := hs.query(k); v.Seq != 2 || v.Aggregates["sum"] != float64(i+1) {
			t.Fatalf("%s after %s = %+v", k, after, v)
		}
	}
}

// ingestAndPark ingests one event (id "x", value i) for keys k0... and waits
// until at most maxActive of them are active and the others parked.
func ingestAndPark(t *testing.T, hs *harness, keys, maxActive int) {
	t.Helper()
	for i := range keys {
		hs.ingest(event(fmt.Sprintf("k%d", i), "x", i))
	}
	eventually(t, "keys to be passivated", func() bool {
		st := hs.host.Stats()
		return st.ActiveKeys <= maxActive && st.ResidentKeys >= keys-maxActive
	})
}
