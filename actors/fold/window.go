package fold

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Event-time windows.
//
// Windows are aligned to the Unix epoch and end-exclusive: a tumbling window
// of size S holds the events with start <= time < start+S, start a multiple
// of S; a sliding window of size S and slide L starts every L and an event
// joins the S/L windows that contain it; a session holds events at most gap
// apart and ends gap after its last event (an event at a session's end
// extends it; sessions that an event bridges, or that touch, merge).
//
// A key's watermark W says that every event time below it is taken as seen.
// A window whose end is at or below W is complete: it emits its result (an
// Output) when W reaches its end. It is kept while W < end +
// allowed_lateness; an event for it meanwhile updates it and it emits again
// at once, with the next revision, which supersedes the previous one (and,
// for a session that grew, the results of the sessions it grew from). Once
// W >= end + allowed_lateness the window is gone: an event for it is late
// for its window spec (counted per spec), and an event whose windows are
// all gone is late for the key: it joins none and is counted (it still
// counts in the running aggregates).
//
// Keys never read a clock: W comes from the log (Advance), so replay emits
// the same outputs, with the same ids, as the live run did.

type windowKind uint8

const (
	tumbling windowKind = iota + 1
	sliding
	session
)

var windowKinds = map[string]windowKind{"tumbling": tumbling, "sliding": sliding, "session": session}

func (k windowKind) String() string {
	for name, v := range windowKinds {
		if v == k {
			return name
		}
	}
	return fmt.Sprintf("windowKind(%d)", uint8(k))
}

// window is a compiled WindowSpec. For tumbling windows slide == size.
type window struct {
	name             string
	kind             windowKind
	size, slide, gap int64 // ms
	aggs             []int // indices into Pipeline.aggs
	ops              []Op  // theirs (a window's aggSet is parallel to them)
}

// compileTime validates the event-time settings and the windows.
func (p *Pipeline) compileTime(spec Spec, bad func(entry, format string, args ...any)) {
	checkSpan := func(entry string, d time.Duration) {
		if d < 0 || d > MaxWindowSpan {
			bad(entry, "must be between 0 and %v (got %v)", MaxWindowSpan, d)
		}
	}
	checkSpan("out_of_orderness", spec.OutOfOrderness)
	checkSpan("allowed_lateness", spec.AllowedLateness)
	checkSpan("idle_timeout", spec.IdleTimeout)
	if spec.OutputRetention < 0 || (spec.OutputRetention > 0 && spec.OutputRetention < time.Minute) {
		bad("output_retention", "must be at least 1m (got %v)", spec.OutputRetention)
	}
	p.ooo = spec.OutOfOrderness.Milliseconds()
	p.lateness = spec.AllowedLateness.Milliseconds()
	p.idle = cmp.Or(spec.IdleTimeout, DefaultIdleTimeout).Milliseconds()
	p.retention = cmp.Or(spec.OutputRetention, DefaultOutputRetention)
	if len(spec.Windows) > 0 && spec.Time == "" {
		// Event time is ingest time: the watermark is the clock itself and
		// no event is ever out of order or late.
		if spec.OutOfOrderness != 0 {
			bad("out_of_orderness", "needs a time field (without one, event time is ingest time and never out of order)")
		}
		if spec.AllowedLateness != 0 {
			bad("allowed_lateness", "needs a time field (without one, event time is ingest time and never late)")
		}
	}
	byName := make(map[string]int, len(p.aggs))
	for i, a := range p.aggs {
		byName[a.name] = i
	}
	for _, n := range slices.Sorted(maps.Keys(spec.Windows)) {
		ws := spec.Windows[n]
		entry := "windows." + n
		checkOutputName(n, entry, bad)
		kind, ok := windowKinds[ws.Type]
		if !ok {
			bad(entry, "type must be tumbling, sliding or session (got %q)", ws.Type)
			continue
		}
		w := window{name: n, kind: kind, size: ws.Size.Milliseconds(), slide: ws.Slide.Milliseconds(), gap: ws.Gap.Milliseconds()}
		windowShape(kind, ws.Size, ws.Slide, ws.Gap, func(string) string { return entry }, "", bad)
		if kind == tumbling {
			w.slide = w.size
		}
		if ws.Aggregates == nil {
			for i := range p.aggs {
				w.aggs = append(w.aggs, i)
				w.ops = append(w.ops, p.aggs[i].op)
			}
		}
		seen := map[string]bool{}
		for _, a := range ws.Aggregates {
			i, ok := byName[a]
			switch {
			case !ok:
				bad(entry, "aggregate %q is not one of the pipeline's aggregates", a)
			case seen[a]:
				bad(entry, "aggregate %q is listed twice", a)
			default:
				w.aggs = append(w.aggs, i)
				w.ops = append(w.ops, p.aggs[i].op)
			}
			seen[a] = true
		}
		p.windows = append(p.windows, w)
	}
}

// windowShape checks the size, slide and gap of a window of the kind, as
// pipeline windows and window joins spell them: each kind takes its own and
// no other, each whole milliseconds up to MaxWindowSpan, a sliding window's
// size a multiple of its slide at most MaxSlidingRatio times. at names the
// entry a field's problem is reported under; why is added to the problem
// of a size or gap that is missing.
func windowShape(kind windowKind, size, slide, gap time.Duration, at func(field string) string, why string, bad func(entry, format string, args ...any)) {
	positive := func(field string, d time.Duration) {
		switch {
		case d <= 0 && field != "slide":
			bad(at(field), "%s %s is required and must be positive%s", kind, field, why)
		case d <= 0:
			bad(at(field), "%s %s is required and must be positive", kind, field)
		case d%time.Millisecond != 0 || d > MaxWindowSpan:
			bad(at(field), "%s must be whole milliseconds, at most %v (got %v)", field, MaxWindowSpan, d)
		}
	}
	absent := func(field string, d time.Duration) {
		if d != 0 {
			bad(at(field), "%s windows take no %s", kind, field)
		}
	}
	switch kind {
	case tumbling:
		positive("size", size)
		absent("slide", slide)
		absent("gap", gap)
	case sliding:
		positive("size", size)
		positive("slide", slide)
		absent("gap", gap)
		if size > 0 && slide > 0 {
			switch {
			case size%slide != 0:
				bad(at("slide"), "size %v must be a multiple of slide %v", size, slide)
			case size/slide > MaxSlidingRatio:
				bad(at("slide"), "size/slide is %d: at most %d (each event joins that many windows)", size/slide, MaxSlidingRatio)
			}
		}
	case session:
		positive("gap", gap)
		absent("size", size)
		absent("slide", slide)
	}
}

// checkOutputName checks the name of a window or pattern: it is part of
// output ids, whose parts are separated by '/'.
func checkOutputName(name, entry string, bad func(entry, format string, args ...any)) {
	if name == "" || strings.ContainsFunc(name, func(r rune) bool { return r == '/' || r < ' ' }) {
		bad(entry, "name must be non-empty and contain no '/' or control characters")
	}
}

// Timed reports whether the pipeline has windows, patterns or a Go handler
// (whose timers are event-time timers), and so needs a watermark.
func (p *Pipeline) Timed() bool {
	return len(p.windows) > 0 || len(p.patterns) > 0 || p.handler != nil || p.join != nil
}

// OutputRetention returns how long the pipeline's outputs are kept.
func (p *Pipeline) OutputRetention() time.Duration { return p.retention }

// EventTime returns the event time of ev, logged at processing time nowMs:
// its time field, else the ingest time.
func (p *Pipeline) EventTime(ev *Event, nowMs int64) int64 {
	if ev.timed {
		return ev.Time
	}
	return nowMs
}

// Clock is a pipeline's event-time clock where events are logged (a node, a
// key group's log). The zero value has seen nothing.
//
// The watermark is the largest event time observed less out_of_orderness.
// When no event moves that largest time for idle_timeout, the watermark
// advances with processing time from where it stood: Base when the idle
// countdown last restarted (at Arrival), plus the processing time since
// Arrival + idle_timeout. An event that does not move the largest event time
// (a duplicate, an old or late one) leaves the countdown alone; Resume
// restarts it (a restart, a take-over) without taking back any advance.
type Clock struct {
	MaxEvent int64 // the largest event time observed, Unix ms
	// Arrival is the processing time the idle countdown last restarted: of
	// the last event that moved MaxEvent, or of the last Resume, Unix ms.
	Arrival int64
	// Base is the watermark as it stood at Arrival (at least MaxEvent less
	// out_of_orderness), Unix ms: where an idle advance starts.
	Base      int64
	Watermark int64 // the last watermark returned, Unix ms
}

// Observe records an event logged at processing time nowMs. Only an event
// later than every one observed restarts the idle countdown.
func (p *Pipeline) Observe(c *Clock, ev *Event, nowMs int64) {
	t := p.EventTime(ev, nowMs)
	if c.Arrival != 0 && t <= c.MaxEvent {
		return
	}
	p.WatermarkAt(c, nowMs) // where it stands now
	c.MaxEvent = max(c.MaxEvent, t)
	c.Arrival = max(c.Arrival, nowMs)
	c.Base = p.Floor(c)
	if p.timeField != "" {
		c.Watermark = c.Base
	}
}

// Resume restarts the idle countdown at processing time nowMs from the
// last watermark returned (a node restarting, a group taken over): the time
// since is not counted, for the time a node was down is not time the source
// was quiet, and nothing is taken back.
func (p *Pipeline) Resume(c *Clock, nowMs int64) {
	if c.Arrival == 0 {
		return // nothing observed
	}
	c.Arrival = max(c.Arrival, nowMs)
	c.Base = p.Floor(c)
}

// Floor returns the watermark c resumes from (see Resume): its last
// watermark, or more if its largest event or its Base says so.
func (p *Pipeline) Floor(c *Clock) int64 {
	return max(c.Watermark, c.Base, c.MaxEvent-p.ooo)
}

// IdleAdvances reports whether the pipeline's watermark advances with
// processing time when input is idle: it has a time field (without one,
// event time is ingest time and the watermark is the clock itself).
func (p *Pipeline) IdleAdvances() bool { return p.timeField != "" }

// WatermarkAt returns the pipeline's watermark at processing time nowMs and
// records it: the largest event time observed less out_of_orderness; once
// that largest time has not moved for idle_timeout, it advances with
// processing time from where it stood (see Clock), so quiet keys still close
// their windows. Without a time field event time is ingest time and the
// watermark is nowMs. It never goes back.
func (p *Pipeline) WatermarkAt(c *Clock, nowMs int64) int64 {
	w := nowMs
	if p.timeField != "" {
		if c.Arrival == 0 {
			return c.Watermark // nothing observed
		}
		w = max(c.Base, c.MaxEvent-p.ooo)
		if idle := nowMs - c.Arrival - p.idle; idle > 0 {
			w += idle
		}
	}
	c.Watermark = max(c.Watermark, w)
	return c.Watermark
}

// win is one window of a key.
type win struct {
	spec       int // index into Pipeline.windows
	start, end int64
	emitted    uint32 // results emitted; the next one's revision
	count      uint64
	lastSeq    uint64
	aggs       aggSet // parallel to the spec's aggs (window.ops)
	// superseded are the last results of the sessions this one grew from,
	// when they are not just its own previous revision (see shown).
	superseded []resultRef
}

// resultRef names one result of a window of the key.
type resultRef struct {
	start, end int64
	revision   uint32
}

// shown returns the results the window's next result supersedes: those it
// grew from, else its own previous revision (none before its first).
func (x *win) shown() []resultRef {
	if len(x.superseded) > 0 {
		return x.superseded
	}
	if x.emitted == 0 {
		return nil
	}
	return []resultRef{{x.start, x.end, x.emitted - 1}}
}

// assign adds an event of time t to its windows; it reports whether it
// joined any (if not, it is late). For each window spec it missed a window
// of (gone: the watermark is at or past its end + allowed_lateness), it
// counts the event late for that spec.
func (p *Pipeline) assign(s *State, ev *Event, t int64) bool {
	joined := false
	for wi := range p.windows {
		w := &p.windows[wi]
		if w.kind == session {
			if p.joinSession(s, wi, ev, t) {
				joined = true
			} else {
				s.lateFor(wi, len(p.windows))
			}
			continue
		}
		for start := t - t%w.slide; start > t-w.size; start -= w.slide {
			end := start + w.size
			if end+p.lateness <= s.wm {
				s.lateFor(wi, len(p.windows))
				break // this window and the earlier ones are gone
			}
			i := s.window(wi, start, end)
			p.addTo(s, i, ev)
			joined = true
			if end <= s.wm { // complete already: a late update
				p.emit(s, ev.Key, i)
			}
		}
	}
	return joined
}

// lateFor counts a late event for window spec wi of n.
func (s *State) lateFor(wi, n int) {
	if len(s.lateWin) < n {
		s.lateWin = append(s.lateWin, make([]uint64, n-len(s.lateWin))...)
	}
	s.lateWin[wi]++
}

// WindowNames returns the names of the pipeline's windows, in the order
// LateIn numbers them.
func (p *Pipeline) WindowNames() []string {
	names := make([]string, len(p.windows))
	for i, w := range p.windows {
		names[i] = w.name
	}
	return names
}

// LateIn returns the number of events too late for at least one window
// they fell in of the pipeline's window i (see WindowNames).
func (s *State) LateIn(i int) uint64 {
	if s.timeState != nil && i < len(s.lateWin) {
		return s.lateWin[i]
	}
	return 0
}

// LateByWindow returns LateIn by window name, every window included, nil
// for a pipeline without windows.
func (p *Pipeline) LateByWindow(s *State) map[string]uint64 {
	if len(p.windows) == 0 {
		return nil
	}
	out := make(map[string]uint64, len(p.windows))
	for i, w := range p.windows {
		out[w.name] = s.LateIn(i)
	}
	return out
}

// joinSession adds an event to the session it starts, extends or bridges.
func (p *Pipeline) joinSession(s *State, wi int, ev *Event, t int64) bool {
	gap := p.windows[wi].gap
	start, end := t, t+gap
	lo, hi := s.specRange(wi)
	var merge []int
	for i := lo; i < hi; i++ {
		// Sessions of a spec never overlap or touch, so those that meet the
		// event's own [t, t+gap) are all that merge.
		if x := &s.wins[i]; x.start <= t+gap && t <= x.end {
			merge = append(merge, i)
			start, end = min(start, x.start), max(end, x.end)
		}
	}
	if end+p.lateness <= s.wm {
		return false // the session it would join is gone
	}
	var i int
	if len(merge) == 0 {
		i = s.window(wi, start, end)
	} else {
		// The results shown so far of the sessions it grows from: the next
		// result, under the new bounds' id, supersedes them all.
		var shown []resultRef
		for _, j := range merge {
			shown = append(shown, s.wins[j].shown()...)
		}
		i = merge[0]
		for _, j := range merge[1:] {
			p.mergeWindows(&s.wins[i], &s.wins[j])
		}
		for k := len(merge) - 1; k > 0; k-- {
			s.wins = slices.Delete(s.wins, merge[k], merge[k]+1)
		}
		x := &s.wins[i]
		x.start, x.end = start, end
		x.superseded = nil
		if len(shown) != 1 || shown[0] != (resultRef{start, end, x.emitted - 1}) {
			x.superseded = shown // not just its own previous revision
		}
	}
	p.addTo(s, i, ev)
	if end <= s.wm {
		p.emit(s, ev.Key, i)
	}
	return true
}

// specRange returns the index range of the windows of spec wi.
func (s *State) specRange(wi int) (lo, hi int) {
	lo, _ = slices.BinarySearchFunc(s.wins, wi, func(x win, spec int) int { return cmp.Compare(x.spec, spec) })
	hi = lo
	for hi < len(s.wins) && s.wins[hi].spec == wi {
		hi++
	}
	return lo, hi
}

// window returns the index of the key's window (wi, start), adding it.
func (s *State) window(wi int, start, end int64) int {
	i, found := slices.BinarySearchFunc(s.wins, win{spec: wi, start: start}, func(x, y win) int {
		return cmp.Or(cmp.Compare(x.spec, y.spec), cmp.Compare(x.start, y.start))
	})
	if !found {
		s.wins = slices.Insert(s.wins, i, win{spec: wi, start: start, end: end})
	}
	return i
}

func (p *Pipeline) addTo(s *State, i int, ev *Event) {
	x := &s.wins[i]
	w := &p.windows[x.spec]
	for j, ai := range w.aggs {
		x.aggs.add(w.ops, j, &ev.contrib[ai])
	}
	x.count++
	x.lastSeq = s.seq
}

// mergeWindows folds session src into dst.
func (p *Pipeline) mergeWindows(dst, src *win) {
	ops := p.windows[dst.spec].ops
	for j := range ops {
		dst.aggs.merge(ops, j, &src.aggs, src.lastSeq > dst.lastSeq)
	}
	dst.count += src.count
	dst.emitted = max(dst.emitted, src.emitted)
	dst.lastSeq = max(dst.lastSeq, src.lastSeq)
}

// emit records the result of window i.
func (p *Pipeline) emit(s *State, key string, i int) {
	x := &s.wins[i]
	w := &p.windows[x.spec]
	values, err := json.Marshal(p.windowValues(w, x))
	if err != nil { // cannot happen: the values are numbers and JSON
		panic(fmt.Sprintf("fold: encode window values: %v", err))
	}
	var supersedes []string
	for _, r := range x.shown() {
		supersedes = append(supersedes, OutputID(p.name, key, w.name, r.start, r.end, r.revision))
	}
	s.out = append(s.out, &keyfoldv1.Output{
		Id:          OutputID(p.name, key, w.name, x.start, x.end, x.emitted),
		Pipeline:    p.name,
		Key:         key,
		Kind:        w.kind.String(),
		Name:        w.name,
		StartMs:     x.start,
		EndMs:       x.end,
		Revision:    x.emitted,
		Count:       x.count,
		ValuesJson:  values,
		WatermarkMs: s.wm,
		Supersedes:  supersedes,
	})
	x.emitted++
	x.superseded = nil
}

// OutputID is the stable id of a window result: the same window of the same
// key emitted again (a replay) gets the same id; a later revision another.
func OutputID(pipeline, key, name string, start, end int64, revision uint32) string {
	return fmt.Sprintf("%s/%s/%s/%d-%d/%d", pipeline, url.PathEscape(key), name, start, end, revision)
}

func (p *Pipeline) windowValues(w *window, x *win) map[string]any {
	values := make(map[string]any, len(w.aggs))
	for j, ai := range w.aggs {
		values[p.aggs[ai].name] = aggValue(w.ops, &x.aggs, j)
	}
	return values
}

// Advance moves the key's watermark to wm (if later than its own), emitting
// the results of the windows whose end it passes, in end order, and
// dropping the windows past allowed lateness; then it fires the Go
// handler's timers due (handler.go), even if wm is not later.
func (p *Pipeline) Advance(s *State, key string, wm int64) {
	if p.handler != nil {
		defer p.fireTimers(s, key)
	}
	if !p.Timed() || wm <= s.timed().wm {
		return
	}
	s.version++
	old := s.wm
	s.wm = wm
	p.runPatterns(s, key, wm)
	p.advanceJoin(s, key, old) // join.go
	var due []int
	for i := range s.wins {
		if e := s.wins[i].end; e > old && e <= wm {
			due = append(due, i)
		}
	}
	slices.SortFunc(due, func(a, b int) int {
		x, y := &s.wins[a], &s.wins[b]
		return cmp.Or(cmp.Compare(x.end, y.end), cmp.Compare(x.spec, y.spec), cmp.Compare(x.start, y.start))
	})
	for _, i := range due {
		p.emit(s, key, i)
	}
	s.wins = slices.DeleteFunc(s.wins, func(x win) bool { return x.end+p.lateness <= wm })
}

// NextTimer returns the watermark at which the key next has something to do
// (a window to emit or to drop, waiting events for its patterns, an
// absence's deadline), 0 if none: Advance to it or beyond.
func (p *Pipeline) NextTimer(s *State) int64 {
	if s.timeState == nil {
		return 0
	}
	next := p.patternTimer(s)
	if t := p.joinTimer(s); t != 0 && (next == 0 || t < next) {
		next = t // join.go
	}
	if t := s.h.nextTimer(false); t != 0 && (next == 0 || t < next) {
		next = t // the Go handler's (handler.go)
	}
	for i := range s.wins {
		d := s.wins[i].end
		if d <= s.wm {
			d += p.lateness
		}
		if next == 0 || d < next {
			next = d
		}
	}
	return next
}

// Watermark returns the key's watermark (0 before any).
func (s *State) Watermark() int64 {
	if s.timeState == nil {
		return 0
	}
	return s.wm
}

// Late returns the number of events too late for every window they belonged
// to.
func (s *State) Late() uint64 {
	if s.timeState == nil {
		return 0
	}
	return s.late
}

// Outputs returns the results emitted and not yet taken, oldest first.
func (s *State) Outputs() []*keyfoldv1.Output {
	if s.timeState == nil {
		return nil
	}
	return s.out
}

// TakeOutputs returns the results emitted and not yet taken, oldest first,
// and forgets them: the caller stores them.
func (s *State) TakeOutputs() []*keyfoldv1.Output {
	if s.timeState == nil {
		return nil
	}
	outs := s.out
	s.out = nil
	return outs
}

// WindowView is one window of a key, as queries show it.
type WindowView struct {
	Name    string         `json:"name"`
	Kind    string         `json:"kind"`
	Start   time.Time      `json:"start"`
	End     time.Time      `json:"end"`
	Count   uint64         `json:"count"`
	Emitted uint32         `json:"emitted"` // results emitted so far
	Values  map[string]any `json:"values"`
}

// Windows returns the key's windows ordered by name then start: the open
// ones and the emitted ones still kept for allowed lateness.
func (p *Pipeline) Windows(s *State) []WindowView {
	if s.timeState == nil {
		return []WindowView{}
	}
	views := make([]WindowView, len(s.wins))
	for i := range s.wins {
		x := &s.wins[i]
		w := &p.windows[x.spec]
		views[i] = WindowView{
			Name: w.name, Kind: w.kind.String(),
			Start: time.UnixMilli(x.start).UTC(), End: time.UnixMilli(x.end).UTC(),
			Count: x.count, Emitted: x.emitted, Values: p.windowValues(w, x),
		}
	}
	return views
}

// windowsProto encodes the key's windows.
func (p *Pipeline) windowsProto(s *State) ([]*keyfoldv1.WindowState, error) {
	if s.timeState == nil {
		return nil, nil
	}
	out := make([]*keyfoldv1.WindowState, 0, len(s.wins))
	for i := range s.wins {
		x := &s.wins[i]
		w := &p.windows[x.spec]
		ws := &keyfoldv1.WindowState{Name: w.name, StartMs: x.start, EndMs: x.end, Emitted: x.emitted, Count: x.count, LastSeq: x.lastSeq}
		for _, r := range x.superseded {
			ws.Superseded = append(ws.Superseded, &keyfoldv1.ResultRef{StartMs: r.start, EndMs: r.end, Revision: r.revision})
		}
		for j, ai := range w.aggs {
			as, err := aggProto(&p.aggs[ai], w.ops, &x.aggs, j)
			if err != nil {
				return nil, fmt.Errorf("fold: window %q: %w", w.name, err)
			}
			if as != nil {
				ws.Aggregates = append(ws.Aggregates, as)
			}
		}
		out = append(out, ws)
	}
	return out, nil
}

// restoreWindows decodes stored windows. Windows of names the pipeline no
// longer has, and tumbling or sliding windows whose size or slide changed,
// are dropped (without emitting); aggregates are matched by name as the
// running ones are.
func (p *Pipeline) restoreWindows(s *State, stored []*keyfoldv1.WindowState) error {
	byName := make(map[string]int, len(p.windows))
	for i, w := range p.windows {
		byName[w.name] = i
	}
	for _, ws := range stored {
		wi, ok := byName[ws.Name]
		if !ok {
			continue
		}
		w := &p.windows[wi]
		if w.kind != session && (ws.EndMs-ws.StartMs != w.size || ws.StartMs%w.slide != 0) {
			continue // its size or slide changed: a window of the old shape cannot take events
		}
		x := win{spec: wi, start: ws.StartMs, end: ws.EndMs, emitted: ws.Emitted, count: ws.Count, lastSeq: ws.LastSeq, aggs: makeAggSet(len(w.ops), 0)}
		for _, r := range ws.Superseded {
			x.superseded = append(x.superseded, resultRef{r.StartMs, r.EndMs, r.Revision})
		}
		for j, ai := range w.aggs {
			if err := restoreAgg(&p.aggs[ai], ws.Aggregates, w.ops, &x.aggs, j); err != nil {
				return fmt.Errorf("fold: window %q: %w", w.name, err)
			}
		}
		s.wins = append(s.wins, x)
	}
	slices.SortFunc(s.wins, func(x, y win) int {
		return cmp.Or(cmp.Compare(x.spec, y.spec), cmp.Compare(x.start, y.start))
	})
	return nil
}
