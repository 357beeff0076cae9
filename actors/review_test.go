package actors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// Regression tests for what a review of the event-time code found.

func timedPipeline(t *testing.T, spec fold.Spec) map[string]*fold.Pipeline {
	t.Helper()
	spec.Key, spec.Time = "k", "ts"
	spec.Aggregates = map[string]fold.AggregateSpec{"n": {Op: "count"}}
	p, err := fold.Compile("p", spec)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*fold.Pipeline{"p": p}
}

func tsEvent(key string, ts int64) []byte {
	b, _ := json.Marshal(map[string]any{"k": key, "ts": ts})
	return b
}

// A key past its ttl with a window still open is kept until the window has
// emitted (expiry runs on processing time, windows on the watermark).
func TestTTLWaitsForOpenWindows(t *testing.T) {
	clock := &fakeClock{}
	clock.set(winBase)
	fs := faultstore.New(openStore(t, t.TempDir()))
	cfg := actors.Config{
		Pipelines: timedPipeline(t, fold.Spec{TTL: 5 * time.Second, Windows: map[string]fold.WindowSpec{"w": {Type: "tumbling", Size: time.Second}}}),
		Now:       clock.Now, CheckpointInterval: 20 * time.Millisecond, WatermarkInterval: 5 * time.Millisecond,
	}
	hs := start(t, fs, cfg)
	defer hs.shutdown()
	hs.ingest2("p", tsEvent("a", winBase+100))
	// Past the ttl, before the idle watermark (30 s) closes the window: the
	// expiry check is logged, and keeps the key.
	appends := fs.Calls(faultstore.OpAppend)
	clock.set(winBase + 6000)
	eventually(t, "the expiry check", func() bool { return fs.Calls(faultstore.OpAppend) > appends })
	if st := hs.host.Stats().Pipelines["p"]; st.Expired != 0 {
		t.Fatalf("the key expired with its window open: %+v", st)
	}
	clock.set(winBase + 60_000) // the watermark closes the window; then the key expires
	eventually(t, "the window's result", func() bool { return len(allOutputs(t, hs.host)) == 1 })
	eventually(t, "the key's expiry", func() bool { return hs.host.Stats().Pipelines["p"].Expired == 1 })
}

// A timer taken out of the index to fire while the store is down (commits
// fail fast) goes back into the index: the window closes once the store is
// back.
func TestTimerRearmedWhileStoreDown(t *testing.T) {
	clock := &fakeClock{}
	clock.set(winBase)
	fs := faultstore.New(openStore(t, t.TempDir()))
	cfg := actors.Config{
		Pipelines: timedPipeline(t, fold.Spec{IdleTimeout: 100 * time.Millisecond, Windows: map[string]fold.WindowSpec{"w": {Type: "tumbling", Size: time.Second}}}),
		Now:       clock.Now, CheckpointInterval: 20 * time.Millisecond, WatermarkInterval: 5 * time.Millisecond,
	}
	hs := start(t, fs, cfg)
	defer hs.shutdown()
	b := ""
	for i := 0; ; i++ { // a key of another group
		if b = fmt.Sprint("b", i); actors.GroupOf("p", b, 8) != actors.GroupOf("p", "a", 8) {
			break
		}
	}
	hs.ingest2("p", tsEvent("a", winBase+100))
	fs.InjectAll(faultstore.OpAppend, faultstore.Fault{Err: errors.New("down")})
	fs.InjectAll(faultstore.OpClaim, faultstore.Fault{Err: errors.New("down")})
	if _, err := hs.host.Ingest(context.Background(), "p", [][]byte{tsEvent(b, winBase+100)}); err == nil {
		t.Fatal("ingest succeeded with the store down")
	}
	fired := hs.host.Stats().TimersFired
	clock.set(winBase + 10_000) // a's window is due; its fire cannot be logged
	eventually(t, "a fire tried", func() bool { return hs.host.Stats().TimersFired > fired })
	fs.Reset()
	eventually(t, "a's window's result", func() bool { return len(allOutputs(t, hs.host)) == 1 })
}

// The time a node was down is not idleness of the source: after a restart
// an event in order is not late.
func TestDowntimeIsNotIdleness(t *testing.T) {
	clock := &fakeClock{}
	clock.set(winBase)
	cfg := actors.Config{
		Pipelines: timedPipeline(t, fold.Spec{OutOfOrderness: 5 * time.Second, Windows: map[string]fold.WindowSpec{"w": {Type: "tumbling", Size: time.Minute}}}),
		Now:       clock.Now, CheckpointInterval: 20 * time.Millisecond, WatermarkInterval: 5 * time.Millisecond,
	}
	store := openStore(t, t.TempDir())
	hs := start(t, store, cfg)
	hs.ingest2("p", tsEvent("a", winBase+1000))
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	clock.set(winBase + 2*60_000) // two minutes down
	hs = start(t, store, cfg)
	defer hs.shutdown()
	// Let the timer loop run a while (it reads the clock at every tick;
	// nothing else runs): with downtime counted as idleness it would move
	// the watermark past the window and close it.
	reads := clock.reads.Load()
	eventually(t, "20 ticks of the timer loop", func() bool { return clock.reads.Load() >= reads+20 })
	hs.ingest2("p", tsEvent("a", winBase+2000)) // resent after the outage, in order
	if v := hs.query("a"); v.Late != 0 || len(v.Windows) != 1 || v.Windows[0].Count != 2 {
		t.Errorf("after a restart: late %d, windows %+v", v.Late, v.Windows)
	}
}
