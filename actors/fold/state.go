package fold

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"time"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// State is the folded state of one key. The zero value is the state of a key
// that has seen nothing. It is not safe for concurrent use: it belongs to
// its key's actor.
type State struct {
	seq  uint64
	dups uint64 // events skipped as duplicates
	now  int64  // the key's clock: the largest processing time applied
	aggs aggSet // parallel to the pipeline's (ops)
	ids  idSet  // ids applied within the dedup window
	// The event-time state, for a pipeline with windows or patterns; nil
	// for one without (most keys, whose memory it would add a third to).
	*timeState
	h *handlerState // the Go handler's part, if the pipeline has one (handler.go)
	// version counts the changes of the state in memory (it is not
	// persisted); snapshots use it to tell what changed since the last one.
	version uint64
}

// timeState is the part of a key's state that only windows and patterns
// use. Read it through the accessors that allow nil (Watermark, Late,
// LateIn, Outputs); code that changes it runs for a pipeline with windows
// or patterns, after timed() gave the state one.
type timeState struct {
	wm   int64 // the key's watermark (see window.go)
	late uint64
	// lateWin counts, per window spec, the events too late for at least
	// one of its windows they fell in (it grows to the specs on demand).
	lateWin []uint64
	wins    []win               // windows, ordered by spec then start
	wait    []waiting           // events the patterns have not seen yet, by time
	pats    []patState          // per pattern
	out     []*keyfoldv1.Output // emitted results not yet taken
	join    *joinState          // of a join's key (join.go)
}

// timed returns the state's event-time part, creating it if needed.
func (s *State) timed() *timeState {
	if s.timeState == nil {
		s.timeState = new(timeState)
	}
	return s.timeState
}

// Duplicates returns the number of events skipped because the key had
// applied their id within the dedup window.
func (s *State) Duplicates() uint64 { return s.dups }

// Seq returns the number of events applied to the key, duplicates excluded.
func (s *State) Seq() uint64 { return s.seq }

// Empty reports whether the key holds nothing: no event applied (or all
// erased) and no emptied window kept to number its next results.
func (s *State) Empty() bool {
	if s.timeState != nil && s.join != nil {
		// A join's key that buffers nothing leaves the store: its counts
		// are the metrics'; what it buffers is all it needs.
		return len(s.join.sides[0]) == 0 && len(s.join.sides[1]) == 0
	}
	return s.seq == 0 && s.ids.len() == 0 && (s.timeState == nil || len(s.wins) == 0) && !s.h.holds() && !s.h.keepsReplies()
}

// Holds reports whether the key holds state a query shows: an event
// applied, or its Go handler's state or timers (a key may have had calls
// only). A key deleted by its handler that keeps only the replies of its
// calls holds none.
func (s *State) Holds() bool { return s.seq > 0 || s.h.holds() }

// Version counts the changes of the state since it was created or restored.
func (s *State) Version() uint64 { return s.version }

// Apply folds one prepared event into the key's state at processing time
// nowMs (Unix milliseconds, taken from the log). It reports whether the event
// was a duplicate, in which case the aggregates and seq are unchanged.
//
// It panics if the event's id needs a look-up in the store's id index: a
// state restored from a snapshot written with SnapshotOptions.IDIndex is
// applied with ApplyEvent.
func (p *Pipeline) Apply(s *State, ev *Event, nowMs int64) (duplicate bool) {
	switch p.ApplyEvent(s, ev, nowMs) {
	case Duplicate:
		return true
	case LookUp:
		panic(fmt.Sprintf("fold: Apply: the id %q of an event for key %q needs a look-up in the store's id index (ApplyEvent)", ev.ID, ev.Key))
	}
	return false
}

// Verdict is what ApplyEvent did with an event.
type Verdict uint8

const (
	// Applied: the event is folded into the state.
	Applied Verdict = iota
	// Duplicate: the key applied the event's id within the dedup window;
	// the aggregates and seq are unchanged.
	Duplicate
	// LookUp: the key holds the fingerprint of the event's id, of an id
	// applied before the state was restored, and only the store's id index
	// tells whether it is this one. Look it up under IDLookups' times, give
	// the answer to the event (Event.SetIndexed) and apply it again. The
	// state's clock and ids may have moved (as applying it again moves
	// them), nothing else.
	LookUp
)

// ApplyEvent is Apply, reporting a duplicate or the need for a look-up
// of the event's id in the store's id index.
//
// The look-up keeps the state's answers the same on replay: the index
// holds what the checkpoints stored, and the key holds in full every id it
// applied since its state was restored, so an id whose fingerprint it
// holds is either one of those it was restored with (in the index as of
// the snapshot it was restored from, and as of the last checkpoint, which
// replay starts from) or a new id.
func (p *Pipeline) ApplyEvent(s *State, ev *Event, nowMs int64) Verdict {
	switch {
	case ev.Erase:
		Erase(s)
		return Applied
	case ev.Expire:
		// A key with work pending (windows to emit, pattern events or an
		// absence to decide) is kept until it is done: expiry runs on
		// processing time, timers on the watermark.
		if p.ttl > 0 && s.Holds() && s.now+p.ttl <= nowMs && p.NextTimer(s) == 0 && s.h.nextTimer(true) == 0 {
			Erase(s)
			return Applied
		}
		// Also the key's processing-time wake-up (WakeAt).
		if s.h != nil {
			if s.h.replies.expire(nowMs-p.dedupWindow.Milliseconds()) > 0 {
				s.version++
			}
			p.fireProcessing(s, ev.Key, nowMs)
		}
		return Applied
	case ev.Call: // its reply is for ApplyCall's caller
		p.ApplyCall(s, ev, nowMs)
		return Applied
	}
	s.version++
	if nowMs > s.now {
		s.now = nowMs
	}
	p.expireIDs(s)
	if ev.ID != "" {
		var fp uint32
		if s.ids.fps {
			fp = Fingerprint(ev.ID)
		}
		dup, held := s.ids.check(ev.ID, fp)
		if held {
			switch {
			case ev.indexedAt == 0:
				return LookUp
			case ev.indexedAt > 0: // stored, and within the window?
				dup = ev.indexedAt > s.now-p.dedupWindow.Milliseconds()
			}
		}
		if dup {
			s.dups++
			return Duplicate
		}
		s.ids.add(ev.ID, p.idAt(s.now), p.bucketWidth())
	}
	for i := range p.ops {
		s.aggs.add(p.ops, i, &ev.contrib[i])
	}
	s.seq++
	if p.Timed() {
		s.timed()
		p.patStates(s) // present from the first event, as in a restored state
		t := p.EventTime(ev, nowMs)
		if !ev.timed && t < s.wm {
			t = s.wm // ingest time behind the watermark (a clock stepped back): never late
		}
		late := len(p.windows) > 0 && !p.assign(s, ev, t)
		if len(p.patterns) > 0 && !p.hold(s, ev, t) {
			late = true
		}
		if late {
			s.late++
		}
		if p.handler != nil {
			p.fireProcessing(s, ev.Key, nowMs) // due before the event came
			p.handleEvent(s, ev, t, nowMs)     // after the built-in operators
		}
	}
	return Applied
}

// IDLookups returns, for an event ApplyEvent answered LookUp, the times of
// the ids the key holds with its id's fingerprint, oldest first: look the
// id up in the store's index under the bucket of each (IndexBucket).
func (p *Pipeline) IDLookups(s *State, ev *Event) []int64 {
	return s.ids.fingerprintTimes(Fingerprint(ev.ID))
}

// IndexBucketMs is the span of processing time whose ids share a bucket
// of the store's id index: a minute, whatever the pipeline's dedup window,
// so that a key's fingerprint names its bucket by its time alone, and the
// index drops what passed the window a minute at a time.
const IndexBucketMs = 60_000

// IndexBucket is the bucket of the store's id index an id applied at at
// (Unix ms) is stored under.
func IndexBucket(at int64) int64 { return at / IndexBucketMs }

// expireIDs forgets ids applied longer than the dedup window ago.
func (p *Pipeline) expireIDs(s *State) {
	s.ids.expire(s.now-p.dedupWindow.Milliseconds(), p.bucketWidth(), s.version)
}

// secondIDsWindow is the shortest dedup window under which a key keeps its
// ids' times to the second (idAt).
const secondIDsWindow = time.Minute

// idAt is the time a key keeps for an id it applies at processing time
// now (Unix ms): now, or under a dedup window of a minute or more, now
// rounded up to the second. An entry of the key's log then holds the time
// since the previous id in one byte or two, not three (appendIDEntry),
// and a key's remembered ids are most of the bytes its snapshots take at
// a million keys (BENCHMARKS.md, session 47). Rounded up, an id is
// remembered for at least the window, up to a second more; everything
// that reads the id's time (its expiry, its bucket, its entry in the
// store's id index) reads the rounded one.
func (p *Pipeline) idAt(now int64) int64 {
	if p.dedupWindow < secondIDsWindow {
		return now
	}
	r := now % 1000 // (negative for a negative now)
	if r > 0 {
		r -= 1000
	}
	return now - r
}

// bucketWidth is the span of processing time, in ms, whose ids share a
// snapshot bucket: a sixteenth of the dedup window.
func (p *Pipeline) bucketWidth() int64 {
	return max(p.dedupWindow.Milliseconds()/16, 1)
}

// Aggregates returns the current value of every aggregate, by name: count is
// a uint64; sum a float64 (0 before any value), or Overflow once its total
// went beyond float64's range; min and max a float64, or nil before any
// value; last the value's JSON (json.RawMessage), or nil.
func (p *Pipeline) Aggregates(s *State) map[string]any {
	out := make(map[string]any, len(p.aggs))
	for i, agg := range p.aggs {
		out[agg.name] = aggValue(p.ops, &s.aggs, i)
	}
	return out
}

// aggValue is the value of aggregate i of a set of ops, as Aggregates
// describes it.
func aggValue(ops []Op, a *aggSet, i int) any {
	switch ops[i] {
	case OpCount:
		return a.count(i)
	case OpSum:
		n := a.num(i)
		if math.IsInf(n, 0) || math.IsNaN(n) {
			return Overflow
		}
		return n
	case OpMin, OpMax:
		if a.count(i) == 0 {
			return nil
		}
		return a.num(i) // a value of an event: finite
	case OpLast:
		if v := a.last(i); v != nil {
			// A copy: the set changes its bytes in place, and a query's
			// answer is read after the key applies more events.
			return json.RawMessage(bytes.Clone(v))
		}
		return nil
	case OpDistinct:
		if h := a.hllSketch(i); h != nil {
			return h.Estimate()
		}
		return uint64(0)
	case OpQuantiles:
		return quantileView(a.ddSketch(i))
	}
	return nil
}

// Overflow is the value of a sum whose running total went beyond float64's
// range (±1.8e308) at some point: the total is no longer known, and later
// events cannot bring it back (IEEE arithmetic keeps it infinite, or NaN
// once sessions with opposite overflows merge). It stays so until the key
// or window is gone. JSON has no infinities, and a clamped number would be
// a wrong total that looks right.
const Overflow = "overflow"

// jsonNumber keeps values JSON can encode: ±Inf is clamped to the largest
// finite float64, NaN becomes 0 (neither comes out of the sketches today).
func jsonNumber(f float64) float64 {
	switch {
	case math.IsInf(f, 1):
		return math.MaxFloat64
	case math.IsInf(f, -1):
		return -math.MaxFloat64
	case math.IsNaN(f):
		return 0
	}
	return f
}

// Tombstone returns the event that erases key when applied.
func Tombstone(key string) *Event { return &Event{Key: key, Erase: true} }

// Erase forgets everything a key holds — its aggregates, its count, the ids
// it remembers, its windows — as a deletion requires (results it emitted
// before stay to be stored): afterwards the state is Empty. The
// key's stored id buckets are marked for deletion, so its next snapshot
// removes them (and, the state being empty, the snapshot itself).
func Erase(s *State) {
	s.version++
	gone := s.ids.gone
	if s.ids.spilled { // inline ids go with the core
		for _, bi := range s.ids.buckets {
			gone = append(gone, goneBucket{bucket: bi.bucket, version: s.version, parts: partsOf(bi.added)})
		}
	}
	// Windows that emitted and are still within allowed lateness stay,
	// emptied, so that an event for one after the deletion emits the next
	// revision, not revision 0 again with other values under the same id.
	var ts *timeState
	if old := s.timeState; old != nil {
		ts = &timeState{wm: old.wm, out: old.out}
		for _, x := range old.wins {
			if x.emitted > 0 && x.end <= old.wm {
				ts.wins = append(ts.wins, win{spec: x.spec, start: x.start, end: x.end, emitted: x.emitted, superseded: x.superseded})
			}
		}
	}
	*s = State{version: s.version, now: s.now, timeState: ts, h: s.h.erased()}
	s.ids.gone = gone
}

func (v Verdict) String() string {
	switch v {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case LookUp:
		return "look up"
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}
