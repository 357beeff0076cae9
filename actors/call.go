package actors

import (
	"context"
	"fmt"
	"slices"

	"github.com/keyfold/keyfold/actors/fold"
)

// Calls of a key's Go handler (fold/call.go). A call is an ingest of one
// input: logged with the key's group, then applied by the key's grain,
// which answers its reply through the ingest's waiter. A read-only call
// goes to the grain as a query does, unlogged.

// CallOptions are a call's options.
type CallOptions struct {
	// ID makes the call exactly-once: a retry with the same id, within the
	// pipeline's dedup window, gets the first call's reply (or error)
	// without the handler running again. "" for none.
	ID string
	// ReadOnly runs the call without logging it; the handler may not
	// change the key. It takes no id.
	ReadOnly bool
}

// Call calls the key's handler with request req (a JSON value) and returns
// its reply, once the request is logged and applied (a read-only call: as
// soon as the key answered, reading every ingest acknowledged before).
// The handler's failure is an error wrapping fold.ErrCallFailed (a
// *fold.CallError with its text); the key is then unchanged. A bad request
// fails before anything is logged (fold.ErrInvalidCall,
// fold.ErrCallTooLarge, fold.ErrNoCallHandler). If ctx ends, or the store
// fails (ErrUnavailable), the call may still be applied: retry it with its
// id.
func (h *Host) Call(ctx context.Context, pipeline, key string, req []byte, o CallOptions) (fold.Reply, error) {
	p, ok := h.cfg.Pipelines[pipeline]
	if !ok {
		return fold.Reply{}, fmt.Errorf("%w %q", ErrUnknownPipeline, pipeline)
	}
	if o.ReadOnly && o.ID != "" {
		return fold.Reply{}, fmt.Errorf("%w: a read-only call takes no id (it is not logged)", fold.ErrInvalidCall)
	}
	ev, err := p.NewCall(key, o.ID, req)
	if err != nil {
		return fold.Reply{}, err
	}
	if o.ReadOnly {
		return h.readCall(ctx, pipeline, ev)
	}
	q, err := h.enqueue(ctx, pipeline, []*fold.Event{ev})
	if err != nil {
		return fold.Reply{}, err
	}
	if _, err := q.Wait(ctx); err != nil {
		return fold.Reply{}, err
	}
	r := q.w.answered()
	if r == nil {
		// Logged, but the key's group was lost before it applied: its
		// take-over replays the call, whose reply only a retry gets.
		return fold.Reply{}, fmt.Errorf("%w: the call was logged but the key group was lost before it answered; retry it with its id", ErrUnavailable)
	}
	return *r, r.Error()
}

// readCallMsg asks a grain to run a read-only call.
type readCallMsg struct {
	ev    *fold.Event
	now   int64
	reply chan callReply
}

type callReply struct {
	r   fold.Reply
	err error
}

// readCall runs a read-only call on the key's grain.
func (h *Host) readCall(ctx context.Context, pipeline string, ev *fold.Event) (fold.Reply, error) {
	msg := &readCallMsg{ev: ev, now: h.cfg.Now().UnixMilli(), reply: make(chan callReply, 1)}
	if err := h.sendRead(pipeline, ev.Key, msg); err != nil {
		return fold.Reply{}, err
	}
	select {
	case r := <-msg.reply:
		if r.err == nil {
			r.err = r.r.Error()
		}
		return r.r, r.err
	case <-ctx.Done():
		return fold.Reply{}, ctx.Err()
	case <-h.failCh:
		return fold.Reply{}, h.Err()
	}
}

// call applies a call the log holds and answers its caller.
func (g *grain) call(ev *fold.Event, s segment) {
	r := g.pipeline.ApplyCall(&g.state, ev, s.nowMs)
	r.Value = slices.Clone(r.Value) // the key may keep it: the caller gets its own
	g.pstats.calls.Add(1)
	if r.Err != "" && !r.Duplicate {
		g.pstats.callFailures.Add(1)
	}
	s.w.answer(r)
}

func (g *grain) readCall(m *readCallMsg) callReply {
	if g.broken != nil {
		return callReply{err: fmt.Errorf("%w: %w", ErrUnavailable, hideStore("loading the key", g.broken))}
	}
	g.pstats.calls.Add(1)
	r := g.pipeline.ReadCall(&g.state, g.id.key, m.ev.Raw, m.now)
	if r.Err != "" {
		g.pstats.callFailures.Add(1)
	}
	return callReply{r: r}
}
