package actors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// fakeClock is a processing-time clock the test moves; it counts its reads.
type fakeClock struct{ ms, reads atomic.Int64 }

func (c *fakeClock) Now() time.Time {
	c.reads.Add(1)
	return time.UnixMilli(c.ms.Load())
}
func (c *fakeClock) set(ms int64) { c.ms.Store(ms) }

const (
	winBase  = int64(1_700_000_000_000)
	winOOO   = 2000
	winIdle  = 1000
	winSize  = 10_000
	winSlide = 5_000
	winGap   = 3_000
)

func windowPipelines(t *testing.T) map[string]*fold.Pipeline {
	t.Helper()
	p, err := fold.Compile("p", fold.Spec{
		Key: "k", Time: "ts", ID: "id",
		OutOfOrderness: winOOO * time.Millisecond,
		IdleTimeout:    winIdle * time.Millisecond,
		Aggregates: map[string]fold.AggregateSpec{
			"n":   {Op: "count"},
			"sum": {Op: "sum", Field: "v"},
		},
		Windows: map[string]fold.WindowSpec{
			"tumble":  {Type: "tumbling", Size: winSize * time.Millisecond},
			"slide":   {Type: "sliding", Size: 2 * winSlide * time.Millisecond, Slide: winSlide * time.Millisecond, Aggregates: []string{"n"}},
			"session": {Type: "session", Gap: winGap * time.Millisecond},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*fold.Pipeline{"p": p}
}

type timedEvent struct {
	key string
	ts  int64
	v   int
	id  string
}

func (e timedEvent) raw() []byte {
	b, _ := json.Marshal(map[string]any{"k": e.key, "ts": e.ts, "v": e.v, "id": e.id})
	return b
}

// allOutputs reads every stored output of pipeline p, by id (checking that
// an id is never stored twice with different contents).
func allOutputs(t *testing.T, h *actors.Host) map[string]string {
	t.Helper()
	out := map[string]string{}
	cursor := ""
	for {
		page, err := h.Outputs(context.Background(), "p", cursor, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page {
			desc := fmt.Sprintf("count=%d %s", o.GetCount(), o.GetValuesJson())
			if prev, ok := out[o.GetId()]; ok && prev != desc {
				t.Fatalf("output %s stored twice, differently: %s and %s", o.GetId(), prev, desc)
			}
			out[o.GetId()] = desc
			cursor = o.Cursor
		}
		if len(page) < 1000 {
			return out
		}
	}
}

// oracle computes the window results of events in one batch computation.
func oracle(events []timedEvent) map[string]string {
	type acc struct{ n, sum int }
	type wkey struct {
		key, name  string
		start, end int64
	}
	wins := map[wkey]*acc{}
	add := func(k wkey, e timedEvent) {
		a := wins[k]
		if a == nil {
			a = &acc{}
			wins[k] = a
		}
		a.n++
		a.sum += e.v
	}
	byKey := map[string][]timedEvent{}
	for _, e := range events {
		start := e.ts - e.ts%winSize
		add(wkey{e.key, "tumble", start, start + winSize}, e)
		for s := e.ts - e.ts%winSlide; s > e.ts-2*winSlide; s -= winSlide {
			add(wkey{e.key, "slide", s, s + 2*winSlide}, e)
		}
		byKey[e.key] = append(byKey[e.key], e)
	}
	for _, evs := range byKey {
		sort.Slice(evs, func(i, j int) bool { return evs[i].ts < evs[j].ts })
		var session []timedEvent
		flush := func() {
			if len(session) == 0 {
				return
			}
			k := wkey{session[0].key, "session", session[0].ts, session[len(session)-1].ts + winGap}
			for _, e := range session {
				add(k, e)
			}
			session = nil
		}
		for _, e := range evs {
			if len(session) > 0 && e.ts > session[len(session)-1].ts+winGap {
				flush()
			}
			session = append(session, e)
		}
		flush()
	}
	out := map[string]string{}
	for k, a := range wins {
		id := fold.OutputID("p", k.key, k.name, k.start, k.end, 0)
		if k.name == "slide" {
			out[id] = fmt.Sprintf(`count=%d {"n":%d}`, a.n, a.n)
		} else {
			out[id] = fmt.Sprintf(`count=%d {"n":%d,"sum":%d}`, a.n, a.n, a.sum)
		}
	}
	return out
}

// TestWindowOracle: a few thousand events over many keys, out of order
// within out_of_orderness, ingested in random batches across a restart, with
// keys passivated and keys that go quiet early: the stored results equal a
// batch computation over the same events, each exactly once, none late.
func TestWindowOracle(t *testing.T) { tiers(t, testWindowOracle) }

func testWindowOracle(t *testing.T, maxMemory int64) {
	rng := rand.New(rand.NewPCG(7, 7))
	var events []timedEvent
	ts := winBase
	for i := range 4000 {
		ts += rng.Int64N(40)
		key := fmt.Sprintf("k%d", rng.IntN(150))
		if i >= 1800 && i < 2000 {
			// Quiet from just before the restart on: their windows close
			// only through the timer index the new host reads back.
			key = fmt.Sprintf("quiet%d", rng.IntN(20))
		}
		events = append(events, timedEvent{key: key, ts: ts, v: rng.IntN(100), id: fmt.Sprint(i)})
	}
	// Out of order: delivered by time plus a jitter below half the bound, so
	// no event is more than out_of_orderness behind any delivered before it.
	delivery := outOfOrder(rng, events, func(e timedEvent) timedEvent { return e }, winOOO/2)

	clock := &fakeClock{}
	clock.set(winBase)
	dir := t.TempDir()
	cfg := actors.Config{
		Pipelines: windowPipelines(t), Now: clock.Now,
		CheckpointInterval: 20 * time.Millisecond, MaxActive: 40, IdleTimeout: time.Hour, MaxMemory: maxMemory,
		WatermarkInterval: 5 * time.Millisecond, OutputInterval: time.Millisecond,
	}
	store := openStore(t, dir)
	hs := start(t, store, cfg)
	for i := 0; i < len(delivery); {
		n := min(1+rng.IntN(50), len(delivery)-i)
		batch := make([][]byte, n)
		for j, e := range delivery[i : i+n] {
			batch[j] = e.raw()
			clock.set(max(clock.ms.Load(), e.ts)) // processing time keeps up
		}
		hs.ingest2("p", batch...)
		i += n
		if i >= len(delivery)/2 && i-n < len(delivery)/2 { // restart halfway
			if err := hs.shutdown(); err != nil {
				t.Fatal(err)
			}
			hs = start(t, store, cfg)
		}
	}
	// Input goes idle: after idle_timeout the watermark advances with
	// processing time and every window closes, quiet keys included.
	clock.set(ts + winIdle + 60_000)
	want := oracle(events)
	var got map[string]string
	eventually(t, "every window's result", func() bool {
		got = allOutputs(t, hs.host)
		return len(got) >= len(want)
	})
	sameResults(t, got, want)
	st := hs.host.Stats()
	if st.Pipelines["p"].Late != 0 || st.TimersFired == 0 {
		t.Errorf("late %d, timers fired %d", st.Pipelines["p"].Late, st.TimersFired)
	}
	t.Logf("%d results from %d events; %d timers fired; %d activations", len(got), len(events), st.TimersFired, st.Activations)
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
}

func (hs *harness) ingest2(pipeline string, raws ...[]byte) {
	hs.t.Helper()
	if _, err := hs.host.Ingest(context.Background(), pipeline, raws); err != nil {
		hs.t.Fatalf("ingest: %v", err)
	}
}

// TestPatternsFireForQuietKeys: absences fire by timer for keys that never
// get another event, across a restart (the timer index is read back), and
// threshold matches count events delivered out of order.
func TestPatternsFireForQuietKeys(t *testing.T) { tiers(t, testPatternsFireForQuietKeys) }

func testPatternsFireForQuietKeys(t *testing.T, maxMemory int64) {
	p, err := fold.Compile("p", fold.Spec{
		Key: "k", Time: "ts", OutOfOrderness: time.Second, IdleTimeout: time.Second,
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}},
		Patterns: map[string]fold.PatternSpec{
			"no_ok": {After: "type == 'fail'", Absent: "type == 'ok'", Within: 5 * time.Second},
			"brute": {Where: "type == 'fail'", Count: 3, Within: 2 * time.Second},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{}
	clock.set(winBase)
	cfg := actors.Config{
		Pipelines: map[string]*fold.Pipeline{"p": p}, Now: clock.Now,
		CheckpointInterval: 20 * time.Millisecond, MaxActive: 10, IdleTimeout: time.Hour, MaxMemory: maxMemory,
		WatermarkInterval: 5 * time.Millisecond, OutputInterval: time.Millisecond,
	}
	store := openStore(t, t.TempDir())
	hs := start(t, store, cfg)
	ev := func(key, typ string, ts int64) []byte {
		b, _ := json.Marshal(map[string]any{"k": key, "type": typ, "ts": ts})
		return b
	}
	want := map[string]string{}
	for i := range 40 {
		key := fmt.Sprintf("u%d", i)
		at := winBase + int64(i)*10
		// Three fails within 2 s, delivered out of order (within the 1 s
		// bound of the whole stream): one brute match.
		hs.ingest2("p", ev(key, "fail", at+600), ev(key, "fail", at), ev(key, "fail", at+300))
		want[fold.OutputID("p", key, "brute", at, at+600, 0)] = "count=3 {}"
		if i%2 == 1 {
			want[fold.OutputID("p", key, "no_ok", at, at+5000, 0)] = "count=1 {}"
		}
	}
	for i := 0; i < 40; i += 2 { // answered in time
		hs.ingest2("p", ev(fmt.Sprintf("u%d", i), "ok", winBase+int64(i)*10+4000))
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	hs = start(t, store, cfg)
	defer hs.shutdown()
	// No more events: after idle_timeout the watermark moves with the clock.
	clock.set(winBase + 60_000)
	var got map[string]string
	eventually(t, "every match", func() bool {
		got = allOutputs(t, hs.host)
		return len(got) >= len(want)
	})
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: got %q, want %q", id, got[id], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d outputs, want %d: %v", len(got), len(want), got)
	}
	v := hs.query("u1")
	if len(v.Patterns) != 2 || v.Patterns[1].Matches != 1 || v.Patterns[0].Matches != 1 {
		t.Errorf("u1 patterns: %+v", v.Patterns)
	}
}

// TestOutputsNeverLostWhenStoringFails: while results cannot be stored,
// checkpoints do not trim the log that emitted them (nor does the drain), so
// a new host replays it and stores them.
func TestOutputsNeverLostWhenStoringFails(t *testing.T) {
	clock := &fakeClock{}
	clock.set(winBase)
	dir := t.TempDir()
	inner := openStore(t, dir)
	fs := faultstore.New(inner)
	fs.InjectAll(faultstore.OpAppendOutputs, faultstore.Fault{Err: errors.New("output log down")})
	cfg := actors.Config{
		Pipelines: windowPipelines(t), Now: clock.Now,
		CheckpointInterval: 10 * time.Millisecond, WatermarkInterval: 5 * time.Millisecond,
		OutputInterval: 5 * time.Millisecond,
	}
	hs := start(t, fs, cfg)
	var events []timedEvent
	for i := range 50 {
		e := timedEvent{key: fmt.Sprintf("k%d", i%5), ts: winBase + int64(i)*100, v: i, id: fmt.Sprint(i)}
		events = append(events, e)
		hs.ingest2("p", e.raw())
	}
	clock.set(winBase + 120_000) // everything closes
	eventually(t, "results emitted", func() bool { return hs.host.Stats().Pipelines["p"].Emitted >= int64(len(oracle(events))) })
	eventually(t, "storing retried", func() bool { return fs.Calls(faultstore.OpAppendOutputs) >= 5 })
	if err := hs.shutdown(); err == nil {
		t.Fatal("the drain succeeded although its results could not be stored")
	}
	if page, err := inner.ReadOutputs(context.Background(), "p", "", 10); err != nil || len(page) != 0 {
		t.Fatalf("outputs stored while the output log was down: %v %v", page, err)
	}
	hs = start(t, inner, cfg) // the output log is back
	defer hs.shutdown()
	want := oracle(events)
	var got map[string]string
	eventually(t, "every result stored", func() bool {
		got = allOutputs(t, hs.host)
		return len(got) >= len(want)
	})
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: got %q, want %q", id, got[id], w)
		}
	}
}

// outOfOrder returns events in the order of their time plus a random
// jitter below jitter ms (of the timedEvent each is, through te).
func outOfOrder[E any](rng *rand.Rand, events []E, te func(E) timedEvent, jitter int64) []E {
	delivery := slices.Clone(events)
	at := make(map[string]int64, len(delivery))
	for _, e := range delivery {
		at[te(e).id] = te(e).ts + rng.Int64N(jitter)
	}
	sort.SliceStable(delivery, func(i, j int) bool { return at[te(delivery[i]).id] < at[te(delivery[j]).id] })
	return delivery
}

// sameResults checks that got holds exactly the results of want, by id.
func sameResults(t *testing.T, got, want map[string]string) {
	t.Helper()
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: got %q, want %q", id, got[id], w)
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("unexpected result %s %s", id, got[id])
		}
	}
}
