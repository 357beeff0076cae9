package actors_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/actors/fold/foldtest"
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/embedded"
)

// BenchmarkIngestKeys measures durable ingest on the host directly (no
// transport) as the number of keys grows: 32 submitters, batches of 100
// events with unique ids over uniformly drawn keys, the five aggregates of
// examples/bench.yaml, on the embedded store. It is what the CPU profiles
// of the state-at-scale work (BENCHMARKS.md) are taken from:
//
//	go test -run '^$' -bench IngestKeys -benchtime 400000x -cpuprofile cpu.out ./actors
//
// Each sub-benchmark starts from an empty store, so at large key counts
// most events meet a key for the first time. It reports the heap the keys
// in memory hold (heap_B/key, active and resident keys alike; mem_B/held_key
// adds the snapshot cache and its keys);
// KEYFOLD_HEAP_PROFILE=FILE writes a heap profile while they are held.
func BenchmarkIngestKeys(b *testing.B) {
	for _, keys := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) { benchIngestKeys(b, keys, false, actors.Config{}) })
	}
}

// BenchmarkIngestKeysSteady is BenchmarkIngestKeys in steady state: before
// the timer starts, every key gets one event and is checkpointed, so every
// event meets a stored key, and at a million keys more keys than the node
// keeps in memory by default (max_memory 1 GiB):
//
//	go test -run '^$' -bench IngestKeysSteady -benchtime 400000x -cpuprofile cpu.out ./actors
func BenchmarkIngestKeysSteady(b *testing.B) {
	for _, keys := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) { benchIngestKeys(b, keys, true, actors.Config{}) })
	}
}

// BenchmarkIngestKeysBeyondMemory is BenchmarkIngestKeysSteady with a
// tenth of the keys fitting in memory, as 10M keys do in the default
// max_memory (1 GiB): a million keys in 100 MiB, so that the steady state
// of ten million keys is measured (and profiled) after a tenth of the
// preload.
//
//	go test -run '^$' -bench IngestKeysBeyondMemory -benchtime 400000x ./actors
//
// Its sub-benchmarks split max_memory differently: cache=N% gives the
// snapshot cache N% of it (50% is the default).
func BenchmarkIngestKeysBeyondMemory(b *testing.B) {
	const maxMemory = actors.DefaultMaxMemory / 10
	for _, pct := range []int64{50, 62, 75} {
		b.Run(fmt.Sprintf("cache=%d%%", pct), func(b *testing.B) {
			benchIngestKeys(b, 1_000_000, true, actors.Config{MaxMemory: maxMemory, CacheMemory: maxMemory * pct / 100})
		})
	}
}

// BenchmarkIngestKeysCheckpoints is BenchmarkIngestKeysSteady at a million
// keys under other checkpoint and memory settings, run long enough for
// several checkpoint rounds to land in the measured part (a round at a
// million keys snapshots most of them; a run of a million events sees one
// or two, and its figure depends on which):
//
//	go test -run '^$' -bench IngestKeysCheckpoints -benchtime 4000000x ./actors
//
// nowait checkpoints at CheckpointBytes whatever the keys took
// (CheckpointMaxBytes equal to it: the rule before session 38);
// ckpt=256MiB checkpoints at 256 MiB (CheckpointBytes and CheckpointMaxBytes)
// and raises CheckpointRecords to 4000; cache=64MiB gives the snapshot cache 64 MiB of max_memory instead of
// half, so that the resident tier holds most keys (and their changes:
// changed keys stay in memory until a checkpoint, and the budget asks for
// one when they fill it); mem=4GiB holds every key in memory; unpacked
// stores snapshots as messages, not packed (as on a store that does not
// allow packed ones).
func BenchmarkIngestKeysCheckpoints(b *testing.B) {
	const fewer, records = 256 << 20, 4000
	for _, c := range []struct {
		name string
		cfg  actors.Config
	}{
		{"default", actors.Config{}},
		{"nowait", actors.Config{CheckpointMaxBytes: actors.DefaultCheckpointBytes}},
		{"ckpt=256MiB", actors.Config{CheckpointBytes: fewer, CheckpointMaxBytes: fewer, CheckpointRecords: records}},
		{"ckpt=256MiB/cache=64MiB", actors.Config{CheckpointBytes: fewer, CheckpointMaxBytes: fewer, CheckpointRecords: records, CacheMemory: 64 << 20}},
		{"mem=4GiB", actors.Config{MaxMemory: 4 << 30}},
		{"mem=4GiB/ckpt=256MiB", actors.Config{MaxMemory: 4 << 30, CheckpointBytes: fewer, CheckpointMaxBytes: fewer, CheckpointRecords: records}},
	} {
		b.Run(c.name, func(b *testing.B) { benchIngestKeys(b, 1_000_000, true, c.cfg) })
	}
	b.Run("unpacked", func(b *testing.B) {
		benchIngestKeys(b, 1_000_000, true, actors.Config{}, func(s persistence.Store) persistence.Store { return unpacked{s} })
	})
}

func benchPipeline(b *testing.B) map[string]*fold.Pipeline {
	p, err := fold.Compile("logins", foldtest.BenchSpec())
	if err != nil {
		b.Fatal(err)
	}
	return map[string]*fold.Pipeline{"logins": p}
}

// benchIngestKeys runs the benchmarks above on a host of cfg (the zero
// Config is the default one).
func benchIngestKeys(b *testing.B, keys int, preload bool, cfg actors.Config, wrap ...func(persistence.Store) persistence.Store) {
	cfg.Pipelines = benchPipeline(b)
	h := runBenchHost(b, cfg, wrap...)
	if preload {
		ingestEach(b, h, keys, func(i int) []byte {
			return fmt.Appendf(nil, `{"user_id":"u%d","event_id":"p%d","type":"login_ok","amount":1,"geo":{"country":"DE"}}`, i, i)
		})
		eventuallyWithin(b, 5*time.Minute, "every preloaded key to be checkpointed", func() bool { return h.Stats().DirtyKeys == 0 })
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	if path := os.Getenv("KEYFOLD_CPU_PROFILE"); path != "" { // the timed part only: -cpuprofile includes the preload
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	st0 := h.Stats()
	cpu0 := cpuTime()
	const submitters, batch = 32, 100
	batches := make(chan int, submitters)
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	b.ResetTimer()
	for s := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(s), 1))
			raws := make([][]byte, batch)
			for n := range batches {
				for i := range raws {
					seq := n*batch + i
					raws[i] = fmt.Appendf(raws[i][:0], `{"user_id":"u%d","event_id":"e%d","type":"%s","amount":%d,"geo":{"country":"%s"}}`,
						r.IntN(keys), seq, [2]string{"login_ok", "login_failed"}[seq%2], seq%100, [3]string{"DE", "FR", "US"}[seq%3])
				}
				if _, err := h.Ingest(context.Background(), "logins", raws); err != nil {
					errOnce.Do(func() { firstErr = err })
				}
			}
		}()
	}
	n := (b.N + batch - 1) / batch
	for i := range n {
		batches <- i
	}
	close(batches)
	wg.Wait()
	b.StopTimer()
	cpu := cpuTime() - cpu0
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	st := h.Stats()
	var done runtime.MemStats
	runtime.ReadMemStats(&done)
	b.ReportMetric(float64(done.TotalAlloc-before.TotalAlloc)/float64(n*batch), "alloc_B/event")
	b.ReportMetric(float64(st.ActiveKeys), "active_keys")
	b.ReportMetric(float64(st.ResidentKeys), "resident_keys")
	b.ReportMetric(float64(st.CachedKeys), "cached_keys")
	// What an event costs the machinery: commits and group checkpoints
	// per thousand events, actors started per event.
	events := float64(n * batch)
	b.ReportMetric(float64(st.Commits-st0.Commits)*1000/events, "commits/1k_events")
	b.ReportMetric(float64(st.Checkpoints-st0.Checkpoints)*1000/events, "group_checkpoints/1k_events")
	b.ReportMetric(float64(st.Activations-st0.Activations)/events, "activations/event")
	b.ReportMetric(float64(st.CacheHits-st0.CacheHits)/events, "cache_hits/event")
	// The heap the keys in memory hold, while they are held: the active
	// ones (with an actor) and the resident ones.
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	heap := float64(int64(after.HeapInuse) - int64(before.HeapInuse))
	if held := st.ActiveKeys + st.ResidentKeys; held > 0 {
		b.ReportMetric(heap/float64(held), "heap_B/key")
	}
	// With the snapshot cache (outside the heap) and its keys.
	if held := int64(st.ActiveKeys+st.ResidentKeys) + st.CachedKeys; held > 0 {
		b.ReportMetric((heap+float64(st.CacheBytes))/float64(held), "mem_B/held_key")
	}
	writeHeapProfile(b)
	b.ReportMetric(float64(n*batch)/b.Elapsed().Seconds(), "events/s")
	// CPU time per event (the process's, user and system): what the work
	// costs, less swayed than events/s by what else the machine runs.
	b.ReportMetric(float64(cpu.Microseconds())/float64(n*batch), "cpu_µs/event")
}

// writeHeapProfile writes a heap profile to $KEYFOLD_HEAP_PROFILE, if set:
// where the heap is (go tool pprof -sample_index=inuse_space).
func writeHeapProfile(b *testing.B) {
	path := os.Getenv("KEYFOLD_HEAP_PROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkResidentKeyMemory measures what a key held in the resident tier
// costs (README, "Sizing"): b.N keys of the bench pipeline, one event each
// (so one remembered id each), passivated out of their actors, then the
// heap they hold per key, after a GC, beside the host's own estimate of it
// (resident_est_B/key, what max_memory is charged); KEYFOLD_HEAP_PROFILE as
// in BenchmarkIngestKeys:
//
//	go test -run '^$' -bench ResidentKeyMemory -benchtime 200000x ./actors
func BenchmarkResidentKeyMemory(b *testing.B) {
	const maxActive = 1000
	_, st, heap := keysHeap(b, actors.Config{MaxActive: maxActive}, func(st actors.Stats) bool {
		return st.ActiveKeys <= maxActive && st.ActiveKeys+st.ResidentKeys == b.N
	})
	heap -= float64(st.ActiveKeys) * actors.ActiveKeyBytes
	b.ReportMetric(float64(st.ResidentKeys), "resident_keys")
	if st.ResidentKeys > 0 {
		b.ReportMetric(heap/float64(st.ResidentKeys), "heap_B/resident_key")
		b.ReportMetric(float64(st.ResidentBytes)/float64(st.ResidentKeys), "resident_est_B/key")
	}
}

// BenchmarkCachedKeyMemory measures what a key kept in the snapshot cache
// costs (README, "Sizing"): as BenchmarkResidentKeyMemory, with a resident
// tier of 1 MiB, so that nearly every key leaves memory into a cache of
// 48 MiB (32 MiB of chunks). cache_B/key is the cache's own memory (outside the heap) per key
// it holds, which counts once the cache is full (fastcache allocates a
// chunk per bucket at first: give it a million keys); heap_B/cached_key is
// the heap its index and the rest take, beyond the keys still in memory
// (charged as estimated).
//
//	go test -run '^$' -bench CachedKeyMemory -benchtime 1000000x ./actors
func BenchmarkCachedKeyMemory(b *testing.B) {
	const maxActive, cache, resident = 1000, 48 << 20, 1 << 20
	cfg := actors.Config{MaxActive: maxActive, CacheMemory: cache, MaxMemory: cache + maxActive*actors.ActiveKeyBytes + resident}
	h, st, heap := keysHeap(b, cfg, func(st actors.Stats) bool {
		return st.ActiveKeys <= maxActive && st.ResidentBytes <= resident
	})
	heap -= float64(st.ActiveKeys)*actors.ActiveKeyBytes + float64(st.ResidentBytes)
	cached := actors.CachedKeys(h, "logins", func(yield func(string) bool) {
		for i := range b.N {
			if !yield(fmt.Sprintf("u%d", i)) {
				return
			}
		}
	})
	b.ReportMetric(float64(cached), "cached_keys")
	b.ReportMetric(float64(st.CachedKeys), "cache_index_entries")
	if cached > 0 {
		b.ReportMetric(float64(st.CacheBytes)/float64(cached), "cache_B/key")
		b.ReportMetric(heap/float64(cached), "heap_B/cached_key")
	}
}

// BenchmarkActiveKeyMemory measures what a key with an actor costs (README,
// "Sizing"; actors.ActiveKeyBytes): as BenchmarkResidentKeyMemory, with
// every key kept active.
//
//	go test -run '^$' -bench ActiveKeyMemory -benchtime 200000x ./actors
func BenchmarkActiveKeyMemory(b *testing.B) {
	_, _, heap := keysHeap(b, actors.Config{MaxActive: 1 << 30, IdleTimeout: time.Hour}, func(st actors.Stats) bool {
		return st.ActiveKeys == b.N
	})
	b.ReportMetric(heap/float64(b.N), "heap_B/active_key")
}

// keysHeap ingests one event for each of b.N keys of the bench pipeline on
// a host configured by cfg, waits until every key is checkpointed and
// settled holds, and returns the host, its stats and the heap the keys hold
// after a GC.
func keysHeap(b *testing.B, cfg actors.Config, settled func(actors.Stats) bool) (*actors.Host, actors.Stats, float64) {
	cfg.Pipelines, cfg.CheckpointInterval = benchPipeline(b), 50*time.Millisecond
	if cfg.MaxMemory == 0 {
		cfg.MaxMemory = 16 << 30
	}
	h := runBenchHost(b, cfg)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	ingestEach(b, h, b.N, func(i int) []byte {
		return fmt.Appendf(nil, `{"user_id":"u%d","event_id":"e%d","type":"login_ok","amount":%d,"geo":{"country":"DE"}}`, i, i, i%100)
	})
	eventuallyWithin(b, 5*time.Minute, "the keys to be checkpointed and settled", func() bool {
		st := h.Stats()
		return st.DirtyKeys == 0 && settled(st)
	})
	b.StopTimer()
	st := h.Stats()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	writeHeapProfile(b)
	return h, st, float64(int64(after.HeapInuse) - int64(before.HeapInuse))
}

// runBenchHost runs a host on a new embedded store until the benchmark ends.
// runBenchHost runs a host of cfg on a new embedded store, seen through
// wrap if given.
func runBenchHost(b *testing.B, cfg actors.Config, wrap ...func(persistence.Store) persistence.Store) *actors.Host {
	b.Helper()
	store, err := embedded.Open(b.TempDir(), embedded.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var s persistence.Store = store
	for _, w := range wrap {
		s = w(s)
	}
	h, stop := hostOn(b, s, cfg)
	b.Cleanup(func() {
		if err := stop(); err != nil {
			b.Error(err)
		}
		store.Close()
	})
	return h
}

// ingestEach ingests event(i) for i in [0, n), a thousand to a call.
func ingestEach(b *testing.B, h *actors.Host, n int, event func(i int) []byte) {
	b.Helper()
	raws := make([][]byte, 0, 1000)
	for i := range n {
		raws = append(raws, event(i))
		if len(raws) == cap(raws) || i == n-1 {
			if _, err := h.Ingest(context.Background(), "logins", raws); err != nil {
				b.Fatal(err)
			}
			raws = raws[:0]
		}
	}
}
