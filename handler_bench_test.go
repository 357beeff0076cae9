package keyfold_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence/memstore"
)

// totals is the state of the trivial handler: what the built-in count and
// sum aggregates keep.
type totals struct {
	Total  int     `json:"total"`
	Amount float64 `json:"amount"`
}

// sumHandler is a trivial Go handler equivalent to a count and a sum of
// amount: it decodes the field and updates its state.
type sumHandler struct{}

func (sumHandler) OnEvent(k *keyfold.Key[totals], ev keyfold.Event) error {
	var e struct {
		Amount *float64 `json:"amount"`
	}
	if err := ev.Decode(&e); err != nil {
		return err
	}
	st := k.State()
	st.Total++
	if e.Amount != nil {
		st.Amount += *e.Amount
	}
	k.Set(st)
	return nil
}

func (sumHandler) OnTimer(*keyfold.Key[totals], keyfold.Timer) error { return nil }

// OnCall does the same for a call's request ({"amount": …}) and replies
// with the totals.
func (sumHandler) OnCall(k *keyfold.Key[totals], req keyfold.Request) (any, error) {
	var r struct {
		Amount float64 `json:"amount"`
	}
	if err := req.Decode(&r); err != nil {
		return nil, err
	}
	st := k.State()
	if !req.ReadOnly {
		st.Total++
		st.Amount += r.Amount
		k.Set(st)
	}
	return st, nil
}

// BenchmarkHandler compares, in one run, events/s through a pipeline whose
// keys keep a count and a sum with the built-in aggregates against the
// same pipeline doing it in a trivial Go handler (and both at once):
// Node.Ingest of batches of 100 events over 10k keys from GOMAXPROCS*4
// goroutines, on the in-memory store (no fsync: the figure is the CPU cost
// of the path, which is where the two differ) and on the embedded store.
func BenchmarkHandler(b *testing.B) {
	for _, store := range []string{"memory", "embedded"} {
		for _, mode := range []string{"builtin", "handler", "both"} {
			b.Run(fmt.Sprintf("store=%s/%s", store, mode), func(b *testing.B) {
				spec := keyfold.PipelineConfig{Key: "user_id", ID: "event_id"}
				if mode != "handler" {
					spec.Aggregates = map[string]keyfold.AggregateConfig{"total": {Op: "count"}, "amount": {Op: "sum", Field: "amount"}}
				}
				cfg := keyfold.Config{Pipelines: map[string]keyfold.PipelineConfig{"logins": spec}}
				if store == "memory" {
					cfg.Store = memstore.New()
				} else {
					cfg.DataDir = b.TempDir()
				}
				if mode != "builtin" {
					if err := keyfold.Handle(&cfg, "logins", sumHandler{}); err != nil {
						b.Fatal(err)
					}
				}
				n := run(b, cfg)
				benchIngest(b, n)
				st, err := n.Query(context.Background(), "logins", "u100") // in the first batch
				if err != nil {
					b.Fatal(err)
				}
				if mode != "builtin" && len(st.State) == 0 || mode != "handler" && st.Aggregates["total"] == uint64(0) {
					b.Fatalf("u100 kept nothing: %+v", st)
				}
			})
		}
	}
}

// benchIngest loads n with Node.Ingest and reports events/s.
func benchIngest(b *testing.B, n *keyfold.Node) {
	const batch = 100
	var seq atomic.Int64
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		events := make([]json.RawMessage, batch)
		for pb.Next() {
			base := seq.Add(batch)
			for i := range int64(batch) {
				id := base + i
				events[i] = fmt.Appendf(nil, `{"user_id":"u%d","event_id":"e%d","type":"login_failed","amount":%d}`, id%10000, id, id%100)
			}
			if _, err := n.Ingest(context.Background(), "logins", events); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(seq.Load())/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(seq.Load()), "ns/event")
}

// BenchmarkHandlerCore is the same comparison in the pure core, without
// the host: Prepare then Apply of one event at a time over 10k keys'
// states, single-threaded, so the figure is the per-event CPU cost of the
// built-in aggregates against the Go handler (its JSON decoding of the
// event included) and both. (Events carry no ids here: they repeat.)
func BenchmarkHandlerCore(b *testing.B) {
	for _, mode := range []string{"builtin", "handler", "both"} {
		b.Run(mode, func(b *testing.B) {
			spec := keyfold.PipelineConfig{Key: "user_id"} // no ids: the events repeat
			if mode != "handler" {
				spec.Aggregates = map[string]keyfold.AggregateConfig{"total": {Op: "count"}, "amount": {Op: "sum", Field: "amount"}}
			}
			cfg := keyfold.Config{Pipelines: map[string]keyfold.PipelineConfig{"logins": spec}}
			if mode != "builtin" {
				if err := keyfold.Handle(&cfg, "logins", sumHandler{}); err != nil {
					b.Fatal(err)
				}
			}
			p, err := fold.Compile("logins", cfg.Pipelines["logins"])
			if err != nil {
				b.Fatal(err)
			}
			const keys = 10000
			states := make([]fold.State, keys)
			raws := make([][]byte, 4096)
			for i := range raws {
				raws[i] = fmt.Appendf(nil, `{"user_id":"u%d","event_id":"e%d","type":"login_failed","amount":%d}`, i%keys, i, i%100)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				ev, err := p.Prepare(raws[i%len(raws)])
				if err != nil {
					b.Fatal(err)
				}
				p.Apply(&states[i%len(raws)%keys], ev, int64(i))
				_ = states[i%len(raws)%keys].TakeOutputs()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkHandlerCall compares, in one run, calls/s through the trivial
// handler's OnCall (Node.Call with an id: logged, applied, answered; and
// read-only calls, not logged) against events/s through its OnEvent, from
// GOMAXPROCS*4 goroutines over 10k keys: events one per Node.Ingest (a
// request each, as a call is) and in batches of 100 (what ingest does
// best). On the in-memory store (the CPU cost of the path) and the
// embedded store (synced: concurrent requests share a commit either way).
func BenchmarkHandlerCall(b *testing.B) {
	for _, c := range []struct{ store, mode string }{
		{"memory", "events100"}, {"memory", "events1"}, {"memory", "calls"}, {"memory", "readonly"},
		{"embedded", "events1"}, {"embedded", "calls"},
	} {
		b.Run(fmt.Sprintf("store=%s/%s", c.store, c.mode), func(b *testing.B) {
			cfg := keyfold.Config{Pipelines: map[string]keyfold.PipelineConfig{"logins": {Key: "user_id", ID: "event_id"}}}
			if c.store == "memory" {
				cfg.Store = memstore.New()
			} else {
				cfg.DataDir = b.TempDir()
			}
			if err := keyfold.Handle(&cfg, "logins", sumHandler{}); err != nil {
				b.Fatal(err)
			}
			n := run(b, cfg)
			switch c.mode {
			case "events100":
				benchIngest(b, n)
			case "events1":
				benchRequests(b, "events", func(ctx context.Context, id int64) error {
					_, err := n.Ingest(ctx, "logins", []json.RawMessage{fmt.Appendf(nil, `{"user_id":"u%d","event_id":"e%d","amount":%d}`, id%10000, id, id%100)})
					return err
				})
			case "calls", "readonly":
				ro := c.mode == "readonly"
				benchRequests(b, "calls", func(ctx context.Context, id int64) error {
					o := keyfold.CallOptions{ID: fmt.Sprintf("c%d", id), ReadOnly: ro}
					if ro {
						o.ID = ""
					}
					_, err := n.Call(ctx, "logins", fmt.Sprintf("u%d", id%10000), fmt.Appendf(nil, `{"amount":%d}`, id%100), o)
					return err
				})
			}
		})
	}
}

// benchRequests runs one request at a time per goroutine, GOMAXPROCS*4
// goroutines, and reports requests/s as unit.
func benchRequests(b *testing.B, unit string, do func(ctx context.Context, id int64) error) {
	var seq atomic.Int64
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := do(context.Background(), seq.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(seq.Load())/b.Elapsed().Seconds(), unit+"/s")
}
