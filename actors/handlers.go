package actors

import (
	"fmt"

	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Go handlers (fold/handler.go) run inside their key's fold.State like the
// built-in operators: the grain only counts their outputs and shows their
// state.

// countOutputs counts the outputs a key emitted, and among them the dead
// letters of its handler's failed calls.
func (g *grain) countOutputs(outs []*keyfoldv1.Output) {
	g.pstats.emitted.Add(int64(len(outs)))
	if g.pipeline.IsJoin() {
		n := 0
		for _, o := range outs {
			if o.GetCount() == 1 { // one event, the other side empty
				n++
			}
		}
		g.pstats.unmatched.Add(int64(n))
	}
	if !g.pipeline.HasHandler() {
		return
	}
	failed := 0
	for _, o := range outs {
		if o.GetKind() == fold.DeadLetterKind {
			failed++
		}
	}
	if failed > 0 {
		g.pstats.failures.Add(int64(failed))
		g.host.log.Warn("handler calls failed", "pipeline", g.id.pipeline, "key", g.id.key, "failures", failed)
	}
}

// queryHandler adds the key's handler state to a query's view.
func (g *grain) queryHandler(v *KeyView) error {
	if !g.pipeline.HasHandler() {
		return nil
	}
	st, failed, err := g.pipeline.HandlerState(&g.state)
	if err != nil {
		return fmt.Errorf("actors: render the handler state of %s/%s: %w", g.id.pipeline, g.id.key, err)
	}
	v.State, v.HandlerFailures = st, failed
	return nil
}
