package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// Outputs: a key hands the results it emits (window results, pattern
// matches) to the host's output queue as it applies the input that emitted
// them; the output loop stores the queue every OutputInterval in one store
// call, and a group's checkpoint stores it before it trims the log those
// inputs came from. So a result is never lost — a crash before it is stored
// replays the inputs, which emit it again with the same id — and may be
// stored twice (a crash after it is stored and before the checkpoint):
// delivery is at least once, with stable ids.

// Output is one stored result, with the cursor that resumes after it.
type Output struct {
	Cursor string
	Time   time.Time // when it was stored
	*keyfoldv1.Output
}

// MaxOutputsPage bounds one read of an output log.
const MaxOutputsPage = 10_000

// Outputs returns up to limit results of pipeline stored after cursor after
// ("" reads from the oldest kept). A cursor that is not one the store made
// is an error wrapping persistence.ErrBadCursor.
func (h *Host) Outputs(ctx context.Context, pipeline, after string, limit int) ([]Output, error) {
	if _, ok := h.cfg.Pipelines[pipeline]; !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownPipeline, pipeline)
	}
	if limit <= 0 || limit > MaxOutputsPage {
		return nil, fmt.Errorf("%w: limit must be between 1 and %d (got %d)", ErrBadArgument, MaxOutputsPage, limit)
	}
	entries, err := h.store.ReadOutputs(ctx, pipeline, after, limit)
	if errors.Is(err, persistence.ErrBadCursor) {
		return nil, fmt.Errorf("%w: %w", ErrBadArgument, hideStore(fmt.Sprintf("cursor %q", after), err))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, hideStore("reading the outputs", err))
	}
	out := make([]Output, len(entries))
	for i, e := range entries {
		o := &keyfoldv1.Output{}
		if err := proto.Unmarshal(e.Data, o); err != nil {
			return nil, fmt.Errorf("actors: output %s of pipeline %q does not decode: %w", e.Cursor, pipeline, err)
		}
		out[i] = Output{Cursor: e.Cursor, Time: e.Time, Output: o}
	}
	return out, nil
}

// outputQueue holds results emitted and not yet stored, in emission order.
type outputQueue struct {
	mu    sync.Mutex
	items []persistence.Output
	flush sync.Mutex   // one store call at a time, so results stay in order
	n     atomic.Int64 // results queued or being stored
}

// MaxQueuedOutputs bounds the results waiting to be stored: beyond it (the
// output log has been failing for a while) commits refuse new input with
// ErrUnavailable rather than let the queue grow without bound.
const MaxQueuedOutputs = 1 << 20

// queueOutputs queues a key's results for storing.
func (h *Host) queueOutputs(pipeline string, outs []*keyfoldv1.Output) {
	items := make([]persistence.Output, 0, len(outs))
	for _, o := range outs {
		data, err := proto.Marshal(o)
		if err != nil { // cannot happen for this message
			h.fail(fmt.Errorf("actors: encode output %s: %w", o.GetId(), err))
			return
		}
		items = append(items, persistence.Output{Pipeline: pipeline, Data: data})
	}
	h.outq.mu.Lock()
	h.outq.items = append(h.outq.items, items...)
	h.outq.mu.Unlock()
	h.outq.n.Add(int64(len(items)))
}

// flushOutputs stores every queued result. On failure they stay queued, in
// order, for the next try.
func (h *Host) flushOutputs(ctx context.Context) error {
	q := &h.outq
	q.flush.Lock()
	defer q.flush.Unlock()
	q.mu.Lock()
	items := q.items
	q.items = nil
	q.mu.Unlock()
	if len(items) == 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, storeTimeout)
	err := h.store.AppendOutputs(wctx, items)
	cancel()
	if err != nil {
		q.mu.Lock()
		q.items = append(items, q.items...)
		q.mu.Unlock()
		return fmt.Errorf("actors: store %d outputs: %w", len(items), err)
	}
	q.n.Add(-int64(len(items))) // n counts them until they are stored
	h.outputs.notify()
	return nil
}

// outputLoop stores the queued results every OutputInterval until ctx ends,
// then once more.
func (h *Host) outputLoop(ctx context.Context) {
	t := time.NewTicker(h.cfg.OutputInterval)
	defer t.Stop()
	failing := false
	for await(h, ctx, t.C) {
		err := h.flushOutputs(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			h.log.Warn("storing outputs failed; retrying", "err", err)
		case err == nil && failing:
			h.log.Info("outputs stored again")
		}
		failing = err != nil
	}
}

// OutputsStored returns a channel closed when this host next stores
// results: a subscriber that has read everything waits on it (and polls
// now and then, for results other nodes store).
func (h *Host) OutputsStored() <-chan struct{} { return h.outputs.wait() }

// outputsBroadcast wakes every waiter at once.
type outputsBroadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func (b *outputsBroadcast) init() { b.ch = make(chan struct{}) }

func (b *outputsBroadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *outputsBroadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}

// trimOutputsLoop deletes results older than their pipeline's retention,
// at start and then every minute, until ctx ends.
func (h *Host) trimOutputsLoop(ctx context.Context) {
	if !h.timed {
		return
	}
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		for name, p := range h.cfg.Pipelines {
			if !p.Timed() {
				continue
			}
			before := h.cfg.Now().Add(-p.OutputRetention())
			tctx, cancel := context.WithTimeout(ctx, storeTimeout)
			n, err := h.store.TrimOutputs(tctx, name, before)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil:
				h.log.Warn("trimming outputs failed; retrying in a minute", "pipeline", name, "err", err)
			case n > 0:
				h.log.Debug("outputs trimmed", "pipeline", name, "outputs", n, "before", before)
			}
		}
		if !await(h, ctx, t.C) {
			return
		}
	}
}
