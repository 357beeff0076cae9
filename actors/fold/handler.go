package fold

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
	"unsafe"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Go handlers.
//
// A pipeline may have a Handler (Spec.Handler; package keyfold's Handle
// adapts a typed one): code that keeps state of its own per key, sets
// timers and emits outputs. The pipeline calls it like one of its
// operators, so it is logged, deduplicated, snapshotted and replayed as
// they are:
//
//   - Apply calls OnEvent for every event it applies (not for duplicates),
//     after the aggregates, windows and patterns took it.
//   - A handler's event-time timers fire once the key's watermark reaches
//     their time, from Advance (after the windows the same advance emits),
//     in (time, name) order. NextTimer includes them, so a quiet or
//     passivated key is woken for them as for its windows. A timer set at
//     or before the watermark fires right after the call that set it (at
//     most maxTimerFires per Apply or Advance; more wait for the next
//     advance).
//   - Its processing-time timers fire once the processing time of an input
//     of the key reaches their time: an event's or a call's (before the
//     handler sees it), or an expiry check's, which is the key's
//     processing-time wake-up: WakeAt includes them, and the shell logs an
//     expiry check (with the time) for a key when its WakeAt passes, so a
//     quiet or passivated key is woken for them, and replay fires them at
//     the same inputs. Timers of both kinds share one name space.
//   - A call is a transaction: what it did through its Call (the state it
//     set, its timers, its outputs, a Delete) takes effect only if it
//     returns nil. A call that returns an error or panics changes nothing
//     but a count of failures and a dead-letter output (kind and name
//     "dead_letter") holding the error and the event or timer; a timer that
//     fired is gone either way.
//   - The decoded state stays in memory; the Handler encodes it only when
//     the key is snapshotted (SnapshotParts), and decodes it when the key
//     is restored.
//
// Replay calls the handler again over the same inputs, so it must be
// deterministic: everything it reads must come from its Call (the state,
// the event, the logged clock and seed), never from the wall clock, a
// random source, or I/O.

// Handler is the engine side of a Go handler. It is shared by every key of
// its pipeline, and called from their actors concurrently: it must keep no
// state of its own.
type Handler interface {
	// OnEvent handles one event applied to the call's key.
	OnEvent(c *Call, ev *Event) error
	// OnTimer handles one of the key's timers that fired.
	OnTimer(c *Call, t Timer) error
	// StateVersion is the version of the encoding EncodeState writes.
	StateVersion() uint32
	// EncodeState encodes a state the handler set.
	EncodeState(v any) ([]byte, error)
	// DecodeState decodes a state EncodeState wrote at version (possibly
	// an older one: it upgrades it).
	DecodeState(data []byte, version uint32) (any, error)
	// StateJSON renders a state as JSON for queries.
	StateJSON(v any) ([]byte, error)
}

// Timer is one of a key's handler timers: it fires once the key's
// watermark reaches At (Unix ms), or, a Processing one, once the
// processing time of an input of the key does.
type Timer struct {
	Name       string
	At         int64
	Processing bool
}

// Output kinds of a handler's outputs.
const (
	HandlerKind    = "handler"     // emitted with Call.Emit
	DeadLetterKind = "dead_letter" // a call that failed; also its name
)

// maxTimerFires bounds the timers one Apply or Advance fires: a handler
// that keeps setting timers at or before the watermark cannot hold its key
// (the rest fire at the next wake-up, NextTimer reporting them due).
const maxTimerFires = 1000

// handlerState is a handler's part of a key's State.
type handlerState struct {
	value   any     // the decoded state; nil: none
	timers  []Timer // by (At, Name); shared with a Call until it copies
	born    int64   // see OutputIDs
	emitted uint64
	failed  uint64
	replies replies // of its calls with ids (call.go)
	// size estimates the bytes of value: measured when it was last encoded
	// (a snapshot), which every key leaving its actor has had.
	size int
}

// Call is one call of a key's handler. What the handler changes through it
// takes effect only if the call returns nil. It is valid only during the
// call.
type Call struct {
	pipeline, key string
	now           int64 // the logged processing time of the input, Unix ms
	at            int64 // the event's time, or the timer's
	wm            int64
	seq           uint64 // the key's, for the seed
	input         []byte // the event, or the timer's name, for the seed
	value         any
	set           bool // value was set (or deleted)
	timers        []Timer
	ownTimers     bool // timers is the call's copy
	outs          []handlerOutput
	deleted       bool
	// A read-only call (ReadCall) changes nothing: forbidden names what it
	// tried, which fails it.
	readOnly  bool
	forbidden string
}

type handlerOutput struct {
	name   string
	values []byte
}

// Pipeline returns the pipeline's name.
func (c *Call) Pipeline() string { return c.pipeline }

// Key returns the key.
func (c *Call) Key() string { return c.key }

// State returns the key's state (as set by the call, if it did), nil when
// it has none.
func (c *Call) State() any { return c.value }

// SetState replaces the key's state; nil removes it.
func (c *Call) SetState(v any) {
	if c.forbid("set the state") {
		return
	}
	c.value, c.set = v, true
}

// forbid reports whether the call is read-only, and if so fails it for
// doing what.
func (c *Call) forbid(what string) bool {
	if c.readOnly && c.forbidden == "" {
		c.forbidden = what
	}
	return c.readOnly
}

// ReadOnly reports whether the call is a read-only one, which may not
// change the key.
func (c *Call) ReadOnly() bool { return c.readOnly }

// Now returns the processing time the input was logged at (Unix ms): of
// the event, or, for a timer, of the latest input of the key.
func (c *Call) Now() int64 { return c.now }

// Time returns the event's time, or the timer's (Unix ms).
func (c *Call) Time() int64 { return c.at }

// Watermark returns the key's watermark (Unix ms).
func (c *Call) Watermark() int64 { return c.wm }

// Seed returns a pseudo-random number fixed by the input: the same call
// replayed gets the same one.
func (c *Call) Seed() uint64 { return seedOf(c.key, c.seq, c.at, c.now, c.input) }

// SetTimer sets the timer name to fire at (Unix ms) event time, replacing
// a timer of that name (of either kind). The name must be non-empty, valid
// text without control characters.
func (c *Call) SetTimer(name string, at int64) error { return c.setTimer(name, at, false) }

// SetProcessingTimer sets the timer name to fire once the processing time
// reaches at (Unix ms), replacing a timer of that name (of either kind).
func (c *Call) SetProcessingTimer(name string, at int64) error { return c.setTimer(name, at, true) }

func (c *Call) setTimer(name string, at int64, processing bool) error {
	if c.forbid("set a timer") {
		return fmt.Errorf("fold: timer %q: %w", name, errReadOnly)
	}
	if err := checkHandlerName(name); err != nil {
		return fmt.Errorf("fold: timer %q: %w", name, err)
	}
	if at < 0 {
		return fmt.Errorf("fold: timer %q: time %d is before 1970", name, at)
	}
	c.own()
	c.timers = slices.DeleteFunc(c.timers, func(t Timer) bool { return t.Name == name })
	t := Timer{Name: name, At: at, Processing: processing}
	i, _ := slices.BinarySearchFunc(c.timers, t, compareTimers)
	c.timers = slices.Insert(c.timers, i, t)
	return nil
}

// CancelTimer removes the timer name; it reports whether there was one.
func (c *Call) CancelTimer(name string) bool {
	i := slices.IndexFunc(c.timers, func(t Timer) bool { return t.Name == name })
	if i < 0 || c.forbid("cancel a timer") {
		return false
	}
	c.own()
	c.timers = slices.Delete(c.timers, i, i+1)
	return true
}

// Timers returns the key's pending timers in firing order (a copy; nil
// when there are none, whether the key's timers were restored or not).
func (c *Call) Timers() []Timer {
	if len(c.timers) == 0 {
		return nil
	}
	return slices.Clone(c.timers)
}

// own makes the call's timers its own copy before it changes them.
func (c *Call) own() {
	if !c.ownTimers {
		c.timers, c.ownTimers = slices.Clone(c.timers), true
	}
}

// Emit records an output named name whose values are the JSON values. Its
// id is stable: the same call replayed emits the same id (see OutputIDs).
func (c *Call) Emit(name string, values []byte) error {
	if c.forbid("emit an output") {
		return fmt.Errorf("fold: output %q: %w", name, errReadOnly)
	}
	if err := checkHandlerName(name); err != nil {
		return fmt.Errorf("fold: output %q: %w", name, err)
	}
	if strings.Contains(name, "/") || name == DeadLetterKind {
		return fmt.Errorf("fold: output %q: a name contains no '/' and is not %q", name, DeadLetterKind)
	}
	if !json.Valid(values) {
		return fmt.Errorf("fold: output %q: values are not JSON", name)
	}
	c.outs = append(c.outs, handlerOutput{name: name, values: slices.Clone(values)})
	return nil
}

// Delete erases the key once the call returns, as a deletion of the key
// does (see Erase): its handler state and timers, its aggregates, windows
// and remembered event ids. Outputs the call emitted stay, and so do the
// replies kept for calls with ids (call.go).
func (c *Call) Delete() {
	if !c.forbid("delete the key") {
		c.deleted = true
	}
}

// errReadOnly fails what a read-only call may not do.
var errReadOnly = errors.New("a read-only call changes nothing")

func compareTimers(a, b Timer) int {
	return cmp.Or(cmp.Compare(a.At, b.At), strings.Compare(a.Name, b.Name))
}

func checkHandlerName(name string) error {
	if name == "" || strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f || r == 0xfffd }) {
		return errors.New("a name must be non-empty valid text without control characters")
	}
	return nil
}

// HandlerOutputID is the id of a handler's output: the key's outputs (its
// dead letters included) are numbered from the processing time of its
// first event, born (Unix ms), so a replay gives each the same id. A
// deletion keeps the numbering while the key is in memory; a key that
// comes back after its deletion was stored is born again, later.
func HandlerOutputID(pipeline, key, name string, born int64, n uint64) string {
	return fmt.Sprintf("%s/%s/%s/%d.%d", pipeline, url.PathEscape(key), name, born, n)
}

// HasHandler reports whether the pipeline has a Go handler.
func (p *Pipeline) HasHandler() bool { return p.handler != nil }

// handleEvent calls the handler for an event applied at processing time
// nowMs with event time t, then fires the timers it made due.
func (p *Pipeline) handleEvent(s *State, ev *Event, t, nowMs int64) {
	if s.h == nil {
		s.h = &handlerState{born: nowMs}
	}
	c := p.newCall(s, ev.Key, nowMs, t, ev.Raw)
	err := callSafely(func() error { return p.handler.OnEvent(c, ev) })
	p.finish(s, c, err, func() any {
		var event any = json.RawMessage(ev.Raw)
		if !json.Valid(ev.Raw) {
			event = string(ev.Raw)
		}
		return map[string]any{"event": event}
	})
	p.fireTimers(s, ev.Key)
	p.fireProcessing(s, ev.Key, nowMs) // set at or before now by the call
}

// fireTimers calls the handler for its event-time timers due at the key's
// watermark.
func (p *Pipeline) fireTimers(s *State, key string) {
	if s.h != nil {
		p.fire(s, key, false, s.wm, s.now)
	}
}

// fireProcessing calls the handler for its processing-time timers due at
// nowMs, the processing time of the key's input.
func (p *Pipeline) fireProcessing(s *State, key string, nowMs int64) {
	if p.handler != nil && s.h != nil {
		p.fire(s, key, true, nowMs, nowMs)
	}
}

// fire calls the handler for its timers of one kind due at limit (the
// watermark, or the processing time), in (time, name) order; their calls
// see now as their processing time.
func (p *Pipeline) fire(s *State, key string, processing bool, limit, now int64) {
	for range maxTimerFires {
		h := s.h
		i := slices.IndexFunc(h.timers, func(t Timer) bool { return t.Processing == processing })
		if i < 0 || h.timers[i].At > limit {
			return
		}
		t := h.timers[i]
		h.timers = slices.Delete(slices.Clone(h.timers), i, i+1) // a Call may share the old slice
		s.version++
		c := p.newCall(s, key, now, t.At, []byte(t.Name))
		err := callSafely(func() error { return p.handler.OnTimer(c, t) })
		p.finish(s, c, err, func() any {
			tm := map[string]any{"name": t.Name, "time": time.UnixMilli(t.At).UTC()}
			if t.Processing {
				tm["processing"] = true
			}
			return map[string]any{"timer": tm}
		})
	}
}

func (p *Pipeline) newCall(s *State, key string, now, at int64, input []byte) *Call {
	return &Call{pipeline: p.name, key: key, now: now, at: at, wm: s.wm, seq: s.seq, input: input, value: s.h.value, timers: s.h.timers}
}

// callSafely runs a handler's call, turning a panic into an error.
func callSafely(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return f()
}

// finish applies a call's changes if it succeeded, else records it in a
// dead-letter output with what failed (input gives its fields).
func (p *Pipeline) finish(s *State, c *Call, err error, input func() any) {
	h := s.h
	if err != nil {
		h.failed++
		v, _ := input().(map[string]any)
		v["error"] = err.Error()
		values, merr := json.Marshal(v)
		if merr != nil { // cannot happen: strings, times and valid JSON
			values = []byte(`{}`)
		}
		p.emitHandler(s, c.key, DeadLetterKind, DeadLetterKind, c.at, values)
		return
	}
	p.commit(s, c)
}

// commit applies the changes of a call that succeeded.
func (p *Pipeline) commit(s *State, c *Call) {
	h := s.h
	if c.set {
		h.value = c.value
	}
	if c.ownTimers {
		h.timers = c.timers
	}
	for _, o := range c.outs {
		p.emitHandler(s, c.key, HandlerKind, o.name, c.at, o.values)
	}
	if c.deleted {
		// The replies kept for retries stay: a call retried after the
		// deletion must not run again (Node.Delete and a ttl forget them).
		kept := s.h.replies
		Erase(s)
		s.h.replies = kept
	}
}

// emitHandler records one output of the key's handler.
func (p *Pipeline) emitHandler(s *State, key, kind, name string, at int64, values []byte) {
	h := s.h
	s.out = append(s.out, &keyfoldv1.Output{
		Id:          HandlerOutputID(p.name, key, name, h.born, h.emitted),
		Pipeline:    p.name,
		Key:         key,
		Kind:        kind,
		Name:        name,
		StartMs:     at,
		EndMs:       at,
		Count:       1,
		ValuesJson:  values,
		WatermarkMs: s.wm,
	})
	h.emitted++
}

// seedOf derives a call's seed from its input (FNV-1a, then a mix).
func seedOf(key string, seq uint64, t, now int64, input []byte) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime
	}
	for _, x := range [3]uint64{seq, uint64(t), uint64(now)} {
		for range 8 {
			h = (h ^ (x & 0xff)) * prime
			x >>= 8
		}
	}
	for _, b := range input {
		h = (h ^ uint64(b)) * prime
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

// erased is what a deletion keeps of the handler's part: the numbering of
// its outputs.
func (h *handlerState) erased() *handlerState {
	if h == nil {
		return nil
	}
	return &handlerState{born: h.born, emitted: h.emitted}
}

// holds reports whether the handler's part holds a state or timers, even
// if the key never applied an event (a key of calls only).
func (h *handlerState) holds() bool {
	return h != nil && (h.value != nil || len(h.timers) > 0)
}

// keepsReplies reports whether the handler's part keeps replies of calls
// (which a deleted key keeps until they expire).
func (h *handlerState) keepsReplies() bool { return h != nil && len(h.replies.list) > 0 }

// nextTimer is the handler's earliest timer of event time (processing:
// of processing time), 0 if none.
func (h *handlerState) nextTimer(processing bool) int64 {
	if h == nil {
		return 0
	}
	for _, t := range h.timers {
		if t.Processing == processing {
			return t.At
		}
	}
	return 0
}

func (h *handlerState) memSize() int {
	if h == nil {
		return 0
	}
	n := int(unsafe.Sizeof(*h)) + cap(h.timers)*int(unsafe.Sizeof(Timer{})) + h.size + h.replies.memSize()
	for _, t := range h.timers {
		n += len(t.Name)
	}
	return n
}

// stateSize estimates the memory of a decoded state from its encoding: a
// value that reports its own size (a MemSize method) is trusted, else
// twice the encoding plus an interface's worth.
func stateSize(v any, encoded int) int {
	if m, ok := v.(interface{ MemSize() int }); ok {
		return m.MemSize()
	}
	return 2*encoded + 16
}

// handlerProto stores the handler's part of the state in ks.
func (p *Pipeline) handlerProto(s *State, ks *keyfoldv1.KeyState) error {
	h := s.h
	if p.handler == nil || h == nil {
		return nil
	}
	hs := &keyfoldv1.HandlerState{BornMs: h.born, Emitted: h.emitted, Failed: h.failed, Replies: h.replies.proto()}
	if h.value != nil {
		data, err := p.handler.EncodeState(h.value)
		if err != nil {
			return fmt.Errorf("fold: encode the handler's state: %w", err)
		}
		hs.Data, hs.Version, hs.Present = data, p.handler.StateVersion(), true
		h.size = stateSize(h.value, len(data))
	}
	for _, t := range h.timers {
		hs.Timers = append(hs.Timers, &keyfoldv1.HandlerTimer{Name: t.Name, AtMs: t.At, Processing: t.Processing})
	}
	ks.Handler = hs
	return nil
}

// restoreHandler rebuilds the handler's part of a restored state. A state
// the handler cannot decode (a version it does not know, or one it has no
// upgrade from) is an error: the key is not read rather than misread. The
// handler's part of a pipeline that no longer has one is dropped.
func (p *Pipeline) restoreHandler(s *State, hs *keyfoldv1.HandlerState) error {
	if p.handler == nil || hs == nil {
		return nil
	}
	h := &handlerState{born: hs.BornMs, emitted: hs.Emitted, failed: hs.Failed, replies: restoreReplies(hs.Replies)}
	if hs.Present {
		v, err := p.handler.DecodeState(hs.Data, hs.Version)
		if err != nil {
			return fmt.Errorf("fold: decode the handler's state (version %d): %w", hs.Version, err)
		}
		h.value, h.size = v, stateSize(v, len(hs.Data))
	}
	for _, t := range hs.Timers {
		h.timers = append(h.timers, Timer{Name: t.Name, At: t.AtMs, Processing: t.Processing})
	}
	slices.SortFunc(h.timers, compareTimers)
	s.h = h
	return nil
}

// HandlerState returns the key's handler state as JSON (nil when it has
// none), and the number of the handler's calls that failed.
func (p *Pipeline) HandlerState(s *State) (json.RawMessage, uint64, error) {
	if p.handler == nil || s.h == nil {
		return nil, 0, nil
	}
	if s.h.value == nil {
		return nil, s.h.failed, nil
	}
	b, err := p.handler.StateJSON(s.h.value)
	return b, s.h.failed, err
}

// HandlerTimers returns the key's pending handler timers in firing order.
func (s *State) HandlerTimers() []Timer {
	if s.h == nil {
		return nil
	}
	return slices.Clone(s.h.timers)
}
