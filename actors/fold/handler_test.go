package fold_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// A random handler program: for each call, a list of operations, each
// guarded by a condition on the input and the state, over a small state.

type progState struct {
	N    int     `json:"n"`
	Sum  int64   `json:"sum"`
	Seen []int64 `json:"seen,omitempty"` // the last values added, at most 4
}

type opKind int

const (
	opAdd opKind = iota
	opTimer
	opCancel
	opEmit
	opDelete
	opFail
	opPanic
	opListTimers
	opProcessingTimer
	opKinds
)

type progOp struct {
	kind     opKind
	mod, rem int64
	delta    int64 // ms, for opTimer: may be negative (a time already passed)
	name     string
}

type program struct {
	onEvent, onTimer, onCall []progOp
	processingFired          int // processing-time timers that fired (replays included)
}

func randomProgram(rng *rand.Rand) *program {
	ops := func() []progOp {
		out := make([]progOp, 1+rng.IntN(6))
		for i := range out {
			o := progOp{kind: opKind(rng.IntN(int(opKinds))), mod: 1 + rng.Int64N(5), name: fmt.Sprintf("t%d", rng.IntN(3))}
			o.rem = rng.Int64N(o.mod)
			if o.kind == opFail || o.kind == opPanic || o.kind == opDelete {
				o.mod += 4 // rarer
			}
			o.delta = rng.Int64N(30_000) - 5_000
			out[i] = o
		}
		return out
	}
	return &program{onEvent: ops(), onTimer: ops(), onCall: ops()}
}

// OnCall runs the program's call operations and replies with what the
// call saw.
func (pr *program) OnCall(c *fold.Call, req *fold.Event) ([]byte, error) {
	var r struct {
		V int64 `json:"v"`
	}
	if err := json.Unmarshal(req.Raw, &r); err != nil {
		return nil, err
	}
	if err := pr.run(c, pr.onCall, r.V); err != nil {
		return nil, err
	}
	st, _ := c.State().(progState)
	return json.Marshal(map[string]any{"n": st.N, "sum": st.Sum, "now": c.Now(), "wm": c.Watermark(), "seed": c.Seed(), "timers": len(c.Timers())})
}

func (pr *program) OnEvent(c *fold.Call, ev *fold.Event) error {
	var e struct {
		V int64 `json:"v"`
	}
	if err := json.Unmarshal(ev.Raw, &e); err != nil {
		return err
	}
	return pr.run(c, pr.onEvent, e.V)
}

func (pr *program) OnTimer(c *fold.Call, t fold.Timer) error {
	if t.Processing {
		pr.processingFired++
	}
	return pr.run(c, pr.onTimer, int64(len(t.Name))+t.At/1000)
}

func (pr *program) run(c *fold.Call, ops []progOp, v int64) error {
	st, _ := c.State().(progState)
	st.Seen = slices.Clone(st.Seen) // changed on a copy, as handlers must
	for _, o := range ops {
		if (v+int64(st.N))%o.mod != o.rem {
			continue
		}
		switch o.kind {
		case opAdd:
			st.N++
			st.Sum += v
			st.Seen = append(st.Seen, v)
			if len(st.Seen) > 4 {
				st.Seen = st.Seen[1:]
			}
			c.SetState(st)
		case opTimer:
			if err := c.SetTimer(o.name, c.Time()+o.delta); err != nil {
				return err
			}
		case opProcessingTimer:
			if err := c.SetProcessingTimer(o.name, c.Now()+o.delta); err != nil {
				return err
			}
		case opCancel:
			c.CancelTimer(o.name)
		case opEmit:
			b, _ := json.Marshal(map[string]any{"n": st.N, "sum": st.Sum, "now": c.Now(), "wm": c.Watermark(), "at": c.Time(), "seed": c.Seed()})
			if err := c.Emit(o.name, b); err != nil {
				return err
			}
		case opDelete:
			c.Delete()
		case opFail:
			return fmt.Errorf("refused %d", v)
		case opPanic:
			panic(fmt.Sprintf("boom %d", v))
		case opListTimers:
			b, _ := json.Marshal(c.Timers())
			if err := c.Emit("timers", b); err != nil {
				return err
			}
		}
	}
	return nil
}

func (pr *program) StateVersion() uint32              { return 1 }
func (pr *program) EncodeState(v any) ([]byte, error) { return json.Marshal(v.(progState)) }
func (pr *program) StateJSON(v any) ([]byte, error)   { return json.Marshal(v) }
func (pr *program) DecodeState(data []byte, version uint32) (any, error) {
	if version != 1 {
		return nil, fmt.Errorf("version %d", version)
	}
	var st progState
	err := json.Unmarshal(data, &st)
	return st, err
}

// handlerSpec has built-in aggregates and a window beside the handler.
func handlerSpec(h fold.Handler) fold.Spec {
	return fold.Spec{
		Key: "k", ID: "id", Time: "t", DedupWindow: 20 * time.Second, OutOfOrderness: 2 * time.Second,
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}, "total": {Op: "sum", Field: "v"}},
		Windows:    map[string]fold.WindowSpec{"tumble": {Type: "tumbling", Size: 10 * time.Second}},
		Handler:    h,
	}
}

// step is one input of a key, as the log hands it over: an event (or a
// call, with its id) logged at now, or an advance of the watermark (a
// timer record).
type step struct {
	raw    string
	now    int64
	wm     int64
	call   bool
	id     string
	wakeUp bool // an expiry check: the key's processing-time wake-up
}

func randomSteps(rng *rand.Rand, n int) []step {
	const base = int64(1_800_000_000_000)
	now, evt, wm := base, base, int64(0)
	steps := make([]step, n)
	for i := range steps {
		now += rng.Int64N(800)
		if rng.IntN(4) == 0 {
			wm = max(wm, evt-2000) + rng.Int64N(3000)
			steps[i] = step{wm: wm}
			continue
		}
		if rng.IntN(10) == 0 {
			steps[i] = step{now: now, wakeUp: true}
			continue
		}
		if rng.IntN(5) == 0 {
			id := fmt.Sprintf("c%d", rng.IntN(i+1)) // often a retry
			if rng.IntN(4) == 0 {
				id = ""
			}
			steps[i] = step{raw: fmt.Sprintf(`{"v":%d}`, rng.IntN(50)), now: now, call: true, id: id}
			continue
		}
		evt += rng.Int64N(1500) - 400
		steps[i] = step{raw: fmt.Sprintf(`{"k":"a","id":"e%d","t":%d,"v":%d}`, rng.IntN(i+1), evt, rng.IntN(50)), now: now}
	}
	return steps
}

// run applies steps to s and returns the outputs they emitted and the
// replies to their calls.
func runSteps(t *testing.T, p *fold.Pipeline, s *fold.State, steps []step) []string {
	t.Helper()
	var outs []string
	for _, st := range steps {
		switch {
		case st.wakeUp:
			p.Apply(s, fold.ExpiryCheck("a"), st.now)
		case st.raw == "":
			p.Advance(s, "a", st.wm)
		case st.call:
			r := p.ApplyCall(s, fold.ReplayCall("a", st.id, []byte(st.raw)), st.now)
			outs = append(outs, fmt.Sprintf("reply %q %s %q %v", st.id, r.Value, r.Err, r.Duplicate))
		default:
			p.Apply(s, p.Replay([]byte(st.raw), "a"), st.now)
		}
		for _, o := range s.TakeOutputs() {
			outs = append(outs, describeOutput(o))
		}
	}
	return outs
}

func describeOutput(o *keyfoldv1.Output) string {
	return fmt.Sprintf("%s %s %s %d %s", o.GetId(), o.GetKind(), o.GetName(), o.GetWatermarkMs(), o.GetValuesJson())
}

// TestHandlerReplay: for random handler programs over random inputs, a
// snapshot at any point, restored and given the rest of the inputs,
// reaches the same state, emits the same outputs and gives the same
// replies to calls as the run that went on without stopping — with the
// handler's failures, panics, deletions and timers (past ones included)
// among them, calls retried with their ids (answered from the kept
// replies, across snapshots), and processing-time timers fired by the
// inputs and by the key's wake-ups (expiry checks).
func TestHandlerReplay(t *testing.T) {
	seeds := uint64(40)
	if raceDetector {
		seeds = 8
	}
	var emitted, failed, fired, replied, retried, refused, processing int
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 16))
			prog := randomProgram(rng)
			defer func() { processing += prog.processingFired }()
			p := mustCompile(t, handlerSpec(prog))
			steps := randomSteps(rng, 300)

			var s fold.State
			type snap struct {
				at, nout int
				store    *partsStore
			}
			var snaps []snap
			var outs []string
			stored := uint64(0)
			for i := range steps {
				outs = append(outs, runSteps(t, p, &s, steps[i:i+1])...)
				if rng.IntN(8) != 0 {
					continue
				}
				parts, err := p.SnapshotParts(&s, stored)
				if err != nil {
					t.Fatal(err)
				}
				ps := &partsStore{buckets: map[bucketPart][]byte{}}
				if len(snaps) > 0 {
					prev := snaps[len(snaps)-1].store // checkpoints write what changed over the last one
					ps.core, ps.buckets = prev.core, cloneBuckets(prev.buckets)
				}
				ps.store(parts)
				s.Persisted(parts.Version)
				stored = parts.Version
				snaps = append(snaps, snap{at: i + 1, nout: len(outs), store: ps})
			}
			want := stateProto(p, &s)
			for _, sn := range snaps {
				r := sn.store.restore(t, p)
				got := runSteps(t, p, &r, steps[sn.at:])
				if !slices.Equal(got, outs[sn.nout:]) {
					t.Fatalf("snapshot after step %d: the tail emitted\n%s\nwant\n%s", sn.at, strings.Join(got, "\n"), strings.Join(outs[sn.nout:], "\n"))
				}
				if gs := stateProto(p, &r); !proto.Equal(gs, want) {
					t.Fatalf("snapshot after step %d: state differs:\n got %v\nwant %v", sn.at, gs, want)
				}
			}
			for _, o := range outs {
				if strings.HasPrefix(o, "reply ") {
					replied++
					if strings.HasSuffix(o, " true") {
						retried++
					}
					if !strings.Contains(o, ` "" `) {
						refused++
					}
					continue
				}
				switch {
				case strings.Contains(o, " dead_letter "):
					failed++
				case strings.Contains(o, " handler "):
					emitted++
				}
				if strings.Contains(o, `"timer"`) || strings.Contains(o, " timers ") {
					fired++
				}
			}
		})
	}
	// The programs did what the property is about.
	if emitted == 0 || failed == 0 || fired == 0 || replied == 0 || retried == 0 || refused == 0 || processing == 0 {
		t.Errorf("the programs emitted %d outputs, %d dead letters, %d from timers, %d replies (%d to retries, %d errors), fired %d processing-time timers: want some of each",
			emitted, failed, fired, replied, retried, refused, processing)
	}
}

func cloneBuckets(m map[bucketPart][]byte) map[bucketPart][]byte {
	out := make(map[bucketPart][]byte, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// recorder is a handler whose calls are scripted by the test.
type recorder struct {
	onEvent func(c *fold.Call, ev *fold.Event) error
	onTimer func(c *fold.Call, t fold.Timer) error
	version uint32
}

func (r *recorder) OnEvent(c *fold.Call, ev *fold.Event) error { return r.onEvent(c, ev) }
func (r *recorder) OnTimer(c *fold.Call, t fold.Timer) error {
	if r.onTimer == nil {
		return nil
	}
	return r.onTimer(c, t)
}
func (r *recorder) StateVersion() uint32              { return max(r.version, 1) }
func (r *recorder) EncodeState(v any) ([]byte, error) { return json.Marshal(v) }
func (r *recorder) StateJSON(v any) ([]byte, error)   { return json.Marshal(v) }
func (r *recorder) DecodeState(data []byte, version uint32) (any, error) {
	if version != r.StateVersion() {
		return nil, fmt.Errorf("cannot read version %d", version)
	}
	var n float64
	err := json.Unmarshal(data, &n)
	return int(n), err
}

// TestHandlerFailureChangesNothing: a call that returns an error or panics
// leaves the handler's state, timers and outputs as they were, records a
// dead letter with the error and the event, and the next event goes on;
// the built-in aggregates took the event all the same.
func TestHandlerFailureChangesNothing(t *testing.T) {
	h := &recorder{onEvent: func(c *fold.Call, ev *fold.Event) error {
		n, _ := c.State().(int)
		c.SetState(n + 1)
		if err := c.SetTimer("t", c.Time()+1000); err != nil {
			return err
		}
		if err := c.Emit("seen", []byte(fmt.Sprint(n+1))); err != nil {
			return err
		}
		switch {
		case strings.Contains(string(ev.Raw), "fail"):
			return errors.New("no")
		case strings.Contains(string(ev.Raw), "panic"):
			var xs []int
			c.SetState(xs[len(ev.Raw)]) // index out of range: a runtime panic
		}
		return nil
	}}
	p := mustCompile(t, handlerSpec(h))
	var s fold.State
	apply := func(raw string, now int64) []*keyfoldv1.Output {
		p.Apply(&s, prepare(t, p, raw), now)
		return s.TakeOutputs()
	}
	apply(`{"k":"a","t":1000,"v":1}`, 5)
	for i, raw := range []string{`{"k":"a","t":2000,"v":2,"x":"fail"}`, `{"k":"a","t":3000,"v":3,"x":"panic"}`} {
		outs := apply(raw, int64(6+i))
		if len(outs) != 1 || outs[0].Kind != fold.DeadLetterKind || outs[0].Name != fold.DeadLetterKind {
			t.Fatalf("%s: outputs %v, want one dead letter", raw, outs)
		}
		var dl struct {
			Error string          `json:"error"`
			Event json.RawMessage `json:"event"`
		}
		if err := json.Unmarshal(outs[0].ValuesJson, &dl); err != nil || dl.Error == "" || string(dl.Event) != raw {
			t.Fatalf("dead letter %s (%v)", outs[0].ValuesJson, err)
		}
		if st, failed, _ := p.HandlerState(&s); string(st) != "1" || failed != uint64(i+1) {
			t.Fatalf("after %s: state %s, %d failures; want 1 and %d", raw, st, failed, i+1)
		}
		if ts := s.HandlerTimers(); len(ts) != 1 || ts[0].At != 2000 {
			t.Fatalf("after %s: timers %v, want t at 2000 still", raw, ts)
		}
	}
	outs := apply(`{"k":"a","t":4000,"v":4}`, 9)
	if len(outs) != 1 || string(outs[0].ValuesJson) != "2" || outs[0].Id != "fuzz/a/seen/5.3" {
		t.Fatalf("after the failures: %v", outs)
	}
	if agg := p.Aggregates(&s); fmt.Sprint(agg["n"], agg["total"]) != "4 10" {
		t.Fatalf("aggregates %v: the failed events still count", agg)
	}
}

// TestHandlerTimersFireInOrder: timers fire in (time, name) order once the
// watermark passes them, each seeing the advanced watermark; one set in
// the past fires right after the call; cancelled ones do not; the key's
// next timer includes them.
func TestHandlerTimersFireInOrder(t *testing.T) {
	var fired []string
	h := &recorder{
		onEvent: func(c *fold.Call, ev *fold.Event) error {
			for _, tm := range []fold.Timer{{Name: "b", At: 5000}, {Name: "a", At: 5000}, {Name: "c", At: 3000}, {Name: "gone", At: 4000}, {Name: "late", At: 100}} {
				if err := c.SetTimer(tm.Name, tm.At); err != nil {
					return err
				}
			}
			c.CancelTimer("gone")
			return nil
		},
		onTimer: func(c *fold.Call, tm fold.Timer) error {
			fired = append(fired, fmt.Sprintf("%s@%d/wm%d", tm.Name, tm.At, c.Watermark()))
			if tm.Name == "c" {
				return c.SetTimer("c2", tm.At) // due already: fires in this advance
			}
			return nil
		},
	}
	p := mustCompile(t, handlerSpec(h))
	var s fold.State
	p.Advance(&s, "a", 1000)
	p.Apply(&s, prepare(t, p, `{"k":"a","t":1500}`), 1)
	if want := []string{"late@100/wm1000"}; !slices.Equal(fired, want) {
		t.Fatalf("fired %v, want %v", fired, want)
	}
	if next := p.NextTimer(&s); next != 3000 {
		t.Fatalf("next timer %d, want 3000", next)
	}
	p.Advance(&s, "a", 11000)
	want := []string{"late@100/wm1000", "c@3000/wm11000", "c2@3000/wm11000", "a@5000/wm11000", "b@5000/wm11000"}
	if !slices.Equal(fired, want) {
		t.Fatalf("fired %v, want %v", fired, want)
	}
	if ts := s.HandlerTimers(); len(ts) != 0 {
		t.Fatalf("timers left %v", ts)
	}
	// The window the event opened still emits as without a handler.
	if outs := s.TakeOutputs(); len(outs) != 1 || outs[0].Kind != "tumbling" {
		t.Fatalf("outputs %v, want the tumbling window's", outs)
	}
}

// TestHandlerDeleteKeepsNumbering: a handler's Delete erases the key (its
// aggregates too), and outputs after it never reuse an earlier id.
func TestHandlerDeleteKeepsNumbering(t *testing.T) {
	h := &recorder{onEvent: func(c *fold.Call, ev *fold.Event) error {
		n, _ := c.State().(int)
		c.SetState(n + 1)
		if err := c.Emit("n", []byte(fmt.Sprint(n+1))); err != nil {
			return err
		}
		if strings.Contains(string(ev.Raw), "end") {
			c.Delete()
		}
		return nil
	}}
	p := mustCompile(t, handlerSpec(h))
	var s fold.State
	ids := map[string]bool{}
	for i, raw := range []string{`{"k":"a","t":1}`, `{"k":"a","t":2,"x":"end"}`, `{"k":"a","t":3}`} {
		p.Apply(&s, prepare(t, p, raw), int64(10+i))
		for _, o := range s.TakeOutputs() {
			if ids[o.Id] {
				t.Fatalf("id %s reused", o.Id)
			}
			ids[o.Id] = true
		}
	}
	if st, _, _ := p.HandlerState(&s); string(st) != "1" || s.Seq() != 1 {
		t.Fatalf("after the deletion: state %s, seq %d; want 1 and 1", st, s.Seq())
	}
}

// TestHandlerStateVersion: a state stored at another version than the
// handler's is refused, not misread.
func TestHandlerStateVersion(t *testing.T) {
	h := &recorder{onEvent: func(c *fold.Call, ev *fold.Event) error { c.SetState(7); return nil }}
	p := mustCompile(t, handlerSpec(h))
	var s fold.State
	p.Apply(&s, prepare(t, p, `{"k":"a","t":1}`), 1)
	r, b := roundTrip(t, p, &s)
	if st, _, _ := p.HandlerState(&r); string(st) != "7" {
		t.Fatalf("restored state %s", st)
	}
	if r.MemSize() <= (&fold.State{}).MemSize() {
		t.Fatalf("MemSize %d does not charge the handler's state", r.MemSize())
	}
	h2 := &recorder{onEvent: h.onEvent, version: 2}
	p2 := mustCompile(t, handlerSpec(h2))
	if _, err := p2.UnmarshalState(b); err == nil || !strings.Contains(err.Error(), "version 1") {
		t.Fatalf("restoring a version-1 state with a version-2 handler: %v", err)
	}
}

// TestCallReplayedWithoutCallHandler: a logged call replayed after its
// pipeline lost its handler, or its handler's OnCall, is answered with
// an error and changes nothing.
func TestCallReplayedWithoutCallHandler(t *testing.T) {
	noHandler := handlerSpec(nil)
	noHandler.Handler = nil
	for name, spec := range map[string]fold.Spec{"no handler": noHandler, "no OnCall": handlerSpec(&recorder{})} {
		p := mustCompile(t, spec)
		var s fold.State
		r := p.ApplyCall(&s, fold.ReplayCall("a", "c1", []byte(`{}`)), 5)
		if !errors.Is(r.Error(), fold.ErrCallFailed) || !strings.Contains(r.Err, "takes no calls") {
			t.Errorf("%s: %+v", name, r)
		}
		if s.Holds() {
			t.Errorf("%s: the call left state", name)
		}
	}
}

// TestKeptRepliesExpire: a key its handler deleted keeps the replies of
// its calls with ids (a retry is answered, not run), asks to be woken when
// the oldest leaves the dedup window, and is empty (its snapshot deleted)
// once the wake-up expired them.
func TestKeptRepliesExpire(t *testing.T) {
	h := &recorder{}
	p := mustCompile(t, handlerSpec(&callingRecorder{recorder: h, onCall: func(c *fold.Call, req *fold.Event) ([]byte, error) {
		c.SetState(1)
		c.Delete()
		return []byte(`"done"`), nil
	}}))
	var s fold.State
	const at = 1_000_000
	if r := p.ApplyCall(&s, fold.ReplayCall("a", "c1", []byte(`{}`)), at); r.Err != "" || string(r.Value) != `"done"` {
		t.Fatalf("call: %+v", r)
	}
	if s.Holds() || s.Empty() {
		t.Fatalf("after the deletion: holds %v, empty %v; want only the kept reply", s.Holds(), s.Empty())
	}
	if r := p.ApplyCall(&s, fold.ReplayCall("a", "c1", []byte(`{}`)), at+10); !r.Duplicate || string(r.Value) != `"done"` {
		t.Fatalf("retry: %+v", r)
	}
	wake := p.WakeAt(&s, at+10)
	if want := int64(at) + p.DedupWindow().Milliseconds() + 1; wake != want {
		t.Fatalf("WakeAt %d, want %d (the reply's expiry)", wake, want)
	}
	p.Apply(&s, fold.ExpiryCheck("a"), wake)
	if !s.Empty() || p.WakeAt(&s, wake) != 0 {
		t.Fatalf("after the wake-up: empty %v, WakeAt %d", s.Empty(), p.WakeAt(&s, wake))
	}
}

// callingRecorder is a recorder that answers calls.
type callingRecorder struct {
	*recorder
	onCall func(c *fold.Call, req *fold.Event) ([]byte, error)
}

func (r *callingRecorder) OnCall(c *fold.Call, req *fold.Event) ([]byte, error) {
	return r.onCall(c, req)
}
