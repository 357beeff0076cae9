package fold

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
	"unsafe"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Calls: request/reply to one key's Go handler (the actor call).
//
// A call is an input of its key like an event: NewCall validates it, the
// shell logs it (keyfold.v1.Input with call set: the request and its id)
// and ApplyCall runs the handler's OnCall in the key's log order, a
// transaction as every handler call is. Its reply goes back to the caller;
// a call with an id also keeps its reply (or error) in the key's state for
// the pipeline's dedup window, so that a retry with the same id is
// answered the same without running the handler again, and a replay of
// the log reproduces both the state and the kept replies.
//
// A call is not an event: it adds to no aggregate, window or pattern, does
// not count in the key's seq, and does not move the pipeline's clock. It
// sees the key's watermark as it stands, and its time is the processing
// time it was logged at.
//
// A read-only call (ReadCall) is not logged: it runs on the state in
// memory and may not change it; what it tries to change fails the call.

// Bounds of a call.
const (
	// MaxRequestBytes bounds a call's request (its JSON).
	MaxRequestBytes = 64 << 10
	// MaxReplyBytes bounds a call's reply: a larger one fails the call.
	MaxReplyBytes = 64 << 10
	// MaxCallIDBytes bounds a call's id.
	MaxCallIDBytes = 256
	// maxKeptReplyBytes bounds the replies a key keeps (ids, replies and
	// errors): beyond it the oldest are forgotten before the dedup window
	// ends, and a retry of one of those runs the handler again.
	maxKeptReplyBytes = 1 << 20
)

// CallHandler is a Handler that also answers calls.
type CallHandler interface {
	Handler
	// OnCall answers one call of the key: req.Raw is the request (a JSON
	// value), req.ID its id. The reply is a JSON value; nil is null.
	OnCall(c *Call, req *Event) ([]byte, error)
}

// Reply is the outcome of a call: the handler's reply (a JSON value), or
// its error's text. Duplicate is set when the reply is one kept from an
// earlier call with the same id.
type Reply struct {
	Value     []byte
	Err       string
	Duplicate bool
}

// Error returns the call's failure as a *CallError, nil if it succeeded.
func (r Reply) Error() error {
	if r.Err == "" {
		return nil
	}
	return &CallError{Msg: r.Err}
}

// reply is a call's outcome a key keeps, by the call's id.
type reply struct {
	id    string
	at    int64 // the processing time the call was logged at
	value []byte
	err   string
}

func (r *reply) size() int { return len(r.id) + len(r.value) + len(r.err) }

// replies are the outcomes of a key's calls with ids, oldest first.
type replies struct {
	list  []*reply
	byID  map[string]*reply
	bytes int
}

func (rs *replies) get(id string) *reply { return rs.byID[id] }

// keep records r, forgetting the oldest beyond maxKeptReplyBytes.
func (rs *replies) keep(r *reply) {
	if rs.byID == nil {
		rs.byID = map[string]*reply{}
	}
	rs.list = append(rs.list, r)
	rs.byID[r.id] = r
	rs.bytes += r.size()
	n := 0
	for rs.bytes > maxKeptReplyBytes && n < len(rs.list)-1 {
		rs.forget(rs.list[n])
		n++
	}
	rs.list = slices.Delete(rs.list, 0, n)
}

// expire forgets the replies of calls logged before horizon; it returns
// how many.
func (rs *replies) expire(horizon int64) int {
	n := 0
	for n < len(rs.list) && rs.list[n].at < horizon {
		rs.forget(rs.list[n])
		n++
	}
	rs.list = slices.Delete(rs.list, 0, n)
	return n
}

// oldest is when the oldest kept reply was logged, 0 if none.
func (rs *replies) oldest() int64 {
	if len(rs.list) == 0 {
		return 0
	}
	return rs.list[0].at
}

func (rs *replies) forget(r *reply) {
	delete(rs.byID, r.id)
	rs.bytes -= r.size()
}

func (rs *replies) memSize() int {
	return cap(rs.list)*int(unsafe.Sizeof(&reply{})) + len(rs.list)*(int(unsafe.Sizeof(reply{}))+48) + rs.bytes
}

// TakesCalls reports whether the pipeline's handler answers calls.
func (p *Pipeline) TakesCalls() bool {
	_, ok := p.handler.(CallHandler)
	return ok
}

// NewCall validates a call of key with request req (a JSON value) and id
// ("" for none), and returns it as the input to log. It fails with
// ErrNoCallHandler if the pipeline's handler takes no calls, with an error
// wrapping ErrCallTooLarge for a request above MaxRequestBytes, and with
// one wrapping ErrInvalidCall for a bad key, id or request.
func (p *Pipeline) NewCall(key, id string, req []byte) (*Event, error) {
	if !p.TakesCalls() {
		return nil, fmt.Errorf("%w: pipeline %q", ErrNoCallHandler, p.name)
	}
	if err := CheckKey(key); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalidCall, err.Error())
	}
	if err := CheckCallID(id); err != nil {
		return nil, err
	}
	if len(req) > MaxRequestBytes {
		return nil, fmt.Errorf("%w: the request is %d bytes, more than %d", ErrCallTooLarge, len(req), MaxRequestBytes)
	}
	if !json.Valid(req) {
		return nil, fmt.Errorf("%w: the request is not a JSON value", ErrInvalidCall)
	}
	return &Event{Raw: req, Key: key, ID: id, Call: true}, nil
}

// CheckCallID reports, wrapping ErrInvalidCall, why id cannot be a call's
// id ("" is none and is fine): it is longer than MaxCallIDBytes, not valid
// UTF-8, or has control characters.
func CheckCallID(id string) error {
	switch {
	case len(id) > MaxCallIDBytes:
		return fmt.Errorf("%w: the id is %d bytes, more than %d", ErrInvalidCall, len(id), MaxCallIDBytes)
	case !utf8.ValidString(id) || strings.ContainsFunc(id, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return fmt.Errorf("%w: the id must be valid UTF-8 text without control characters", ErrInvalidCall)
	}
	return nil
}

// ReplayCall rebuilds a logged call for replay (it was validated when it
// was logged).
func ReplayCall(key, id string, req []byte) *Event {
	return &Event{Raw: req, Key: key, ID: id, Call: true}
}

// ApplyCall applies a call (from NewCall or ReplayCall) to the key's state
// at processing time nowMs, and returns its reply. A call whose id the key
// keeps a reply for gets that reply, and changes nothing else. A call the
// handler fails changes nothing; its error is the reply (kept as one).
func (p *Pipeline) ApplyCall(s *State, ev *Event, nowMs int64) Reply {
	if p.handler == nil { // a logged call replayed after the handler was removed
		return Reply{Err: ErrNoCallHandler.Error()}
	}
	s.version++
	if nowMs > s.now {
		s.now = nowMs
	}
	p.expireIDs(s) // the key's clock moved: as an event's would (and a snapshot does)
	if s.h == nil {
		s.h = &handlerState{born: nowMs}
	}
	if s.h.replies.expire(s.now-p.dedupWindow.Milliseconds()) > 0 {
		s.version++
	}
	if ev.ID != "" {
		if r := s.h.replies.get(ev.ID); r != nil {
			return Reply{Value: r.value, Err: r.err, Duplicate: true}
		}
	}
	if p.Timed() { // always, with a handler
		s.timed()
	}
	p.fireProcessing(s, ev.Key, nowMs) // due before the call came
	c := p.newCall(s, ev.Key, nowMs, nowMs, ev.Raw)
	out := p.runCall(c, ev)
	if out.Err == "" {
		p.commit(s, c)
	}
	p.fireTimers(s, ev.Key)
	p.fireProcessing(s, ev.Key, nowMs) // set at or before now by the call
	if ev.ID != "" {
		// After the call, which may have deleted the key (the kept
		// replies stay).
		s.h.replies.keep(&reply{id: ev.ID, at: s.now, value: out.Value, err: out.Err})
	}
	return out
}

// ReadCall runs a read-only call of the key at processing time nowMs: it
// is not logged, and the handler may not change the key (setting its
// state, timers or outputs, or deleting it, fails the call). s is not
// changed.
func (p *Pipeline) ReadCall(s *State, key string, req []byte, nowMs int64) Reply {
	c := &Call{pipeline: p.name, key: key, now: nowMs, at: nowMs, wm: s.Watermark(), seq: s.seq, input: req, readOnly: true}
	if s.h != nil {
		c.value, c.timers = s.h.value, s.h.timers
	}
	return p.runCall(c, &Event{Raw: req, Key: key, Call: true})
}

// runCall calls the handler's OnCall and checks its reply.
func (p *Pipeline) runCall(c *Call, ev *Event) Reply {
	ch, ok := p.handler.(CallHandler)
	if !ok { // a logged call replayed after the handler lost its OnCall, or a read-only call of such a pipeline
		return Reply{Err: ErrNoCallHandler.Error()}
	}
	var value []byte
	err := callSafely(func() (err error) {
		value, err = ch.OnCall(c, ev)
		return err
	})
	switch {
	case c.forbidden != "": // whatever the handler made of it
		err = fmt.Errorf("a read-only call cannot %s", c.forbidden)
	case err != nil:
	case len(value) > MaxReplyBytes:
		err = fmt.Errorf("the reply is %d bytes, more than %d", len(value), MaxReplyBytes)
	case value == nil:
		value = []byte("null")
	case !json.Valid(value):
		err = fmt.Errorf("the reply is not JSON")
	}
	if err != nil {
		return Reply{Err: err.Error()}
	}
	return Reply{Value: slices.Clone(value)}
}

// repliesProto and restoreReplies store and read a key's kept replies.
func (rs *replies) proto() []*keyfoldv1.HandlerReply {
	out := make([]*keyfoldv1.HandlerReply, len(rs.list))
	for i, r := range rs.list {
		out[i] = &keyfoldv1.HandlerReply{Id: r.id, AtMs: r.at, Reply: r.value, Error: r.err}
	}
	return out
}

func restoreReplies(in []*keyfoldv1.HandlerReply) replies {
	var rs replies
	for _, r := range in {
		rs.keep(&reply{id: r.Id, at: r.AtMs, value: r.Reply, err: r.Error})
	}
	return rs
}
