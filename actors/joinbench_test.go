package actors_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
)

// BenchmarkJoinIngest runs one load through a node with orders and payments
// (embedded store, synced) without and then with an outer interval join of
// the two, in the same run: events/s of each and their ratio, and the heap
// each event the join buffers costs (both hosts hold the same keys in
// memory; every event stays buffered: its interval is an hour ahead).
//
//	go test ./actors -run '^$' -bench BenchmarkJoinIngest -benchtime 1x
func BenchmarkJoinIngest(b *testing.B) {
	const (
		keys   = 2000
		events = 100_000
		batch  = 500
	)
	run := func(b *testing.B, withJoin bool) (perSec float64, heap uint64, buffered int64) {
		ps := joinPipelines(b, "outer")
		if !withJoin {
			delete(ps, "paid")
		}
		hs := start(b, openStore(b, b.TempDir()), actors.Config{Pipelines: ps, MaxActive: 4 * keys, MaxMemory: 1 << 30, IdleTimeout: time.Hour,
			CheckpointInterval: time.Second})
		ctx := context.Background()
		raws := map[string][][]byte{}
		began := time.Now()
		for i := range events {
			side := [2]string{"orders", "payments"}[i%2]
			raws[side] = append(raws[side], timedEvent{key: fmt.Sprint("k", i/2%keys), ts: winBase + int64(i), v: i, id: fmt.Sprint(i)}.raw())
			if len(raws[side]) == batch {
				if _, err := hs.host.Ingest(ctx, side, raws[side]); err != nil {
					b.Fatal(err)
				}
				raws[side] = raws[side][:0]
			}
		}
		perSec = events / time.Since(began).Seconds()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heap, buffered = ms.HeapAlloc, hs.host.Stats().Pipelines["paid"].Buffered
		if err := hs.shutdown(); err != nil {
			b.Fatal(err)
		}
		return perSec, heap, buffered
	}
	for range b.N {
		without, heapWithout, _ := run(b, false)
		with, heapWith, buffered := run(b, true)
		b.ReportMetric(without, "events/s-without")
		b.ReportMetric(with, "events/s-join")
		b.ReportMetric(with/without, "ratio")
		b.ReportMetric(float64(buffered), "buffered")
		if buffered > 0 && heapWith > heapWithout {
			b.ReportMetric(float64(heapWith-heapWithout)/float64(buffered), "heap-B/buffered")
		}
	}
}

// BenchmarkJoinApply is the core's cost of an interval join per event: an
// event of each side in turn on one key, against its buffered partners
// (about 20 within the bounds), and the estimated state bytes per buffered
// event.
func BenchmarkJoinApply(b *testing.B) {
	ps := joinPipelines(b, "outer")
	j, sides := ps["paid"], [2]*fold.Pipeline{ps["orders"], ps["payments"]}
	evs := make([]*fold.Event, 1024)
	for i := range evs {
		ev, err := sides[i%2].Prepare(timedEvent{key: "k", ts: winBase + int64(i)*250, v: i, id: fmt.Sprint(i)}.raw())
		if err != nil {
			b.Fatal(err)
		}
		evs[i] = ev
	}
	b.ReportAllocs()
	var s fold.State
	buffered, size := 0, 0
	for i := range b.N {
		if i%len(evs) == 0 {
			s = fold.State{}
		}
		j.ApplySide(&s, i%2, evs[i%len(evs)], 0)
		s.TakeOutputs()
		if n := s.Buffered(); n > buffered {
			buffered, size = n, s.MemSize()
		}
	}
	if buffered > 0 {
		b.ReportMetric(float64(size)/float64(buffered), "state-B/buffered")
	}
}
