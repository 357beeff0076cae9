package actors_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// A commit reads the keys it activates in one batched call per key group,
// not one read per key.
func TestActivationReadsInBatches(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	// The keys are stored by a restart (keys never stored need no read at
	// all: TestNewKeysAreNotRead).
	raws := make([][]byte, 400)
	for i := range raws {
		raws[i] = event(fmt.Sprintf("k%d", i), fmt.Sprint(i), 1)
	}
	hs := start(t, fs, actors.Config{Groups: 4})
	hs.ingest(raws...)
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	hs = start(t, fs, actors.Config{Groups: 4})
	defer hs.shutdown()
	for i := range raws {
		raws[i] = event(fmt.Sprintf("k%d", i), fmt.Sprint(1000+i), 1)
	}
	before := fs.Calls(faultstore.OpGet)
	hs.ingest(raws...)
	if reads := fs.Calls(faultstore.OpGet) - before; reads != 1 {
		t.Errorf("activating 400 keys in 4 groups took %d reads, want one for all the groups", reads)
	}
	if v := hs.query("k399"); v.Seq != 2 {
		t.Errorf("k399 = %+v", v)
	}
}

// A restart reads the snapshots of the keys its log's tail names in one
// batched call per key group and batch of records, not one read per key,
// and each key starts from its snapshot.
func TestReplayReadsInBatches(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	cfg := actors.Config{Groups: 4}
	hs := start(t, fs, cfg)
	for i := range 400 {
		hs.ingest(event(fmt.Sprintf("k%d", i), "", 1))
	}
	if err := hs.shutdown(); err != nil { // checkpoints them
		t.Fatal(err)
	}
	// A second event to each key, never checkpointed: the tail to replay.
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("test: no checkpoints")})
	hs = start(t, fs, cfg)
	raws := make([][]byte, 400)
	for i := range raws {
		raws[i] = event(fmt.Sprintf("k%d", i), "", 10)
	}
	hs.ingest(raws...)
	_ = hs.shutdown() // its checkpoint fails, as a crash would leave it
	fs.Reset()

	before := fs.Calls(faultstore.OpGet)
	hs = start(t, fs, cfg)
	defer hs.shutdown()
	// (Two more reads a group: its filter of stored keys, header and layers.)
	if reads := fs.Calls(faultstore.OpGet) - before; reads <= 8 || reads > 4+8 {
		t.Errorf("replaying a record naming 100 keys in each of 4 groups took %d reads, want at most one per group and the filters' two", reads)
	}
	if st := hs.host.Stats(); st.Replayed == 0 {
		t.Errorf("replayed %d records, want the tail", st.Replayed)
	}
	for _, k := range []string{"k0", "k123", "k399"} {
		if v := hs.query(k); v.Seq != 2 || v.Aggregates["sum"] != float64(11) {
			t.Errorf("%s after the restart = %+v, want seq 2, sum 11 (its snapshot and the replayed event)", k, v)
		}
	}
}

// A start's recovery keeps the keys its log's tail names within MaxActive,
// as ingest does, though no passivation loop runs before Run: replaying a
// million keys left them all active, each with an actor.
func TestRecoveryBoundsActiveKeys(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	cfg := actors.Config{Groups: 4, MaxActive: 10}
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("test: no checkpoints")})
	hs := start(t, fs, cfg)
	for i := range 200 {
		hs.ingest(event(fmt.Sprintf("k%d", i), "", i))
	}
	_ = hs.shutdown() // its checkpoint fails: the 200 keys are only in the log
	fs.Reset()

	cfg.Store, cfg.Pipelines = fs, pipelines(t)
	h, err := actors.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := h.Stats(); st.Replayed == 0 || st.ActiveKeys > 10 {
		t.Errorf("after replaying %d records naming 200 keys: %d active keys, want at most MaxActive, 10", st.Replayed, st.ActiveKeys)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for _, i := range []int{0, 57, 199} {
		if v, err := h.Query(context.Background(), "p", fmt.Sprintf("k%d", i)); err != nil || v.Seq != 1 || v.Aggregates["sum"] != float64(i) {
			t.Errorf("k%d after the recovery = %+v, %v; want seq 1, sum %d", i, v, err, i)
		}
	}
}

// A key that a replay's batched read started leaves memory changed (to the
// spill) in the middle of the batch and comes back for a later record of
// it: it must come back from the spill, not from the batch's read (which
// lacks the records it took meanwhile). Passivation runs every millisecond
// with one active key and almost no memory, while a lost group's tail of
// 200 records over 10 keys is replayed, again and again.
func TestReplayedKeyLeavesMemoryMidBatch(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	cfg := actors.Config{Groups: 1, MaxActive: 1, MaxMemory: 4096, IdleTimeout: time.Millisecond, CheckpointInterval: time.Millisecond}
	hs := start(t, fs, cfg)
	const keys = 10
	for i := range keys {
		hs.ingest(event(fmt.Sprintf("k%d", i), "", 1))
	}
	if err := hs.shutdown(); err != nil { // checkpoints them
		t.Fatal(err)
	}
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("test: no checkpoints")})
	hs = start(t, fs, cfg)
	defer hs.shutdown()
	for i := range 200 {
		hs.ingest(event(fmt.Sprintf("k%d", i%keys), "", 10))
	}
	for round := range 5 {
		fs.FailNext(faultstore.OpAppend, errors.New("test: lose the group"))
		if _, err := hs.host.Ingest(context.Background(), "p", [][]byte{event("k0", "", 1000)}); err == nil {
			t.Fatal("ingest succeeded with its append failing")
		}
		eventually(t, "the group served again", func() bool { return hs.host.Stats().GroupsTakingOver == 0 && hs.host.Stats().GroupsUnavailable == 0 })
		for i := range keys {
			if v := hs.query(fmt.Sprintf("k%d", i)); v.Seq != 21 || v.Aggregates["sum"] != float64(201) {
				t.Fatalf("round %d: k%d after the take-over = seq %d, sum %v; want 21, 201", round, i, v.Seq, v.Aggregates["sum"])
			}
		}
	}
}

// Keys reactivated over and over, from snapshots the commits read in
// batches or from the resident tier: with slow reads, checkpoints and
// passivations every millisecond and more keys than may stay active,
// concurrent writers' events all count exactly once, on the keys they name.
func TestBatchedActivationOracle(t *testing.T) { tiers(t, testBatchedActivationOracle) }

func testBatchedActivationOracle(t *testing.T, maxMemory int64) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	hs := start(t, fs, actors.Config{Groups: 2, MaxActive: 3, CheckpointInterval: time.Millisecond,
		CheckpointRecords: 2, IdleTimeout: time.Millisecond, MaxMemory: maxMemory})
	const writers, perWriter, keys = 4, 150, 12
	var mu sync.Mutex
	want := map[string][2]int{} // count, sum
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range perWriter {
				if rng.IntN(3) == 0 {
					fs.DelayNext(faultstore.OpGet, time.Duration(rng.IntN(4))*time.Millisecond)
				}
				key := fmt.Sprintf("k%d", rng.IntN(keys))
				v := 1 + rng.IntN(9)
				if _, err := hs.host.Ingest(context.Background(), "p", [][]byte{event(key, fmt.Sprintf("w%d-%d", w, i), v)}); err != nil {
					t.Errorf("ingest: %v", err)
					return
				}
				mu.Lock()
				c := want[key]
				want[key] = [2]int{c[0] + 1, c[1] + v}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for key, c := range want {
		if v := hs.query(key); v.Seq != uint64(c[0]) || v.Aggregates["sum"] != float64(c[1]) {
			t.Errorf("%s: seq %d sum %v, want %d and %d", key, v.Seq, v.Aggregates["sum"], c[0], c[1])
		}
	}
	if st := hs.host.Stats(); st.Passivated == 0 {
		t.Errorf("no key was passivated: the test did not exercise reactivation (%+v)", st)
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
}
