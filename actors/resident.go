package actors

import (
	"errors"
	"unsafe"

	"github.com/keyfold/keyfold/actors/fold"
)

// The resident tier: keys held in memory without an actor.
//
// A protoactor actor costs about 460 B of its own (context, mailbox, process
// registry entry; more than 2 KiB with protoactor's default mailbox and a
// Props per actor), half the state of a key with a few aggregates. So a
// key keeps an actor only while it is in use (about the MaxActive most
// recently used keys, for about IdleTimeout: passivate); passivation
// takes the key's actor back (into the pool of idle actors, shell.go) and
// parks the key's grain here, state and all, within a budget of bytes. The key's next message
// gives it an actor again around the same grain: no store read, no
// decoding. Beyond the budget the least recently parked clean keys leave memory;
// their state is in their snapshots, so they come back from the store on
// demand. While no key of a group has left memory, a key found neither
// active nor parked is new and needs no store read either (groupState.complete).
//
// Why a parked grain is current: a parked key is not active, so nothing
// changes it: only an actor applies inputs, and a key's next input gives
// the parked grain an actor. A parked grain belongs to the group
// incarnation (epoch) it was active in; dropping a group (a loss, a
// release, an abandon) drops its parked keys, and activation takes a parked
// grain only of the group's current epoch.
//
// Dirty keys park too: passivation does not wait for a checkpoint (at a
// million keys it forced one every few thousand events). A checkpoint
// snapshots a parked key without an actor (holding it as if stopping
// meanwhile). Over the budget, the least recently parked clean keys leave
// memory first; then the least recently parked dirty ones go to the spill
// (spill.go), packed, until their group's next checkpoint; a dirty key
// that cannot go there stays (pinned), and the budget asks for a
// checkpoint when only such keys and the spill are left. So a key's state
// is always in memory, in the spill or in its snapshot. The tier keeps its
// clean, dirty and pinned keys in three lists, so that eviction walks only
// keys it can take: with one list, every park walked past the same dirty
// keys at the tail, and that walk was most of what h.mu was held for at a
// million keys (a mutex profile, BENCHMARKS.md session 9). A parked key
// turns clean only when a checkpoint stored it (a key turns dirty only by
// an input, which takes it out of the tier first), and moves to the clean
// list then.
//
// Handing the grain over: the actor processes the messages already in its
// mailbox, then parks the grain when it reaches passivateMsg and goes back
// to the pool of idle actors (shell.go), so no actor touches a parked
// grain. Until then the key is stopping: messages sent to it wait (stoppingGrain) and go
// to a new actor around the same grain once the old one stopped; those a
// grain answers without applying anything (snapshots, queries) it answers
// at once, and a key that only waited for those parks. Everything here is
// guarded by h.mu.

// stoppingGrain is a grain whose actor was told to stop, and the messages
// sent to its key since, in order.
type stoppingGrain struct {
	g       *grain
	waiting []any
}

// holdLocked makes g's key stopping: what is sent to it waits until
// parkLocked hands the grain on. g must be neither active nor parked. h.mu
// must be held.
func (h *Host) holdLocked(g *grain) {
	g.stop = &stoppingGrain{g: g}
	g.tier = tierStopping
}

// errDropped answers what waited for a grain whose group was dropped while
// its actor stopped: the take-over replays the group's log.
var errDropped = errors.New("actors: the key's group was dropped")

// grainBytes is what a parked key costs beyond its state (State.MemSize,
// which counts the State struct in the grain) and its key's bytes outside
// the grain (keyHeapBytes): the rest of the grain, its entries in the
// registry's index (keyindex.go: a 16-byte slot at 35–70% load), its
// group's slice and the lists' table (lru.go), and the heap's rounding of
// its objects to their size classes (residentSlack). Until session 58 the
// State struct was counted twice, and a resident key was charged a quarter
// more than it took (BENCHMARKS.md).
var grainBytes = int(unsafe.Sizeof(grain{})-unsafe.Sizeof(fold.State{})) + residentSlack + tableBytes

// residentSlack is what grainBytes adds for the index slot, the group's
// slice and the size classes' rounding: measured, a resident key of five
// aggregates and one id takes 681 B of heap (-bench ResidentKeyMemory)
// and is charged 687.
const residentSlack = 120

// keyHeapBytes is what the key's bytes take outside the grain: nothing if
// they are in it (newGrainLocked).
func (g *grain) keyHeapBytes() int {
	if len(g.id.key) > 0 && unsafe.StringData(g.id.key) == &g.keyBytes[0] {
		return 0
	}
	return len(g.id.key)
}

type resident struct {
	// The parked keys by parking, most recent first: those whose snapshot
	// holds their state (clean), the others (dirty), which a checkpoint
	// moves to clean, and the dirty ones that cannot be spilled (pinned).
	clean, dirty, pinned lru
	spill                spill // the dirty keys that left memory (spill.go)
	bytes                int64 // estimated, of every parked key, and the spill's
	max                  int64 // budget: beyond it keys leave, clean ones first
}

// rlist names a resident list.
type rlist uint8

const (
	rlistClean rlist = iota
	rlistDirty
	rlistPinned
)

// init makes the lists the table's.
func (r *resident) init(t *grainTable) { r.clean.t, r.dirty.t, r.pinned.t = t, t, t }

// n is the number of parked keys.
func (r *resident) n() int { return r.clean.n + r.dirty.n + r.pinned.n }

// needsCheckpoint reports whether the tier is over its budget with no key
// left that can leave memory before a checkpoint.
func (r *resident) needsCheckpoint() bool {
	return r.bytes > r.max && r.clean.n == 0 && r.dirty.n == 0 && (r.pinned.n > 0 || r.spill.bytes > 0)
}

// list returns the list g is in (or goes to).
func (r *resident) list(g *grain) *lru {
	switch g.rlist {
	case rlistDirty:
		return &r.dirty
	case rlistPinned:
		return &r.pinned
	}
	return &r.clean
}

// parkLocked puts a stopped grain in the resident tier, if it is still the
// key's latest incarnation and its group's, after what waited for it; h.mu
// must be held, by the grain's only user: its actor (passivateMsg), the
// passivation if that actor is idle (stopLocked), or a checkpoint that
// took it out of the tier to snapshot it.
func (h *Host) parkLocked(g *grain) {
	st := g.stop
	if st == nil {
		return // stopped with the host, or dropped: nothing waits
	}
	g.stop = nil
	gs := &h.groups[g.group]
	if !h.currentLocked(g) || g.broken != nil {
		h.forgetLocked(g)
		// (A grain of the epoch a take-over is replaying is current: a
		// passivation during the replay used to drop it here, and its
		// key was lost from memory until the next replay.)
		// Its group was dropped (or the host stopped): nothing of it
		// stays, and what waited is answered as by a dropped grain.
		if len(st.waiting) > 0 && g.broken == nil {
			g.broken = errDropped
		}
		for _, m := range st.waiting {
			g.handleHeld(m)
		}
		g.leaveMemory()
		return
	}
	for i, m := range st.waiting {
		if needsActor(m) {
			// The key has inputs (or a call) again: a new actor around the
			// same grain takes them and what follows.
			h.spawnLocked(g)
			for _, m := range st.waiting[i:] {
				g.sh.send(m)
			}
			return
		}
		g.handleHeld(m) // a snapshot, a query: no actor needed
	}
	g.rlist = rlistClean
	if g.dirtyIdx != 0 {
		g.rlist = rlistDirty
	}
	if h.cfg.MaxMemory < 0 && g.rlist == rlistClean {
		gs.complete = false // the key leaves memory
		h.keyLeftMemory()
		g.leaveMemory()
		h.forgetLocked(g)
		return
	}
	g.rsize = int64(grainBytes + g.keyHeapBytes() + g.state.MemSize())
	g.tier = tierParked
	gs.parked = append(gs.parked, g)
	g.parkIdx = int32(len(gs.parked))
	r := &h.resident
	r.list(g).pushFront(g)
	r.bytes += g.rsize
	h.evictLocked()
}

// cleanedLocked moves a parked key a checkpoint stored to the clean keys,
// which eviction may take.
func (h *Host) cleanedLocked(g *grain) {
	r := &h.resident
	if g.rlist == rlistClean {
		return
	}
	from := r.list(g)
	g.rlist = rlistClean
	from.moveTo(&r.clean, g)
}

// needsActor reports whether a grain's message must be processed by its
// actor: everything but what the host answers for a parked key under h.mu
// (snapshots, queries); inputs and calls run a key's code, which
// may take h.mu.
func needsActor(m any) bool {
	switch m.(type) {
	case *snapshotMsg, *queryMsg:
		return false
	}
	return true
}

// evictLocked makes the resident tier fit its budget: the least recently
// parked clean keys leave memory (their state is in their snapshots), into
// the snapshot cache (cache.go); then the least recently parked dirty
// ones, into the spill (spill.go). Those that cannot be spilled stay
// (pinned) until a checkpoint, which it asks for when only they and the
// spill are left over the budget. h.mu must be held.
func (h *Host) evictLocked() {
	r := &h.resident
	for r.bytes > r.max {
		if g := r.clean.back(); g != nil {
			h.groups[g.group].complete = false // a key leaves memory
			h.cache.put(g)
			h.keyLeftMemory()
			g.leaveMemory()
			h.unparkLocked(g)
			h.forgetLocked(g)
			continue
		}
		if g := r.dirty.back(); g != nil {
			if !h.spillLocked(g) {
				g.rlist = rlistPinned
				r.dirty.moveTo(&r.pinned, g)
			}
			continue
		}
		if r.needsCheckpoint() {
			h.hurryCheckpoint()
			h.nudgeCheckpoint()
		}
		return
	}
}

// unparkLocked takes a grain out of the resident tier (the caller says
// where it goes: its tier is still tierParked).
func (h *Host) unparkLocked(g *grain) {
	h.resident.list(g).remove(g)
	h.resident.bytes -= g.rsize
	gs := &h.groups[g.group]
	removeAt(&gs.parked, g.parkIdx, func(moved *grain, idx int32) { moved.parkIdx = idx })
	g.parkIdx = 0
}

// dropParkedLocked drops the parked keys of a group, and its spill.
func (h *Host) dropParkedLocked(group uint32) {
	h.dropSpillLocked(group)
	gs := &h.groups[group]
	for n := len(gs.parked); n > 0; n = len(gs.parked) {
		g := gs.parked[n-1]
		g.leaveMemory()
		h.unparkLocked(g)
		h.forgetLocked(g)
	}
	gs.parked = nil
}

// leaveMemory takes what a grain leaving memory adds to its pipeline's
// gauges back. h.mu must be held, and no actor may run the grain.
func (g *grain) leaveMemory() {
	g.pstats.buffered.Add(-g.counted)
	g.counted = 0
}
