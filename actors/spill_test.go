package actors_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// spillConfig is a host whose resident tier holds a few dozen keys, and
// whose checkpoints come only when the tier asks for one (or at shutdown).
func spillConfig(residentBudget int64) actors.Config {
	return actors.Config{Groups: 4, MaxActive: 5, IdleTimeout: time.Hour, CheckpointInterval: time.Hour,
		CheckpointBytes: 1 << 40, CheckpointRecords: 1 << 30, CacheMemory: -1,
		MaxMemory: 5*actors.ActiveKeyBytes + residentBudget}
}

// Changed keys beyond the resident tier's budget leave memory into the
// spill without a checkpoint, and come back from there whole (remembered
// ids included) and still changed: no store read, no checkpoint.
func TestSpilledKeysComeBackChanged(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	hs := start(t, fs, spillConfig(96<<10))
	defer hs.shutdown()
	reads := fs.Calls(faultstore.OpGet) // (the take-overs': filters of stored keys)
	const keys = 300
	for i := range keys {
		hs.ingest(event(fmt.Sprintf("k%d", i), "x", i))
	}
	eventually(t, "keys to be passivated", func() bool { return hs.host.Stats().ActiveKeys <= 5 })
	st := hs.host.Stats()
	if st.SpilledKeys < keys/2 || st.DirtyKeys != keys || st.Checkpoints != 0 {
		t.Fatalf("stats %+v: want most of %d changed keys spilled, none checkpointed", st, keys)
	}
	if st.ResidentBytes > 96<<10 {
		t.Errorf("resident tier holds %d bytes, budget %d", st.ResidentBytes, 96<<10)
	}
	for i := range keys {
		k := fmt.Sprintf("k%d", i)
		if r := hs.ingest(event(k, "x", 1000)); r.Duplicates != 1 {
			t.Fatalf("%s: retried id not recognised after the spill: %+v", k, r)
		}
		hs.ingest(event(k, "y", 1))
		if v := hs.query(k); v.Seq != 2 || v.Aggregates["sum"] != float64(i+1) || fmt.Sprint(v.Aggregates["last"]) != "[49]" { // "1"
			t.Fatalf("%s = %+v", k, v)
		}
	}
	st = hs.host.Stats()
	if st.Unspills < keys/2 || st.DirtyKeys != keys || st.Checkpoints != 0 {
		t.Errorf("stats %+v: want the spilled keys back, all still changed, no checkpoint", st)
	}
	if n := fs.Calls(faultstore.OpGet) - reads; n != 0 {
		t.Errorf("%d store reads for keys that never left memory or the spill", n)
	}
}

// A checkpoint writes the spilled keys: after it nothing is replayed, and
// every key is what it was. The spill empties into the snapshot cache,
// from where keys come back and change again. With 40 ids a key, they are
// in buckets (of two parts each), spilled with none of them stored; the
// cache's form of them, numbered as stored, takes the next id into the
// right part.
func TestCheckpointWritesSpilledKeys(t *testing.T) {
	for _, ids := range []int{2, 40} {
		for _, failFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("ids=%d/failFirst=%v", ids, failFirst), func(t *testing.T) {
				checkpointWritesSpilledKeys(t, ids, failFirst)
			})
		}
	}
}

func checkpointWritesSpilledKeys(t *testing.T, ids int, failFirst bool) {
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	// (A budget the spill fits in: over it, the tier would ask for a
	// checkpoint of its own.)
	budget := int64(96 << 10)
	if ids > 2 {
		budget = 160 << 10
	}
	cfg := spillConfig(budget)
	cfg.CacheMemory = actors.MinCacheMemory
	cfg.MaxMemory += actors.MinCacheMemory
	cfg.Groups = 1 // one checkpoint: the one that fails
	hs := start(t, fs, cfg)
	const keys = 300
	for i := range keys {
		evs := [][]byte{event(fmt.Sprintf("k%d", i), "x0", i)}
		for j := 1; j < ids; j++ {
			evs = append(evs, event(fmt.Sprintf("k%d", i), fmt.Sprint("x", j), 1))
		}
		hs.ingest(evs...)
	}
	eventually(t, "keys to be spilled", func() bool { return hs.host.Stats().SpilledKeys >= keys/2 })
	if failFirst { // the spill thaws, and the next checkpoint writes it
		fs.FailNext(faultstore.OpCheckpoint, errors.New("injected"))
	}
	if err := actors.Checkpoint(hs.host, context.Background()); (err != nil) != failFirst {
		t.Fatalf("checkpoint: %v", err)
	}
	if failFirst {
		if st := hs.host.Stats(); st.SpilledKeys < keys/2 {
			t.Fatalf("after a failed checkpoint %d keys spilled, want them all still", st.SpilledKeys)
		}
		if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	st := hs.host.Stats()
	if st.SpilledKeys != 0 || st.SpilledBytes != 0 || st.DirtyKeys != 0 || st.CachedKeys < keys/2 {
		t.Fatalf("after the checkpoint: %+v; want no spill, nothing changed, the keys in the cache", st)
	}
	if st.Snapshots != keys { // each key changed once, written once: from the spill or memory
		t.Fatalf("%d key snapshots counted, want %d (the spilled ones included)", st.Snapshots, keys)
	}
	hits := st.CacheHits
	for i := range keys { // from the cache
		k := fmt.Sprintf("k%d", i)
		if v := hs.query(k); v.Seq != uint64(ids) || v.Aggregates["sum"] != float64(i+ids-1) {
			t.Fatalf("%s = %+v", k, v)
		}
		hs.ingest(event(k, "later", 1))
	}
	if st := hs.host.Stats(); st.CacheHits-hits < keys/2 {
		t.Fatalf("%d keys back from the snapshot cache, want most of %d", st.CacheHits-hits, keys)
	}
	if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	// Nothing to replay: the checkpoints trimmed the log, so every key's
	// state is in its snapshot.
	hs2 := start(t, openStore(t, dir), actors.Config{Groups: 1})
	defer hs2.shutdown()
	if st := hs2.host.Stats(); st.Replayed != 0 {
		t.Errorf("replayed %d records after the checkpoints", st.Replayed)
	}
	for i := range keys {
		k := fmt.Sprintf("k%d", i)
		if v := hs2.query(k); v.Seq != uint64(ids+1) || v.Aggregates["sum"] != float64(i+ids) {
			t.Fatalf("%s after restart = %+v", k, v)
		}
		evs := [][]byte{event(k, "later", 5)} // (applied to the key from the cache)
		for j := range ids {
			evs = append(evs, event(k, fmt.Sprint("x", j), 5))
		}
		if r := hs2.ingest(evs...); r.Duplicates != ids+1 {
			t.Fatalf("%s: %d of its %d ids remembered across the spill and a restart", k, r.Duplicates, ids+1)
		}
	}
}

// A key that leaves memory into the spill while its checkpoint is being
// stored (after it replied with its snapshot) is clean once the checkpoint
// is: the next checkpoint does not write it again. (It was left dirty in
// the spill, and written twice: TestCheckpointWritesSpilledKeys saw it
// when passivations were still under way as its checkpoint ran.)
func TestKeySpilledWhileItsCheckpointIsStoredIsClean(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	cfg := spillConfig(8 << 10)
	cfg.Groups = 1
	cfg.CacheMemory = actors.MinCacheMemory
	cfg.MaxMemory += actors.MinCacheMemory
	hs := start(t, fs, cfg)
	defer hs.shutdown()
	batch := func(prefix string, n int) [][]byte {
		var evs [][]byte
		for i := range n {
			evs = append(evs, event(fmt.Sprintf("%s%d", prefix, i), "x", i))
		}
		return evs
	}
	const first, later = 5, 300
	hs.ingest(batch("a", first)...) // active (MaxActive 5) and changed
	if st := hs.host.Stats(); st.ActiveKeys != first || st.DirtyKeys != first {
		t.Fatalf("stats %+v: want %d active changed keys", st, first)
	}
	hold := make(chan struct{})
	fs.Inject(faultstore.OpCheckpoint, 1, faultstore.Fault{Wait: hold})
	done := make(chan error, 1)
	go func() { done <- actors.Checkpoint(hs.host, context.Background()) }()
	eventually(t, "the checkpoint to reach the store", func() bool { return fs.Calls(faultstore.OpCheckpoint) == 1 })
	// Meanwhile later keys push the first ones out of memory: they were
	// used and parked first, so they spill first.
	hs.ingest(batch("b", later)...)
	eventually(t, "keys to spill", func() bool { return hs.host.Stats().SpilledKeys >= later/2 })
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// (The spill's budget may have asked for a checkpoint of its own
	// meanwhile: this one writes whatever is left.) Each key changed once
	// is written once.
	if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := hs.host.Stats(); st.Snapshots != first+later || st.DirtyKeys != 0 || st.SpilledKeys != 0 {
		t.Fatalf("after the checkpoints: %+v; want %d snapshots in all, nothing changed or spilled", st, first+later)
	}
	for i := range first { // from the snapshot cache, as written
		if v := hs.query(fmt.Sprintf("a%d", i)); v.Seq != 1 || v.Aggregates["sum"] != float64(i) {
			t.Fatalf("a%d = %+v", i, v)
		}
	}
}

// Spilled keys are only in memory until a checkpoint: a crash before it
// loses nothing, the log replays them.
func TestSpilledKeysSurviveACrash(t *testing.T) {
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("injected")}) // none is written
	hs := start(t, fs, spillConfig(8<<10))
	const keys = 200
	for i := range keys {
		hs.ingest(event(fmt.Sprintf("k%d", i), "x", i))
	}
	eventually(t, "keys to be spilled", func() bool { return hs.host.Stats().SpilledKeys >= keys/2 })
	hs2 := crashAndRestart(t, hs, fs, dir, 4)
	defer hs2.shutdown()
	for i := range keys {
		k := fmt.Sprintf("k%d", i)
		if v := hs2.query(k); v.Seq != 1 || v.Aggregates["sum"] != float64(i) {
			t.Fatalf("%s after the crash = %+v", k, v)
		}
	}
}

// Concurrent writers over a tier that spills at once, checkpoints every few
// records, some of them failing (landed or not), then a crash and a
// restart: every key holds exactly what was acknowledged, and the
// acknowledged ids are remembered. This crosses checkpoints with keys
// spilling and coming back while they run (the keys a checkpoint began
// with and that spilled since, and the spilled ones it froze and that came
// back since). With few keys, each remembers more ids than a snapshot
// holds inline: they are in buckets of several parts, which the spill
// keeps with what of them is stored (before session 45 such keys stayed
// in memory).
func TestSpillUnderCheckpointsAndCrash(t *testing.T) {
	for _, c := range []struct {
		name string
		keys int
	}{{"ids inline", 60}, {"ids in buckets", 6}} {
		t.Run(c.name, func(t *testing.T) { spillUnderCheckpointsAndCrash(t, c.keys) })
	}
}

func spillUnderCheckpointsAndCrash(t *testing.T, keys int) {
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	cfg := actors.Config{Groups: 4, MaxActive: 3, IdleTimeout: time.Millisecond, CheckpointInterval: 2 * time.Millisecond,
		CheckpointRecords: 5, CacheMemory: -1, MaxMemory: 3*actors.ActiveKeyBytes + 2<<10}
	hs := start(t, fs, cfg)
	const (
		writers = 4
		rounds  = 150
	)
	var (
		mu    sync.Mutex
		sums  = map[string]int{}
		seqs  = map[string]int{}
		acked = map[string][]string{} // the acknowledged ids of each key
		wg    sync.WaitGroup
	)
	// Half the rounds first, then the spills of the rest counted: by then
	// a key of six remembers about 50 ids.
	var spillsBefore atomic.Int64
	var half sync.WaitGroup
	half.Add(writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := range rounds {
				if i == rounds/2 {
					half.Done()
					half.Wait()
					if w == 0 {
						spillsBefore.Store(hs.host.Stats().Spills)
					}
				}
				if rng.IntN(10) == 0 {
					fs.Inject(faultstore.OpCheckpoint, 1+rng.IntN(3), faultstore.Fault{Err: errors.New("injected"), After: rng.IntN(2) == 0})
				}
				k := fmt.Sprintf("k%d", rng.IntN(keys))
				v := rng.IntN(100)
				id := fmt.Sprintf("w%d-%d", w, i)
				r, err := hs.host.Ingest(context.Background(), "p", [][]byte{event(k, id, v)})
				if err != nil {
					t.Errorf("ingest: %v", err)
					return
				}
				if r.Duplicates != 0 {
					t.Errorf("%s: a new id counted as a duplicate", k)
				}
				mu.Lock()
				sums[k] += v
				seqs[k]++
				acked[k] = append(acked[k], id)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	st := hs.host.Stats()
	t.Logf("spills %d (%d in the second half), unspills %d, checkpoints %d", st.Spills, st.Spills-spillsBefore.Load(), st.Unspills, st.Checkpoints)
	if st.Spills-spillsBefore.Load() == 0 || st.Unspills == 0 {
		t.Errorf("stats %+v: want keys spilled and back, in the second half too", st)
	}
	if err := actors.CheckRegistry(hs.host); err != nil {
		t.Error(err)
	}
	hs2 := crashAndRestart(t, hs, fs, dir, 4)
	defer hs2.shutdown()
	for i := range keys {
		k := fmt.Sprintf("k%d", i)
		v, err := hs2.host.Query(context.Background(), "p", k)
		if seqs[k] == 0 {
			if !errors.Is(err, actors.ErrNotFound) {
				t.Errorf("%s never written = %+v %v", k, v, err)
			}
			continue
		}
		if err != nil || v.Seq != uint64(seqs[k]) || v.Aggregates["sum"] != float64(sums[k]) {
			t.Errorf("%s = %+v %v; want %d events summing to %d", k, v, err, seqs[k], sums[k])
		}
	}
	for k, ids := range acked {
		for _, id := range ids {
			if r := hs2.ingest(event(k, id, 1)); r.Duplicates != 1 {
				t.Errorf("%s: acknowledged id %s not remembered after the crash: %+v", k, id, r)
			}
		}
	}
}

// A checkpoint writes every key changed as of its start, wherever the key
// went meanwhile: a key of its dirty list spilled after it began (written
// from the spill, or from its grain if it came back), and a spilled key it
// froze that came back and changed again (written as frozen; the change is
// above the checkpoint, in the log). A crash after it replays the rest.
func TestCheckpointFollowsKeysThatMoved(t *testing.T) {
	for _, moved := range []string{"spilled", "spilled and back", "frozen and back"} {
		t.Run(moved, func(t *testing.T) {
			dir := t.TempDir()
			fs := faultstore.New(openStore(t, dir))
			cfg := actors.Config{Groups: 1, MaxActive: 1, IdleTimeout: time.Hour, CheckpointInterval: time.Hour,
				CheckpointBytes: 1 << 40, CheckpointRecords: 1 << 30}
			var hook atomic.Pointer[func()]
			hs := start(t, fs, cfg, func(h *actors.Host) {
				actors.SetAfterFreeze(h, func(uint32) {
					if f := hook.Swap(nil); f != nil {
						(*f)()
					}
				})
			})
			const keys = 20
			for i := range keys {
				hs.ingest(event(fmt.Sprintf("k%d", i), "a", i))
			}
			eventually(t, "keys to be parked", func() bool { return hs.host.Stats().ActiveKeys <= 1 })
			again := func() {
				for i := range keys / 2 {
					hs.ingest(event(fmt.Sprintf("k%d", i), "b", 100))
				}
			}
			var during func()
			switch moved {
			case "spilled":
				during = func() { actors.SpillParked(hs.host) }
			case "spilled and back":
				during = func() { actors.SpillParked(hs.host); again() }
			case "frozen and back":
				if n := actors.SpillParked(hs.host); n < keys-1 {
					t.Fatalf("%d keys spilled, want %d", n, keys-1)
				}
				during = again
			}
			hook.Store(&during)
			if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
				t.Fatal(err)
			}
			if hook.Load() != nil {
				t.Fatal("the checkpoint did not run the hook")
			}
			// What it wrote from the spill left the spill (to the snapshot
			// cache), the keys spilled after it froze included: nothing
			// spilled is left, and in the first case nothing changed.
			if st := hs.host.Stats(); st.SpilledKeys != 0 || st.SpilledBytes != 0 || (moved == "spilled" && st.DirtyKeys != 0) {
				t.Errorf("after the checkpoint: %d keys spilled in %d B, %d changed; want none spilled", st.SpilledKeys, st.SpilledBytes, st.DirtyKeys)
			}
			hs2 := crashAndRestart(t, hs, fs, dir, 1)
			defer hs2.shutdown()
			for i := range keys {
				want := float64(i)
				if moved != "spilled" && i < keys/2 {
					want += 100
				}
				if v := hs2.query(fmt.Sprintf("k%d", i)); v.Aggregates["sum"] != want {
					t.Errorf("k%d after the crash = %+v, want sum %v", i, v, want)
				}
			}
		})
	}
}

// crashAndRestart stops hs as a crash would (no checkpoint is written from
// here on: the store refuses them) and starts a host over the same data.
func crashAndRestart(t *testing.T, hs *harness, fs *faultstore.Store, dir string, groups uint32) *harness {
	t.Helper()
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("injected: crashed")})
	// (Its final checkpoint fails if anything changed since the last one;
	// the restart must find everything either way.)
	_ = hs.shutdown()
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	return start(t, openStore(t, dir), actors.Config{Groups: groups})
}

// A spilled key whose state does not decode (not expected: the spill holds
// what it encoded) is not read from the store, whose snapshot is older: its
// group is lost and taken over, and the log replays the key.
func TestUndecodableSpilledKeyIsReplayed(t *testing.T) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{Groups: 1, MaxActive: 1, IdleTimeout: time.Hour,
		CheckpointInterval: time.Hour, CheckpointBytes: 1 << 40, CheckpointRecords: 1 << 30})
	defer hs.shutdown()
	for i := range 10 {
		hs.ingest(event(fmt.Sprintf("k%d", i), "a", i+1))
	}
	eventually(t, "keys to be parked", func() bool { return hs.host.Stats().ActiveKeys <= 1 })
	actors.SpillParked(hs.host)
	if !actors.CorruptSpilled(hs.host, "p", "k3") {
		t.Fatal("k3 is not spilled")
	}
	hs.ingest(event("k3", "b", 100)) // logged: the take-over applies it
	eventually(t, "the group to be taken over", func() bool {
		st := hs.host.Stats()
		return st.GroupsLost > 0 && st.GroupsUnavailable == 0
	})
	for i := range 10 {
		want := float64(i + 1)
		if i == 3 {
			want += 100
		}
		if v := hs.query(fmt.Sprintf("k%d", i)); v.Aggregates["sum"] != want {
			t.Errorf("k%d = %+v, want sum %v", i, v, want)
		}
	}
}
