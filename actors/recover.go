package actors

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/keyfold/keyfold/persistence"
	"golang.org/x/sync/errgroup"
)

// Recover claims every key group, which fences off any earlier owner, and
// replays each group's log above its checkpoint into its keys. Call it once,
// before Run. If it fails the host is unusable and has released its actors.
func (h *Host) Recover(ctx context.Context) error {
	err := h.recover(ctx)
	if err != nil {
		h.stopAll()
	}
	return err
}

func (h *Host) recover(ctx context.Context) error {
	if err := h.store.CheckGroups(ctx, h.cfg.Groups); err != nil {
		return fmt.Errorf("actors: recover: %w", err)
	}
	start := time.Now()
	// Claim every group first, concurrently: each claim is a synced write,
	// and the store shares fsyncs between concurrent writes.
	states := make([]persistence.GroupState, h.cfg.Groups)
	var claims errgroup.Group
	claims.SetLimit(32)
	for g := range h.cfg.Groups {
		claims.Go(func() (err error) {
			if states[g], err = h.store.Claim(ctx, g); err != nil {
				return fmt.Errorf("actors: recover: claim group %d: %w", g, err)
			}
			return nil
		})
	}
	if err := claims.Wait(); err != nil {
		return err
	}
	for g := range h.cfg.Groups {
		st := states[g]
		h.mu.Lock()
		gs := &h.groups[g]
		gs.epoch, gs.checkpoint, gs.dispatched = st.Epoch, st.Checkpoint, st.Checkpoint
		h.mu.Unlock()
		err := h.store.Read(ctx, g, st.Checkpoint, func(pos persistence.Position, data []byte) error {
			return h.replay(g, pos, data)
		})
		if err != nil {
			return fmt.Errorf("actors: recover: read group %d: %w", g, err)
		}
	}
	h.log.Info("recovered", "groups", h.cfg.Groups, "records", h.stats.replayed.Load(),
		"keys", h.Stats().ActiveKeys, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// replay hands one logged record to its keys. The record's inputs were
// accepted when logged, so they are applied whatever the configuration says
// now (see fold.Pipeline.Replay); only the inputs of a pipeline that was
// removed from the configuration are dropped, with a warning.
func (h *Host) replay(g uint32, pos persistence.Position, data []byte) error {
	h.stats.replayed.Add(1)
	rec, err := decodeRecord(data)
	if err != nil {
		return fmt.Errorf("actors: group %d record %d does not decode (corrupt log?): %w", g, pos, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ki := range rec.Keys {
		p := h.cfg.Pipelines[ki.Pipeline]
		if p == nil {
			h.log.Warn("discarding logged inputs of a pipeline no longer configured",
				"pipeline", ki.Pipeline, "key", ki.Key, "group", g, "seq", pos, "inputs", len(ki.Inputs))
			continue
		}
		if strings.ContainsRune(ki.Key, 0) { // cannot be logged today; would collide in the snapshot store
			h.log.Warn("discarding logged inputs of a key containing NUL", "pipeline", ki.Pipeline, "group", g, "seq", pos)
			continue
		}
		msg := &applyMsg{pos: pos}
		for _, in := range ki.Inputs {
			if len(msg.segs) == 0 || msg.segs[len(msg.segs)-1].nowMs != in.IngestTimeMs {
				msg.segs = append(msg.segs, segment{nowMs: in.IngestTimeMs})
			}
			last := &msg.segs[len(msg.segs)-1]
			last.events = append(last.events, p.Replay(in.Event, ki.Key))
		}
		id := keyID{ki.Pipeline, ki.Key}
		h.sendLocked(id, g, msg)
		h.groups[g].dirty[id] = pos
	}
	h.groups[g].dispatched = pos
	return nil
}
