package actors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// A checkpoint of many changed keys asks them for their snapshots a chunk
// at a time: it never floods the actors' workers (asked all at once, the
// keys of one group overflowed the workers' queue, and inputs waited behind
// their snapshots), and checkpoints running while the keys change lose
// nothing and count nothing twice: after a crash, state and ids match an
// oracle of what was acknowledged.
func TestCheckpointInChunksUnderLoad(t *testing.T) {
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	// One group of many keys, most active and some parked: a checkpoint
	// asks for many chunks, of both kinds. (Tens of thousands of snapshot
	// requests at once are what overflowed the workers' queue; under the
	// race detector, which would take minutes for them, fewer keys check
	// the rest.)
	keys, maxActive := 60000, 50000
	if raceDetector {
		keys, maxActive = 3000, 2500
	}
	cfg := actors.Config{Groups: 1, MaxActive: maxActive, IdleTimeout: time.Hour, CheckpointInterval: time.Hour,
		CheckpointRecords: 1 << 30, CheckpointBytes: 64 << 10}
	hs := start(t, fs, cfg)
	var (
		mu  sync.Mutex
		sum = make([]int, keys) // acknowledged, by key
		n   = make([]int, keys)
	)
	ingest := func(batch [][]byte, ks []int, vs []int) {
		t.Helper()
		r, err := hs.host.Ingest(context.Background(), "p", batch)
		if err != nil {
			t.Errorf("ingest: %v", err)
			return
		}
		if r.Duplicates != 0 {
			t.Errorf("ingest of new ids: %+v", r)
		}
		mu.Lock()
		for i, k := range ks {
			sum[k] += vs[i]
			n[k]++
		}
		mu.Unlock()
	}
	// Every key once: all dirty, most of them active, the first checkpoints
	// of 64 KiB of log each come due while this goes on.
	for lo := 0; lo < keys; lo += 500 {
		var batch [][]byte
		var ks, vs []int
		for k := lo; k < lo+500; k++ {
			batch = append(batch, event(fmt.Sprintf("k%d", k), fmt.Sprintf("a%d", k), k))
			ks, vs = append(ks, k), append(vs, k)
		}
		ingest(batch, ks, vs)
	}
	// Then four writers on random keys while checkpoints run.
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for b := range 60 {
				var batch [][]byte
				var ks, vs []int
				for i := range 50 {
					k := rng.IntN(keys)
					batch = append(batch, event(fmt.Sprintf("k%d", k), fmt.Sprintf("w%d-%d-%d", w, b, i), 1))
					ks, vs = append(ks, k), append(vs, 1)
				}
				ingest(batch, ks, vs)
			}
		}()
	}
	wg.Wait()
	st := hs.host.Stats()
	if st.Checkpoints < 2 {
		t.Fatalf("%d group checkpoints during the load, want several", st.Checkpoints)
	}
	if st.Overflows != 0 && !raceDetector {
		t.Errorf("%d mailbox runs overflowed the workers' queue: the checkpoints' snapshot requests flooded it", st.Overflows)
	}
	// The crash: nothing more is checkpointed, the log tail is replayed.
	// One more batch after the checkpoints stop, so that there is a tail
	// even if a checkpoint covered the whole load just before (which made
	// this test fail now and then).
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("injected")})
	{
		var batch [][]byte
		var ks, vs []int
		for k := range 10 {
			batch = append(batch, event(fmt.Sprintf("k%d", k), fmt.Sprintf("tail-%d", k), 1))
			ks, vs = append(ks, k), append(vs, 1)
		}
		ingest(batch, ks, vs)
	}
	hs.shutdown()
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	hs = start(t, openStore(t, dir), actors.Config{Groups: 1})
	defer hs.shutdown()
	if hs.host.Stats().Replayed == 0 {
		t.Error("nothing replayed: the crash was not one")
	}
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		v := hs.query(key)
		if v.Seq != uint64(n[k]) || v.Aggregates["sum"] != float64(sum[k]) {
			t.Fatalf("%s after the crash: seq %d sum %v, acknowledged %d events of sum %d", key, v.Seq, v.Aggregates["sum"], n[k], sum[k])
		}
	}
	// Their ids survived too.
	if r := hs.ingest(event("k7", "a7", 7), event(fmt.Sprintf("k%d", keys-1), fmt.Sprintf("a%d", keys-1), keys-1)); r.Duplicates != 2 {
		t.Errorf("resent ids not recognised after the crash: %+v", r)
	}
}

// A release's checkpoint of a group may run while the checkpoint loop's of
// the same group is still on its way to the store with older snapshots.
// Whichever lands last, the store must end with the newer state: the
// older snapshot landing after the newer one (with the log above it
// already trimmed by the newer) would lose what came between.
func TestOverlappingCheckpointsOfAGroupKeepTheNewer(t *testing.T) {
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	// (A checkpoint after each record, whatever the keys took: one
	// delivery to one key would wait for a second.)
	hs := start(t, fs, actors.Config{Groups: 1, CheckpointInterval: time.Hour, CheckpointRecords: 1, IdleTimeout: time.Hour,
		CheckpointMaxBytes: actors.DefaultCheckpointBytes})
	// The loop's checkpoint of the first event takes its snapshot, then
	// waits on its way to the store.
	calls, landed := fs.Calls(faultstore.OpCheckpoint), hs.host.Stats().Checkpoints
	fs.DelayNext(faultstore.OpCheckpoint, 2*time.Second)
	hs.ingest(event("k", "a", 1))
	eventually(t, "the loop's checkpoint", func() bool { return fs.Calls(faultstore.OpCheckpoint) > calls })
	// Meanwhile the key changes, and the group is released: the release's
	// checkpoint stores the newer snapshot and trims the log through it.
	hs.ingest(event("k", "b", 10))
	if err := hs.host.SetOwned(context.Background(), []uint32{}); err != nil {
		t.Fatal(err)
	}
	// Both have landed, in whichever order.
	eventually(t, "both checkpoints to land", func() bool { return hs.host.Stats().Checkpoints >= landed+2 })
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	hs = start(t, fs, actors.Config{Groups: 1})
	defer hs.shutdown()
	if v := hs.query("k"); v.Seq != 2 || v.Aggregates["sum"] != float64(11) {
		t.Fatalf("after the overlapping checkpoints: seq %d sum %v, want 2 events of sum 11", v.Seq, v.Aggregates["sum"])
	}
}

// A nudge of the checkpoint loop checkpoints only if a checkpoint is still
// due when the loop takes it: commits nudge it while a checkpoint runs
// (their group is above the position that checkpoint is about to store),
// and acting on those nudges once it ended wrote a second checkpoint of
// whatever changed meanwhile.
func TestCheckpointNudgeThatIsNoLongerDue(t *testing.T) {
	cfg := actors.Config{Groups: 1, IdleTimeout: time.Hour, CheckpointInterval: time.Hour,
		CheckpointBytes: 1 << 30, CheckpointRecords: 3}
	hs := start(t, openStore(t, t.TempDir()), cfg)
	ingest := func(i int) {
		t.Helper()
		if _, err := hs.host.Ingest(context.Background(), "p", [][]byte{event("k", fmt.Sprintf("e%d", i), i)}); err != nil {
			t.Fatal(err)
		}
	}
	ingest(1) // one record above the checkpoint: none due
	// The loop takes a nudge only between checkpoints: once it has taken a
	// second one, any checkpoint the first started has ended.
	for range 2 {
		actors.NudgeCheckpoint(hs.host)
		eventually(t, "the loop to take the nudge", func() bool { return !actors.CheckpointNudged(hs.host) })
	}
	if st := hs.host.Stats(); st.DirtyKeys != 1 || st.Checkpoints != 0 {
		t.Fatalf("after a nudge with no checkpoint due: %d dirty keys, %d group checkpoints; want 1, 0", st.DirtyKeys, st.Checkpoints)
	}
	ingest(2)
	ingest(3) // three records: due, and the commit nudges
	eventually(t, "the due checkpoint", func() bool { return hs.host.Stats().DirtyKeys == 0 })
}

// CheckpointRecords follows CheckpointBytes unless set: a fixed count
// would trigger checkpoints long before a larger CheckpointBytes does.
func TestCheckpointRecordsFollowBytes(t *testing.T) {
	for _, c := range []struct {
		bytes       int64
		records     int
		wantRecords int
	}{
		{0, 0, 2048}, // the default 128 MiB
		{1 << 20, 0, actors.DefaultCheckpointRecords}, // at least the default
		{256 << 20, 0, 4096},
		{256 << 20, 7, 7}, // set: kept
	} {
		got := actors.WithDefaults(actors.Config{CheckpointBytes: c.bytes, CheckpointRecords: c.records}).CheckpointRecords
		if got != c.wantRecords {
			t.Errorf("CheckpointBytes %d, CheckpointRecords %d: %d records, want %d", c.bytes, c.records, got, c.wantRecords)
		}
	}
}

// CheckpointBounds: the defaults together (the same 256 MiB bound as when
// checkpoints began at 64 MiB), 4 × a start set alone, and a bound set
// alone below the default start is the start too (a configuration valid
// before the default start rose stays valid, and never waits).
func TestCheckpointBounds(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct{ bytes, max, wantBytes, wantMax int64 }{
		{0, 0, 128 * mib, 256 * mib},
		{64 * mib, 0, 64 * mib, 256 * mib},
		{32 * mib, 0, 32 * mib, 128 * mib},
		{0, 512 * mib, 128 * mib, 512 * mib},
		{0, 64 * mib, 64 * mib, 64 * mib},
		{10 * mib, 20 * mib, 10 * mib, 20 * mib},
		{math.MaxInt64 / 2, 0, math.MaxInt64 / 2, math.MaxInt64},
		{-1, 0, -1, 0}, // (refused by Validate: left as it is)
		{0, -1, 0, -1},
	} {
		b, m := actors.CheckpointBounds(c.bytes, c.max)
		if b != c.wantBytes || m != c.wantMax {
			t.Errorf("CheckpointBounds(%d, %d) = %d, %d; want %d, %d", c.bytes, c.max, b, m, c.wantBytes, c.wantMax)
		}
		d := actors.WithDefaults(actors.Config{CheckpointBytes: c.bytes, CheckpointMaxBytes: c.max})
		if d.CheckpointBytes != b || d.CheckpointMaxBytes != m {
			t.Errorf("defaults of %d, %d: %d, %d; want CheckpointBounds's %d, %d", c.bytes, c.max, d.CheckpointBytes, d.CheckpointMaxBytes, b, m)
		}
	}
}

// The records at which a checkpoint no longer waits scale with the bound
// over the start, not by a whole ratio (a bound set alone between 128 and
// 256 MiB over the default start waited for no more records than the
// start), and saturate.
func TestCheckpointMaxRecords(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		cfg  actors.Config
		want uint64
	}{
		{actors.Config{}, 4096},
		{actors.Config{CheckpointMaxBytes: 200 * mib}, 3200},
		{actors.Config{CheckpointBytes: 64 * mib}, 4096},
		{actors.Config{CheckpointBytes: 1, CheckpointMaxBytes: math.MaxInt64, CheckpointRecords: math.MaxInt}, math.MaxUint64},
	} {
		if got := actors.CheckpointMaxRecords(c.cfg); got != c.want {
			t.Errorf("%+v: %d records, want %d", c.cfg, got, c.want)
		}
	}
}

// A checkpoint is not a use of the keys it snapshots: the least recently
// used key is still the one passivated after it. (Snapshots went to active
// keys as messages that made each the most recently used, so a key used
// long ago but changed since the last checkpoint outlived one used after
// it.) Both ways a checkpoint snapshots an active key are covered: itself,
// while the key's actor is idle, and through the actor (always, for a
// pipeline with a Go handler, whose codec runs on the actor).
func TestCheckpointIsNotAUse(t *testing.T) {
	for name, ps := range map[string]map[string]*fold.Pipeline{"idle": pipelines(t), "through the actor": handlerPipelines(t, flaky{})} {
		t.Run(name, func(t *testing.T) {
			hs := start(t, openStore(t, t.TempDir()), actors.Config{Pipelines: ps, Groups: 1, MaxActive: 3, IdleTimeout: time.Hour, CheckpointInterval: time.Hour})
			defer hs.shutdown()
			for _, k := range []string{"a", "b", "c", "a"} { // used last: a; least recently: b
				hs.ingest(event(k, "", 1))
			}
			if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
				t.Fatal(err)
			}
			if st := hs.host.Stats(); st.DirtyKeys != 0 {
				t.Fatalf("%d keys dirty after the checkpoint", st.DirtyKeys)
			}
			hs.ingest(event("d", "", 1)) // one more than MaxActive: the least recently used goes
			eventually(t, "a key to be passivated", func() bool {
				return !actors.Active(hs.host, "p", "a") || !actors.Active(hs.host, "p", "b") || !actors.Active(hs.host, "p", "c")
			})
			for k, want := range map[string]bool{"a": true, "b": false, "c": true, "d": true} {
				if got := actors.Active(hs.host, "p", k); got != want {
					t.Errorf("key %s active %v after the checkpoint and a new key, want %v", k, got, want)
				}
			}
		})
	}
}

// handlerPipelines is the pipeline "p" of key "k" counting its events,
// with a Go handler.
func handlerPipelines(t *testing.T, h fold.Handler) map[string]*fold.Pipeline {
	t.Helper()
	p, err := fold.Compile("p", fold.Spec{Key: "k", Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*fold.Pipeline{"p": p}
}

// startParked starts a host of one group and one active key on ps, applies
// events (of key a) and then one event of key b, which parks a, changed.
func startParked(t *testing.T, ps map[string]*fold.Pipeline, events ...[]byte) *harness {
	t.Helper()
	hs := start(t, openStore(t, t.TempDir()), actors.Config{Pipelines: ps, Groups: 1, MaxActive: 1, IdleTimeout: time.Hour, CheckpointInterval: time.Hour})
	hs.ingest(events...)
	hs.ingest(event("b", "", 1))
	eventually(t, "a to be parked", func() bool {
		return !actors.Active(hs.host, "p", "a") && actors.InMemory(hs.host, "p", "a")
	})
	return hs
}

// A checkpoint that fails on one key puts back the parked keys it held to
// snapshot: what is sent to them afterwards is applied, not left waiting
// for good. (The failing key here is active and idle, snapshotted by the
// checkpoint itself after the parked key was taken out of the tier.)
func TestFailedCheckpointPutsParkedKeysBack(t *testing.T) {
	hs := startParked(t, nil, event("a", "", 1))
	defer hs.shutdown()
	broken := errors.New("injected: b's activation failed")
	if !actors.Break(hs.host, "p", "b", broken) {
		t.Fatal("b is not in memory")
	}
	if err := actors.Checkpoint(hs.host, context.Background()); !errors.Is(err, broken) {
		t.Fatalf("checkpoint: %v, want b's error", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := hs.host.Ingest(ctx, "p", [][]byte{event("a", "", 2)}); err != nil {
		t.Fatalf("ingest to the parked key after the failed checkpoint: %v", err)
	}
	if v := hs.query("a"); v.Seq != 2 || v.Aggregates["sum"] != float64(3) {
		t.Fatalf("a = %+v, want both events", v)
	}
}

// encodePanics is a Go handler whose state encoding panics once a key has
// seen two events.
type encodePanics struct{ flaky }

func (encodePanics) EncodeState(v any) ([]byte, error) {
	if v.(flakyState).N >= 2 {
		panic("encoding the state")
	}
	return json.Marshal(v)
}

// A panic while a checkpoint snapshots a key without its actor (a parked
// key) fails the host, as it does on the key's actor, instead of ending
// the process; the keys it held are put back.
func TestSnapshotPanicFailsTheHost(t *testing.T) {
	hs := startParked(t, handlerPipelines(t, encodePanics{}), event("a", "", 1), event("a", "", 2)) // a's state panics to encode
	defer hs.shutdown()
	if err := actors.Checkpoint(hs.host, context.Background()); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("checkpoint: %v, want the panic as an error", err)
	}
	if err := hs.host.Err(); !errors.Is(err, actors.ErrFailed) {
		t.Fatalf("host error %v, want it failed", err)
	}
}

// jsonPanics is a Go handler whose state rendering panics.
type jsonPanics struct{ flaky }

func (jsonPanics) StateJSON(any) ([]byte, error) { panic("rendering the state") }

// A panic while the host answers a query of a parked key itself (no actor
// runs it) fails the host, as on the key's actor, instead of ending the
// process.
func TestParkedQueryPanicFailsTheHost(t *testing.T) {
	hs := startParked(t, handlerPipelines(t, jsonPanics{}), event("a", "", 1))
	defer hs.shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := hs.host.Query(ctx, "p", "a"); !errors.Is(err, actors.ErrFailed) {
		t.Fatalf("query: %v, want the host failed", err)
	}
}
