package fold

import "time"

// State expiry: a pipeline's ttl deletes the state of keys that received no
// event for that long. The clock is processing time — the time the node
// logged the key's events, the same clock as dedup — because it always
// advances: event time can stall (a quiet source), jump, or be absent, and a
// key must expire whatever its events say. The host logs an expiry check
// (ExpiryCheck) when a key's expiry passes; applying it erases the key only
// if it is still idle by the logged clock, so an event logged just before
// the check keeps the key, and replay decides the same way.

// MinTTL is the shortest ttl.
const MinTTL = time.Second

func (p *Pipeline) compileTTL(spec Spec, bad func(entry, format string, args ...any)) {
	if spec.TTL == 0 {
		return
	}
	if spec.TTL < MinTTL || spec.TTL%time.Millisecond != 0 {
		bad("ttl", "must be at least %v, in whole milliseconds (got %v)", MinTTL, spec.TTL)
		return
	}
	p.ttl = spec.TTL.Milliseconds()
	if spec.ID != "" && spec.TTL < p.dedupWindow {
		bad("ttl", "%v is shorter than dedup_window %v: an expired key forgets its ids, so a retry could count twice", spec.TTL, p.dedupWindow)
	}
	// A key must not expire with work pending: its windows and patterns
	// need at most their span, the lateness and the out-of-orderness.
	need := int64(0)
	for _, w := range p.windows {
		need = max(need, w.size, w.gap)
	}
	for _, pt := range p.patterns {
		need = max(need, pt.within)
	}
	if need > 0 {
		need += p.ooo + p.lateness
		if p.ttl <= need {
			bad("ttl", "%v must exceed the longest window or pattern span plus out_of_orderness and allowed_lateness (%v), or keys would expire with windows open", spec.TTL, time.Duration(need)*time.Millisecond)
		}
	}
}

// TTL returns the pipeline's ttl, 0 if keys never expire.
func (p *Pipeline) TTL() time.Duration { return time.Duration(p.ttl) * time.Millisecond }

// WakesByClock reports whether the pipeline's keys are woken by
// processing time (WakeAt): with a ttl, or a Go handler (its
// processing-time timers, its kept replies leaving the dedup window).
func (p *Pipeline) WakesByClock() bool { return p.ttl > 0 || p.handler != nil }

// WakeAt returns the processing time (Unix ms) at which the key is to get
// an expiry check (ExpiryCheck, logged with that time) if it receives
// nothing more, 0 if never: the earliest of when it expires (ttl), its Go
// handler's next processing-time timer, and when its oldest kept reply
// leaves the dedup window. A key past its ttl but kept because timers are
// pending (see Apply) is due for another check an eighth of the ttl after
// nowMs, the processing time of the last check.
func (p *Pipeline) WakeAt(s *State, nowMs int64) int64 {
	next := p.expiry(s, nowMs)
	if s.h == nil {
		return next
	}
	earliest := func(t int64) {
		if t != 0 && (next == 0 || t < next) {
			next = t
		}
	}
	earliest(s.h.nextTimer(true))
	if at := s.h.replies.oldest(); at != 0 {
		earliest(at + p.dedupWindow.Milliseconds() + 1)
	}
	return next
}

// expiry is when the key expires by its ttl (see WakeAt), 0 if never.
func (p *Pipeline) expiry(s *State, nowMs int64) int64 {
	if p.ttl == 0 || !s.Holds() {
		return 0
	}
	if e := s.now + p.ttl; e > nowMs {
		return e
	}
	return nowMs + max(p.ttl/8, MinTTL.Milliseconds())
}

// ExpiryCheck returns the event that erases key when applied if the key
// has been idle for the pipeline's ttl.
func ExpiryCheck(key string) *Event { return &Event{Key: key, Expire: true} }
