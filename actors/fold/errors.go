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
