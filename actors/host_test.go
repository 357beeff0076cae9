package actors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/embedded"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

func pipelines(t testing.TB) map[string]*fold.Pipeline {
	t.Helper()
	p, err := fold.Compile("p", fold.Spec{
		Key: "k",
		ID:  "id",
		Aggregates: map[string]fold.AggregateSpec{
			"n":    {Op: "count"},
			"sum":  {Op: "sum", Field: "v"},
			"last": {Op: "last", Field: "v"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*fold.Pipeline{"p": p}
}

type harness struct {
	t     testing.TB
	store persistence.Store
	host  *actors.Host
	stop  context.CancelFunc
	done  chan error
}

func openStore(t testing.TB, dir string) *embedded.Store {
	t.Helper()
	return openStoreWith(t, dir, embedded.Options{})
}

// openStoreWith opens an embedded store in dir with opts.
func openStoreWith(t testing.TB, dir string, opts embedded.Options) *embedded.Store {
	t.Helper()
	s, err := embedded.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Closed before its directory is removed (Pebble may still be writing
	// there; closing twice is fine).
	t.Cleanup(func() { s.Close() })
	return s
}

// start recovers and runs a host over store, after setup (if any) saw it.
func start(t testing.TB, store persistence.Store, cfg actors.Config, setup ...func(*actors.Host)) *harness {
	t.Helper()
	cfg.Store = store
	if cfg.Pipelines == nil {
		cfg.Pipelines = pipelines(t)
	}
	if cfg.Groups == 0 {
		cfg.Groups = 8
	}
	h, err := actors.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range setup {
		f(h)
	}
	if err := h.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hs := &harness{t: t, store: store, host: h, stop: cancel, done: make(chan error, 1)}
	go func() { hs.done <- h.Run(ctx) }()
	return hs
}

// shutdown drains the host and returns Run's error. The store stays open.
func (hs *harness) shutdown() error {
	hs.stop()
	select {
	case err := <-hs.done:
		return err
	case <-time.After(30 * time.Second):
		hs.t.Fatal("host did not stop within 30s")
		return nil
	}
}

func event(key string, id string, v int) []byte {
	m := map[string]any{"k": key, "v": v}
	if id != "" {
		m["id"] = id
	}
	b, _ := json.Marshal(m)
	return b
}

func (hs *harness) ingest(raws ...[]byte) actors.Result {
	hs.t.Helper()
	r, err := hs.host.Ingest(context.Background(), "p", raws)
	if err != nil {
		hs.t.Fatalf("ingest: %v", err)
	}
	return r
}

func (hs *harness) query(key string) actors.KeyView {
	hs.t.Helper()
	v, err := hs.host.Query(context.Background(), "p", key)
	if err != nil {
		hs.t.Fatalf("query %s: %v", key, err)
	}
	return v
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, 20*time.Second, what, cond)
}

// eventuallyWithin polls cond until it holds, failing t after d.
func eventuallyWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !pollUntil(d, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// pollUntil polls cond until it holds or d passed, and reports whether it
// held: for a test whose own check says better than a timeout what is
// missing.
func pollUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond) // the poll's interval
	}
	return true
}

func TestIngestQueryOrder(t *testing.T) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{})
	defer hs.shutdown()
	for i := range 100 {
		hs.ingest(event("a", fmt.Sprint(i), i), event("b", "", i))
	}
	a, b := hs.query("a"), hs.query("b")
	if a.Seq != 100 || a.Aggregates["sum"] != float64(4950) || string(a.Aggregates["last"].(json.RawMessage)) != "99" {
		t.Errorf("a = %+v", a)
	}
	if b.Seq != 100 || string(b.Aggregates["last"].(json.RawMessage)) != "99" {
		t.Errorf("b = %+v", b)
	}
	if _, err := hs.host.Query(context.Background(), "p", "never"); !errors.Is(err, actors.ErrNotFound) {
		t.Errorf("unseen key: %v, want ErrNotFound", err)
	}
	if _, err := hs.host.Ingest(context.Background(), "nope", nil); !errors.Is(err, actors.ErrUnknownPipeline) {
		t.Errorf("unknown pipeline: %v", err)
	}
}

// TestConcurrentIngestPerKeyOrder: concurrent writers to the same keys; the
// last value of each key is the one acknowledged last by its only writer.
func TestConcurrentIngestPerKeyOrder(t *testing.T) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{})
	defer hs.shutdown()
	const writers, batches = 8, 50
	errc := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := range batches {
				// each writer owns its key; every batch also touches a shared key
				_, err := hs.host.Ingest(context.Background(), "p", [][]byte{
					event(fmt.Sprintf("w%d", w), fmt.Sprintf("w%d-%d", w, i), i),
					event("shared", fmt.Sprintf("s%d-%d", w, i), 1),
				})
				if err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range writers {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for w := range writers {
		v := hs.query(fmt.Sprintf("w%d", w))
		if v.Seq != batches || string(v.Aggregates["last"].(json.RawMessage)) != fmt.Sprint(batches-1) {
			t.Errorf("w%d = %+v", w, v)
		}
	}
	if v := hs.query("shared"); v.Seq != writers*batches {
		t.Errorf("shared seq = %d, want %d", v.Seq, writers*batches)
	}
	if st := hs.host.Stats(); st.Commits == 0 || st.Commits > writers*batches {
		t.Errorf("commits = %d", st.Commits)
	}
}

// tiers runs f with a host whose passivated keys stay in memory without an
// actor (the resident tier, the default: MaxMemory 0) and with one whose
// passivated keys leave memory and come back from the store (MaxMemory
// -1): a passivated key comes back either way.
func tiers(t *testing.T, f func(t *testing.T, maxMemory int64)) {
	t.Run("resident", func(t *testing.T) { f(t, 0) })
	t.Run("store", func(t *testing.T) { f(t, -1) })
}

func TestPassivationBoundsActiveKeys(t *testing.T) { tiers(t, testPassivationBoundsActiveKeys) }

func testPassivationBoundsActiveKeys(t *testing.T, maxMemory int64) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{
		MaxActive: 10, IdleTimeout: time.Hour, CheckpointInterval: 10 * time.Millisecond, MaxMemory: maxMemory,
	})
	defer hs.shutdown()
	for i := range 200 {
		hs.ingest(event(fmt.Sprintf("k%d", i), "x", i))
	}
	eventually(t, "active keys <= 10", func() bool { return hs.host.Stats().ActiveKeys <= 10 })
	// Passivated keys come back, dedup state included.
	for i := range 200 {
		k := fmt.Sprintf("k%d", i)
		if r := hs.ingest(event(k, "x", 1000)); r.Duplicates != 1 {
			t.Fatalf("%s: retried id not recognised after passivation: %+v", k, r)
		}
		if v := hs.query(k); v.Seq != 1 || v.Aggregates["sum"] != float64(i) {
			t.Fatalf("%s after reactivation = %+v", k, v)
		}
	}
	st := hs.host.Stats()
	if st.Passivated < 190 || st.Activations < 390 {
		t.Errorf("stats = %+v", st)
	}
	if resident := st.Unparked > 0; resident != (maxMemory >= 0) {
		t.Errorf("%d activations from the resident tier with MaxMemory %d", st.Unparked, maxMemory)
	}
}

func TestIdleKeysPassivate(t *testing.T) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{
		IdleTimeout: 20 * time.Millisecond, CheckpointInterval: 10 * time.Millisecond,
	})
	defer hs.shutdown()
	hs.ingest(event("a", "", 5), event("b", "", 6))
	eventually(t, "idle keys passivated", func() bool { return hs.host.Stats().ActiveKeys == 0 })
	if v := hs.query("a"); v.Seq != 1 || v.Aggregates["sum"] != float64(5) {
		t.Errorf("a = %+v", v)
	}
}

// TestRecoverReplaysUncheckpointedTail: without a checkpoint, a new host
// rebuilds the state from the log alone, exactly once.
func TestRecoverReplaysUncheckpointedTail(t *testing.T) {
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	// No checkpoint may write anything: the state must come from the log.
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("injected")})
	hs := start(t, fs, actors.Config{CheckpointInterval: time.Hour})
	for i := range 50 {
		hs.ingest(event("a", fmt.Sprint(i), 1), event(fmt.Sprintf("k%d", i%7), "", i))
	}
	// A resent event: logged, skipped, counted once by this host.
	if r := hs.ingest(event("a", "7", 1)); r.Duplicates != 1 || hs.host.Stats().Duplicates != 1 {
		t.Fatalf("resend: %+v, host counted %d duplicates", r, hs.host.Stats().Duplicates)
	}
	if err := hs.shutdown(); err == nil {
		t.Fatal("shutdown with a failing checkpoint reported no error")
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	hs2 := start(t, openStore(t, dir), actors.Config{})
	defer hs2.shutdown()
	// Each ingest wrote one record per key group it touched.
	if st := hs2.host.Stats(); st.Replayed < 51 || st.Replayed > 101 {
		t.Errorf("replayed %d records, want 51..101", st.Replayed)
	}
	if v := hs2.query("a"); v.Seq != 50 || v.Aggregates["n"] != uint64(50) {
		t.Errorf("a after replay = %+v", v)
	}
	// The replay (applied by now: a was queried) skipped the logged
	// duplicate again; the counter says what this host's replies reported.
	if st := hs2.host.Stats(); st.Duplicates != 0 || st.Pipelines["p"].Duplicates != 0 {
		t.Errorf("after replay the host counted %d duplicates (pipeline %d), want 0", st.Duplicates, st.Pipelines["p"].Duplicates)
	}
	if r := hs2.ingest(event("a", "49", 1)); r.Duplicates != 1 {
		t.Errorf("id applied before the crash not deduplicated after replay: %+v", r)
	}
}

// TestCleanShutdownLeavesNothingToReplay: the final checkpoint covers all.
func TestCleanShutdownLeavesNothingToReplay(t *testing.T) {
	dir := t.TempDir()
	store := openStore(t, dir)
	hs := start(t, store, actors.Config{CheckpointInterval: time.Hour})
	for i := range 30 {
		hs.ingest(event(fmt.Sprintf("k%d", i), "", i))
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	hs2 := start(t, store, actors.Config{})
	defer hs2.shutdown()
	if st := hs2.host.Stats(); st.Replayed != 0 {
		t.Errorf("replayed %d records after a clean shutdown", st.Replayed)
	}
	if v := hs2.query("k29"); v.Seq != 1 || v.Aggregates["sum"] != float64(29) {
		t.Errorf("k29 = %+v", v)
	}
}

// TestFailedAppendRetakesGroup: a store error fails the call with
// ErrUnavailable and loses the group (memory may no longer match the log);
// the host stays up, takes the group over again and then holds exactly
// what reached the log, whether the failed write landed (Fault.After) or
// not. Retrying the uncertain event is safe because it has an id.
func TestFailedAppendRetakesGroup(t *testing.T) {
	for _, landed := range []bool{false, true} {
		t.Run(fmt.Sprintf("landed=%v", landed), func(t *testing.T) {
			dir := t.TempDir()
			fs := faultstore.New(openStore(t, dir))
			hs := start(t, fs, actors.Config{CheckpointInterval: time.Hour})
			hs.ingest(event("a", "1", 1))
			fs.Inject(faultstore.OpAppend, 1, faultstore.Fault{Err: errors.New("disk on fire"), After: landed})
			if _, err := hs.host.Ingest(context.Background(), "p", [][]byte{event("a", "2", 10)}); !errors.Is(err, actors.ErrUnavailable) {
				t.Fatalf("ingest with failing append: %v, want ErrUnavailable", err)
			}
			want := uint64(1)
			if landed {
				want = 2
			}
			var v actors.KeyView
			eventually(t, "the group to be taken over", func() bool {
				var err error
				v, err = hs.host.Query(context.Background(), "p", "a")
				return err == nil
			})
			if v.Seq != want {
				t.Errorf("after the take-over a = %+v, want seq %d", v, want)
			}
			if st := hs.host.Stats(); st.GroupsLost != 1 || st.GroupsUnavailable != 0 {
				t.Errorf("stats: %d groups lost, %d unavailable; want 1, 0", st.GroupsLost, st.GroupsUnavailable)
			}
			hs.ingest(event("a", "2", 10))
			if v := hs.query("a"); v.Seq != 2 || v.Aggregates["sum"] != float64(11) {
				t.Errorf("after retry a = %+v", v)
			}
			if err := hs.shutdown(); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			hs2 := start(t, fs, actors.Config{})
			defer hs2.shutdown()
			if v := hs2.query("a"); v.Seq != 2 || v.Aggregates["sum"] != float64(11) {
				t.Errorf("after restart a = %+v", v)
			}
		})
	}
}

// TestRefusedAppendKeepsGroup: an append the store refused before writing
// anything (persistence.ErrNoSpace: a full disk) fails the call with
// ErrUnavailable, saying the disk is full, and the group stays served: no
// take-over, reads go on, and the retry after space is freed is applied once.
func TestRefusedAppendKeepsGroup(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	hs := start(t, fs, actors.Config{CheckpointInterval: time.Hour})
	defer hs.shutdown()
	hs.ingest(event("a", "1", 1))
	fs.Inject(faultstore.OpAppend, 1, faultstore.Fault{Err: fmt.Errorf("embedded: append: %w: /data has 0 bytes free", persistence.ErrNoSpace)})
	_, err := hs.host.Ingest(context.Background(), "p", [][]byte{event("a", "2", 10)})
	if !errors.Is(err, actors.ErrUnavailable) || !strings.Contains(err.Error(), "disk is full") || strings.Contains(err.Error(), "/data") {
		t.Fatalf("ingest with a refused append: %v, want ErrUnavailable saying the disk is full (and not the store's text)", err)
	}
	if v, err := hs.host.Query(context.Background(), "p", "a"); err != nil || v.Seq != 1 {
		t.Fatalf("query after a refused append = %+v, %v; want seq 1 at once", v, err)
	}
	if st := hs.host.Stats(); st.GroupsLost != 0 || st.GroupsUnavailable != 0 {
		t.Errorf("stats: %d groups lost, %d unavailable; want 0, 0", st.GroupsLost, st.GroupsUnavailable)
	}
	hs.ingest(event("a", "2", 10))
	if v := hs.query("a"); v.Seq != 2 || v.Aggregates["sum"] != float64(11) {
		t.Errorf("after retry a = %+v", v)
	}
}

// awaitGone waits until key of pipeline p leaves memory altogether, so
// that its next event reads its snapshot: not active, parked nor stopping
// (a stopping key is in neither count of Stats, and takes an event without
// a read), and neither spilled nor in the snapshot cache.
func (hs *harness) awaitGone(key string) {
	hs.t.Helper()
	eventually(hs.t, key+" to leave memory", func() bool {
		st := hs.host.Stats()
		return !actors.InMemory(hs.host, "p", key) && st.SpilledKeys == 0 && st.CachedKeys == 0
	})
}

// TestFailedActivationRetakesGroup: a key whose snapshot cannot be read
// loses its group instead of the inputs sent to it; the ingest that
// activated it is answered (its inputs are in the log) and the take-over
// applies them.
func TestFailedActivationRetakesGroup(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	// No resident tier: a passivated key leaves memory, so its next event
	// reads its snapshot.
	hs := start(t, fs, actors.Config{Groups: 2, CheckpointInterval: time.Millisecond, IdleTimeout: time.Millisecond, MaxMemory: -1})
	hs.ingest(event("a", "1", 1))
	hs.awaitGone("a")
	// Both reads fail: the commit's batched read of the keys it activates,
	// then the grain's own read, which it falls back to.
	fs.FailNext(faultstore.OpGet, errors.New("injected"))
	fs.FailNth(faultstore.OpGet, 2, errors.New("injected"))
	if _, err := hs.host.Ingest(context.Background(), "p", [][]byte{event("a", "2", 2)}); err != nil {
		t.Fatalf("ingest activating a key whose snapshot read fails: %v", err)
	}
	var v actors.KeyView
	eventually(t, "the group to be taken over", func() bool {
		var err error
		v, err = hs.host.Query(context.Background(), "p", "a")
		return err == nil
	})
	if v.Seq != 2 || v.Aggregates["sum"] != float64(3) {
		t.Errorf("a = %+v, want both events", v)
	}
	if st := hs.host.Stats(); st.GroupsLost != 1 {
		t.Errorf("%d groups lost, want 1", st.GroupsLost)
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
}

// TestTwoHostsOneStore: two hosts that both believe they own every group of
// one store (two nodes pointed at one Redis) fence each other over and over,
// yet every acknowledged event counts exactly once: a fenced host drops the
// group and replays the other's records when it takes the group back.
func TestTwoHostsOneStore(t *testing.T) {
	store := openStore(t, t.TempDir())
	cfg := actors.Config{Groups: 4, CheckpointInterval: 5 * time.Millisecond}
	a := start(t, store, cfg)
	b := start(t, store, cfg)
	const keys, perHost = 6, 150
	acked := make([]map[string]int, 2) // key -> acknowledged distinct ids, per host
	done := make(chan struct{})
	for i, hs := range []*harness{a, b} {
		acked[i] = map[string]int{}
		go func() {
			defer func() { done <- struct{}{} }()
			for n := range perHost {
				key := fmt.Sprintf("k%d", n%keys)
				raw := event(key, fmt.Sprintf("h%d-%d", i, n), 1)
				for try := 0; ; try++ {
					_, err := hs.host.Ingest(context.Background(), "p", [][]byte{raw})
					if err == nil {
						acked[i][key]++
						break
					}
					if !errors.Is(err, actors.ErrUnavailable) || try > 2000 {
						t.Errorf("host %d ingest: %v", i, err)
						return
					}
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	<-done
	<-done
	lost := a.host.Stats().GroupsLost + b.host.Stats().GroupsLost
	for _, hs := range []*harness{a, b} {
		if err := hs.shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	if lost == 0 {
		t.Error("no group was ever lost: the hosts did not fence each other")
	}
	c := start(t, store, cfg)
	defer c.shutdown()
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		want := acked[0][key] + acked[1][key]
		if v := c.query(key); v.Seq != uint64(want) || fmt.Sprint(v.Aggregates["n"]) != fmt.Sprint(want) {
			t.Errorf("%s = %+v, want %d events", key, v, want)
		}
	}
	t.Logf("groups lost and retaken: %d", lost)
}

func TestBatchRejectedWhole(t *testing.T) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{})
	defer hs.shutdown()
	_, err := hs.host.Ingest(context.Background(), "p", [][]byte{event("a", "", 1), []byte(`{"k":"a","v":"lots"}`)})
	var be *fold.BatchError
	if !errors.As(err, &be) || be.Index != 1 || !errors.Is(err, fold.ErrInvalidEvent) {
		t.Fatalf("err = %v", err)
	}
	if _, err := hs.host.Query(context.Background(), "p", "a"); !errors.Is(err, actors.ErrNotFound) {
		t.Errorf("rejected batch left state: %v", err)
	}
}

// TestFailedCheckpointIsRetried: a checkpoint that fails leaves its keys
// dirty; the next one writes them, and the host keeps serving meanwhile.
func TestFailedCheckpointIsRetried(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	fs.FailNext(faultstore.OpCheckpoint, errors.New("injected"))
	hs := start(t, fs, actors.Config{Groups: 1, CheckpointInterval: 10 * time.Millisecond})
	hs.ingest(event("a", "", 1))
	eventually(t, "a checkpoint after the failed one", func() bool { return hs.host.Stats().Checkpoints > 0 })
	if fs.Calls(faultstore.OpCheckpoint) < 2 {
		t.Errorf("Checkpoint called %d times, want a failure and a retry", fs.Calls(faultstore.OpCheckpoint))
	}
	hs.ingest(event("a", "", 2))
	if err := hs.shutdown(); err != nil {
		t.Fatalf("host failed after a transient checkpoint error: %v", err)
	}
}

// TestQueriesOfUnseenKeysStayBounded: a scan of keys that hold nothing
// activates grains, and they too leave memory.
func TestQueriesOfUnseenKeysStayBounded(t *testing.T) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{MaxActive: 10, IdleTimeout: time.Hour, CheckpointInterval: time.Hour})
	defer hs.shutdown()
	for i := range 100 {
		if _, err := hs.host.Query(context.Background(), "p", fmt.Sprintf("ghost%d", i)); !errors.Is(err, actors.ErrNotFound) {
			t.Fatalf("ghost%d: %v", i, err)
		}
	}
	eventually(t, "active keys <= 10", func() bool { return hs.host.Stats().ActiveKeys <= 10 })
}

// TestReplayAfterConfigChange: events acknowledged under one configuration
// are all replayed under a stricter one: what no longer validates
// contributes nothing, but every event counts and every id is remembered.
func TestReplayAfterConfigChange(t *testing.T) {
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("injected")})
	lenient, err := fold.Compile("p", fold.Spec{Key: "k", ID: "id", Aggregates: map[string]fold.AggregateSpec{
		"n": {Op: "count"}, "last": {Op: "last", Field: "v"}, // any value will do
	}})
	if err != nil {
		t.Fatal(err)
	}
	hs := start(t, fs, actors.Config{CheckpointInterval: time.Hour, Pipelines: map[string]*fold.Pipeline{"p": lenient}})
	hs.ingest([]byte(`{"k":"a","id":"1","v":"lots"}`), []byte(`{"k":"a","id":"2","v":3}`))
	hs.shutdown()
	fs.Close()

	strict, err := fold.Compile("p", fold.Spec{Key: "k", ID: "id", Aggregates: map[string]fold.AggregateSpec{
		"n": {Op: "count"}, "sum": {Op: "sum", Field: "v"}, // "lots" is no longer acceptable
	}})
	if err != nil {
		t.Fatal(err)
	}
	hs2 := start(t, openStore(t, dir), actors.Config{Pipelines: map[string]*fold.Pipeline{"p": strict}})
	defer hs2.shutdown()
	if v := hs2.query("a"); v.Seq != 2 || v.Aggregates["n"] != uint64(2) || v.Aggregates["sum"] != float64(3) {
		t.Errorf("a after replay under the new config = %+v", v)
	}
	if r := hs2.ingest([]byte(`{"k":"a","id":"1","v":100}`)); r.Duplicates != 1 {
		t.Errorf("id of the event that no longer validates was forgotten: %+v", r)
	}
}

// TestReplayBoundedByCheckpoint: after a crash, only what was logged since
// the last checkpoint is replayed, however much was ingested before it.
func TestReplayBoundedByCheckpoint(t *testing.T) {
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	hs := start(t, fs, actors.Config{Groups: 4, CheckpointInterval: 5 * time.Millisecond})
	for i := range 400 {
		hs.ingest(event(fmt.Sprintf("k%d", i%50), fmt.Sprint(i), 1))
	}
	eventually(t, "a checkpoint of the first 400 batches", func() bool { return hs.host.Stats().DirtyKeys == 0 })
	// From now on no checkpoint lands: the "crash" loses them all.
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("injected")})
	for i := range 20 {
		hs.ingest(event("late", fmt.Sprint(i), 1))
	}
	hs.shutdown()
	fs.Close()

	hs2 := start(t, openStore(t, dir), actors.Config{Groups: 4})
	defer hs2.shutdown()
	if st := hs2.host.Stats(); st.Replayed != 20 {
		t.Errorf("replayed %d records, want the 20 logged after the last checkpoint", st.Replayed)
	}
	if v := hs2.query("late"); v.Seq != 20 {
		t.Errorf("late = %+v", v)
	}
	if v := hs2.query("k7"); v.Seq != 8 {
		t.Errorf("k7 = %+v, want seq 8", v)
	}
}

// TestCheckpointFollowsLogBytes: under load a checkpoint starts once
// CheckpointBytes were logged since the last one, not on a timer: with the
// interval an hour away, a host that logged less than its bound writes no
// checkpoint, and one that logged more does.
func TestCheckpointFollowsLogBytes(t *testing.T) {
	for _, c := range []struct {
		bytes int64
		want  bool
	}{{1 << 30, false}, {4 << 10, true}} {
		t.Run(fmt.Sprint(c.bytes), func(t *testing.T) {
			hs := start(t, openStore(t, t.TempDir()), actors.Config{Groups: 4, CheckpointInterval: time.Hour,
				CheckpointRecords: 1 << 30, CheckpointBytes: c.bytes})
			defer hs.shutdown()
			for i := range 200 { // ≈ 60 bytes of log each: ≈ 12 KiB
				hs.ingest(event(fmt.Sprintf("k%d", i%20), fmt.Sprint(i), 1))
			}
			if !c.want {
				if st := hs.host.Stats(); st.Checkpoints != 0 || st.DirtyKeys != 20 {
					t.Fatalf("below the bound: %d group checkpoints, %d dirty keys; want none and 20", st.Checkpoints, st.DirtyKeys)
				}
				return
			}
			eventually(t, "a checkpoint after 4 KiB of log", func() bool { return hs.host.Stats().Checkpoints > 0 })
		})
	}
}

// TestCheckpointWaitsForRepeatedKeys: past CheckpointBytes a checkpoint
// waits while the keys changed since the last one took fewer than two
// deliveries each (it would write about a snapshot per event), and starts
// once they took two, or at CheckpointMaxBytes whatever they took.
func TestCheckpointWaitsForRepeatedKeys(t *testing.T) {
	const begin, most = 4 << 10, 32 << 10
	cfg := actors.Config{Groups: 4, CheckpointInterval: time.Hour, CheckpointRecords: 1 << 30,
		CheckpointBytes: begin, CheckpointMaxBytes: most}
	// newKeys sends an event to each of n keys never sent one, and
	// returns their names.
	next := 0
	newKeys := func(hs *harness, n int) []string {
		var keys []string
		for range n {
			keys = append(keys, fmt.Sprintf("k%d", next))
			hs.ingest(event(keys[len(keys)-1], fmt.Sprint(next), 1))
			next++
		}
		return keys
	}
	waiting := func(t *testing.T, hs *harness, when string) {
		t.Helper()
		if actors.CheckpointDue(hs.host) {
			t.Fatalf("%s: a checkpoint is due", when)
		}
		if st := hs.host.Stats(); st.Checkpoints != 0 || st.LoggedBytes < begin || st.LoggedBytes >= most {
			t.Fatalf("%s: %d group checkpoints, %d bytes logged; want none, between %d and %d", when, st.Checkpoints, st.LoggedBytes, begin, most)
		}
	}

	t.Run("keys sent to again", func(t *testing.T) {
		hs := start(t, openStore(t, t.TempDir()), cfg)
		defer hs.shutdown()
		var keys []string
		for st := hs.host.Stats(); st.LoggedBytes < 2*begin && st.Checkpoints == 0; st = hs.host.Stats() {
			keys = append(keys, newKeys(hs, 10)...)
		}
		waiting(t, hs, fmt.Sprintf("%d keys, one event each", len(keys)))
		for i, k := range keys[:len(keys)-1] { // one short of two each
			hs.ingest(event(k, fmt.Sprintf("again%d", i), 1))
		}
		waiting(t, hs, "every key but one sent to twice")
		hs.ingest(event(keys[len(keys)-1], "again", 1))
		eventually(t, "a checkpoint once the keys took two deliveries each", func() bool { return hs.host.Stats().Checkpoints > 0 })
	})
	t.Run("new keys up to the bound", func(t *testing.T) {
		hs := start(t, openStore(t, t.TempDir()), cfg)
		defer hs.shutdown()
		for st := hs.host.Stats(); st.LoggedBytes < most-(1<<10) && st.Checkpoints == 0; st = hs.host.Stats() {
			newKeys(hs, 1)
		}
		waiting(t, hs, "new keys, one event each, just below the bound")
		for hs.host.Stats().Checkpoints == 0 && hs.host.Stats().LoggedBytes < most {
			newKeys(hs, 1)
		}
		eventually(t, "a checkpoint at the bound", func() bool { return hs.host.Stats().Checkpoints > 0 })
	})
}

// TestCheckpointWritesWhatChanged: a checkpoint writes the snapshots of the
// keys changed since the last one, once each however many events they
// took, and Stats.Snapshots counts them.
func TestCheckpointWritesWhatChanged(t *testing.T) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{Groups: 4, CheckpointInterval: 5 * time.Millisecond})
	defer hs.shutdown()
	for round, keys := range []int{20, 5} {
		var batch [][]byte // three events to each key, in one commit
		for i := range 3 * keys {
			batch = append(batch, event(fmt.Sprintf("k%d", i%keys), fmt.Sprintf("r%d-%d", round, i), 1))
		}
		hs.ingest(batch...)
		eventually(t, "every change stored", func() bool { return hs.host.Stats().DirtyKeys == 0 })
	}
	if got := hs.host.Stats().Snapshots; got != 25 {
		t.Fatalf("%d key snapshots written, want 25 (20 keys, then 5 of them again)", got)
	}
}

// TestDedupAcrossBucketsAndRestarts: ids spread over many snapshot buckets
// survive passivation, checkpoints and a restart, and expire on time.
func TestDedupAcrossBucketsAndRestarts(t *testing.T) {
	p, err := fold.Compile("p", fold.Spec{Key: "k", ID: "id", DedupWindow: time.Second, // 62ms buckets
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}})
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	const t0 = 1_000_000
	clock.Store(t0)
	cfg := actors.Config{
		Pipelines: map[string]*fold.Pipeline{"p": p}, MaxActive: 1, CheckpointInterval: 2 * time.Millisecond,
		Now: func() time.Time { return time.UnixMilli(clock.Load()) },
	}
	dir := t.TempDir()
	store := openStoreWith(t, dir, embedded.Options{Now: cfg.Now})
	hs := start(t, store, cfg)
	for i := range 100 {
		clock.Store(t0 + 40*int64(i))
		hs.ingest(event("a", fmt.Sprintf("i%d", i), 1))
		hs.host.Query(context.Background(), "p", fmt.Sprintf("ghost%d", i)) // crowds a out
	}
	eventually(t, "all snapshots written", func() bool { return hs.host.Stats().DirtyKeys == 0 })
	if hs.host.Stats().Passivated == 0 {
		t.Error("nothing was passivated")
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}

	hs2 := start(t, store, cfg)
	defer hs2.shutdown()
	// Now is t0+40*99: ids applied at or before now-1s (i <= 74) expired.
	for _, c := range []struct {
		id  string
		dup bool
	}{{"i99", true}, {"i75", true}, {"i74", false}, {"i0", false}} {
		if r := hs2.ingest(event("a", c.id, 1)); (r.Duplicates == 1) != c.dup {
			t.Errorf("%s after restart: %+v, want duplicate=%v", c.id, r, c.dup)
		}
	}
}

// TestHostDedupUnderFaults: random checkpoint failures (landed or not),
// passivation after every idle millisecond, a clock going back and forth,
// and clean restarts: every ingest's duplicate verdict matches a reference
// fold.State fed the same inputs.
func TestHostDedupUnderFaults(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 3))
			p, err := fold.Compile("p", fold.Spec{Key: "k", ID: "id", DedupWindow: 500 * time.Millisecond, // 31ms buckets
				Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}})
			if err != nil {
				t.Fatal(err)
			}
			var clock atomic.Int64
			clock.Store(1_000_000)
			now := func() time.Time { return time.UnixMilli(clock.Load()) }
			// The store judges the ids' expiry by the host's clock: by
			// the wall clock, ids stamped in 1970 expire at once.
			fs := faultstore.New(openStoreWith(t, t.TempDir(), embedded.Options{Now: now}))
			// Odd seeds: passivated keys leave memory (read back from the
			// store); even seeds: they stay resident.
			cfg := actors.Config{Pipelines: map[string]*fold.Pipeline{"p": p}, MaxActive: 2, Groups: 4,
				CheckpointInterval: time.Millisecond, CheckpointRecords: 3, IdleTimeout: time.Millisecond, MaxMemory: -int64(seed % 2),
				Now: now}
			oracle := map[string]*fold.State{}
			hs := start(t, fs, cfg)
			for i := range 600 {
				switch rng.IntN(12) {
				case 0:
					clock.Add(-rng.Int64N(300))
				case 1:
					clock.Add(rng.Int64N(700))
				default:
					clock.Add(rng.Int64N(15))
				}
				if rng.IntN(8) == 0 {
					fs.Inject(faultstore.OpCheckpoint, 1+rng.IntN(3), faultstore.Fault{Err: errors.New("injected"), After: rng.IntN(2) == 0})
				}
				key := fmt.Sprintf("k%d", rng.IntN(4))
				id := fmt.Sprintf("e%d", rng.IntN(60))
				raw := event(key, id, 1)
				now := clock.Load()
				r := hs.ingest(raw)
				o := oracle[key]
				if o == nil {
					o = &fold.State{}
					oracle[key] = o
				}
				dup := p.Apply(o, p.Replay(raw, key), now)
				if (r.Duplicates == 1) != dup {
					t.Fatalf("event %d %s/%s: host dup=%v oracle dup=%v", i, key, id, r.Duplicates == 1, dup)
				}
				if rng.IntN(4) == 0 { // a checkpoint, then passivation, at a random point
					eventually(t, "the checkpoint to catch up", func() bool { return hs.host.Stats().DirtyKeys == 0 })
				}
				if rng.IntN(120) == 0 {
					fs.Reset()
					if err := hs.shutdown(); err != nil {
						t.Fatalf("shutdown: %v", err)
					}
					hs = start(t, fs, cfg)
				}
			}
			fs.Reset()
			if err := hs.shutdown(); err != nil {
				t.Fatal(err)
			}
			t.Logf("puts %d, passivations %d", fs.Calls(faultstore.OpCheckpoint), hs.host.Stats().Passivated)
		})
	}
}

// TestDeleteKey: a deletion is logged and erases the key's state, its ids
// and (at the next checkpoint) everything it had in the store; it holds
// across a restart with and without a checkpoint after it, and the key can
// start afresh.
func TestDeleteKey(t *testing.T) {
	for _, checkpointed := range []bool{true, false} {
		t.Run(fmt.Sprintf("checkpointed=%v", checkpointed), func(t *testing.T) {
			dir := t.TempDir()
			fs := faultstore.New(openStore(t, dir))
			hs := start(t, fs, actors.Config{Groups: 2, CheckpointInterval: time.Hour})
			for i := range 20 {
				hs.ingest(event("a", fmt.Sprint(i), 1), event("b", fmt.Sprint(i), 1))
			}
			// Snapshot a and b (with their ids) through a clean restart.
			if err := hs.shutdown(); err != nil {
				t.Fatal(err)
			}
			hs = start(t, fs, actors.Config{Groups: 2, CheckpointInterval: time.Hour})
			if err := hs.host.Delete(context.Background(), "p", "a"); err != nil {
				t.Fatal(err)
			}
			if _, err := hs.host.Query(context.Background(), "p", "a"); !errors.Is(err, actors.ErrNotFound) {
				t.Errorf("query after delete: %v, want ErrNotFound", err)
			}
			if v := hs.query("b"); v.Seq != 20 {
				t.Errorf("b = %+v, want untouched", v)
			}
			if !checkpointed {
				fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("no checkpoint")})
			}
			err := hs.shutdown()
			if checkpointed != (err == nil) {
				t.Fatalf("shutdown: %v", err)
			}
			fs.Reset()
			if checkpointed {
				g := actors.GroupOf("a", 2)
				if _, err := fs.Get(context.Background(), g, "p\x00a"); !errors.Is(err, persistence.ErrNotFound) {
					t.Errorf("snapshot of a after delete and checkpoint: %v, want ErrNotFound", err)
				}
			}
			hs = start(t, fs, actors.Config{Groups: 2})
			defer hs.shutdown()
			if _, err := hs.host.Query(context.Background(), "p", "a"); !errors.Is(err, actors.ErrNotFound) {
				t.Errorf("query after delete and restart: %v, want ErrNotFound", err)
			}
			if r := hs.ingest(event("a", "3", 5)); r.Accepted != 1 {
				t.Errorf("an id of the deleted key: %+v, want it applied afresh", r)
			}
			if v := hs.query("a"); v.Seq != 1 || v.Aggregates["sum"] != float64(5) {
				t.Errorf("a after delete and one event = %+v", v)
			}
			for _, bad := range []string{"", "x\x00y"} {
				if err := hs.host.Delete(context.Background(), "p", bad); !errors.Is(err, fold.ErrInvalidEvent) {
					t.Errorf("Delete(%q) = %v, want ErrInvalidEvent", bad, err)
				}
			}
			if err := hs.host.Delete(context.Background(), "nope", "a"); !errors.Is(err, actors.ErrUnknownPipeline) {
				t.Errorf("Delete in an unknown pipeline = %v", err)
			}
		})
	}
}

// TestStaleAppendFailureDoesNotStickStoreDown: an append of an old
// incarnation of a group fails after the group was lost and claimed again;
// the host must not then refuse every ingest as "store unreachable" (no
// claim would follow to clear that).
func TestStaleAppendFailureDoesNotStickStoreDown(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	// No resident tier: a's next event reads the store (and the read fails).
	hs := start(t, fs, actors.Config{Groups: 1, CheckpointInterval: time.Millisecond, IdleTimeout: time.Millisecond, MaxMemory: -1})
	defer hs.shutdown()
	hs.ingest(event("a", "1", 1))
	hs.awaitGone("a")

	fs.Inject(faultstore.OpAppend, 1, faultstore.Fault{Delay: 300 * time.Millisecond, Err: errors.New("timeout")})
	appends := fs.Calls(faultstore.OpAppend)
	slow := make(chan error, 1)
	go func() { _, err := hs.host.Ingest(context.Background(), "p", [][]byte{event("b", "1", 1)}); slow <- err }()
	eventually(t, "the slow append to start", func() bool { return fs.Calls(faultstore.OpAppend) > appends })
	fs.FailNext(faultstore.OpGet, errors.New("injected"))
	hs.host.Query(context.Background(), "p", "a") // loses the group; it is claimed again
	eventually(t, "the take-over", func() bool { return hs.host.Stats().GroupsLost == 1 && hs.host.Stats().GroupsUnavailable == 0 })
	if err := <-slow; !errors.Is(err, actors.ErrUnavailable) {
		t.Fatalf("the slow ingest: %v", err)
	}
	eventually(t, "ingest to work again", func() bool {
		_, err := hs.host.Ingest(context.Background(), "p", [][]byte{event("c", "1", 1)})
		return err == nil
	})
}
