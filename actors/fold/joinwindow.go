package fold

import "slices"

// Tumbling and sliding window joins.
//
// The windows are pipeline windows': a window of size S starts at every
// multiple of the slide L (L = S for tumbling) and holds the event times
// start <= t < start+S, so an event is in S/L windows. A left and a right
// event match once in each window they are both in: a sliding window's
// match names its window (the id ends in "/start-end"), so one pair in two
// overlapping windows is two results, each stable. A window closes, and
// its matches are emitted, when the key's watermark W reaches its end; it
// is gone when W reaches its end plus allowed_lateness. An event joins
// those of its windows that are not gone when it comes (joined with the
// other side at once in those that closed), is late when none is left, and
// is buffered until its last window is gone: then, if it matched nothing
// in any window, a left or outer join emits it alone.

// joinWindow is the window of a sliding window join's match, Unix ms.
type joinWindow struct{ start, end int64 }

// lastStart is the start of the last window holding time t.
func (j *join) lastStart(t int64) int64 { return t - mod(t, j.slide) }

// firstJoined is the start of the first window e joined: of those holding
// it, the first after the ones it missed.
func (j *join) firstJoined(e *joinEvent) int64 {
	return j.lastStart(e.t) - j.size + j.slide + int64(e.missed)*j.slide
}

// joined reports whether e joined the window starting at start.
func (j *join) joined(e *joinEvent, start int64) bool {
	return start >= j.firstJoined(e) && start <= j.lastStart(e.t)
}

// missed returns how many of the windows holding time t, the earliest,
// are gone when their end is at or below limit (W - allowed_lateness).
func (j *join) missed(t, limit int64) uint32 {
	var n uint32
	for start := j.lastStart(t) - j.size + j.slide; start <= j.lastStart(t) && start+j.size <= limit; start += j.slide {
		n++
	}
	return n
}

// matchWindow returns the match window of the one starting at start: nil for a
// tumbling join, whose ids and results do not name it (one pair, one
// window).
func (j *join) matchWindow(start int64) *joinWindow {
	if j.window != sliding {
		return nil
	}
	return &joinWindow{start, start + j.size}
}

// windowArrive joins the event just buffered at index i of side with the
// other side in each of its windows that closed already (the others join
// it when they close).
func (p *Pipeline) windowArrive(s *State, key string, side, i int) {
	js, j := s.join, p.join
	e := &js.sides[side][i]
	for start := j.firstJoined(e); start <= j.lastStart(e.t) && start+j.size <= s.wm; start += j.slide {
		other := js.sides[1-side]
		k, _ := slices.BinarySearchFunc(other, joinEvent{t: start}, compareJoinEvents)
		for ; k < len(other) && other[k].t < start+j.size; k++ {
			if !j.joined(&other[k], start) {
				continue
			}
			other[k].matched, e.matched = true, true
			if side == 0 {
				p.emitJoin(s, key, e, &other[k], j.matchWindow(start))
			} else {
				p.emitJoin(s, key, &other[k], e, j.matchWindow(start))
			}
		}
	}
}

// closeWindows joins the events of the windows whose end the watermark
// passed since old, in end order: every left event with every right one
// that joined the window.
func (p *Pipeline) closeWindows(s *State, key string, old int64) {
	js, j := s.join, p.join
	left, right := js.sides[0], js.sides[1]
	// The windows closing, from the left events' (a window of right events
	// alone closes to nothing): those holding a time after old - size.
	var starts []int64
	a, _ := slices.BinarySearchFunc(left, joinEvent{t: old - j.size + 1}, compareJoinEvents)
	for k := a; k < len(left) && left[k].t < s.wm; k++ {
		for start := j.firstJoined(&left[k]); start <= j.lastStart(left[k].t); start += j.slide {
			if end := start + j.size; end > old && end <= s.wm {
				starts = append(starts, start)
			}
		}
	}
	slices.Sort(starts)
	for _, start := range slices.Compact(starts) {
		l, _ := slices.BinarySearchFunc(left, joinEvent{t: start}, compareJoinEvents)
		r, _ := slices.BinarySearchFunc(right, joinEvent{t: start}, compareJoinEvents)
		for k := l; k < len(left) && left[k].t < start+j.size; k++ {
			if !j.joined(&left[k], start) {
				continue
			}
			for q := r; q < len(right) && right[q].t < start+j.size; q++ {
				if j.joined(&right[q], start) {
					left[k].matched, right[q].matched = true, true
					p.emitJoin(s, key, &left[k], &right[q], j.matchWindow(start))
				}
			}
		}
	}
}

// nextWindowEnd returns the end of the first window of left events still
// to close (after the watermark), 0 if none.
func (p *Pipeline) nextWindowEnd(s *State) int64 {
	j, left := p.join, s.join.sides[0]
	from := s.wm - j.size + 1 // a window ending after wm starts here or later
	from += mod(-from, j.slide)
	var next int64
	k, _ := slices.BinarySearchFunc(left, joinEvent{t: from}, compareJoinEvents)
	for ; k < len(left) && (next == 0 || left[k].t < next); k++ {
		// Its windows end after its time: none before next once it is past.
		if start := max(j.firstJoined(&left[k]), from); start <= j.lastStart(left[k].t) && (next == 0 || start+j.size < next) {
			next = start + j.size
		}
	}
	return next
}
