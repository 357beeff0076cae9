package fold

import (
	"math"
	"slices"
)

// Session window joins.
//
// A session of a key is a run of its buffered events, both sides', whose
// times follow each other within gap (a difference of exactly gap is
// within: such sessions touch, and merge). A left and a right event in the
// same session match, once: a session only ever grows, so a pair in one
// session stays in it, and its id is the interval join's (the two events),
// its content the two events, never the session's bounds (they may grow).
//
// A session [first, last] closes when the key's watermark W passes
// last + gap (W > last + gap: an event at last + gap would still be in it),
// and then its matches are emitted. An event is late, as for the interval
// join, when its time is more than allowed_lateness behind W; one on time
// that lands in a closed session (or bridges two) is joined at once with
// the session's other side (and the bridged sessions with each other). A
// session is gone, and its events leave, when W passes last + gap +
// allowed_lateness: an event still on time is then more than gap after
// its last event, so no event to come can join it; only then is an event
// of it that matched nothing emitted alone (left and outer joins).
//
// Which pairs were emitted is told by the events' sealed flags: a closed
// session's events are all sealed, and every pair of sealed events of one
// session was emitted, no pair with an unsealed one. An event that opens a
// closed session again (after its last, within gap, with its own end
// still ahead of W) joins it unsealed; the session's pairs with it are
// emitted when the session closes again.

// span is a session: the first and last times of its events, Unix ms.
type span struct{ first, last int64 }

// sessions returns the key's sessions in time order.
func (p *Pipeline) sessions(js *joinState) []span {
	var out []span
	l, r := js.sides[0], js.sides[1]
	for i, k := 0, 0; i < len(l) || k < len(r); {
		var t int64
		if k == len(r) || i < len(l) && l[i].t <= r[k].t {
			t, i = l[i].t, i+1
		} else {
			t, k = r[k].t, k+1
		}
		if n := len(out); n > 0 && t-out[n-1].last <= p.join.gap {
			out[n-1].last = t
		} else {
			out = append(out, span{t, t})
		}
	}
	return out
}

// within returns the index range of side's events in session sp.
func (js *joinState) within(side int, sp span) (int, int) {
	es := js.sides[side]
	a, _ := slices.BinarySearchFunc(es, joinEvent{t: sp.first}, compareJoinEvents)
	b, _ := slices.BinarySearchFunc(es, joinEvent{t: sp.last + 1}, compareJoinEvents)
	return a, b
}

// sessionArrive buffers an event on time, at index i of side; if the
// session it joins is closed, it emits the session's new pairs: those of
// the event, and those across the two sessions it bridges, if it does.
func (p *Pipeline) sessionArrive(s *State, key string, side, i int, e joinEvent) {
	js, gap := s.join, p.join.gap
	merged := span{e.t, e.t}
	var parts []span // the sessions it joins: at most one each side of it
	for _, sp := range p.sessions(js) {
		if sp.first-gap <= e.t && e.t <= sp.last+gap {
			parts = append(parts, sp)
			merged = span{min(merged.first, sp.first), max(merged.last, sp.last)}
		}
	}
	e.sealed = merged.last+gap < s.wm
	js.sides[side] = slices.Insert(js.sides[side], i, e)
	if !e.sealed {
		return // joined when its session closes
	}
	ne := &js.sides[side][i]
	p.emitSession(s, key, merged, func(l, r *joinEvent) bool {
		return l == ne || r == ne || len(parts) == 2 && (l.t <= parts[0].last) != (r.t <= parts[0].last)
	})
}

// closeSessions emits the matches of the sessions the watermark passed,
// in time order, and drops the sessions gone, emitting their unmatched
// events alone if the mode says so.
func (p *Pipeline) closeSessions(s *State, key string) {
	js, gap := s.join, p.join.gap
	first := int64(math.MaxInt64) // the first event's time: no session ends before it
	for _, es := range js.sides {
		if len(es) > 0 {
			first = min(first, es[0].t)
		}
	}
	if first == math.MaxInt64 || first+gap >= s.wm {
		return // nothing to close, nor to drop (a session is dropped after it closed)
	}
	spans := p.sessions(js)
	for _, sp := range spans {
		if sp.last+gap >= s.wm {
			break // open, and so are the later ones
		}
		p.emitSession(s, key, sp, func(l, r *joinEvent) bool { return !l.sealed || !r.sealed })
		for side := range 2 {
			a, b := js.within(side, sp)
			for k := a; k < b; k++ {
				js.sides[side][k].sealed = true
			}
		}
	}
	for _, sp := range spans {
		if sp.last+gap+p.lateness >= s.wm {
			return
		}
		la, lb := js.within(0, sp)
		ra, rb := js.within(1, sp)
		left, right := js.sides[0][la:lb], js.sides[1][ra:rb]
		for len(left) > 0 || len(right) > 0 { // in time order, left first
			if len(right) == 0 || len(left) > 0 && left[0].t <= right[0].t {
				if !left[0].matched && p.join.mode != innerJoin {
					p.emitJoin(s, key, &left[0], nil, nil)
				}
				left = left[1:]
			} else {
				if !right[0].matched && p.join.mode == outerJoin {
					p.emitJoin(s, key, nil, &right[0], nil)
				}
				right = right[1:]
			}
		}
		js.sides[0] = slices.Delete(js.sides[0], la, lb)
		js.sides[1] = slices.Delete(js.sides[1], ra, rb)
	}
}

// emitSession emits the pairs of session sp that want says are new, left
// major, in time order.
func (p *Pipeline) emitSession(s *State, key string, sp span, want func(l, r *joinEvent) bool) {
	js := s.join
	la, lb := js.within(0, sp)
	ra, rb := js.within(1, sp)
	for k := la; k < lb; k++ {
		for q := ra; q < rb; q++ {
			if l, r := &js.sides[0][k], &js.sides[1][q]; want(l, r) {
				l.matched, r.matched = true, true
				p.emitJoin(s, key, l, r, nil)
			}
		}
	}
}

// sessionTimer returns the watermark at which the key next has a session
// to close or to drop, 0 if none. It is past the watermark even if a state
// restored under another configuration holds a session due already.
func (p *Pipeline) sessionTimer(s *State) int64 {
	js, gap := s.join, p.join.gap
	spans := p.sessions(js)
	if len(spans) == 0 {
		return 0
	}
	next := spans[0].last + gap + p.lateness + 1 // the first one gone
	for _, sp := range spans {
		la, lb := js.within(0, sp)
		ra, rb := js.within(1, sp)
		unsealed := func(es []joinEvent) bool { return slices.ContainsFunc(es, func(e joinEvent) bool { return !e.sealed }) }
		if unsealed(js.sides[0][la:lb]) || unsealed(js.sides[1][ra:rb]) {
			next = min(next, sp.last+gap+1) // the first one to close
			break
		}
	}
	return max(next, s.wm+1)
}
