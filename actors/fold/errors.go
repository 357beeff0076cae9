package fold

import (
	"errors"
	"fmt"
)

// ErrInvalidEvent is wrapped by every error that rejects an event.
var ErrInvalidEvent = errors.New("fold: invalid event")

// FieldError rejects an event because of one of its fields.
type FieldError struct {
	Field  string // the field's (dotted) path, or the aggregate for a where filter
	Reason string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return fmt.Sprintf("field %q: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidEvent) hold for field errors.
func (e *FieldError) Is(target error) bool { return target == ErrInvalidEvent }

// SpecError reports a problem with one entry of a pipeline's configuration.
type SpecError struct {
	Pipeline string // the pipeline's name, or the join's
	Entry    string // e.g. "aggregates.amount", or "" for the pipeline itself
	Problem  string
	Join     bool // of a join (CompileJoin), not a pipeline
}

// Where names the pipeline or join, as errors do: `pipeline "p"`.
func (e *SpecError) Where() string {
	if e.Join {
		return fmt.Sprintf("join %q", e.Pipeline)
	}
	return fmt.Sprintf("pipeline %q", e.Pipeline)
}

func (e *SpecError) Error() string {
	if e.Entry == "" {
		return fmt.Sprintf("%s: %s", e.Where(), e.Problem)
	}
	return fmt.Sprintf("%s: %s: %s", e.Where(), e.Entry, e.Problem)
}

// BatchError rejects a whole batch because of one of its events.
type BatchError struct {
	Index int   // the event's index in the batch, from 0
	Err   error // why, usually a *FieldError
}

func (e *BatchError) Error() string { return fmt.Sprintf("event %d: %v", e.Index, e.Err) }

func (e *BatchError) Unwrap() error { return e.Err }

var (
	// ErrInvalidCall is wrapped by every error that rejects a call's
	// request before it is logged: a bad key or id, a request that is not
	// JSON, a pipeline whose handler takes no calls.
	ErrInvalidCall = errors.New("fold: invalid call")
	// ErrNoCallHandler rejects a call to a pipeline without a Go handler,
	// or whose handler has no OnCall.
	ErrNoCallHandler = errors.New("fold: the pipeline's handler takes no calls")
	// ErrCallTooLarge rejects a request above MaxRequestBytes; a reply
	// above MaxReplyBytes fails its call (a *CallError).
	ErrCallTooLarge = errors.New("fold: call too large")
	// ErrCallFailed is wrapped by a *CallError: the handler failed the call
	// (returned an error, panicked, or changed the key in a read-only
	// call), and the key is unchanged.
	ErrCallFailed = errors.New("fold: the call failed")
)

// CallError is a call the handler failed: Msg is its error's text, as the
// caller (and a retry with the same id) gets it.
type CallError struct{ Msg string }

func (e *CallError) Error() string { return "call failed: " + e.Msg }

// Is makes errors.Is(err, ErrCallFailed) hold.
func (e *CallError) Is(target error) bool { return target == ErrCallFailed }
