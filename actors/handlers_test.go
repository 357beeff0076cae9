package actors_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// flaky is a Go handler (engine side) counting a key's events and their
// values; it panics for values divisible by 5 and fails for those
// divisible by 7.
type flaky struct{}

type flakyState struct {
	N   int `json:"n"`
	Sum int `json:"sum"`
}

func (flaky) OnEvent(c *fold.Call, ev *fold.Event) error {
	var e struct {
		V int `json:"v"`
	}
	if err := json.Unmarshal(ev.Raw, &e); err != nil {
		return err
	}
	st, _ := c.State().(flakyState)
	st.N++
	st.Sum += e.V
	c.SetState(st) // dropped if the call fails
	switch {
	case e.V%5 == 0:
		var xs []int
		return fmt.Errorf("unreachable %d", xs[e.V]) // index out of range: a runtime panic
	case e.V%7 == 0:
		return errors.New("multiple of 7")
	}
	return c.Emit("seen", []byte(fmt.Sprint(st.N)))
}

func (flaky) OnTimer(*fold.Call, fold.Timer) error { return nil }
func (flaky) StateVersion() uint32                 { return 1 }
func (flaky) EncodeState(v any) ([]byte, error)    { return json.Marshal(v) }
func (flaky) StateJSON(v any) ([]byte, error)      { return json.Marshal(v) }
func (flaky) DecodeState(data []byte, _ uint32) (any, error) {
	var st flakyState
	err := json.Unmarshal(data, &st)
	return st, err
}

// TestHandlerPanicsNeitherStopNorLose: a handler that panics or fails for
// some events does not stop the host or block its key: every event of
// the key still counts in the aggregates, the others reach the handler,
// each failure is a dead letter and counted, and a replay of the log
// (nothing checkpointed) rebuilds the same state and the same outputs.
func TestHandlerPanicsNeitherStopNorLose(t *testing.T) {
	p, err := fold.Compile("p", fold.Spec{
		Key: "k", ID: "id",
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}, "sum": {Op: "sum", Field: "v"}},
		Handler:    flaky{},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := actors.Config{
		Pipelines: map[string]*fold.Pipeline{"p": p}, MaxActive: 2, IdleTimeout: time.Hour,
		WatermarkInterval: 5 * time.Millisecond, OutputInterval: time.Millisecond,
	}
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("injected")})
	cfg.CheckpointInterval = time.Hour
	hs := start(t, fs, cfg)

	type want struct{ n, sum, okN, okSum, failed int }
	wants := map[string]*want{}
	failures := 0
	for i := 1; i <= 120; i++ {
		key := fmt.Sprintf("k%d", i%6)
		w := wants[key]
		if w == nil {
			w = &want{}
			wants[key] = w
		}
		w.n++
		w.sum += i
		if i%5 == 0 || i%7 == 0 {
			w.failed++
			failures++
		} else {
			w.okN++
			w.okSum += i
		}
		hs.ingest(event(key, fmt.Sprint(i), i))
		if i%10 == 0 { // a retry: a duplicate, which the handler never sees
			if r := hs.ingest(event(key, fmt.Sprint(i), i)); r.Duplicates != 1 {
				t.Fatalf("retry of %d: %+v", i, r)
			}
		}
	}
	if err := hs.host.Err(); err != nil {
		t.Fatalf("the host failed: %v", err)
	}
	check := func(hs *harness, when string) {
		t.Helper()
		for key, w := range wants {
			v := hs.query(key)
			if v.Seq != uint64(w.n) || v.Aggregates["sum"] != float64(w.sum) {
				t.Errorf("%s: %s: seq %d sum %v, want %d and %d", when, key, v.Seq, v.Aggregates["sum"], w.n, w.sum)
			}
			if st := fmt.Sprintf(`{"n":%d,"sum":%d}`, w.okN, w.okSum); string(v.State) != st || v.HandlerFailures != uint64(w.failed) {
				t.Errorf("%s: %s: handler state %s with %d failures, want %s and %d", when, key, v.State, v.HandlerFailures, st, w.failed)
			}
		}
		var dead, seen int
		eventually(t, "every output stored", func() bool {
			dead, seen = 0, 0
			for id, desc := range allOutputs(t, hs.host) {
				switch {
				case strings.Contains(id, "/dead_letter/"):
					dead++
					if !strings.Contains(desc, `"error":`) || !strings.Contains(desc, `"event":{`) {
						t.Fatalf("dead letter %s: %s", id, desc)
					}
				case strings.Contains(id, "/seen/"):
					seen++
				}
			}
			return dead+seen >= 120
		})
		if dead != failures || seen != 120-failures {
			t.Errorf("%s: %d dead letters and %d outputs stored, want %d and %d", when, dead, seen, failures, 120-failures)
		}
	}
	check(hs, "live")
	if got := hs.host.Stats().Pipelines["p"].HandlerFailures; got != int64(failures) {
		t.Errorf("HandlerFailures = %d, want %d", got, failures)
	}
	if err := hs.shutdown(); err == nil {
		t.Fatal("shutdown with a failing checkpoint reported no error")
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	// A new host replays the whole log: the same state, and the outputs
	// again under the same ids with the same contents (allOutputs checks).
	cfg.CheckpointInterval = 0
	hs2 := start(t, openStore(t, dir), cfg)
	defer hs2.shutdown()
	if st := hs2.host.Stats(); st.Replayed < 120 {
		t.Fatalf("replayed %d records, want at least 120", st.Replayed)
	}
	check(hs2, "replayed")
}
