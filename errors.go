package keyfold

import (
	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
)

// Errors of the embedding API. Callers test them with errors.Is.
var (
	// ErrNotReady reports a call before Run has recovered and started.
	ErrNotReady = actors.ErrNotReady
	// ErrUnknownPipeline reports a pipeline the node was not configured with.
	ErrUnknownPipeline = actors.ErrUnknownPipeline
	// ErrNotFound reports a key that holds no state.
	ErrNotFound = actors.ErrNotFound
	// ErrInvalidEvent wraps every rejection of a batch for one of its events;
	// errors.As with *BatchError tells which event and field.
	ErrInvalidEvent = fold.ErrInvalidEvent
	// ErrClosed reports a call on a node that is draining or stopped.
	ErrClosed = actors.ErrClosed
	// ErrUnavailable reports a failed write to the store: the batch may or
	// may not have been logged; retrying is safe for events with ids.
	ErrUnavailable = actors.ErrUnavailable
	// ErrCallFailed wraps a call the handler failed (returned an error,
	// panicked, or changed the key in a read-only call): errors.As with
	// *CallError gives its text. The key is unchanged.
	ErrCallFailed = fold.ErrCallFailed
	// ErrNoCallHandler refuses a call to a pipeline whose handler is not a
	// Caller (or that has no handler).
	ErrNoCallHandler = fold.ErrNoCallHandler
	// ErrCallTooLarge refuses a request above MaxRequestBytes.
	ErrCallTooLarge = fold.ErrCallTooLarge
	// ErrInvalidCall refuses a call with a bad key, id or request (not
	// JSON), or a read-only call with an id.
	ErrInvalidCall = fold.ErrInvalidCall
)

// CallError is a call the handler failed: Msg is its error's text.
type CallError = fold.CallError

// BatchError rejects a batch because of one event: Index is its position in
// the batch; Err (a *FieldError) names the field.
type BatchError = fold.BatchError

// FieldError names the field that made an event invalid.
type FieldError = fold.FieldError
