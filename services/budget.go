package services

import (
	"fmt"
	"sync/atomic"
)

// Defaults of the ingest limits (the node's max_ingest_bytes and
// max_batch_events).
const (
	DefaultMaxIngestBytes = 256 << 20
	DefaultMaxBatchEvents = 100_000
)

// EventCost is what an ingest reserves per event on top of its bytes: the
// event prepared for its key (fold.Event and its contributions, ~180 B for
// small events, BenchmarkPrepareBatch), the slices that carry it through the
// transport (~50 B), and its input in the group log's record (~100 B).
const EventCost = 384

// Budget bounds the memory of the ingest requests in flight on a node: the
// bytes of their bodies (messages) and EventCost per event. The HTTP and
// gRPC APIs share one, so the bound holds whichever way requests arrive. A
// request that does not fit is refused at once (ErrOverBudget: 429,
// ResourceExhausted, retry later) rather than queued: its body is already
// (partly) in memory.
type Budget struct {
	limit int64
	used  atomic.Int64
}

// NewBudget returns a budget of limit bytes.
func NewBudget(limit int64) *Budget { return &Budget{limit: limit} }

// Reserve takes n bytes of the budget, or fails with an error wrapping
// ErrOverBudget, taking nothing, if they do not fit. Each successful
// Reserve must be matched by Release(n).
func (b *Budget) Reserve(n int64) error {
	if n <= 0 {
		return nil
	}
	for {
		used := b.used.Load()
		if used+n > b.limit {
			return fmt.Errorf("%w: %d bytes wanted, %d of %d (max_ingest_bytes) in use: retry later", ErrOverBudget, n, used, b.limit)
		}
		if b.used.CompareAndSwap(used, used+n) {
			return nil
		}
	}
}

// Release returns n bytes taken by Reserve.
func (b *Budget) Release(n int64) {
	if n <= 0 {
		return
	}
	b.used.Add(-n)
}

// BatchTooLarge is the error of a batch of n events, more than max.
func BatchTooLarge(n, max int) error {
	return fmt.Errorf("%w: %d events or more, max_batch_events is %d: split the batch", ErrTooManyEvents, n, max)
}
