package actors

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Key groups a host serves. One node serves them all; in a cluster each
// node serves those placement assigns it (cluster.Assign) and moves them
// with SetOwned. Safety never depends on the assignment: a group's new owner
// claims it in the store, which fences the old one.

// unavailable is the error of a call for a group that is not served now.
func (gs *groupState) unavailable(g uint32) error {
	if !gs.owned {
		return fmt.Errorf("%w: %w: key group %d", ErrUnavailable, ErrNotOwner, g)
	}
	return fmt.Errorf("%w: key group %d is being taken over: %w", ErrUnavailable, g, hideStore("it was lost", gs.lastErr))
}

// Owned returns the key groups the host is to serve, ascending.
func (h *Host) Owned() []uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var gs []uint32
	for g := range h.groups {
		if h.groups[g].owned {
			gs = append(gs, uint32(g))
		}
	}
	return gs
}

// SetOwned makes the host serve exactly groups. Groups it stops serving are
// released first: new inputs for them fail with ErrNotOwner, their queued
// results are stored, they are checkpointed (so the next owner replays
// next to nothing) and their keys leave memory. Then the new groups are
// taken over (claimed, which fences their previous owner, and replayed).
// It returns when every new group is served, or ctx ends (the rest are
// retried by the take-over loop).
func (h *Host) SetOwned(ctx context.Context, groups []uint32) error {
	want := make([]bool, h.cfg.Groups)
	for _, g := range groups {
		if g >= h.cfg.Groups {
			return fmt.Errorf("%w: key group %d of %d", ErrBadArgument, g, h.cfg.Groups)
		}
		want[g] = true
	}
	var release, acquire []uint32
	h.mu.Lock()
	for g := range h.groups {
		switch gs := &h.groups[g]; {
		case gs.owned && !want[g]:
			gs.owned = false // commits refuse its inputs from now on
			release = append(release, uint32(g))
		case !gs.owned && want[g]:
			gs.owned = true
			acquire = append(acquire, uint32(g))
		}
	}
	h.mu.Unlock()
	if len(release) > 0 {
		h.log.Info("releasing key groups", "groups", len(release), "list", GroupList(release))
		start := time.Now()
		err := h.release(ctx, release)
		h.log.Info("key groups released", "groups", len(release), "took", time.Since(start).Round(time.Millisecond), "err", err)
	}
	if len(acquire) == 0 {
		return nil
	}
	h.log.Info("taking key groups over", "groups", len(acquire), "list", GroupList(acquire))
	start := time.Now()
	if err := h.takeOverUntilDone(ctx, acquire); err != nil {
		// The take-over loop retries them (they are owned and not ready).
		select {
		case h.lostNow <- struct{}{}:
		default:
		}
		return fmt.Errorf("actors: take over %d key groups: %w", len(acquire), err)
	}
	h.log.Info("key groups taken over", "groups", len(acquire), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// release checkpoints the groups (best effort: a group whose checkpoint
// fails is replayed a little longer by its next owner) and drops their keys.
func (h *Host) release(ctx context.Context, groups []uint32) error {
	var errs []error
	// A paced round of the loop holds the groups it checkpoints (and the
	// snapshot slots) for its pace; the groups released wait for it, and
	// refuse inputs meanwhile.
	h.hurryCheckpoint()
	if err := h.flushOutputs(ctx); err != nil {
		errs = append(errs, err)
	} else {
		for _, g := range groups {
			if err := h.checkpointGroup(ctx, g, nil); err != nil {
				errs = append(errs, err)
			}
		}
	}
	drop := make(map[uint32]bool, len(groups))
	h.mu.Lock()
	for _, g := range groups {
		if gs := &h.groups[g]; !gs.owned { // not owned again meanwhile
			gs.ready = false
			drop[g] = true
		}
	}
	h.dropGroupsLocked(drop)
	h.mu.Unlock()
	return errors.Join(errs...)
}

// Abandon stops serving every key group at once and writes nothing: the
// groups' keys leave memory unsaved, and calls for them fail with
// ErrNotOwner until SetOwned gives them back, which takes them over anew
// (claims them, fencing any owner since, and replays their logs). It is for
// a host whose memory may be stale: its node's membership lease ran out
// (the process was paused, or cut off), so other nodes may have owned its
// groups and written to them meanwhile. Checkpointing would be pointless
// (the store fences an owner whose epoch is not the group's) and could not
// be trusted. Outputs already handed to the output queue are still stored
// (they came from acknowledged inputs; outputs are at least once). It
// returns the groups it stopped serving.
func (h *Host) Abandon(reason error) []uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var list []uint32
	drop := make(map[uint32]bool)
	for g := range h.groups {
		if gs := &h.groups[g]; gs.owned || gs.ready {
			gs.owned, gs.ready, gs.lastErr = false, false, reason
			drop[uint32(g)] = true
			list = append(list, uint32(g))
		}
	}
	if len(list) == 0 {
		return nil
	}
	h.log.Warn("abandoning key groups", "groups", len(list), "list", GroupList(list), "err", reason)
	h.dropGroupsLocked(drop)
	return list
}

// GroupList writes ascending key groups compactly, for logs: "0-3,7,9".
func GroupList(groups []uint32) string {
	var b strings.Builder
	for i := 0; i < len(groups); {
		j := i
		for j+1 < len(groups) && groups[j+1] == groups[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(groups[i]), 10))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.FormatUint(uint64(groups[j]), 10))
		}
		i = j + 1
	}
	return b.String()
}
