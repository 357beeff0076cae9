package fold

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Patterns: threshold (at least N matching events within T), sequence (A then
// B then … within T) and absence (A not followed by B within T), per key, in
// event time.
//
// A pattern sees a key's events in event-time order, as Flink's CEP does:
// an event waits in the key's state until the watermark passes its time, and
// is then processed with the others in (time, arrival) order, so events out
// of order within out_of_orderness are matched as if they had come in order.
// An event behind the key's watermark when it arrives is late for patterns:
// they skip it (it is counted in late). An absence fires when the watermark
// passes A's time + T: by then every event before that instant has been
// processed. Matches are outputs, with ids numbered by match.

// MaxPatternSteps bounds the filters of all of a pipeline's patterns: an
// event's matches are one 64-bit mask.
const MaxPatternSteps = 64

type patternKind uint8

const (
	threshold patternKind = iota + 1
	sequence
	absence
)

func (k patternKind) String() string {
	switch k {
	case threshold:
		return "threshold"
	case sequence:
		return "sequence"
	case absence:
		return "absence"
	}
	return fmt.Sprintf("patternKind(%d)", uint8(k))
}

// PatternSpec is one pattern of each key. Exactly one form applies:
// threshold (Where and Count), sequence (Sequence), or absence (After and
// Absent); all take Within.
type PatternSpec struct {
	// Where and Count: at least Count events matching Where within Within.
	// After a match the count starts again from zero.
	Where string `yaml:"where"`
	Count int    `yaml:"count"`
	// Sequence: an event matching each filter in turn, the first to the
	// last within Within.
	Sequence []string `yaml:"sequence"`
	// After and Absent: an event matching After not followed by one
	// matching Absent within Within.
	After  string `yaml:"after"`
	Absent string `yaml:"absent"`
	// Within bounds the span of a match. Required.
	Within time.Duration `yaml:"within"`
}

// pattern is a compiled PatternSpec.
type pattern struct {
	name   string
	kind   patternKind
	within int64 // ms
	count  int   // threshold
	steps  int   // its filters: bits first..first+steps-1 of an event's mask
	first  int
}

// compilePatterns validates the patterns; their filters become p.steps.
func (p *Pipeline) compilePatterns(spec Spec, bad func(entry, format string, args ...any)) {
	for _, n := range slices.Sorted(maps.Keys(spec.Patterns)) {
		ps := spec.Patterns[n]
		entry := "patterns." + n
		checkOutputName(n, entry, bad)
		if _, clash := spec.Windows[n]; clash {
			bad(entry, "a window has the same name (outputs are told apart by name)")
		}
		pt := pattern{name: n, within: ps.Within.Milliseconds(), count: ps.Count, first: len(p.steps)}
		var filters []string
		forms := 0
		if ps.Where != "" || ps.Count != 0 {
			forms++
			pt.kind, filters = threshold, []string{ps.Where}
			if ps.Where == "" {
				bad(entry, "a threshold pattern needs where (the events it counts)")
			}
			if ps.Count < 1 {
				bad(entry, "a threshold pattern needs count >= 1 (got %d)", ps.Count)
			}
		}
		if ps.Sequence != nil {
			forms++
			pt.kind, filters = sequence, ps.Sequence
			if len(ps.Sequence) < 2 {
				bad(entry, "a sequence needs at least two filters (got %d)", len(ps.Sequence))
			}
		}
		if ps.After != "" || ps.Absent != "" {
			forms++
			pt.kind, filters = absence, []string{ps.After, ps.Absent}
			if ps.After == "" || ps.Absent == "" {
				bad(entry, "an absence pattern needs both after and absent")
			}
		}
		if forms != 1 {
			bad(entry, "give exactly one of: where and count (threshold), sequence, or after and absent (absence)")
			continue
		}
		switch {
		case ps.Within <= 0:
			bad(entry, "within is required and must be positive")
		case ps.Within%time.Millisecond != 0 || ps.Within > MaxWindowSpan:
			bad(entry, "within must be whole milliseconds, at most %v (got %v)", MaxWindowSpan, ps.Within)
		}
		for i, src := range filters {
			w, err := compileWhere(src)
			if err != nil && src != "" {
				bad(entry, "filter %d %q does not compile: %v", i+1, src, firstLine(err))
			}
			p.steps = append(p.steps, w)
		}
		pt.steps = len(filters)
		p.patterns = append(p.patterns, pt)
	}
	if len(p.steps) > MaxPatternSteps {
		bad("patterns", "at most %d filters in all (got %d)", MaxPatternSteps, len(p.steps))
	}
	if len(p.patterns) > 0 && spec.Time == "" && spec.OutOfOrderness != 0 {
		bad("out_of_orderness", "needs a time field (without one, event time is ingest time and never out of order)")
	}
}

// stepMask evaluates the pattern filters on an event: bit i is set when
// filter i matches.
func (p *Pipeline) stepMask(f *fields, env map[string]any) (uint64, error) {
	var mask uint64
	for i, w := range p.steps {
		if w == nil {
			continue
		}
		ok, err := w.eval(f, env)
		if err != nil {
			return 0, &FieldError{Field: "patterns.where", Reason: err.Error()}
		}
		if ok {
			mask |= 1 << i
		}
	}
	return mask, nil
}

// waiting is an event kept until the watermark passes its time.
type waiting struct {
	t, seq int64
	mask   uint64
}

// patState is one pattern's progress on a key.
type patState struct {
	times   []int64 // threshold: the matching events of the current count
	starts  []int64 // sequence: [i] the start of the latest run waiting for step i (-1: none)
	since   int64   // absence: the time of the unresolved After event (-1: none)
	matches uint64
}

func (p *Pipeline) patStates(s *State) []patState {
	if len(s.pats) < len(p.patterns) {
		for _, pt := range p.patterns[len(s.pats):] {
			ps := patState{since: -1}
			if pt.kind == sequence {
				ps.starts = slices.Repeat([]int64{-1}, pt.steps)
			}
			s.pats = append(s.pats, ps)
		}
	}
	return s.pats
}

// hold keeps an event for the patterns until the watermark passes it; it
// reports false if the event is already behind the watermark (late).
func (p *Pipeline) hold(s *State, ev *Event, t int64) bool {
	if ev.steps == 0 {
		return true
	}
	if t < s.wm {
		return false
	}
	w := waiting{t: t, seq: int64(s.seq), mask: ev.steps}
	i, _ := slices.BinarySearchFunc(s.wait, w, func(a, b waiting) int { return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.seq, b.seq)) })
	s.wait = slices.Insert(s.wait, i, w)
	return true
}

// runPatterns processes the waiting events below wm in order, firing the
// absences whose deadline comes first, then those at or below wm.
func (p *Pipeline) runPatterns(s *State, key string, wm int64) {
	if len(p.patterns) == 0 {
		return
	}
	pats := p.patStates(s)
	n := 0
	for n < len(s.wait) && s.wait[n].t < wm {
		e := s.wait[n]
		p.fireAbsences(s, key, pats, e.t)
		for i := range p.patterns {
			p.step(s, key, i, &pats[i], e)
		}
		n++
	}
	s.wait = slices.Delete(s.wait, 0, n)
	p.fireAbsences(s, key, pats, wm)
}

// fireAbsences emits the absences whose deadline is at or below t.
func (p *Pipeline) fireAbsences(s *State, key string, pats []patState, t int64) {
	for i := range p.patterns {
		pt, ps := &p.patterns[i], &pats[i]
		if pt.kind == absence && ps.since >= 0 && ps.since+pt.within <= t {
			p.match(s, key, pt, ps, ps.since, ps.since+pt.within, 1)
			ps.since = -1
		}
	}
}

// step feeds one event to one pattern.
func (p *Pipeline) step(s *State, key string, i int, ps *patState, e waiting) {
	pt := &p.patterns[i]
	hit := func(step int) bool { return e.mask&(1<<(pt.first+step)) != 0 }
	switch pt.kind {
	case threshold:
		if !hit(0) {
			return
		}
		ps.times = append(ps.times, e.t)
		k := 0
		for k < len(ps.times) && e.t-ps.times[k] >= pt.within {
			k++
		}
		ps.times = slices.Delete(ps.times, 0, k)
		if len(ps.times) >= pt.count {
			p.match(s, key, pt, ps, ps.times[0], e.t, len(ps.times))
			ps.times = nil // re-armed: the next match needs count new events
		}
	case sequence:
		for j := range ps.starts {
			if ps.starts[j] >= 0 && e.t-ps.starts[j] >= pt.within {
				ps.starts[j] = -1
			}
		}
		// From the last step down, so one event advances a run one step.
		for j := pt.steps - 1; j >= 1; j-- {
			if ps.starts[j] < 0 || !hit(j) {
				continue
			}
			if j == pt.steps-1 {
				p.match(s, key, pt, ps, ps.starts[j], e.t, pt.steps)
			} else {
				ps.starts[j+1] = max(ps.starts[j+1], ps.starts[j])
			}
			ps.starts[j] = -1
		}
		if hit(0) {
			ps.starts[1] = max(ps.starts[1], e.t)
		}
	case absence:
		if ps.since >= 0 && hit(1) && e.t-ps.since < pt.within {
			ps.since = -1 // resolved: B came in time
		}
		if ps.since < 0 && hit(0) {
			ps.since = e.t
		}
	}
}

// match emits one match of a pattern, spanning [start, end] in event time.
func (p *Pipeline) match(s *State, key string, pt *pattern, ps *patState, start, end int64, events int) {
	s.out = append(s.out, &keyfoldv1.Output{
		Id:          OutputID(p.name, key, pt.name, start, end, uint32(ps.matches)),
		Pipeline:    p.name,
		Key:         key,
		Kind:        pt.kind.String(),
		Name:        pt.name,
		StartMs:     start,
		EndMs:       end,
		Count:       uint64(events),
		ValuesJson:  []byte("{}"),
		WatermarkMs: s.wm,
	})
	ps.matches++
}

// patternTimer is when the key's patterns next need the watermark: just
// past its oldest waiting event, or an absence's deadline (0: never).
func (p *Pipeline) patternTimer(s *State) int64 {
	var next int64
	if len(s.wait) > 0 {
		next = s.wait[0].t + 1
	}
	for i := range s.pats {
		if pt := &p.patterns[i]; pt.kind == absence && s.pats[i].since >= 0 {
			if d := s.pats[i].since + pt.within; next == 0 || d < next {
				next = d
			}
		}
	}
	return next
}

// PatternView is one pattern's progress on a key, as queries show it.
type PatternView struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Matches uint64 `json:"matches"`
	// Threshold: the matching events counted so far, the first one's time.
	Count int        `json:"count,omitempty"`
	Since *time.Time `json:"since,omitempty"`
	// Sequence: the step the most advanced run waits for (1-based: 2 = the
	// second filter), and when that run started. Absence: when the unanswered
	// After event happened (Since) and the deadline.
	Waiting  int        `json:"waiting_for_step,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`
}

// Patterns returns each pattern's progress on the key, by name.
func (p *Pipeline) Patterns(s *State) []PatternView {
	var mine []patState
	if s.timeState != nil {
		mine = slices.Clone(s.pats)
	}
	pats := p.patStates(&State{timeState: &timeState{pats: mine}})
	views := make([]PatternView, len(p.patterns))
	at := func(ms int64) *time.Time { t := time.UnixMilli(ms).UTC(); return &t }
	for i, pt := range p.patterns {
		ps := &pats[i]
		v := PatternView{Name: pt.name, Kind: pt.kind.String(), Matches: ps.matches}
		switch pt.kind {
		case threshold:
			if v.Count = len(ps.times); v.Count > 0 {
				v.Since = at(ps.times[0])
			}
		case sequence:
			for j := len(ps.starts) - 1; j >= 1; j-- {
				if ps.starts[j] >= 0 {
					v.Waiting, v.Since = j+1, at(ps.starts[j])
					break
				}
			}
		case absence:
			if ps.since >= 0 {
				v.Since, v.Deadline = at(ps.since), at(ps.since+pt.within)
			}
		}
		views[i] = v
	}
	return views
}

// patternsProto encodes the key's waiting events and pattern progress.
func (p *Pipeline) patternsProto(s *State, ks *keyfoldv1.KeyState) {
	if s.timeState == nil {
		return
	}
	for _, w := range s.wait {
		ks.Waiting = append(ks.Waiting, &keyfoldv1.WaitingEvent{TimeMs: w.t, Seq: w.seq, Steps: p.stepNames(w.mask)})
	}
	for i := range s.pats {
		ps := &s.pats[i]
		ks.Patterns = append(ks.Patterns, &keyfoldv1.PatternState{
			Name: p.patterns[i].name, Kind: p.patterns[i].kind.String(), Times: ps.times, Starts: ps.starts,
			Since: ps.since, Matches: ps.matches,
		})
	}
}

// stepNames names the filters a mask holds ("name/0", …), so a stored
// waiting event means the same after the pipeline's patterns change.
func (p *Pipeline) stepNames(mask uint64) []string {
	var names []string
	for _, pt := range p.patterns {
		for j := range pt.steps {
			if mask&(1<<(pt.first+j)) != 0 {
				names = append(names, fmt.Sprintf("%s/%d", pt.name, j))
			}
		}
	}
	return names
}

// restorePatterns decodes stored waiting events and pattern progress;
// patterns of names the pipeline no longer has, or whose kind or number of
// steps changed, start afresh.
func (p *Pipeline) restorePatterns(s *State, ks *keyfoldv1.KeyState) {
	if len(p.patterns) == 0 || (ks.Seq == 0 && len(ks.Patterns) == 0) {
		return // as a state that never applied an event: no progress yet
	}
	bits := map[string]uint64{}
	byName := map[string]int{}
	for i, pt := range p.patterns {
		byName[pt.name] = i
		for j := range pt.steps {
			bits[fmt.Sprintf("%s/%d", pt.name, j)] = 1 << (pt.first + j)
		}
	}
	for _, w := range ks.Waiting {
		var mask uint64
		for _, n := range w.Steps {
			mask |= bits[n]
		}
		if mask != 0 {
			s.wait = append(s.wait, waiting{t: w.TimeMs, seq: w.Seq, mask: mask})
		}
	}
	pats := p.patStates(s)
	for _, st := range ks.Patterns {
		i, ok := byName[st.Name]
		if !ok {
			continue
		}
		pt := &p.patterns[i]
		if st.Kind != pt.kind.String() || (pt.kind == sequence && len(st.Starts) != pt.steps) {
			continue
		}
		pats[i] = patState{times: st.Times, starts: st.Starts, since: st.Since, matches: st.Matches}
		if pt.kind != sequence {
			pats[i].starts = nil
		}
		if pt.kind != absence {
			pats[i].since = -1
		}
	}
}
