package fold_test

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/keyfold/keyfold/actors/fold"
)

// Each benchmark op is one event, so ns/op and allocs/op are per event.

// quickstart compiles the logins pipeline of examples/quickstart.yaml
// without its sketches: six aggregates (two counts, one filtered; sum, max,
// min; last of a nested field), an id with a 24h dedup window and a time
// field — the pipeline of the figures of 2026-11-29.
func quickstart(b *testing.B) *fold.Pipeline {
	return quickstartWith(b, false)
}

// quickstartWith compiles it, with its two sketches (distinct of the
// country, quantiles of the amount) if sketches.
func quickstartWith(b *testing.B, sketches bool) *fold.Pipeline {
	b.Helper()
	spec := quickstartSpec(b)
	if !sketches {
		delete(spec.Aggregates, "countries")
		delete(spec.Aggregates, "amounts")
	}
	p, err := fold.Compile("logins", spec)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// quickstartSpec reads the logins pipeline of examples/quickstart.yaml.
func quickstartSpec(b *testing.B) fold.Spec {
	b.Helper()
	raw, err := os.ReadFile("../../examples/quickstart.yaml")
	if err != nil {
		b.Fatal(err)
	}
	var doc struct {
		Pipelines map[string]fold.Spec `yaml:"pipelines"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		b.Fatal(err)
	}
	spec, ok := doc.Pipelines["logins"]
	if !ok || len(spec.Aggregates) != 8 {
		b.Fatalf("examples/quickstart.yaml: want a logins pipeline with 8 aggregates, got %+v", spec)
	}
	return spec
}

// benchEvents returns n realistic login events of one user, each with its
// own id unless noIDs.
func benchEvents(n int, noIDs bool) [][]byte {
	types := []string{"login_ok", "login_ok", "login_ok", "login_failed"}
	countries := []string{"FR", "DE", "US", "JP", "BR"}
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil,
			`{"event_id":"evt-%08d","user_id":"user-1234","ts":"2024-03-01T12:%02d:%02d.%03dZ","type":%q,"amount":%d.%02d,"geo":{"country":%q,"city":"somewhere"},"ua":"Mozilla/5.0 (X11; Linux x86_64)"}`,
			i, i/60%60, i%60, i%1000, types[i%len(types)], i%500, i%100, countries[i%len(countries)])
		if noIDs {
			out[i] = append([]byte(`{"event_id":null,`), out[i][len(`{"event_id":"evt-00000000",`):]...)
		}
	}
	return out
}

func BenchmarkPrepare(b *testing.B) {
	p := quickstart(b)
	raws := benchEvents(1024, false)
	b.SetBytes(int64(len(raws[0])))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := p.Prepare(raws[i%len(raws)]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrepareBatch prepares batches of 1024 events and reports the
// bytes allocated per event and per byte of input: tiny events (a key and
// nothing else, a count: the 11-byte events of issue 13) and the realistic
// quickstart events.
func BenchmarkPrepareBatch(b *testing.B) {
	tiny := make([][]byte, 1024)
	for i := range tiny {
		tiny[i] = fmt.Appendf(nil, `{"k":"%d"}`, i%1000)
	}
	for _, c := range []struct {
		name string
		p    *fold.Pipeline
		raws [][]byte
	}{
		{"events=tiny", mustCompile(b, fold.Spec{Key: "k", Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}}), tiny},
		{"events=quickstart", quickstart(b), benchEvents(1024, false)},
	} {
		b.Run(c.name, func(b *testing.B) {
			size := 0
			for _, r := range c.raws {
				size += len(r)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for b.Loop() {
				if _, err := c.p.PrepareBatch(c.raws); err != nil {
					b.Fatal(err)
				}
			}
			runtime.ReadMemStats(&after)
			alloc := float64(after.TotalAlloc - before.TotalAlloc)
			b.ReportMetric(alloc/float64(b.N)/float64(len(c.raws)), "B/event")
			b.ReportMetric(alloc/float64(b.N)/float64(size), "B/input-byte")
		})
	}
}

// BenchmarkApply applies prepared events to one key at a steady state of
// the dedup set: processing time advances so that an id expires before the
// same event comes round again, and the key remembers ~1024 ids.
func BenchmarkApply(b *testing.B) {
	for _, c := range []struct {
		ids, sketches bool
	}{{true, false}, {false, false}, {false, true}} {
		p := quickstartWith(b, c.sketches)
		withIDs := c.ids
		b.Run(fmt.Sprintf("ids=%v/sketches=%v", c.ids, c.sketches), func(b *testing.B) {
			events, err := p.PrepareBatch(benchEvents(1024, !withIDs))
			if err != nil {
				b.Fatal(err)
			}
			step := p.DedupWindow().Milliseconds()/int64(len(events)) + 1
			var s fold.State
			now := int64(1_700_000_000_000)
			for _, ev := range events { // warm up to the steady state
				now += step
				p.Apply(&s, ev, now)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				now += step
				if p.Apply(&s, events[i%len(events)], now) {
					b.Fatal("unexpected duplicate")
				}
			}
		})
	}
}

// BenchmarkPrepareApply is the whole per-event cost of the core.
func BenchmarkPrepareApply(b *testing.B) {
	p := quickstart(b)
	raws := benchEvents(1024, false)
	step := p.DedupWindow().Milliseconds()/int64(len(raws)) + 1
	var s fold.State
	now := int64(1_700_000_000_000)
	b.SetBytes(int64(len(raws[0])))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ev, err := p.Prepare(raws[i%len(raws)])
		if err != nil {
			b.Fatal(err)
		}
		now += step
		p.Apply(&s, ev, now)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// appliedState is the state of a key that applied n of benchEvents, one
// a second.
func appliedState(b *testing.B, p *fold.Pipeline, n int) fold.State {
	b.Helper()
	events, err := p.PrepareBatch(benchEvents(n, false))
	if err != nil {
		b.Fatal(err)
	}
	var s fold.State
	now := int64(1_700_000_000_000)
	for _, ev := range events {
		now += int64(time.Second / time.Millisecond)
		p.Apply(&s, ev, now)
	}
	return s
}

// BenchmarkSnapshot is the cost of checkpointing a key that remembers ~1024
// ids (one op is one MarshalState and one UnmarshalState).
func BenchmarkSnapshot(b *testing.B) {
	p := quickstart(b)
	s := appliedState(b, p, 1024)
	buf, err := p.MarshalState(&s)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf, err := p.MarshalState(&s)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.UnmarshalState(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshotIndexed: a checkpoint's snapshot of a key remembering
// n ids (all but the newest in the store's id index already) after one
// more event, as a store with an id index takes it: packed, the new id
// handed over. The ids come a 24h window's nth apart, so that the key
// keeps n. from=memory: the key stayed in memory since its last snapshot;
// from=cache: it came back from the snapshot cache for the event (its ids
// fingerprints), as most keys do at a million keys.
func BenchmarkSnapshotIndexed(b *testing.B) {
	p := quickstart(b)
	now := int64(1_700_000_000_000)
	for _, from := range []string{"memory", "cache"} {
		for _, n := range []int{8, 30, 96} {
			b.Run(fmt.Sprintf("from=%s/ids=%d", from, n), func(b *testing.B) {
				var s fold.State
				apply := func(i int) {
					ev, err := p.Prepare([]byte(fmt.Sprintf(`{"user_id":"k","event_id":"event-%08d"}`, i)))
					if err != nil {
						b.Fatal(err)
					}
					p.Apply(&s, ev, now+int64(i)*(86_400_000/int64(n)/1000*1000+1000))
				}
				o := fold.SnapshotOptions{Packed: true, IDIndex: true, PackedParts: true}
				for i := range n {
					apply(i)
				}
				parts, err := p.Snapshot(&s, 0, nil, o)
				if err != nil {
					b.Fatal(err)
				}
				s.Persisted(parts.Version)
				var buf, cached []byte
				b.ReportAllocs()
				i := n
				for b.Loop() {
					b.StopTimer()
					if from == "cache" {
						if cached, err = p.AppendCached(cached[:0], &s); err != nil {
							b.Fatal(err)
						}
						if s, err = p.UnpackCached(cached); err != nil {
							b.Fatal(err)
						}
					}
					apply(i)
					i++
					b.StartTimer()
					parts, err := p.Snapshot(&s, parts.Version, buf[:0], o)
					if err != nil || len(parts.IDs) != 1 {
						b.Fatalf("snapshot: %v, %d ids handed over", err, len(parts.IDs))
					}
					buf = parts.CoreData
					s.Persisted(parts.Version)
				}
			})
		}
	}
}

// BenchmarkCheckpointHotKey: the snapshot of a key that applied an id every
// second for a day (86,400 ids remembered), taken after one more event, as
// a checkpoint takes it: the whole state inline, against the parts that
// changed.
func BenchmarkCheckpointHotKey(b *testing.B) {
	p := quickstart(b) // dedup_window: 24h
	var s fold.State
	now := int64(1_700_000_000_000)
	apply := func(i int) {
		now += 1000
		ev, err := p.Prepare([]byte(fmt.Sprintf(`{"user_id":"hot","event_id":"e%d"}`, i)))
		if err != nil {
			b.Fatal(err)
		}
		p.Apply(&s, ev, now)
	}
	for i := range 86_400 {
		apply(i)
	}
	b.Run("inline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.MarshalState(&s); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parts", func(b *testing.B) {
		b.ReportAllocs()
		i := 86_400
		for b.Loop() {
			b.StopTimer()
			stored := s.Version()
			apply(i)
			i++
			b.StartTimer()
			parts, err := p.SnapshotParts(&s, stored)
			if err != nil {
				b.Fatal(err)
			}
			s.Persisted(parts.Version)
		}
	})
}

// windowSpecs are the window setups the window benchmarks compare, on the
// quickstart pipeline's running aggregates.
var windowSpecs = []struct {
	name    string
	windows map[string]fold.WindowSpec
	all     bool // and ids, sketches and three patterns
}{
	{"none", nil, false},
	{"tumbling", map[string]fold.WindowSpec{
		"per_minute": {Type: "tumbling", Size: time.Minute, Aggregates: []string{"total", "amount"}},
	}, false},
	{"sliding", map[string]fold.WindowSpec{
		"last_hour": {Type: "sliding", Size: time.Hour, Slide: 5 * time.Minute, Aggregates: []string{"total"}},
	}, false},
	{"tumbling+sliding+session", map[string]fold.WindowSpec{
		"per_minute": {Type: "tumbling", Size: time.Minute, Aggregates: []string{"total", "amount"}},
		"last_hour":  {Type: "sliding", Size: time.Hour, Slide: 5 * time.Minute, Aggregates: []string{"total"}},
		"sessions":   {Type: "session", Gap: 30 * time.Minute, Aggregates: []string{"total"}},
	}, false},
	{"all features", map[string]fold.WindowSpec{
		"per_minute": {Type: "tumbling", Size: time.Minute, Aggregates: []string{"total", "amount", "countries", "amounts"}},
		"last_hour":  {Type: "sliding", Size: time.Hour, Slide: 5 * time.Minute, Aggregates: []string{"total"}},
		"sessions":   {Type: "session", Gap: 30 * time.Minute, Aggregates: []string{"total"}},
	}, true},
}

func windowed(b *testing.B, windows map[string]fold.WindowSpec, all bool) *fold.Pipeline {
	b.Helper()
	spec := quickstartSpec(b)
	if all {
		spec.Patterns = map[string]fold.PatternSpec{
			"brute":     {Where: "type == 'login_failed'", Count: 3, Within: 5 * time.Minute},
			"ok_failed": {Sequence: []string{"type == 'login_ok'", "type == 'login_failed'"}, Within: time.Minute},
			"no_ok":     {After: "type == 'login_failed'", Absent: "type == 'login_ok'", Within: time.Minute},
		}
		spec.TTL = 720 * time.Hour
	} else { // the cost of windows alone
		delete(spec.Aggregates, "countries")
		delete(spec.Aggregates, "amounts")
		spec.ID = ""
	}
	spec.Windows = windows
	p, err := fold.Compile("logins", spec)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkWindows is the cost per event of windows: one op advances the
// key's watermark to 5 s behind the event (emitting what closes) and applies
// the event; event time moves 1 s per event, so a tumbling minute emits
// every 60 events and a sliding hour (12 windows an event) every 300. "all
// features" adds ids (24 h dedup), the two sketches (also in the minute
// windows) and three patterns.
func BenchmarkWindows(b *testing.B) {
	for _, ws := range windowSpecs {
		p := windowed(b, ws.windows, ws.all)
		b.Run(ws.name, func(b *testing.B) {
			events, err := p.PrepareBatch(benchEvents(1024, !ws.all))
			if err != nil {
				b.Fatal(err)
			}
			// Ids cycle through more than a dedup window's worth (one event
			// a second, 24 h), so none is a duplicate.
			ids := make([]string, 1<<17)
			for i := range ids {
				ids[i] = fmt.Sprintf("evt-%d", i)
			}
			var s fold.State
			ts := int64(1_700_000_000_000)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				ts += 1000
				ev := *events[i%len(events)]
				ev.Time = ts
				if ev.ID != "" {
					ev.ID = ids[i%len(ids)]
				}
				p.Advance(&s, "user-1234", ts-5000)
				p.Apply(&s, &ev, ts)
				if i%1024 == 0 { // the output queue takes the results
					s.TakeOutputs()
				}
			}
		})
	}
}

// BenchmarkWindowMemory reports the heap a key takes with its windows open:
// 10,000 keys of 10 events each, within one minute of event time (so every
// window is open), without ids.
func BenchmarkWindowMemory(b *testing.B) {
	for _, ws := range windowSpecs {
		p := windowed(b, ws.windows, ws.all)
		b.Run(ws.name, func(b *testing.B) {
			events, err := p.PrepareBatch(benchEvents(10, !ws.all))
			if err != nil {
				b.Fatal(err)
			}
			const keys = 10_000
			var perKey float64
			for b.Loop() {
				states := make([]fold.State, keys)
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				for k := range states {
					for i, ev := range events {
						e := *ev
						e.Time = 1_700_000_000_000 + int64(i)*1000
						p.Apply(&states[k], &e, e.Time)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perKey = float64(after.HeapAlloc-before.HeapAlloc) / keys
				runtime.KeepAlive(states)
			}
			b.ReportMetric(perKey, "B/key")
		})
	}
}

// BenchmarkRestoreParts: a key whose ids are stored in buckets coming back
// into memory: its core and the parts of its ids (1 s apart, so in one
// bucket) decoded, as activation reads them from the store.
func BenchmarkRestoreParts(b *testing.B) {
	for _, n := range []int{64, 1024} {
		b.Run(fmt.Sprintf("ids=%d", n), func(b *testing.B) {
			p := quickstart(b)
			s := appliedState(b, p, n)
			parts, err := p.SnapshotParts(&s, 0)
			if err != nil {
				b.Fatal(err)
			}
			ps := &partsStore{buckets: map[bucketPart][]byte{}}
			ps.store(parts)
			load := loadFrom(ps)
			b.ReportAllocs()
			for b.Loop() {
				r, err := p.RestoreParts(ps.core, load)
				if err != nil {
					b.Fatal(err)
				}
				if r.Seq() != uint64(n) {
					b.Fatalf("restored seq %d, want %d", r.Seq(), n)
				}
			}
		})
	}
}
