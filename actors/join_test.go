package actors_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence/memstore"
)

const (
	joinLower = 0
	joinUpper = 5_000
	joinOOO   = 2_000
	// The window joins': sliding windows of 4s every 1s, sessions of 2s.
	joinSize, joinSlide = 4_000, 1_000
	joinGap             = 2_000
)

// joinPipelines are orders and payments joined by an interval join "paid":
// payment.ts - order.ts in [0, 5s].
func joinPipelines(t testing.TB, mode string) map[string]*fold.Pipeline {
	t.Helper()
	return joinPipelinesOf(t, "interval", mode)
}

// joinPipelinesOf are orders and payments joined by "paid", of the kind:
// interval (see joinPipelines), sliding or session (joinSize, joinSlide,
// joinGap).
func joinPipelinesOf(t testing.TB, kind, mode string) map[string]*fold.Pipeline {
	t.Helper()
	ps := map[string]*fold.Pipeline{}
	for _, name := range []string{"orders", "payments"} {
		p, err := fold.Compile(name, fold.Spec{Key: "k", Time: "ts", ID: "id", Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}})
		if err != nil {
			t.Fatal(err)
		}
		ps[name] = p
	}
	lower, upper := time.Duration(joinLower)*time.Millisecond, time.Duration(joinUpper)*time.Millisecond
	spec := fold.JoinSpec{
		Type: "interval", Mode: mode, Lower: &lower, Upper: &upper,
		Left:           fold.JoinSideSpec{Pipeline: "orders", Fields: []string{"v"}},
		Right:          fold.JoinSideSpec{Pipeline: "payments", Fields: []string{"v"}},
		OutOfOrderness: joinOOO * time.Millisecond, IdleTimeout: time.Second,
	}
	switch kind {
	case "sliding":
		spec.Type, spec.Window, spec.Lower, spec.Upper = "window", "sliding", nil, nil
		spec.Size, spec.Slide = joinSize*time.Millisecond, joinSlide*time.Millisecond
	case "session":
		spec.Type, spec.Window, spec.Lower, spec.Upper = "window", "session", nil, nil
		spec.Gap = joinGap * time.Millisecond
	}
	j, err := fold.CompileJoin("paid", spec, ps)
	if err != nil {
		t.Fatal(err)
	}
	ps["paid"] = j
	return ps
}

type sideEvent struct {
	side string
	timedEvent
}

// oracleID names a result of "paid" as the README says join results are
// named: join/key/left/right, each side id@time (Unix ms) or empty, key and
// ids path-escaped; a sliding window's match adds /start-end.
func oracleID(key string, l, r *sideEvent, window string) string {
	ref := func(e *sideEvent) string {
		if e == nil {
			return ""
		}
		return fmt.Sprintf("%s@%d", url.PathEscape(e.id), e.ts)
	}
	return "paid/" + url.PathEscape(key) + "/" + ref(l) + "/" + ref(r) + window
}

// joinOracle is the outer join of events of the kind (interval, sliding
// or session), computed in one batch: result id -> the ids it joins.
func joinOracle(kind string, events []sideEvent) map[string]string {
	// Sessions: per key, the events of both sides by time, each within
	// joinGap of the one before.
	session := map[string]int{}
	if kind == "session" {
		byTime := slices.Clone(events)
		slices.SortStableFunc(byTime, func(a, b sideEvent) int { return cmp.Or(strings.Compare(a.key, b.key), cmp.Compare(a.ts, b.ts)) })
		n := 0
		for i, e := range byTime {
			if i > 0 && (e.key != byTime[i-1].key || e.ts-byTime[i-1].ts > joinGap) {
				n++
			}
			session[e.id] = n
		}
	}
	out := map[string]string{}
	matched := map[string]bool{}
	for _, o := range events {
		if o.side != "orders" {
			continue
		}
		for _, p := range events {
			if p.side != "payments" || p.key != o.key {
				continue
			}
			var windows []string // the results of the pair: one, or one a window (sliding)
			switch d := p.ts - o.ts; kind {
			case "interval":
				if d >= joinLower && d <= joinUpper {
					windows = []string{""}
				}
			case "session":
				if session[o.id] == session[p.id] {
					windows = []string{""}
				}
			case "sliding": // the windows [start, start+size) holding both
				for start := min(o.ts, p.ts) / joinSlide * joinSlide; start > max(o.ts, p.ts)-joinSize; start -= joinSlide {
					windows = append(windows, fmt.Sprintf("/%d-%d", start, start+joinSize))
				}
			}
			for _, w := range windows {
				out[oracleID(o.key, &o, &p, w)] = o.id + "+" + p.id
				matched[o.id], matched[p.id] = true, true
			}
		}
	}
	for _, e := range events {
		switch {
		case matched[e.id]:
		case e.side == "payments":
			out[oracleID(e.key, nil, &e, "")] = "+" + e.id
		default:
			out[oracleID(e.key, &e, nil, "")] = e.id + "+"
		}
	}
	return out
}

// joinOutputs reads every stored result of the join, by id, checking that
// an id is never stored twice with different contents.
func joinOutputs(t *testing.T, h *actors.Host) map[string]string {
	t.Helper()
	out, seen := map[string]string{}, map[string]string{}
	cursor := ""
	for {
		page, err := h.Outputs(context.Background(), "paid", cursor, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page {
			if prev, ok := seen[o.GetId()]; ok && prev != string(o.GetValuesJson()) {
				t.Fatalf("output %s stored twice, differently: %s and %s", o.GetId(), prev, o.GetValuesJson())
			}
			seen[o.GetId()] = string(o.GetValuesJson())
			var v struct{ Left, Right *struct{ ID string } }
			if err := json.Unmarshal(o.GetValuesJson(), &v); err != nil {
				t.Fatal(err)
			}
			var l, r string
			if v.Left != nil {
				l = v.Left.ID
			}
			if v.Right != nil {
				r = v.Right.ID
			}
			out[o.GetId()] = l + "+" + r
			cursor = o.Cursor
		}
		if len(page) < 1000 {
			return out
		}
	}
}

// TestJoinOracle: an outer interval, sliding window or session window join
// over a seeded out-of-order stream of two inputs and 120 keys, crossing a
// take-over by a second host (the first one stops without a final
// checkpoint, as after a crash), equals the batch computation: every match
// once (a sliding window's once a window), every unmatched event once and
// never one that matched, quiet keys closed by their timers.
func TestJoinOracle(t *testing.T) {
	for _, kind := range []string{"interval", "sliding", "session"} {
		t.Run(kind, func(t *testing.T) {
			tiers(t, func(t *testing.T, maxMemory int64) { testJoinOracle(t, kind, maxMemory) })
		})
	}
}

func testJoinOracle(t *testing.T, kind string, maxMemory int64) {
	rng := rand.New(rand.NewPCG(17, 3))
	var events []sideEvent
	ts := winBase
	for i := range 3000 {
		ts += rng.Int64N(30)
		key := fmt.Sprintf("k%d", rng.IntN(120))
		if i >= 1400 && i < 1500 {
			key = fmt.Sprintf("quiet%d", rng.IntN(10)) // only before the take-over
		}
		side := "orders"
		if rng.IntN(2) == 0 {
			side = "payments"
		}
		events = append(events, sideEvent{side, timedEvent{key: key, ts: ts, v: i, id: fmt.Sprintf("%c%d", side[0], i)}})
	}
	delivery := outOfOrder(rng, events, func(e sideEvent) timedEvent { return e.timedEvent }, joinOOO/2)

	clock := &fakeClock{}
	clock.set(winBase)
	cfg := actors.Config{
		Pipelines: joinPipelinesOf(t, kind, "outer"), Now: clock.Now,
		CheckpointInterval: 20 * time.Millisecond, MaxActive: 40, IdleTimeout: time.Hour, MaxMemory: maxMemory,
		WatermarkInterval: 5 * time.Millisecond, OutputInterval: time.Millisecond,
	}
	store := memstore.New()
	hs := start(t, store, cfg)
	if hs.host.Layout() != actors.LayoutKey {
		t.Fatalf("a new store has layout %v, want %v", hs.host.Layout(), actors.LayoutKey)
	}
	for i := 0; i < len(delivery); {
		n := min(1+rng.IntN(40), len(delivery)-i)
		byPipeline := map[string][][]byte{}
		for _, e := range delivery[i : i+n] {
			byPipeline[e.side] = append(byPipeline[e.side], e.raw())
			clock.set(max(clock.ms.Load(), e.ts))
		}
		for _, side := range []string{"orders", "payments"} {
			if len(byPipeline[side]) > 0 {
				hs.ingest2(side, byPipeline[side]...)
			}
		}
		i += n
		if i >= len(delivery)/2 && i-n < len(delivery)/2 {
			// A second host takes every group over (fencing the first,
			// which never writes its final checkpoint) and replays the log.
			old := hs
			hs = start(t, store.Reopen(), cfg)
			_ = old.shutdown() // fenced: its final checkpoint fails
		}
	}
	clock.set(ts + 60_000) // idle: every interval closes, quiet keys too
	want := joinOracle(kind, events)
	// Poll until every result is in, or until the deadline: then the
	// comparison says which are missing.
	var got map[string]string
	pollUntil(20*time.Second, func() bool {
		got = joinOutputs(t, hs.host)
		return len(got) >= len(want)
	})
	sameResults(t, got, want)
	st := hs.host.Stats().Pipelines["paid"]
	if st.Late != 0 {
		t.Errorf("late %d, want 0 (nothing is delivered beyond out_of_orderness)", st.Late)
	}
	eventually(t, "nothing buffered", func() bool { return hs.host.Stats().Pipelines["paid"].Buffered == 0 })
	if _, err := hs.host.Query(context.Background(), "paid", "quiet1"); !errors.Is(err, actors.ErrNotFound) {
		t.Errorf("a join key with nothing buffered: %v, want ErrNotFound (its state left the store)", err)
	}
	t.Logf("%d results (%d unmatched since the take-over) from %d events", len(got), st.Unmatched, len(events))
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
}

// TestJoinIngestAndQuery: an event is logged once, under its pipeline, and
// reaches the join; the join's key shows what it buffers; a join takes no
// events of its own.
func TestJoinIngestAndQuery(t *testing.T) {
	clock := &fakeClock{}
	clock.set(winBase)
	hs := start(t, memstore.New(), actors.Config{Pipelines: joinPipelines(t, "inner"), Now: clock.Now, WatermarkInterval: 5 * time.Millisecond})
	defer hs.shutdown()
	k := "a"
	if g := hs.host.GroupOf("orders", k); g != hs.host.GroupOf("payments", k) || g != hs.host.GroupOf("paid", k) || g != actors.GroupOf(k, 8) {
		t.Fatalf("the key's groups differ across pipelines on a new store")
	}
	hs.ingest2("orders", timedEvent{key: k, ts: winBase, v: 1, id: "o1"}.raw())
	hs.ingest2("payments", timedEvent{key: k, ts: winBase + 1000, v: 2, id: "p1"}.raw(), timedEvent{key: k, ts: winBase + 9000, v: 3, id: "p2"}.raw())
	v, err := hs.host.Query(context.Background(), "paid", k)
	if err != nil {
		t.Fatal(err)
	}
	if v.Join == nil || v.Join.Results != 1 || v.Join.Sides[0].Buffered != 1 || v.Join.Sides[1].Buffered != 2 ||
		!v.Join.Sides[1].Oldest.Equal(time.UnixMilli(winBase+1000)) || !v.Join.Sides[1].Newest.Equal(time.UnixMilli(winBase+9000)) {
		t.Errorf("join view %+v", v.Join)
	}
	if o, err := hs.host.Query(context.Background(), "orders", k); err != nil || o.Seq != 1 {
		t.Errorf("orders' key: %+v, %v", o, err)
	}
	if _, err := hs.host.Ingest(context.Background(), "paid", [][]byte{timedEvent{key: k, ts: winBase, id: "x"}.raw()}); !errors.Is(err, fold.ErrJoinIngest) {
		t.Errorf("ingest into a join: %v, want ErrJoinIngest", err)
	}
}

// TestJoinRefusedOnOldLayout: a store created before the layout was
// recorded keeps hashing pipeline and key, serves pipelines as before, and
// refuses joins with a message that says why and what to do.
func TestJoinRefusedOnOldLayout(t *testing.T) {
	store := memstore.New()
	if _, err := store.CheckGroups(context.Background(), 8, 0); err != nil { // as an old build created it
		t.Fatal(err)
	}
	cfg := actors.Config{Pipelines: joinPipelines(t, "inner"), Store: store, Groups: 8}
	h, err := actors.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = h.Recover(context.Background())
	if !errors.Is(err, actors.ErrLayout) {
		t.Fatalf("Recover with a join on an old store = %v, want ErrLayout", err)
	}
	t.Log(err)

	ps := joinPipelines(t, "inner")
	delete(ps, "paid")
	hs := start(t, store.Reopen(), actors.Config{Pipelines: ps})
	defer hs.shutdown()
	if hs.host.Layout() != actors.LayoutPipelineKey {
		t.Fatalf("layout %v, want %v", hs.host.Layout(), actors.LayoutPipelineKey)
	}
	differ := false
	for i := range 20 {
		k := fmt.Sprint("k", i)
		differ = differ || hs.host.GroupOf("orders", k) != hs.host.GroupOf("payments", k)
	}
	if !differ {
		t.Error("the old layout puts every key of two pipelines in the same group")
	}
	hs.ingest2("orders", timedEvent{key: "a", ts: winBase, id: "o1"}.raw())
	if v, err := hs.host.Query(context.Background(), "orders", "a"); err != nil || v.Seq != 1 {
		t.Errorf("query on an old store: %+v, %v", v, err)
	}
}
