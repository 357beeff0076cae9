package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// Outputs: the results keys emit (window results, session ends) are stored
// by the checkpoint that stores the state that emitted them, in the
// pipeline's output log. A crash before that checkpoint replays the inputs
// and emits them again with the same ids, so an output is never lost; the
// Redis store may append one twice (see persistence.CheckpointData), which
// is why each carries a stable id.

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
		return nil, fmt.Errorf("%w: cursor %q: %w", ErrBadArgument, after, err)
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
