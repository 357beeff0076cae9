package actors

import (
	"errors"
	"syscall"

	"github.com/keyfold/keyfold/persistence"
)

var (
	// ErrNotReady reports a call before the node has recovered its state.
	ErrNotReady = errors.New("actors: node not ready")
	// ErrClosed reports an ingest or query after the host stopped accepting.
	ErrClosed = errors.New("actors: host is shutting down")
	// ErrNotFound reports a query for a key that holds no state.
	ErrNotFound = errors.New("actors: key not found")
	// ErrUnknownPipeline reports a pipeline the host was not configured with.
	ErrUnknownPipeline = errors.New("actors: unknown pipeline")
	// ErrUnavailable reports that a key group cannot serve now: the store
	// failed a write or is unreachable, or another owner took the group
	// over, and the host is taking it over again (replaying its log). The
	// events of a failed ingest may or may not have been logged, so retry
	// only events that carry an id: those are applied once.
	ErrUnavailable = errors.New("actors: key group unavailable")
	// ErrFailed reports that the host stopped after an error it cannot
	// recover from by itself (a corrupt log record, a panic in a grain); the
	// process must restart (and replay) before it can serve again.
	ErrFailed = errors.New("actors: host failed")
	// ErrNotOwner reports a key group this host does not serve: another
	// node owns it (it comes with ErrUnavailable, so clients retry).
	ErrNotOwner = errors.New("actors: key group owned by another node")
	// ErrNotServed refuses a whole batch, before anything of it is logged,
	// because one of its key groups is not served here now: another node
	// owns it, or it is being taken over. It comes with ErrUnavailable; a
	// cluster node routes the batch again.
	ErrNotServed = errors.New("actors: batch refused, nothing logged")
	// ErrBadArgument reports an argument out of range or malformed (an
	// outputs cursor, a page size).
	ErrBadArgument = errors.New("actors: bad argument")
	// ErrBusy reports a request refused because a node is at its limit of
	// concurrent work; retry later. The transports refuse with it, and a
	// cluster member passes on an owner's refusal with it.
	ErrBusy = errors.New("too many concurrent requests")
	// ErrLayout refuses to start a host with joins on a store laid out
	// before the key group of a key stopped depending on its pipeline
	// (LayoutPipelineKey): there a key's sides are in different groups.
	ErrLayout = errors.New("actors: the store's key-group layout cannot serve joins")
)

// storeFailure wraps a store error in what callers of the host see: its
// text says only what failed, so that API clients are not shown the
// store's internals (addresses, key names); errors.Is and errors.As still
// reach the store error, and the host logs it whole.
type storeFailure struct {
	what string
	err  error
}

func (e *storeFailure) Error() string {
	switch {
	case errors.Is(e.err, persistence.ErrFenced):
		return e.what + ": another owner took the key group over"
	case errors.Is(e.err, persistence.ErrBadCursor):
		return e.what + ": not a cursor of this pipeline's outputs, or past the newest one"
	}
	if errors.Is(e.err, persistence.ErrNoSpace) || errors.Is(e.err, syscall.ENOSPC) {
		return e.what + ": the store's disk is full"
	}
	return e.what + ": the store failed or did not answer"
}

func (e *storeFailure) Unwrap() error { return e.err }

// hideStore wraps err for callers (nil stays nil).
func hideStore(what string, err error) error {
	if err == nil {
		return nil
	}
	return &storeFailure{what, err}
}
