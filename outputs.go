package keyfold

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/keyfold/keyfold/actors"
)

// Output is one result a key emitted: a window's values once the watermark
// passed its end (revision 0), and again for each late event within
// allowed lateness (revisions 1, 2, …). Outputs are delivered at least once:
// ID is stable (a replay after a crash emits the same result with the same
// ID), so consumers deduplicate by it.
type Output struct {
	// Cursor resumes a read or a subscription after this output.
	Cursor   string `json:"cursor"`
	ID       string `json:"id"`
	Pipeline string `json:"pipeline"`
	Key      string `json:"key"`
	// Kind is the window type (tumbling, sliding, session), the pattern
	// type (threshold, sequence, absence), or, for a Go handler's output,
	// "handler" (Key.Emit) or "dead_letter" (a call that failed); Name the
	// window's or pattern's name in the pipeline, or the name emitted.
	Kind     string    `json:"kind"`
	Name     string    `json:"name"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"` // a window's is exclusive; a pattern's is its last event (an absence's deadline)
	Revision uint32    `json:"revision"`
	Count    uint64    `json:"count"` // events in the window, or matched by the pattern
	// Values are the window's aggregates, by name.
	Values json.RawMessage `json:"values"`
	// Watermark is the key's watermark when it emitted the result.
	Watermark time.Time `json:"watermark"`
	// Supersedes are the IDs of the earlier results this one replaces: the
	// window's previous revision and, for a session that a late event
	// extended or merged with others, the last results of those sessions
	// (their IDs differ, as their bounds did). A reader keeping the latest
	// results drops these.
	Supersedes []string `json:"supersedes,omitempty"`
	// Stored is when the output reached the store.
	Stored time.Time `json:"stored"`
}

// Defaults and bounds of output reads.
const (
	DefaultOutputsLimit = 100
	MaxOutputsLimit     = actors.MaxOutputsPage
)

// ErrBadArgument reports a malformed cursor or an out-of-range limit.
var ErrBadArgument = actors.ErrBadArgument

// Outputs returns up to limit outputs of pipeline stored after the output
// whose Cursor is after ("" reads from the oldest kept), oldest first. An
// empty page means there is nothing newer yet.
func (n *Node) Outputs(ctx context.Context, pipeline, after string, limit int) ([]Output, error) {
	page, err := n.storedOutputs(ctx, pipeline, after, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Output, len(page))
	for i, o := range page {
		out[i] = outputOf(o)
	}
	return out, nil
}

// storedOutputs reads a page of outputs as the store holds them: the form
// the gRPC API passes through, and the one Output is made from.
func (n *Node) storedOutputs(ctx context.Context, pipeline, after string, limit int) ([]actors.Output, error) {
	h, err := n.serving(pipeline)
	if err != nil {
		return nil, err
	}
	return h.Outputs(ctx, pipeline, after, limit)
}

// outputOf is a stored output in the embedding API's (and HTTP's) form.
func outputOf(o actors.Output) Output {
	return Output{
		Cursor: o.Cursor, ID: o.GetId(), Pipeline: o.GetPipeline(), Key: o.GetKey(),
		Kind: o.GetKind(), Name: o.GetName(),
		Start: time.UnixMilli(o.GetStartMs()).UTC(), End: time.UnixMilli(o.GetEndMs()).UTC(),
		Revision: o.GetRevision(), Count: o.GetCount(), Values: json.RawMessage(o.GetValuesJson()),
		Watermark: time.UnixMilli(o.GetWatermarkMs()).UTC(), Stored: o.Time.UTC(), Supersedes: o.GetSupersedes(),
	}
}

// subscribePoll is how often a subscriber that has read everything looks
// again for outputs this node did not store (another node's, in a cluster).
const subscribePoll = time.Second

// Subscribe calls fn with every output of pipeline stored after cursor after
// ("" from the oldest kept), in order, and then with each new one as it is
// stored, until ctx ends (it then returns nil), fn returns an error (which it
// returns), the node drains (ErrClosed), or reading fails. Resume a broken
// subscription from the Cursor of the last output handled.
func (n *Node) Subscribe(ctx context.Context, pipeline, after string, fn func(Output) error) error {
	return n.subscribe(ctx, pipeline, after, func(o actors.Output) error { return fn(outputOf(o)) })
}

// subscribe is Subscribe with the outputs as the store holds them.
func (n *Node) subscribe(ctx context.Context, pipeline, after string, fn func(actors.Output) error) error {
	const page = 1000
	for {
		h, err := n.serving(pipeline)
		if err != nil {
			return err
		}
		if n.draining.Load() {
			return ErrClosed
		}
		stored := h.OutputsStored() // before reading: nothing is missed
		outs, err := n.storedOutputs(ctx, pipeline, after, page)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("keyfold: subscribe to %q: %w", pipeline, err)
		}
		for _, o := range outs {
			if err := fn(o); err != nil {
				return err
			}
			after = o.Cursor
		}
		if len(outs) == page {
			continue
		}
		t := time.NewTimer(subscribePoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-n.drain:
			t.Stop()
			return ErrClosed
		case <-stored:
		case <-t.C:
		}
		t.Stop()
	}
}
