package fold_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"go.yaml.in/yaml/v3"

	"github.com/keyfold/keyfold/actors/fold"
)

// TestDataDriven runs the scripts in testdata/*.txt (regenerate the expected
// output with `go test ./actors/fold -run TestDataDriven -rewrite`). Commands:
//
//	pipeline [name=N]          YAML body: one fold.Spec. Compiles it (prints
//	                           the errors, one a line, or "ok"); on success it
//	                           replaces the pipeline and drops every state (a
//	                           State belongs to its pipeline) but keeps the
//	                           snapshots, so a later restore runs against it.
//	prepare                    one JSON event a line: prints what Prepare
//	                           makes of it (key, id, time) or its error.
//	ingest [now=D] [key=K] [batch]
//	                           one JSON event a line, applied in order at
//	                           processing time D (a Go duration since the
//	                           epoch, default 0); a line "@D {...}" applies
//	                           its event at D. Each event goes to the state of
//	                           its own key, or of K when given (so a restored
//	                           copy can be fed the same events). With batch
//	                           the lines are prepared as one batch first
//	                           (PrepareBatch): one bad event rejects them all.
//	state key=K                seq and aggregates (JSON, sorted by name).
//	snapshot key=K             MarshalState; prints the persisted message.
//	restore key=K [from=F]     UnmarshalState of F's (default K's) last
//	                           snapshot, with the current pipeline, into K.
//	compare key=K with=J       "equal" when K and J have the same seq,
//	                           aggregates and marshalled bytes.
//	advance key=K wm=MS        Advance K's watermark to MS (Unix ms).
//	windows key=K              K's watermark, late count, next timer, late
//	                           counts per window (non-zero) and windows.
//	persist key=K              marks K's emitted outputs stored.
//	observe now=D              one JSON event a line: the pipeline's clock
//	                           (one per script, reset by pipeline) observes
//	                           each, logged at processing time D; prints the
//	                           clock.
//	watermark now=D            the clock's watermark at processing time D.
//	resume now=D               restarts the clock's idle countdown at D (a
//	                           restart, a take-over); prints the clock.
//	erase key=K                applies a tombstone to K; prints its windows.
//	expire key=K now=D         applies an expiry check to K at processing
//	                           time D (a Go duration since the epoch).
//	join [name=N]              YAML body: "pipelines:" (fold.Spec by name)
//	                           and "join:" (one fold.JoinSpec). Compiles the
//	                           sides, then the join (prints the errors, one a
//	                           line, or "ok"); on success the join is the
//	                           pipeline the other commands use (advance,
//	                           windows, snapshot, restore, compare).
//	side name=S [now=D]        one JSON event a line: prepared by side S of
//	                           the join and applied to the join's key
//	                           (ApplySide); prints what happened and the
//	                           results.
//	buffers key=K              the join's view of K (JoinView, as JSON).
//
// ingest and advance print each result a key emits ("emit ID …"), each
// event too late for every window ("late") and for each window that missed
// it ("late for W").
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{states: map[string]*fold.State{}, snaps: map[string][]byte{}}
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			return h.run(t, td)
		})
	})
}

type harness struct {
	p      *fold.Pipeline
	sides  map[string]*fold.Pipeline // of the join (join)
	states map[string]*fold.State
	snaps  map[string][]byte
	clock  fold.Clock
}

func (h *harness) run(t *testing.T, td *datadriven.TestData) string {
	if td.Cmd != "pipeline" && td.Cmd != "join" && h.p == nil {
		td.Fatalf(t, "%s before any pipeline", td.Cmd)
	}
	switch td.Cmd {
	case "pipeline":
		return h.pipeline(t, td)
	case "prepare":
		return h.prepare(td)
	case "ingest":
		return h.ingest(t, td)
	case "state":
		return h.state(h.arg(t, td, "key"))
	case "snapshot":
		key := h.arg(t, td, "key")
		b, err := h.p.MarshalState(h.get(key))
		if err != nil {
			return "error: " + err.Error()
		}
		h.snaps[key] = b
		return describeProto(h.p, h.get(key))
	case "restore":
		key := h.arg(t, td, "key")
		from := key
		if td.HasArg("from") {
			from = h.arg(t, td, "from")
		}
		b, ok := h.snaps[from]
		if !ok {
			td.Fatalf(t, "no snapshot of %q", from)
		}
		s, err := h.p.UnmarshalState(b)
		if err != nil {
			return "error: " + err.Error()
		}
		h.states[key] = &s
		return h.state(key)
	case "compare":
		return h.compare(h.arg(t, td, "key"), h.arg(t, td, "with"))
	case "advance":
		key := h.arg(t, td, "key")
		var wm int64
		td.ScanArgs(t, "wm", &wm)
		s := h.get(key)
		before := len(s.Outputs())
		h.p.Advance(s, key, wm)
		return describeOutputs(s, before)
	case "windows":
		return h.windows(h.arg(t, td, "key"))
	case "erase":
		key := h.arg(t, td, "key")
		h.p.Apply(h.get(key), fold.Tombstone(key), 0)
		return h.windows(key)
	case "expire":
		key := h.arg(t, td, "key")
		now, err := time.ParseDuration(h.arg(t, td, "now"))
		if err != nil {
			td.Fatalf(t, "now: %v", err)
		}
		s := h.get(key)
		h.p.Apply(s, fold.ExpiryCheck(key), now.Milliseconds())
		if s.Seq() == 0 {
			return "expired"
		}
		return fmt.Sprintf("kept (expires at %v)", time.Duration(h.p.WakeAt(s, now.Milliseconds()))*time.Millisecond)
	case "observe":
		now := h.now(t, td)
		for _, line := range lines(td.Input) {
			ev, err := h.p.Prepare([]byte(line))
			if err != nil {
				td.Fatalf(t, "%s: %v", line, err)
			}
			h.p.Observe(&h.clock, ev, now)
		}
		return describeClock(&h.clock)
	case "watermark":
		return fmt.Sprintf("wm=%d", h.p.WatermarkAt(&h.clock, h.now(t, td)))
	case "resume":
		h.p.Resume(&h.clock, h.now(t, td))
		return describeClock(&h.clock)
	case "persist":
		return fmt.Sprintf("stored %d outputs", len(h.get(h.arg(t, td, "key")).TakeOutputs()))
	case "join":
		return h.join(t, td)
	case "side":
		return h.side(t, td)
	case "buffers":
		b, err := json.Marshal(h.p.Join(h.get(h.arg(t, td, "key"))))
		if err != nil {
			return "error: " + err.Error()
		}
		return string(b)
	default:
		td.Fatalf(t, "unknown command %q", td.Cmd)
		return ""
	}
}

func (h *harness) arg(t *testing.T, td *datadriven.TestData, name string) string {
	var v string
	td.ScanArgs(t, name, &v)
	return v
}

// now reads the argument now=D (a Go duration since the epoch) in Unix ms.
func (h *harness) now(t *testing.T, td *datadriven.TestData) int64 {
	d, err := time.ParseDuration(h.arg(t, td, "now"))
	if err != nil {
		td.Fatalf(t, "now: %v", err)
	}
	return d.Milliseconds()
}

func describeClock(c *fold.Clock) string {
	return fmt.Sprintf("max=%d arrival=%d base=%d wm=%d", c.MaxEvent, c.Arrival, c.Base, c.Watermark)
}

func (h *harness) get(key string) *fold.State {
	s, ok := h.states[key]
	if !ok {
		s = new(fold.State)
		h.states[key] = s
	}
	return s
}

func (h *harness) pipeline(t *testing.T, td *datadriven.TestData) string {
	name := "test"
	if td.HasArg("name") {
		name = h.arg(t, td, "name")
	}
	var spec fold.Spec
	dec := yaml.NewDecoder(strings.NewReader(td.Input))
	dec.KnownFields(true)
	if err := dec.Decode(&spec); err != nil {
		td.Fatalf(t, "pipeline YAML: %v", err)
	}
	p, err := fold.Compile(name, spec)
	if err != nil {
		var out strings.Builder
		for _, e := range unjoin(err) {
			var se *fold.SpecError
			if !errors.As(e, &se) {
				t.Errorf("compile error %v (%T) is not a *fold.SpecError", e, e)
			}
			fmt.Fprintf(&out, "error: %v\n", e)
		}
		return out.String()
	}
	h.p = p
	h.states = map[string]*fold.State{}
	h.clock = fold.Clock{}
	return "ok"
}

// unjoin splits an errors.Join error into its errors.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func (h *harness) prepare(td *datadriven.TestData) string {
	var out strings.Builder
	for _, line := range lines(td.Input) {
		ev, err := h.p.Prepare([]byte(line))
		if err != nil {
			out.WriteString(describeErr(err) + "\n")
			continue
		}
		fmt.Fprintf(&out, "key=%q id=%q time=%d\n", ev.Key, ev.ID, ev.Time)
	}
	return out.String()
}

func (h *harness) ingest(t *testing.T, td *datadriven.TestData) string {
	var now time.Duration
	if td.HasArg("now") {
		d, err := time.ParseDuration(h.arg(t, td, "now"))
		if err != nil {
			td.Fatalf(t, "now: %v", err)
		}
		now = d
	}
	into := ""
	if td.HasArg("key") {
		into = h.arg(t, td, "key")
	}
	type input struct {
		at  time.Duration
		raw []byte
	}
	var inputs []input
	for _, line := range lines(td.Input) {
		at := now
		if rest, ok := strings.CutPrefix(line, "@"); ok {
			ds, ev, _ := strings.Cut(rest, " ")
			d, err := time.ParseDuration(ds)
			if err != nil {
				td.Fatalf(t, "%s: %v", line, err)
			}
			at, line = d, ev
		}
		inputs = append(inputs, input{at, []byte(line)})
	}

	var out strings.Builder
	apply := func(ev *fold.Event, at time.Duration) {
		key := ev.Key
		if into != "" {
			key = into
		}
		st := h.get(key)
		before, late := len(st.Outputs()), st.Late()
		lateIn := h.p.LateByWindow(st)
		defer func() {
			if st.Late() > late {
				out.WriteString("late\n")
			}
			for _, name := range h.p.WindowNames() {
				if n := h.p.LateByWindow(st)[name]; n > lateIn[name] {
					fmt.Fprintf(&out, "late for %s\n", name)
				}
			}
			out.WriteString(describeOutputs(st, before))
		}()
		if h.p.Apply(st, ev, at.Milliseconds()) {
			fmt.Fprintf(&out, "duplicate key=%s", key)
		} else {
			fmt.Fprintf(&out, "applied key=%s seq=%d", key, h.get(key).Seq())
		}
		if ev.ID != "" {
			fmt.Fprintf(&out, " id=%s", ev.ID)
		}
		if ev.Time != 0 {
			fmt.Fprintf(&out, " time=%d", ev.Time)
		}
		out.WriteString("\n")
	}

	if td.HasArg("batch") {
		raws := make([][]byte, len(inputs))
		for i, in := range inputs {
			raws[i] = in.raw
		}
		evs, err := h.p.PrepareBatch(raws)
		if err != nil {
			var be *fold.BatchError
			if !errors.As(err, &be) {
				t.Errorf("PrepareBatch error %v (%T) is not a *fold.BatchError", err, err)
			}
			if !errors.Is(err, fold.ErrInvalidEvent) {
				t.Errorf("PrepareBatch error %v does not wrap fold.ErrInvalidEvent", err)
			}
			return fmt.Sprintf("batch rejected: %v", err)
		}
		for i, ev := range evs {
			apply(ev, inputs[i].at)
		}
		return out.String()
	}
	for _, in := range inputs {
		ev, err := h.p.Prepare(in.raw)
		if err != nil {
			out.WriteString(describeErr(err) + "\n")
			continue
		}
		if !bytes.Equal(ev.Raw, in.raw) {
			t.Errorf("Event.Raw = %q, want the input %q", ev.Raw, in.raw)
		}
		apply(ev, in.at)
	}
	return out.String()
}

// describeOutputs prints the outputs s emitted after the first before.
func describeOutputs(s *fold.State, before int) string {
	var out strings.Builder
	for _, o := range s.Outputs()[before:] {
		fmt.Fprintf(&out, "emit %s kind=%s count=%d wm=%d %s\n", o.GetId(), o.GetKind(), o.GetCount(), o.GetWatermarkMs(), o.GetValuesJson())
		for _, id := range o.GetSupersedes() {
			fmt.Fprintf(&out, "  supersedes %s\n", id)
		}
	}
	return out.String()
}

func (h *harness) windows(key string) string {
	s := h.get(key)
	var out strings.Builder
	fmt.Fprintf(&out, "wm=%d late=%d next=%d", s.Watermark(), s.Late(), h.p.NextTimer(s))
	for i, name := range h.p.WindowNames() {
		if n := s.LateIn(i); n > 0 {
			fmt.Fprintf(&out, " late_in_%s=%d", name, n)
		}
	}
	out.WriteString("\n")
	for _, w := range h.p.Windows(s) {
		b, err := json.Marshal(w.Values)
		if err != nil {
			return "error: " + err.Error()
		}
		fmt.Fprintf(&out, "%s %s [%d, %d) count=%d emitted=%d %s\n", w.Name, w.Kind, w.Start.UnixMilli(), w.End.UnixMilli(), w.Count, w.Emitted, b)
	}
	return out.String()
}

// describeErr renders an event's rejection, checking that it is the
// documented *FieldError wrapping ErrInvalidEvent.
func describeErr(err error) string {
	var fe *fold.FieldError
	if !errors.As(err, &fe) || !errors.Is(err, fold.ErrInvalidEvent) {
		return fmt.Sprintf("UNEXPECTED ERROR TYPE %T: %v", err, err)
	}
	return "error: " + err.Error()
}

func (h *harness) state(key string) string {
	s := h.get(key)
	b, err := json.Marshal(h.p.Aggregates(s))
	if err != nil {
		return "error: " + err.Error()
	}
	empty := ""
	if s.Empty() {
		empty = " (empty)"
	}
	return fmt.Sprintf("seq=%d%s\n%s", s.Seq(), empty, b)
}

// describeProto prints the persisted form of a state field by field (the
// text format of protobuf is deliberately unstable).
func describeProto(p *fold.Pipeline, s *fold.State) string {
	ks := stateProto(p, s)
	var out strings.Builder
	fmt.Fprintf(&out, "seq=%d now_ms=%d\n", ks.GetSeq(), ks.GetNowMs())
	for _, a := range ks.GetAggregates() {
		fmt.Fprintf(&out, "aggregate %s count=%d number=%v", a.GetName(), a.GetCount(), a.GetNumber())
		if a.GetLastJson() != nil {
			fmt.Fprintf(&out, " last=%s", a.GetLastJson())
		}
		out.WriteString("\n")
	}
	for _, e := range ks.GetSeen() {
		fmt.Fprintf(&out, "seen %s at_ms=%d\n", e.GetId(), e.GetAtMs())
	}
	return out.String()
}

func (h *harness) compare(a, b string) string {
	sa, sb := h.get(a), h.get(b)
	var diffs []string
	if sa.Seq() != sb.Seq() {
		diffs = append(diffs, fmt.Sprintf("seq %d != %d", sa.Seq(), sb.Seq()))
	}
	if aa, ab := h.p.Aggregates(sa), h.p.Aggregates(sb); !reflect.DeepEqual(aa, ab) {
		diffs = append(diffs, fmt.Sprintf("aggregates %v != %v", aa, ab))
	}
	ba, err1 := h.p.MarshalState(sa)
	bb, err2 := h.p.MarshalState(sb)
	if err := errors.Join(err1, err2); err != nil {
		return "error: " + err.Error()
	}
	if !bytes.Equal(ba, bb) {
		diffs = append(diffs, fmt.Sprintf("marshalled state differs:\n%s---\n%s", describeProto(h.p, sa), describeProto(h.p, sb)))
	}
	if len(diffs) == 0 {
		return "equal"
	}
	return strings.Join(diffs, "\n")
}

// lines returns the non-empty lines of a command's input.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

func (h *harness) join(t *testing.T, td *datadriven.TestData) string {
	name := "j"
	if td.HasArg("name") {
		name = h.arg(t, td, "name")
	}
	var doc struct {
		Pipelines map[string]fold.Spec `yaml:"pipelines"`
		Join      fold.JoinSpec        `yaml:"join"`
	}
	dec := yaml.NewDecoder(strings.NewReader(td.Input))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		td.Fatalf(t, "join YAML: %v", err)
	}
	sides := map[string]*fold.Pipeline{}
	for n, spec := range doc.Pipelines {
		p, err := fold.Compile(n, spec)
		if err != nil {
			td.Fatalf(t, "pipeline %s: %v", n, err)
		}
		sides[n] = p
	}
	p, err := fold.CompileJoin(name, doc.Join, sides)
	if err != nil {
		var out strings.Builder
		for _, e := range unjoin(err) {
			var se *fold.SpecError
			if !errors.As(e, &se) || !se.Join {
				t.Errorf("compile error %v (%T) is not a join's *fold.SpecError", e, e)
			}
			fmt.Fprintf(&out, "error: %v\n", e)
		}
		return out.String()
	}
	h.p, h.sides = p, sides
	h.states = map[string]*fold.State{}
	h.clock = fold.Clock{}
	return "ok"
}

func (h *harness) side(t *testing.T, td *datadriven.TestData) string {
	if !h.p.IsJoin() {
		td.Fatalf(t, "side before any join")
	}
	name := h.arg(t, td, "name")
	sides := h.p.JoinSides()
	side := slices.Index(sides[:], name)
	if side < 0 {
		td.Fatalf(t, "%s is not a side of the join", name)
	}
	var now int64
	if td.HasArg("now") {
		now = h.now(t, td)
	}
	var out strings.Builder
	for _, line := range lines(td.Input) {
		ev, err := h.sides[name].Prepare([]byte(line))
		if err != nil {
			td.Fatalf(t, "%s: %v", line, err)
		}
		st := h.get(ev.Key)
		before, late := len(st.Outputs()), st.Late()
		switch {
		case h.p.ApplySide(st, side, ev, now):
			fmt.Fprintf(&out, "duplicate %s %s\n", name, ev.ID)
		case st.Late() > late:
			fmt.Fprintf(&out, "late %s %s\n", name, ev.ID)
		}
		out.WriteString(describeOutputs(st, before))
	}
	return out.String()
}
