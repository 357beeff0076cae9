package keyfold

import (
	"context"
	"encoding/json"

	"github.com/keyfold/keyfold/actors"
)

// CallOptions are a call's options: ID makes it exactly-once (a retry with
// the same id, within the pipeline's dedup window, gets the first reply or
// error without the handler running again); ReadOnly runs it without
// logging it, on the key as its last logged input left it, and the
// handler may not change the key (a read-only call takes no id).
type CallOptions = actors.CallOptions

// CallResult is a call's answer: the handler's reply, a JSON value (null
// when it returned nil), and whether it is a reply kept from an earlier
// call with the same id.
type CallResult struct {
	Reply     json.RawMessage `json:"reply"`
	Duplicate bool            `json:"duplicate,omitempty"`
}

// Call sends request (a JSON value, at most MaxRequestBytes) to the key's
// handler, the pipeline's Caller (see Handle), and returns its reply once
// the request is logged and applied (a read-only call: once the key
// answered; it sees every ingest and call acknowledged before). In a
// cluster the key's owner answers.
//
// A handler that fails the call is an error wrapping ErrCallFailed (a
// *CallError, with the handler's error text); the key is unchanged. A
// request refused before anything is logged: ErrUnknownPipeline,
// ErrNoCallHandler, ErrCallTooLarge, or ErrInvalidCall (a bad key, id or
// JSON). ErrUnavailable, or ctx ending, leaves it unknown whether the call
// was applied: retry it with the same id.
func (n *Node) Call(ctx context.Context, pipeline, key string, request json.RawMessage, opts CallOptions) (CallResult, error) {
	r, err := n.route(pipeline)
	if err != nil {
		return CallResult{}, err
	}
	rep, err := r.Call(ctx, pipeline, key, request, opts)
	if err != nil {
		return CallResult{}, err
	}
	return CallResult{Reply: rep.Value, Duplicate: rep.Duplicate}, nil
}
