package actors

import "github.com/keyfold/keyfold/persistence"

// The registry of keys in memory.
//
// Every key in memory has one grain, found by the key's name in one index
// (Host.keys, keyindex.go), and the grain says where the key is: active (it has an actor,
// and is in the order of use that passivation walks), stopping (its actor
// was told to passivate it and has not yet reached that message), or parked
// in the resident tier (resident.go). What the host keeps per group of its
// keys (the parked ones, the dirty ones) is kept in slices that the grains
// know their place in, and a checkpoint holds the grains themselves, so a
// key is looked up by its name once per message sent to it, and once more
// when it enters or leaves memory. (Separate maps for active, stopping,
// parked and dirty keys were looked up about twenty times per activation
// and passivation, and those look-ups, missing the CPU's caches in maps of
// a million keys, were a fifth of the CPU at a million keys: BENCHMARKS.md,
// session 13.)
//
// A grain in the registry belongs to its group's current incarnation
// (epoch), with one exception: dropping a group (a loss, a release) takes
// its active and parked keys out at once, but a stopping key stays until
// its actor is done with it and parkLocked takes it out (its group's epoch
// has moved by then, or the group is not served). A look-up treats such a
// grain as absent (lookupLocked), and a new grain for the key replaces it.
// Everything here is guarded by h.mu.

// tier is where a key in memory is.
type tier uint8

const (
	tierGone     tier = iota // not in memory (left it, or never entered)
	tierActive               // has an actor (shell.go)
	tierStopping             // its actor passivates it (resident.go)
	tierParked               // in the resident tier, without an actor
)

// lookupLocked returns the key's grain if it is in memory, in its group's
// current incarnation; nil if not. h.mu must be held.
func (h *Host) lookupLocked(id keyID, group uint32) *grain {
	g := h.keys.get(id)
	if g == nil || g.epoch != h.groups[group].epoch {
		return nil
	}
	return g
}

// forgetLocked takes a grain out of the registry, if it is still the key's
// there (an active or parked one always is). h.mu must be held.
func (h *Host) forgetLocked(g *grain) {
	if g.tier != tierGone {
		h.keys.remove(g)
	}
	g.tier = tierGone
}

// currentLocked reports whether a grain in the registry belongs to its
// group's current incarnation, served now or being replayed: as
// lookupLocked would find it, without looking it up. (A grain of a dropped
// incarnation has an older epoch than its group's, or its group is not
// served until its next claim, which moves the epoch; stopAll forgets
// every key.) h.mu must be held.
func (h *Host) currentLocked(g *grain) bool {
	gs := &h.groups[g.group]
	return !h.stopped && g.tier != tierGone && g.epoch == gs.epoch && (gs.ready || gs.replaying)
}

// markDirtyLocked records that a key in memory was handed the record at
// pos: its state is newer than its snapshot until a checkpoint stores it.
// h.mu must be held.
func (h *Host) markDirtyLocked(g *grain, pos persistence.Position) {
	g.dirtyAt = pos
	if g.dirtyIdx != 0 {
		return
	}
	gs := &h.groups[g.group]
	gs.dirty = append(gs.dirty, g)
	g.dirtyIdx = int32(len(gs.dirty))
}

// cleanLocked records that a key's snapshot holds its state. h.mu must be
// held.
func (h *Host) cleanLocked(g *grain) {
	if g.dirtyIdx == 0 {
		return
	}
	gs := &h.groups[g.group]
	removeAt(&gs.dirty, g.dirtyIdx, func(moved *grain, idx int32) { moved.dirtyIdx = idx })
	g.dirtyIdx, g.dirtyAt = 0, 0
	if g.tier == tierParked {
		h.cleanedLocked(g)
	}
}

// removeAt removes the element at index idx-1 of s by moving the last one
// there, and tells the moved one its new index+1.
func removeAt(s *[]*grain, idx int32, moved func(*grain, int32)) {
	i, last := int(idx-1), len(*s)-1
	if i != last {
		(*s)[i] = (*s)[last]
		moved((*s)[i], idx)
	}
	(*s)[last] = nil
	*s = (*s)[:last]
}
