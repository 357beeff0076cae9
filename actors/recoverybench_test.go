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
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/embedded"
	"github.com/keyfold/keyfold/persistence/faultstore"
	"github.com/keyfold/keyfold/persistence/redisstore"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

// Recovery costs, measured on the host directly (no HTTP): how long taking
// a group over takes against the length of its log tail, how long a
// passivated key takes to activate, and that a restart does not grow with
// the number of keys in the store.

func benchPipelines(b *testing.B) map[string]*fold.Pipeline {
	p, err := fold.Compile("p", fold.Spec{Key: "k", ID: "id", Aggregates: map[string]fold.AggregateSpec{
		"n": {Op: "count"}, "sum": {Op: "sum", Field: "v"}, "max": {Op: "max", Field: "v"},
	}})
	if err != nil {
		b.Fatal(err)
	}
	return map[string]*fold.Pipeline{"p": p}
}

// benchStores are the durable stores recovery is measured on. Each opens a
// new, empty store; reopen opens the same data again.
var benchStores = []struct {
	name string
	open func(b *testing.B) (open func() persistence.Store)
}{
	{"redis", func(b *testing.B) func() persistence.Store {
		url := redistest.Start(b).URL()
		return func() persistence.Store {
			s, err := redisstore.Open(url, redisstore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}
	}},
	{"embedded", func(b *testing.B) func() persistence.Store {
		dir := b.TempDir()
		return func() persistence.Store {
			s, err := embedded.Open(dir, embedded.Options{})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}
	}},
}

// hostOn recovers a host on store and runs it (with benchPipelines unless
// cfg names its own); stop drains it and returns Run's error.
func hostOn(b *testing.B, store persistence.Store, cfg actors.Config) (h *actors.Host, stop func() error) {
	b.Helper()
	cfg.Store = store
	if cfg.Pipelines == nil {
		cfg.Pipelines = benchPipelines(b)
	}
	h, err := actors.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := h.Recover(context.Background()); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	return h, func() error { cancel(); return <-done }
}

// ingestKeys logs records ingests of perRecord events each, over keys keys.
func ingestKeys(b *testing.B, h *actors.Host, records, perRecord, keys int) {
	b.Helper()
	n := 0
	for range records {
		raws := make([][]byte, perRecord)
		for i := range raws {
			raws[i], _ = json.Marshal(map[string]any{"k": fmt.Sprint("k", n%keys), "id": fmt.Sprint("e", n), "v": n % 100})
			n++
		}
		if _, err := h.Ingest(context.Background(), "p", raws); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTakeOver measures taking over one key group whose log holds a
// tail of N records (10 events each, over 100 keys) above its checkpoint:
// the claim, reading the tail and replaying it into the keys.
func BenchmarkTakeOver(b *testing.B) {
	for _, st := range benchStores {
		for _, tail := range []int{0, 100, 1000, 10000} {
			b.Run(fmt.Sprintf("store=%s/tail=%d", st.name, tail), func(b *testing.B) {
				open := st.open(b)
				// No checkpoint may land: the tail must stay in the log.
				fs := faultstore.New(open())
				fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("benchmark: no checkpoints")})
				cfg := actors.Config{Groups: 1, CheckpointInterval: time.Hour}
				h, stop := hostOn(b, fs, cfg)
				ingestKeys(b, h, tail, 10, 100)
				_ = stop() // the final checkpoint fails, as intended
				b.ResetTimer()
				for b.Loop() {
					h, stop := hostOn(b, fs, cfg)
					b.StopTimer()
					if got := h.Stats().Replayed; got != int64(tail) {
						b.Fatalf("replayed %d records, want %d", got, tail)
					}
					_ = stop()
					b.StartTimer()
				}
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/take-over")
				_ = fs.Close()
			})
		}
	}
}

// BenchmarkActivation measures the first query of a passivated key: one
// snapshot read (the key's id buckets too: each key holds 5 ids).
func BenchmarkActivation(b *testing.B) {
	for _, st := range benchStores {
		b.Run("store="+st.name, func(b *testing.B) {
			open := st.open(b)
			store := open()
			defer store.Close()
			const keys = 20000
			cfg := actors.Config{Groups: 64, CheckpointInterval: time.Hour}
			h, stop := hostOn(b, store, cfg)
			ingestKeys(b, h, keys*5/1000, 1000, keys)
			if err := stop(); err != nil { // the final checkpoint snapshots every key
				b.Fatal(err)
			}
			h, stop = hostOn(b, store, cfg)
			defer stop()
			i := 0
			for b.Loop() {
				if _, err := h.Query(context.Background(), "p", fmt.Sprint("k", i%keys)); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if i > keys {
				b.Logf("%d queries of %d keys: some were active", i, keys)
			}
			b.ReportMetric(float64(h.Stats().Activations), "activations")
		})
	}
}

// BenchmarkRestart measures a restart (claims of 256 groups, empty tails)
// with 1,000 and 100,000 keys in the store: it must not depend on the
// number of keys, which are activated on demand.
func BenchmarkRestart(b *testing.B) {
	for _, st := range benchStores {
		for _, keys := range []int{1000, 100000} {
			b.Run(fmt.Sprintf("store=%s/keys=%d", st.name, keys), func(b *testing.B) {
				open := st.open(b)
				store := open()
				defer store.Close()
				cfg := actors.Config{CheckpointInterval: time.Hour}
				h, stop := hostOn(b, store, cfg)
				ingestKeys(b, h, keys/1000, 1000, keys)
				if err := stop(); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					_, stop := hostOn(b, store, cfg)
					b.StopTimer()
					if err := stop(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/restart")
			})
		}
	}
}
