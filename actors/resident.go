package actors

import "unsafe"

// The resident tier: keys held in memory without an actor.
//
// A protoactor actor costs about 2 KiB of its own (mailbox, context, process
// registry entry), more than the state of a key with a few aggregates. So a
// key keeps an actor only while it is in use (the MaxActive most recently
// used keys, for at most IdleTimeout); passivation stops the actor and parks
// the key's grain here, state and all, within a budget of bytes. The key's
// next message spawns an actor around the same grain: no store read, no
// decoding. Beyond the budget the least recently parked keys leave memory;
// their state is in their snapshots, so they come back from the store on
// demand. While no key of a group has left memory, a key found neither
// active nor parked is new and needs no store read either (groupState.complete).
//
// Why a parked grain is current: passivation takes clean keys only (their
// snapshot holds their state), and a parked key is not active, so nothing
// changes it: only an actor applies inputs, and a key's next input spawns
// its actor from the parked grain. A parked grain belongs to the group
// incarnation (epoch) it was active in; dropping a group (a loss, a
// release, an abandon) drops its parked keys, and activation takes a parked
// grain only of the group's current epoch.
//
// Handing the grain over: the actor stops after the messages already in
// its mailbox (Poison), and the grain parks itself when protoactor tells it
// it stopped (actor.Stopped), so no actor touches a parked grain. Until
// then the key is neither active nor parked; a message meanwhile activates
// it from the store (the snapshot is current), and the stopping grain then
// does not park (h.stopping no longer names it). Everything here is
// guarded by h.mu.

// grainBytes is what a parked key costs beyond its state: the grain, its
// entry in the group's map and the key's name.
var grainBytes = int(unsafe.Sizeof(grain{})) + 64

type resident struct {
	order lru[grain, *grain] // by parking, most recent first
	bytes int64              // estimated, of every parked key
	max   int64              // budget: beyond it the least recently parked leave
}

// park puts a stopped grain in the resident tier, if it is still the key's
// latest incarnation and its group's; h.mu must be held.
func (h *Host) parkLocked(g *grain) {
	if h.stopping[g.id] != g {
		g.leaveMemory()
		return // activated again meanwhile (from the store), or dropped
	}
	delete(h.stopping, g.id)
	gs := &h.groups[g.group]
	if g.broken != nil || !gs.ready || gs.epoch != g.epoch {
		g.leaveMemory()
		return // its group was dropped: nothing of it stays
	}
	if h.resident.max <= 0 {
		gs.complete = false // the key leaves memory
		g.leaveMemory()
		return
	}
	g.rsize = int64(grainBytes + len(g.id.pipeline) + len(g.id.key) + g.state.MemSize())
	if gs.parked == nil {
		gs.parked = make(map[keyID]*grain)
	}
	gs.parked[g.id] = g
	r := &h.resident
	r.order.pushFront(g)
	r.bytes += g.rsize
	for r.bytes > r.max && r.order.tail != nil {
		h.groups[r.order.tail.group].complete = false // a key leaves memory
		r.order.tail.leaveMemory()
		h.unparkLocked(r.order.tail)
	}
}

// unparkLocked takes a grain out of the resident tier.
func (h *Host) unparkLocked(g *grain) {
	h.resident.order.remove(g)
	h.resident.bytes -= g.rsize
	delete(h.groups[g.group].parked, g.id)
}

// parkedLocked returns the key's parked grain, if its group holds one.
func (h *Host) parkedLocked(id keyID, group uint32) *grain {
	return h.groups[group].parked[id]
}

// dropParkedLocked drops the parked keys of a group.
func (h *Host) dropParkedLocked(group uint32) {
	for _, g := range h.groups[group].parked {
		g.leaveMemory()
		h.unparkLocked(g)
	}
	h.groups[group].parked = nil
}

// leaveMemory takes what a grain leaving memory adds to its pipeline's
// gauges back. h.mu must be held, and no actor may run the grain.
func (g *grain) leaveMemory() {
	g.pstats.buffered.Add(-g.counted)
	g.counted = 0
}
