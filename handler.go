package keyfold

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/keyfold/keyfold/actors/fold"
)

// Handler is the behaviour of every key of a pipeline: Go code with a state
// of type S per key, timers and outputs, run on the same durable machinery
// as the built-in operators (see "Go handlers" in the README). Register it
// with Handle.
//
// Each key's calls run one at a time, in the key's log order, on the key's
// actor; calls of different keys run concurrently, so the Handler value
// itself is shared and must keep no state: everything a key remembers goes
// in its S.
//
// A handler must be deterministic: after a crash, or when its key group
// moves to another node, the node calls it again over the logged inputs
// and must reach the same state and emit the same outputs. So it reads
// only what Key and the event give it: no wall clock (Key.Now is the
// logged time), no random source (Key.Seed), no I/O, no global state.
//
// A call that returns an error or panics changes nothing: what it did
// through Key (Set, timers, Emit, Delete) is dropped, and the pipeline
// emits a dead-letter output instead (kind and name "dead_letter", values
// {"error": …, "event": …} or {"error": …, "timer": …}) and counts it
// (keyfold_pipeline_handler_failures_total). The key goes on with its next
// input. Memory S shares with the key's state (a map, a slice, a pointed-to
// message) that the call changed in place before failing stays changed:
// change a copy and Set it. (Replay fails the same way, so the key stays
// consistent either way.)
type Handler[S any] interface {
	// OnEvent handles one event of the key, after the pipeline's
	// aggregates, windows and patterns took it. Duplicates (an id already
	// applied) do not reach it.
	OnEvent(k *Key[S], ev Event) error
	// OnTimer handles one of the key's timers, once the key's watermark
	// reached its time (a processing-time timer: once the node's clock
	// did).
	OnTimer(k *Key[S], t Timer) error
}

// Caller is a Handler that also answers requests to one key (the actor
// call: Node.Call, and POST /v1/pipelines/{p}/keys/{key}/call). OnCall runs
// on the key's actor like OnEvent, in the key's log order, under the same
// rules: deterministic, a transaction (an error or a panic changes
// nothing). Its reply is encoded as JSON (encoding/json; protojson for a
// proto.Message; a json.RawMessage as it is; nil is null), at most
// MaxReplyBytes, and goes back to the caller; an error goes back as the
// call's error (a *CallError with its text), not to the dead-letter output.
//
// A call is logged before OnCall sees it and replayed after a crash like
// an event, but it is not an event: it adds to no aggregate or window, is
// not counted in the key's seq, and moves no clock. Key.Now and Key.Time
// are the time it was logged at. A call with an id (Request.ID) is
// exactly-once: its reply (or error) is kept in the key's state for the
// pipeline's dedup window (up to 1 MiB of replies per key, the oldest
// forgotten first), and a retry with the same id is answered with it
// without calling OnCall again, also after a restart, and after the
// handler deleted the key (Key.Delete keeps them; Node.Delete does not). A read-only call
// (Request.ReadOnly) is not logged and sees the key as its last logged
// input left it: it may read but not change it (Set, SetTimer,
// CancelTimer, Emit or Delete fail the call), and its Key.Now is the
// node's clock.
type Caller[S any] interface {
	Handler[S]
	OnCall(k *Key[S], req Request) (reply any, err error)
}

// Request is a call as a handler sees it.
type Request struct {
	// ID is the call's id ("" for none).
	ID string
	// ReadOnly is set for a read-only call.
	ReadOnly bool
	// Raw is the request, a JSON value.
	Raw json.RawMessage
}

// Decode decodes the request into v, as json.Unmarshal does.
func (r Request) Decode(v any) error { return json.Unmarshal(r.Raw, v) }

// Bounds of a call: a request above MaxRequestBytes is refused
// (ErrCallTooLarge); a reply above MaxReplyBytes fails its call.
const (
	MaxRequestBytes = fold.MaxRequestBytes
	MaxReplyBytes   = fold.MaxReplyBytes
	MaxCallIDBytes  = fold.MaxCallIDBytes
)

// HandlerFuncs is a Handler (and, with Call set, a Caller) of functions; a
// nil Event or Timer does nothing, and without Call the pipeline takes no
// calls.
type HandlerFuncs[S any] struct {
	Event func(k *Key[S], ev Event) error
	Timer func(k *Key[S], t Timer) error
	Call  func(k *Key[S], req Request) (any, error)
}

// OnCall calls f.Call.
func (f HandlerFuncs[S]) OnCall(k *Key[S], req Request) (any, error) {
	if f.Call == nil {
		return nil, errors.New("keyfold: the handler takes no calls")
	}
	return f.Call(k, req)
}

// takesCalls reports whether a HandlerFuncs is a Caller.
func (f HandlerFuncs[S]) takesCalls() bool { return f.Call != nil }

// OnEvent calls f.Event.
func (f HandlerFuncs[S]) OnEvent(k *Key[S], ev Event) error {
	if f.Event == nil {
		return nil
	}
	return f.Event(k, ev)
}

// OnTimer calls f.Timer.
func (f HandlerFuncs[S]) OnTimer(k *Key[S], t Timer) error {
	if f.Timer == nil {
		return nil
	}
	return f.Timer(k, t)
}

// Event is an event as a handler sees it.
type Event struct {
	// ID is the event's id ("" when the pipeline has no id field or the
	// event none).
	ID string
	// Time is the event's time: its time field, else the time it was
	// logged.
	Time time.Time
	// Raw is the event as it was received (a JSON object).
	Raw json.RawMessage
}

// Decode decodes the event into v, as json.Unmarshal does.
func (e Event) Decode(v any) error { return json.Unmarshal(e.Raw, v) }

// Timer is one of a key's timers: of event time, or of processing time
// (SetProcessingTimer).
type Timer struct {
	Name       string
	Time       time.Time
	Processing bool
}

// Key is one key during one call of its handler: its state, the input's
// times, its timers and what it emits. It is valid only during the call.
type Key[S any] struct {
	c *fold.Call
}

// Pipeline returns the pipeline's name.
func (k *Key[S]) Pipeline() string { return k.c.Pipeline() }

// Key returns the key.
func (k *Key[S]) Key() string { return k.c.Key() }

// State returns the key's state: as the call set it, else as the key
// holds it; the zero S when it has none (see Exists). It is the value in
// memory, not a copy: change a copy of what it points to, and Set it.
func (k *Key[S]) State() S {
	if v, ok := k.c.State().(S); ok {
		return v
	}
	var zero S
	return zero
}

// ReadOnly reports whether the call is a read-only call, which may not
// change the key.
func (k *Key[S]) ReadOnly() bool { return k.c.ReadOnly() }

// Exists reports whether the key has a state (one was Set and not
// deleted).
func (k *Key[S]) Exists() bool { return k.c.State() != nil }

// Set replaces the key's state, once the call returns nil. In a read-only
// call it fails the call.
func (k *Key[S]) Set(s S) { k.c.SetState(s) }

// Now returns the time the input was logged at, by the node that logged
// it: the event's or call's ingest time; for an event-time timer, that of
// the key's latest input; for a processing-time timer, that of the input
// (or wake-up) that fired it. Replay gives the same time. It is the only
// clock a handler may read (a read-only call's is the node's clock).
func (k *Key[S]) Now() time.Time { return time.UnixMilli(k.c.Now()).UTC() }

// Time returns the event's time (as Event.Time), or the timer's.
func (k *Key[S]) Time() time.Time { return time.UnixMilli(k.c.Time()).UTC() }

// Watermark returns the key's watermark: every event time below it is
// taken as seen. The zero time before the key has one.
func (k *Key[S]) Watermark() time.Time {
	if wm := k.c.Watermark(); wm > 0 {
		return time.UnixMilli(wm).UTC()
	}
	return time.Time{}
}

// Seed returns a pseudo-random number fixed by the input (the key, the
// event or timer, the logged time): replay gets the same one. Use it, not
// math/rand, to seed what must look random.
func (k *Key[S]) Seed() uint64 { return k.c.Seed() }

// SetTimer sets the timer name to fire at t (event time, to the
// millisecond), replacing a timer of that name (of either kind): OnTimer
// gets it once the
// key's watermark reaches t, even if the key gets no other input, was
// passivated or the node restarted. A time at or before the watermark
// fires right after this call. In a pipeline without a time field, event
// time is the ingest time and the watermark is the node's clock, so timers
// fire by processing time (within the node's watermark interval).
func (k *Key[S]) SetTimer(name string, t time.Time) error {
	return k.c.SetTimer(name, t.UnixMilli())
}

// SetProcessingTimer sets the timer name to fire at t by the node's clock
// (processing time, to the millisecond), replacing a timer of that name
// (of either kind): OnTimer gets it (Timer.Processing set) once the
// processing time of an input of the key reaches t. For a quiet key that
// input is a wake-up the node logs (with its time) within its watermark
// interval after t, even if the key was passivated or the node restarted
// (after a crash: once the key's group is served again, late by the
// downtime). Replay fires it at the same input, so its call sees the same
// Now. A time at or before Now fires right after this call.
func (k *Key[S]) SetProcessingTimer(name string, t time.Time) error {
	return k.c.SetProcessingTimer(name, t.UnixMilli())
}

// CancelTimer removes the timer name; it reports whether there was one.
func (k *Key[S]) CancelTimer(name string) bool { return k.c.CancelTimer(name) }

// Timers returns the key's pending timers, in firing order.
func (k *Key[S]) Timers() []Timer {
	ts := k.c.Timers()
	out := make([]Timer, len(ts))
	for i, t := range ts {
		out[i] = Timer{Name: t.Name, Time: time.UnixMilli(t.At).UTC(), Processing: t.Processing}
	}
	return out
}

// Emit records an output of the key: Output.Kind "handler", Name name,
// Values value as JSON, Start and End the event's (timer's) time. Its ID
// is stable (pipeline/key/name/born.n, numbered per key): a replay emits
// the same output under the same ID. Outputs are stored as window results
// are, read with Node.Outputs and followed with Node.Subscribe. name must
// be non-empty text without '/' or control characters, and not
// "dead_letter".
func (k *Key[S]) Emit(name string, value any) error {
	b, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("keyfold: output %q: %w", name, err)
	}
	return k.c.Emit(name, b)
}

// Delete erases the key once the call returns nil, as Node.Delete does:
// its state and timers, the pipeline's aggregates and windows of it, and
// the event ids it remembers (so an event retried after it applies
// again). The replies kept for calls with ids stay (a call retried after
// it is answered, not run again); Node.Delete forgets them too.
func (k *Key[S]) Delete() { k.c.Delete() }

// Codec encodes a handler's state for snapshots. Encode must not fail for
// a state the handler sets.
type Codec[S any] interface {
	Encode(s S) ([]byte, error)
	Decode(data []byte) (S, error)
}

// JSONCodec encodes states with encoding/json (the default).
func JSONCodec[S any]() Codec[S] { return jsonCodec[S]{} }

type jsonCodec[S any] struct{}

func (jsonCodec[S]) Encode(s S) ([]byte, error) { return json.Marshal(s) }

func (jsonCodec[S]) Decode(data []byte) (S, error) {
	var s S
	err := json.Unmarshal(data, &s)
	return s, err
}

// ProtoCodec encodes states that are protobuf messages (S a generated
// message pointer type, such as *cartpb.Cart) in the protobuf wire format.
// Queries show them as protojson renders them.
func ProtoCodec[S proto.Message]() Codec[S] { return protoCodec[S]{} }

type protoCodec[S proto.Message] struct{}

func (protoCodec[S]) Encode(s S) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(s)
}

func (protoCodec[S]) Decode(data []byte) (S, error) {
	var zero S
	s, ok := zero.ProtoReflect().Type().New().Interface().(S)
	if !ok {
		return zero, fmt.Errorf("keyfold: %T is not a generated message type", zero)
	}
	return s, proto.Unmarshal(data, s)
}

// HandlerOption configures a handler's state encoding (Handle): see
// WithCodec and WithStateVersion.
type HandlerOption[S any] struct{ apply func(*handlerAdapter[S]) }

// WithCodec encodes the handler's states with c (default: JSONCodec).
func WithCodec[S any](c Codec[S]) HandlerOption[S] {
	return HandlerOption[S]{func(a *handlerAdapter[S]) { a.codec = c }}
}

// WithStateVersion marks the states the handler encodes with version
// (default 1; it must be at least 1) and reads those stored by an older
// version with upgrade, which gets that version and the data its codec
// wrote. Without an upgrade, or for a version newer than this one, a
// stored state is not read: the key's group is not served (its requests
// get ErrUnavailable, and the error is logged) until a handler that reads
// it runs, so that a state is never misread.
func WithStateVersion[S any](version uint32, upgrade func(from uint32, data []byte) (S, error)) HandlerOption[S] {
	return HandlerOption[S]{func(a *handlerAdapter[S]) { a.version, a.upgrade = version, upgrade }}
}

// Handle registers h as the handler of the pipeline of that name in cfg,
// before New(cfg): its every key gets a state S, encoded by the codec the
// options choose (JSON by default). The pipeline keeps its aggregates,
// windows and patterns, computed as without a handler, before it. A
// pipeline has at most one handler.
func Handle[S any](cfg *Config, pipeline string, h Handler[S], opts ...HandlerOption[S]) error {
	if cfg == nil || h == nil {
		return errors.New("keyfold: Handle: nil config or handler")
	}
	spec, ok := cfg.Pipelines[pipeline]
	if !ok {
		return fmt.Errorf("keyfold: Handle: %w %q (configure it first)", ErrUnknownPipeline, pipeline)
	}
	if spec.Handler != nil {
		return fmt.Errorf("keyfold: Handle: pipeline %q has a handler already", pipeline)
	}
	a := &handlerAdapter[S]{h: h, codec: JSONCodec[S](), version: 1}
	for _, o := range opts {
		if o.apply != nil {
			o.apply(a)
		}
	}
	if a.codec == nil || a.version == 0 {
		return fmt.Errorf("keyfold: Handle: pipeline %q: a codec and a state version of at least 1 are required", pipeline)
	}
	spec.Handler = a
	if c, ok := h.(Caller[S]); ok {
		if f, ok := h.(interface{ takesCalls() bool }); !ok || f.takesCalls() {
			spec.Handler = &callAdapter[S]{a, c}
		}
	}
	cfg.Pipelines[pipeline] = spec
	return nil
}

// handlerAdapter runs a typed Handler as the pipeline's fold.Handler.
type handlerAdapter[S any] struct {
	h       Handler[S]
	codec   Codec[S]
	version uint32
	upgrade func(from uint32, data []byte) (S, error)
}

func (a *handlerAdapter[S]) OnEvent(c *fold.Call, ev *fold.Event) error {
	return a.h.OnEvent(&Key[S]{c: c}, Event{ID: ev.ID, Time: time.UnixMilli(c.Time()).UTC(), Raw: ev.Raw})
}

func (a *handlerAdapter[S]) OnTimer(c *fold.Call, t fold.Timer) error {
	return a.h.OnTimer(&Key[S]{c: c}, Timer{Name: t.Name, Time: time.UnixMilli(t.At).UTC(), Processing: t.Processing})
}

// callAdapter is a handlerAdapter whose handler answers calls.
type callAdapter[S any] struct {
	*handlerAdapter[S]
	c Caller[S]
}

func (a *callAdapter[S]) OnCall(c *fold.Call, req *fold.Event) ([]byte, error) {
	v, err := a.c.OnCall(&Key[S]{c: c}, Request{ID: req.ID, ReadOnly: c.ReadOnly(), Raw: req.Raw})
	if err != nil {
		return nil, err
	}
	return encodeReply(v)
}

// encodeReply encodes a handler's reply as JSON.
func encodeReply(v any) ([]byte, error) {
	switch r := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		return r, nil
	case proto.Message:
		return protojson.Marshal(r)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("keyfold: reply: %w", err)
	}
	return b, nil
}

func (a *handlerAdapter[S]) StateVersion() uint32 { return a.version }

func (a *handlerAdapter[S]) EncodeState(v any) ([]byte, error) {
	s, ok := v.(S)
	if !ok {
		return nil, fmt.Errorf("keyfold: state of type %T, want %T", v, s)
	}
	return a.codec.Encode(s)
}

func (a *handlerAdapter[S]) DecodeState(data []byte, version uint32) (any, error) {
	var (
		s   S
		err error
	)
	switch {
	case version == a.version:
		s, err = a.codec.Decode(data)
	case version > a.version:
		return nil, fmt.Errorf("keyfold: the state was written at version %d, newer than the handler's %d", version, a.version)
	case a.upgrade == nil:
		return nil, fmt.Errorf("keyfold: the state was written at version %d and the handler (version %d) has no upgrade", version, a.version)
	default:
		s, err = a.upgrade(version, data)
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (a *handlerAdapter[S]) StateJSON(v any) ([]byte, error) {
	if m, ok := v.(proto.Message); ok {
		return protojson.Marshal(m)
	}
	return json.Marshal(v)
}
