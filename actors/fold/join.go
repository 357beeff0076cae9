package fold

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Joins between two pipelines.
//
// A join is compiled into a Pipeline of its own (CompileJoin), whose keys are
// the join's actors: the key k of a join holds what the join buffers of the
// events with key k of its two sides. Events are not ingested into a join:
// an event ingested into a side pipeline is logged once, under the side, and
// the host hands it to the side's key and, with the side's index, to the
// key of every join the side feeds (ApplySide), at apply and at replay
// alike. Both are in one key group (the store's layout hashes the key
// alone), so they are logged, recovered and moved together.
//
// A join's watermark is its own clock's, observing the events of both sides
// by their sides' time fields, with the join's out_of_orderness and
// idle_timeout (it is logged and replayed like a pipeline's).
//
// Interval join: a left event l and a right event r match when
// lower <= r.time - l.time <= upper, both bounds inclusive (as Flink's
// IntervalJoin). A match is emitted when its second event arrives. An event
// is late, not joined and counted, when its time is more than
// allowed_lateness behind the key's watermark W. An event is buffered until
// W passes the last time a partner of it can have (l.time + upper, or
// r.time - lower) by more than allowed_lateness: by then every partner still
// to come is late. Only then, for left and outer joins, is an event that
// matched nothing emitted with the other side empty: never an unmatched
// result that a later match contradicts.
//
// Temporal (enrichment) join: each left event is joined with the right
// side's latest version (the right event with the largest time at or below
// the left event's time; of equal times, the largest id) once W passes the
// left event's time, when every version up to it is in. Events behind W
// when they arrive are late. The right side keeps the versions at or after W
// and the latest one before it: all that a left event still to come can
// need.
//
// Window join: a left and a right event in the same window match; they are
// joined when the window closes (later ones, within allowed_lateness, at
// once). Tumbling and sliding windows are pipeline windows' (epoch-aligned,
// end-exclusive) and close when W reaches their end; an event joins those
// of its windows that are not gone (W at or past end plus
// allowed_lateness), is late when they all are, and leaves when its last
// one is gone: as for the interval join, only then is an event that
// matched nothing emitted alone. Sessions are in joinsession.go.
//
// Sides are told apart by index: 0 is left, 1 is right.

// JoinSpec is one join, as written in YAML under joins.
type JoinSpec struct {
	// Type is interval, window or temporal.
	Type string `yaml:"type"`
	// Mode is inner (the default), left or outer (outer: interval only).
	Mode string `yaml:"mode"`
	// Left and Right are the two inputs.
	Left  JoinSideSpec `yaml:"left"`
	Right JoinSideSpec `yaml:"right"`
	// Lower and Upper bound right.time - left.time for an interval join
	// (inclusive). Both are required: a join without a time bound would
	// buffer forever.
	Lower *time.Duration `yaml:"lower"`
	Upper *time.Duration `yaml:"upper"`
	// Window is a window join's kind of window, spelled as a pipeline's
	// windows: tumbling (the default; size), sliding (size and slide) or
	// session (gap). A left and a right event in the same window match.
	Window string `yaml:"window"`
	// Size is a tumbling or sliding window's length (aligned to the Unix
	// epoch, end-exclusive); Slide how often a sliding window starts (Size
	// a multiple of it); Gap how far apart in event time the events of a
	// session may be (both sides', in time order).
	Size  time.Duration `yaml:"size"`
	Slide time.Duration `yaml:"slide"`
	Gap   time.Duration `yaml:"gap"`
	// OutOfOrderness, AllowedLateness, IdleTimeout and OutputRetention are
	// the join's own, as a pipeline's (allowed_lateness: not temporal).
	OutOfOrderness  time.Duration `yaml:"out_of_orderness"`
	AllowedLateness time.Duration `yaml:"allowed_lateness"`
	IdleTimeout     time.Duration `yaml:"idle_timeout"`
	OutputRetention time.Duration `yaml:"output_retention"`
}

// JoinSideSpec is one input of a join.
type JoinSideSpec struct {
	// Pipeline is the side's pipeline: its events, by its key, time and id
	// fields. It must have a time field and an id field.
	Pipeline string `yaml:"pipeline"`
	// Fields are the (dotted) fields of the side's events its results carry.
	Fields []string `yaml:"fields"`
}

type joinKind uint8

const (
	intervalJoin joinKind = iota + 1
	temporalJoin
	windowJoin
)

type joinMode uint8

const (
	innerJoin joinMode = iota + 1
	leftJoin
	outerJoin
)

// join is a compiled JoinSpec.
type join struct {
	kind         joinKind
	mode         joinMode
	sides        [2]string
	fields       [2][][]string // split paths
	names        [2][]string   // the fields as configured
	lower, upper int64         // ms
	// Window joins: the kind of window, and its size, slide (tumbling: the
	// size) and gap, ms.
	window           windowKind
	size, slide, gap int64
}

// CompileJoin validates a join against the compiled pipelines it names and
// compiles it into the Pipeline of its keys. It reports every problem at
// once, each a *SpecError with Join set.
func CompileJoin(name string, spec JoinSpec, pipelines map[string]*Pipeline) (*Pipeline, error) {
	var errs []error
	bad := func(entry, format string, args ...any) {
		errs = append(errs, &SpecError{Pipeline: name, Entry: entry, Problem: fmt.Sprintf(format, args...), Join: true})
	}
	if name == "" || strings.ContainsFunc(name, func(r rune) bool { return r == '/' || unicode.IsSpace(r) || unicode.IsControl(r) }) {
		bad("", "name must be non-empty and contain no '/', whitespace or control characters")
	}
	if _, clash := pipelines[name]; clash {
		bad("", "a pipeline has the same name (a join's keys are read, and its outputs listed, by its name)")
	}
	j := &join{}
	switch spec.Type {
	case "interval":
		j.kind = intervalJoin
	case "temporal":
		j.kind = temporalJoin
	case "window":
		j.kind = windowJoin
	case "":
		bad("type", "is required: interval, window or temporal")
	default:
		bad("type", "must be interval, window or temporal (got %q)", spec.Type)
	}
	switch spec.Mode {
	case "", "inner":
		j.mode = innerJoin
	case "left":
		j.mode = leftJoin
	case "outer":
		j.mode = outerJoin
		if j.kind == temporalJoin {
			bad("mode", "a temporal join is inner or left (a right version is not an event to emit alone)")
		}
	default:
		bad("mode", "must be inner, left or outer (got %q)", spec.Mode)
	}
	for i, side := range []JoinSideSpec{spec.Left, spec.Right} {
		entry := [2]string{"left", "right"}[i]
		j.sides[i] = side.Pipeline
		p := pipelines[side.Pipeline]
		switch {
		case side.Pipeline == "":
			bad(entry, "pipeline is required (the side's input)")
		case p == nil:
			bad(entry, "pipeline %q is not defined", side.Pipeline)
		default:
			if p.timeField == "" {
				bad(entry, "pipeline %q has no time field: a join matches events by event time", side.Pipeline)
			}
			if p.idField == "" {
				bad(entry, "pipeline %q has no id field: a join's results are named by the ids of the events they join", side.Pipeline)
			}
		}
		seen := map[string]bool{}
		for _, f := range side.Fields {
			switch {
			case f == "" || strings.HasPrefix(f, ".") || strings.HasSuffix(f, ".") || strings.Contains(f, ".."):
				bad(entry, "field %q is not a (dotted) field name", f)
			case seen[f]:
				bad(entry, "field %q is listed twice", f)
			}
			seen[f] = true
			j.fields[i] = append(j.fields[i], splitPath(f))
			j.names[i] = append(j.names[i], f)
		}
	}
	if spec.Left.Pipeline != "" && spec.Left.Pipeline == spec.Right.Pipeline {
		bad("right", "is the same pipeline as left: a join's sides are two pipelines")
	}
	span := func(entry string, d *time.Duration) int64 {
		switch {
		case d == nil:
			return 0
		case *d%time.Millisecond != 0 || *d > MaxWindowSpan || *d < -MaxWindowSpan:
			bad(entry, "must be whole milliseconds between -%v and %v (got %v)", MaxWindowSpan, MaxWindowSpan, *d)
		}
		return d.Milliseconds()
	}
	switch j.kind {
	case intervalJoin:
		if spec.Lower == nil || spec.Upper == nil {
			bad("", "an interval join needs lower and upper, the bounds of right.time - left.time: without a time bound it would buffer every event forever")
		}
		j.lower, j.upper = span("lower", spec.Lower), span("upper", spec.Upper)
		if spec.Lower != nil && spec.Upper != nil && *spec.Lower > *spec.Upper {
			bad("lower", "%v is above upper %v: no pair could match", *spec.Lower, *spec.Upper)
		}
	case windowJoin:
		j.window = windowKinds[cmp.Or(spec.Window, "tumbling")]
		if j.window == 0 {
			bad("window", "must be tumbling, sliding or session (got %q)", spec.Window)
			break
		}
		windowShape(j.window, spec.Size, spec.Slide, spec.Gap, func(field string) string { return field },
			": a window join without it has no time bound and would buffer every event forever", bad)
		if spec.Lower != nil || spec.Upper != nil {
			bad("", "a window join takes no lower or upper: events in the same window match")
		}
		j.size, j.slide, j.gap = spec.Size.Milliseconds(), spec.Slide.Milliseconds(), spec.Gap.Milliseconds()
		if j.window == tumbling {
			j.slide = j.size
		}
	case temporalJoin:
		if spec.Lower != nil || spec.Upper != nil {
			bad("", "a temporal join takes no lower or upper: it joins each left event with the right version as of its time")
		}
		if spec.AllowedLateness != 0 {
			bad("allowed_lateness", "a temporal join takes none: an event behind the watermark is late")
		}
	}
	if j.kind != windowJoin {
		for _, f := range []struct {
			entry string
			set   bool
		}{{"window", spec.Window != ""}, {"size", spec.Size != 0}, {"slide", spec.Slide != 0}, {"gap", spec.Gap != 0}} {
			if f.set {
				bad(f.entry, "only a window join takes a %s", f.entry)
			}
		}
	}
	// The join's clock runs on event time (its sides' time fields): its
	// pipeline has a time field for what the clock does, none that is read.
	p := &Pipeline{name: name, join: j, timeField: "(join)", dedupWindow: DefaultDedupWindow}
	p.compileTime(Spec{OutOfOrderness: spec.OutOfOrderness, AllowedLateness: spec.AllowedLateness,
		IdleTimeout: spec.IdleTimeout, OutputRetention: spec.OutputRetention, Time: p.timeField}, bad)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	p.fingerprint = fingerprintOf(name, Spec{Key: "(join)", Time: "(join) " + fmt.Sprint(spec.Type, spec.Mode, spec.Left, spec.Right, j.lower, j.upper, j.window, j.size, j.slide, j.gap)})
	return p, nil
}

// IsJoin reports whether the pipeline is a join's (CompileJoin): its keys
// take the events of its sides, not events of their own.
func (p *Pipeline) IsJoin() bool { return p.join != nil }

// JoinSides returns the pipelines of a join's left and right sides.
func (p *Pipeline) JoinSides() [2]string { return p.join.sides }

// ErrJoinIngest rejects events sent to a join instead of to its sides.
// It wraps ErrInvalidEvent.
var ErrJoinIngest = fmt.Errorf("%w: a join takes no events of its own: send them to its sides' pipelines", ErrInvalidEvent)

// joinState is what a key of a join holds, beyond its seq, duplicates,
// watermark and late count.
type joinState struct {
	sides              [2][]joinEvent // by (time, id)
	results, unmatched uint64
}

// joinEvent is one buffered event of a side.
type joinEvent struct {
	t      int64
	id     string
	fields []byte // JSON object
	// Window joins: how many of the sliding windows that hold it, the
	// earliest, were gone when it came (it joined the others); for a
	// session, whether its session closed since (see joinsession.go).
	// Next to matched, so the event takes no more room than without.
	missed  uint32
	matched bool
	sealed  bool
}

func compareJoinEvents(a, b joinEvent) int {
	return cmp.Or(cmp.Compare(a.t, b.t), strings.Compare(a.id, b.id))
}

// ApplySide applies an event of side (0 left, 1 right) of the join, prepared
// by the side's pipeline, to a key of the join at processing time nowMs. It
// reports whether it was a duplicate (its side buffers an event of that
// time and id). Tombstones and expiry checks go through Apply. An event
// without an id is ignored: nothing could name its results.
func (p *Pipeline) ApplySide(s *State, side int, ev *Event, nowMs int64) (duplicate bool) {
	if ev.Erase || ev.Expire {
		return p.Apply(s, ev, nowMs)
	}
	if ev.ID == "" {
		return false
	}
	s.version++
	s.now = max(s.now, nowMs)
	ts := s.timed()
	if ts.join == nil {
		ts.join = &joinState{}
	}
	js := ts.join
	t := p.EventTime(ev, nowMs)
	e := joinEvent{t: t, id: ev.ID}
	i, found := slices.BinarySearchFunc(js.sides[side], e, compareJoinEvents)
	if found {
		s.dups++
		return true
	}
	s.seq++
	late := t < ts.wm-p.lateness // interval and session joins
	switch {
	case p.join.kind == temporalJoin:
		late = t < ts.wm
	case p.join.kind == windowJoin && p.join.window != session:
		e.missed = p.join.missed(t, ts.wm-p.lateness)
		late = int64(e.missed) == p.join.size/p.join.slide // its windows are all gone
	}
	if late {
		ts.late++
		return false
	}
	e.fields = p.join.project(side, ev.Raw)
	switch {
	case p.join.kind == temporalJoin:
		js.sides[side] = slices.Insert(js.sides[side], i, e)
		return false
	case p.join.kind == windowJoin && p.join.window == session:
		p.sessionArrive(s, ev.Key, side, i, e) // joinsession.go
		return false
	case p.join.kind == windowJoin:
		js.sides[side] = slices.Insert(js.sides[side], i, e)
		p.windowArrive(s, ev.Key, side, i) // joinwindow.go
		return false
	}
	// Interval: match against the other side's buffered events, in order.
	o := 1 - side
	lo, hi := t+p.join.lower, t+p.join.upper // partner times, for a left event
	if side == 1 {
		lo, hi = t-p.join.upper, t-p.join.lower
	}
	other := js.sides[o]
	k, _ := slices.BinarySearchFunc(other, joinEvent{t: lo}, compareJoinEvents)
	for ; k < len(other) && other[k].t <= hi; k++ {
		other[k].matched, e.matched = true, true
		if side == 0 {
			p.emitJoin(s, ev.Key, &e, &other[k], nil)
		} else {
			p.emitJoin(s, ev.Key, &other[k], &e, nil)
		}
	}
	js.sides[side] = slices.Insert(js.sides[side], i, e)
	p.expireJoin(s, ev.Key) // one whose partners are all behind the watermark already
	return false
}

// project returns the side's configured fields of raw as a JSON object
// (absent fields left out), the fields in name order and their values as
// the event wrote them. Only the objects on the fields' paths are decoded,
// and into raw values: decoding the whole event into maps was most of a
// join's cost per event.
func (j *join) project(side int, raw []byte) []byte {
	if len(j.fields[side]) == 0 {
		return nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil // the side took it; an event it no longer reads carries nothing
	}
	type field struct {
		name string
		v    json.RawMessage
	}
	var found []field
	for fi, path := range j.fields[side] {
		v, ok := top[path[0]]
		for _, part := range path[1:] {
			var m map[string]json.RawMessage
			if !ok || json.Unmarshal(v, &m) != nil {
				ok = false
				break
			}
			v, ok = m[part]
		}
		if ok && !bytes.Equal(v, []byte("null")) {
			found = append(found, field{j.names[side][fi], v})
		}
	}
	slices.SortFunc(found, func(a, b field) int { return strings.Compare(a.name, b.name) })
	out := []byte{'{'}
	for i, f := range found {
		if i > 0 {
			out = append(out, ',')
		}
		name, _ := json.Marshal(f.name) // a string: cannot fail
		out = append(out, name...)
		out = append(out, ':')
		var c bytes.Buffer
		if json.Compact(&c, f.v) != nil { // cannot happen: it decoded
			return nil
		}
		out = append(out, c.Bytes()...)
	}
	return append(out, '}')
}

// until returns the watermark from which an event of side at time t can
// have no partner still on time: just past its last partner time (not for
// sessions: see joinsession.go).
func (j *join) until(side int, t int64) int64 {
	if j.kind == windowJoin { // its last window's end: partners are in it
		return j.lastStart(t) + j.size
	}
	if side == 0 {
		return t + j.upper + 1
	}
	return t - j.lower + 1
}

// expireJoin drops the interval join's events whose partners are all
// behind the key's watermark by more than allowed_lateness, in the order
// they expire, emitting those that matched nothing if the mode says so.
func (p *Pipeline) expireJoin(s *State, key string) {
	js := s.join
	wm := s.wm
	for {
		side := -1
		var at int64
		for i := range 2 {
			if len(js.sides[i]) == 0 {
				continue
			}
			if d := p.join.until(i, js.sides[i][0].t) + p.lateness; d <= wm && (side < 0 || d < at) {
				side, at = i, d
			}
		}
		if side < 0 {
			return
		}
		e := js.sides[side][0]
		js.sides[side] = js.sides[side][1:]
		if !e.matched && (p.join.mode == outerJoin || p.join.mode == leftJoin && side == 0) {
			if side == 0 {
				p.emitJoin(s, key, &e, nil, nil)
			} else {
				p.emitJoin(s, key, nil, &e, nil)
			}
		}
	}
}

// runTemporal joins the left events the watermark passed with the right
// version as of their time, then drops the versions no left event still to
// come can need.
func (p *Pipeline) runTemporal(s *State, key string) {
	js := s.join
	wm := s.wm
	left, right := js.sides[0], js.sides[1]
	n := 0
	for ; n < len(left) && left[n].t < wm; n++ {
		l := &left[n]
		// The latest version at or before l's time.
		v, _ := slices.BinarySearchFunc(right, joinEvent{t: l.t + 1}, compareJoinEvents)
		switch {
		case v > 0:
			p.emitJoin(s, key, l, &right[v-1], nil)
		case p.join.mode == leftJoin:
			p.emitJoin(s, key, l, nil, nil)
		}
	}
	js.sides[0] = slices.Delete(left, 0, n)
	// Left events to come are at or after wm: of the versions before wm
	// only the latest is needed.
	v, _ := slices.BinarySearchFunc(right, joinEvent{t: wm}, compareJoinEvents)
	if v > 1 {
		js.sides[1] = slices.Delete(right, 0, v-1)
	}
}

// advanceJoin is Advance's part for a join's key, after the watermark moved
// from old.
func (p *Pipeline) advanceJoin(s *State, key string, old int64) {
	if s.join == nil {
		return
	}
	switch p.join.kind {
	case temporalJoin:
		p.runTemporal(s, key)
		return
	case windowJoin:
		if p.join.window == session {
			p.closeSessions(s, key) // joinsession.go
			return
		}
		p.closeWindows(s, key, old) // joinwindow.go
	}
	p.expireJoin(s, key)
}

// mod is t mod m in [0, m), for negative t too.
func mod(t, m int64) int64 { return ((t % m) + m) % m }

// joinTimer is the watermark at which the join's key next has something to
// do, 0 if none.
func (p *Pipeline) joinTimer(s *State) int64 {
	if s.timeState == nil || s.join == nil {
		return 0
	}
	js := s.join
	switch {
	case p.join.kind == temporalJoin:
		if len(js.sides[0]) == 0 {
			return 0
		}
		return js.sides[0][0].t + 1
	case p.join.kind == windowJoin && p.join.window == session:
		return p.sessionTimer(s) // joinsession.go
	}
	var next int64
	for i := range 2 {
		if len(js.sides[i]) > 0 {
			if d := p.join.until(i, js.sides[i][0].t) + p.lateness; next == 0 || d < next {
				next = d
			}
		}
	}
	if p.join.kind == windowJoin {
		if end := p.nextWindowEnd(s); end != 0 && end < next {
			next = end // joinwindow.go
		}
	}
	return next
}

// JoinResultKind is the Kind of a join's results, by the join's type.
func (j *join) kindName() string {
	return [...]string{"", "interval", "temporal", "window"}[j.kind]
}

// emitJoin records a result: a match, or (one of l and r nil) an event
// alone; w is the window of a sliding window join's match (nil for any
// other result), part of its id and shown in it.
func (p *Pipeline) emitJoin(s *State, key string, l, r *joinEvent, w *joinWindow) {
	js := s.join
	// {"left":{"fields":…,"id":…,"time":…},"right":…}, as json.Marshal
	// would write the maps (keys sorted), appended directly: encoding maps
	// was half the cost of a match.
	values := make([]byte, 0, 160+len(l.fieldsJSON())+len(r.fieldsJSON()))
	values = append(values, `{"left":`...)
	values = l.appendJSON(values)
	values = append(values, `,"right":`...)
	values = r.appendJSON(values)
	if w != nil {
		values = append(values, `,"window":{"end":`...)
		values = appendTimeJSON(values, w.end)
		values = append(values, `,"start":`...)
		values = appendTimeJSON(values, w.start)
		values = append(values, '}')
	}
	values = append(values, '}')
	o := &keyfoldv1.Output{
		Pipeline:    p.name,
		Key:         key,
		Kind:        p.join.kindName(),
		Name:        p.name,
		ValuesJson:  values,
		WatermarkMs: s.wm,
	}
	switch {
	case l != nil && r != nil:
		o.StartMs, o.EndMs, o.Count = l.t, r.t, 2
		js.results++
	case l != nil:
		o.StartMs, o.EndMs, o.Count = l.t, l.t, 1
		js.unmatched++
	default:
		o.StartMs, o.EndMs, o.Count = r.t, r.t, 1
		js.unmatched++
	}
	o.Id = JoinOutputID(p.name, key, l.ref(), r.ref())
	if w != nil {
		o.Id += "/" + strconv.FormatInt(w.start, 10) + "-" + strconv.FormatInt(w.end, 10)
	}
	s.out = append(s.out, o)
}

// fieldsJSON is the event's fields as a JSON object (nil: none).
func (e *joinEvent) fieldsJSON() []byte {
	switch {
	case e == nil:
		return nil
	case len(e.fields) == 0:
		return []byte("{}")
	}
	return e.fields
}

// appendJSON appends the event as a result shows it, null for nil.
func (e *joinEvent) appendJSON(b []byte) []byte {
	if e == nil {
		return append(b, "null"...)
	}
	b = append(b, `{"fields":`...)
	b = append(b, e.fieldsJSON()...)
	b = append(b, `,"id":`...)
	id, _ := json.Marshal(e.id) // a string: cannot fail
	b = append(b, id...)
	b = append(b, `,"time":`...)
	b = appendTimeJSON(b, e.t)
	return append(b, '}')
}

// appendTimeJSON appends Unix ms t as a JSON string, RFC 3339 in UTC.
func appendTimeJSON(b []byte, t int64) []byte {
	b = append(b, '"')
	b = time.UnixMilli(t).UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// JoinEvent names an event a join result joins: its id and event time.
type JoinEvent struct {
	ID     string
	TimeMs int64
}

// ref names a buffered event (nil: none).
func (e *joinEvent) ref() *JoinEvent {
	if e == nil {
		return nil
	}
	return &JoinEvent{e.id, e.t}
}

// JoinOutputID is the stable id of a join's result: the join, the key, and
// the left and right events it joins as id@time (Unix ms; empty for a side
// it lacks), key and ids path-escaped. An event is one id at one time (the
// join buffers and deduplicates events by both), so the same events always
// give the same id and the same content, whatever replays or resends. A
// sliding window join's match adds "/start-end", its window (Unix ms): a
// pair in two overlapping windows is two results.
func JoinOutputID(name, key string, left, right *JoinEvent) string {
	side := func(e *JoinEvent) string {
		if e == nil {
			return ""
		}
		return url.PathEscape(e.ID) + "@" + strconv.FormatInt(e.TimeMs, 10)
	}
	return fmt.Sprintf("%s/%s/%s/%s", name, url.PathEscape(key), side(left), side(right))
}

// JoinView is what a query shows of a join's key.
type JoinView struct {
	Type      string         `json:"type"`
	Window    string         `json:"window,omitempty"` // window joins: tumbling, sliding or session
	Mode      string         `json:"mode"`
	Results   uint64         `json:"results"`
	Unmatched uint64         `json:"unmatched"`
	Sides     []JoinSideView `json:"sides"`
}

// JoinSideView is one side's buffered events on a key.
type JoinSideView struct {
	Pipeline string     `json:"pipeline"`
	Buffered int        `json:"buffered"`
	Oldest   *time.Time `json:"oldest,omitempty"`
	Newest   *time.Time `json:"newest,omitempty"`
}

// Join returns the view of a join's key; nil for a pipeline that is not a
// join.
func (p *Pipeline) Join(s *State) *JoinView {
	if p.join == nil {
		return nil
	}
	v := &JoinView{Type: p.join.kindName(), Mode: [...]string{"", "inner", "left", "outer"}[p.join.mode]}
	if p.join.window != 0 {
		v.Window = p.join.window.String()
	}
	var js joinState
	if s.timeState != nil && s.join != nil {
		js = *s.join
	}
	v.Results, v.Unmatched = js.results, js.unmatched
	for i := range 2 {
		sv := JoinSideView{Pipeline: p.join.sides[i], Buffered: len(js.sides[i])}
		if n := len(js.sides[i]); n > 0 {
			oldest, newest := time.UnixMilli(js.sides[i][0].t).UTC(), time.UnixMilli(js.sides[i][n-1].t).UTC()
			sv.Oldest, sv.Newest = &oldest, &newest
		}
		v.Sides = append(v.Sides, sv)
	}
	return v
}

// Buffered returns the number of events a join's key buffers (0 for any
// other key).
func (s *State) Buffered() int {
	if s.timeState == nil || s.join == nil {
		return 0
	}
	return len(s.join.sides[0]) + len(s.join.sides[1])
}

// joinProto encodes a join key's buffers.
func joinProto(s *State) *keyfoldv1.JoinState {
	if s.timeState == nil || s.join == nil {
		return nil
	}
	js := s.join
	enc := func(es []joinEvent) []*keyfoldv1.JoinEvent {
		if len(es) == 0 {
			return nil
		}
		out := make([]*keyfoldv1.JoinEvent, len(es))
		for i, e := range es {
			out[i] = &keyfoldv1.JoinEvent{Id: e.id, TimeMs: e.t, FieldsJson: e.fields, Matched: e.matched, WindowsMissed: e.missed, Sealed: e.sealed}
		}
		return out
	}
	return &keyfoldv1.JoinState{Left: enc(js.sides[0]), Right: enc(js.sides[1]), Results: js.results, Unmatched: js.unmatched}
}

// restoreJoin decodes a join key's buffers; they are sorted again, so a
// snapshot that is not (written by hand, or corrupt) cannot break the
// searches.
func (p *Pipeline) restoreJoin(s *State, st *keyfoldv1.JoinState) {
	if p.join == nil || st == nil {
		return
	}
	js := &joinState{results: st.Results, unmatched: st.Unmatched}
	for i, es := range [2][]*keyfoldv1.JoinEvent{st.Left, st.Right} {
		for _, e := range es {
			js.sides[i] = append(js.sides[i], joinEvent{t: e.TimeMs, id: e.Id, fields: e.FieldsJson, matched: e.Matched, missed: e.WindowsMissed, sealed: e.Sealed})
		}
		slices.SortFunc(js.sides[i], compareJoinEvents)
		js.sides[i] = slices.CompactFunc(js.sides[i], func(a, b joinEvent) bool { return compareJoinEvents(a, b) == 0 })
	}
	s.join = js
}
