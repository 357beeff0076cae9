package actors

import (
	"encoding/binary"
	"errors"
	"hash/maphash"
	"slices"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
)

// The spill: changed keys out of memory until a checkpoint writes them.
//
// A changed (dirty) key's state is newer than its snapshot, so it could not
// leave memory until a checkpoint stored it: once the resident tier was
// full of them, its budget asked for a checkpoint, and at a million keys
// that made checkpoints follow memory rather than CheckpointBytes: a round
// every ~300k events whatever CheckpointBytes said, each costing ~12 µs per
// key it wrote (BENCHMARKS.md, session 18). Now the least recently parked
// dirty key over the budget is packed (fold.AppendSpilled, a tenth of what
// it takes as a grain) into its group's spill and leaves the registry; the
// next checkpoint of its group writes it from there, and then moves it to
// the snapshot cache, as a clean key leaving memory would have gone.
//
// Why a spilled state is current: a key is spilled only while parked (no
// actor runs it) and current (its group's incarnation); it stays spilled
// until it is activated, and every activation looks in the spill before
// the snapshot cache or the store (newGrainLocked), taking the entry out:
// the key comes back dirty, from the same state, position and last
// processing time. Dropping a group drops its spill with its parked keys:
// the log, untrimmed above the last checkpoint, replays them.
//
// Why a checkpoint loses nothing: at its start (under h.mu, with the
// group's dirty keys and the position it trims through) it freezes the
// group's arenas; every entry live then holds the key as of every record
// at or below that position. It writes them all, even those activated
// meanwhile (their grains are newer and stay dirty for the next one; the
// frozen bytes are not written to, so it reads them without h.mu). A key
// of its dirty list spilled after it began is written from where it is
// now: its new grain, or the spill (snapshotKeys). On success, the
// entries still live go to the snapshot cache and the arenas are freed
// (and so do the entries it wrote for keys that spilled after it began,
// if they are still there: retireMovedLocked); on failure the arenas thaw
// and the next checkpoint writes them.
//
// The spill is kept outside the Go heap's pointers: entries in 32 KiB
// chunks, an index from a hash of the key's name to where its entry is,
// with no pointers in it, so the collector neither scans nor walks a
// spilled key (the walk of every object a key holds is what an event
// costs most at a million keys, BENCHMARKS.md session 15). A name whose
// hash another spilled key has is not spilled (it stays in memory, pinned,
// until a checkpoint); the seed is random per host. Everything here is
// guarded by h.mu.

const (
	// An arena's chunks grow from 1 KiB to 32 KiB: a group with a few
	// spilled keys holds little (there are 256 groups by default).
	spillChunkShift = 15
	spillChunkBytes = 1 << spillChunkShift
	spillFirstChunk = 1 << 10
	// spillMaxChunks bounds an arena (2 GiB), so that an offset (chunk and
	// place in it) fits 32 bits; a fuller group opens another arena.
	spillMaxChunks = 1 << 16
	// spillIndexBytes is what an index entry costs: 20 B of slot and its
	// share of a swiss table between growths.
	spillIndexBytes = 40
)

// spillLoc is where a spilled key's entry is: its group, the arena's id
// and the offset in the arena.
type spillLoc struct{ group, arena, off uint32 }

// spill is the index of every spilled key, and scratch buffers.
type spill struct {
	seed      maphash.Seed
	index     map[uint64]spillLoc
	nextArena uint32
	bytes     int64 // the arenas' chunks and the index's entries
	name, buf []byte
}

// spillArena holds entries of one group, appended; an entry stays until
// the arena goes. Entry: a flag byte (dead: its key was activated before
// a checkpoint froze the arena), the body's length, the body: the
// pipeline and the key (each length-prefixed), the position it is dirty
// at, its last processing time, then the position and the state as
// fold.AppendSpilled packs it (decodeCached reads it).
type spillArena struct {
	id     uint32
	chunks [][]byte
	bytes  int64 // the chunks' capacity
	frozen bool  // a checkpoint writes it: not written to
}

// spillEntryBytes is the most an entry of body takes in a chunk.
func spillEntryBytes(body []byte) int { return 1 + binary.MaxVarintLen32 + len(body) }

// add appends body as an entry (at most spillChunkBytes: spillEntryBytes)
// and returns its offset.
func (a *spillArena) add(body []byte) uint32 {
	need := spillEntryBytes(body)
	if n := len(a.chunks); n == 0 || cap(a.chunks[n-1])-len(a.chunks[n-1]) < need {
		size := spillChunkBytes
		if n < spillChunkShift-10 {
			size = max(spillFirstChunk<<n, need)
		}
		a.chunks = append(a.chunks, make([]byte, 0, size))
		a.bytes += int64(size)
	}
	c := len(a.chunks) - 1
	ch := a.chunks[c]
	off := uint32(c)<<spillChunkShift | uint32(len(ch))
	ch = append(ch, 0)
	ch = binary.AppendUvarint(ch, uint64(len(body)))
	a.chunks[c] = append(ch, body...)
	return off
}

// at returns the entry at off: whether it is dead, and its body.
func (a *spillArena) at(off uint32) (dead bool, body []byte) {
	ch := a.chunks[off>>spillChunkShift][off&(spillChunkBytes-1):]
	n, w := binary.Uvarint(ch[1:])
	return ch[0] != 0, ch[1+w : 1+w+int(n)]
}

// kill marks the entry at off dead, unless the arena is frozen.
func (a *spillArena) kill(off uint32) {
	if !a.frozen {
		a.chunks[off>>spillChunkShift][off&(spillChunkBytes-1)] = 1
	}
}

// each calls f with every entry's offset, deadness and body.
func (a *spillArena) each(f func(off uint32, dead bool, body []byte)) {
	for c, ch := range a.chunks {
		for o := 0; o < len(ch); {
			n, w := binary.Uvarint(ch[o+1:])
			end := o + 1 + w + int(n)
			f(uint32(c)<<spillChunkShift|uint32(o), ch[o] != 0, ch[o+1+w:end])
			o = end
		}
	}
}

// spilledEntry is an entry's body, decoded; its byte slices are in the
// arena.
type spilledEntry struct {
	pipeline, key []byte
	dirtyAt       persistence.Position
	lastNow       int64
	value         []byte // position and packed state (decodeCached)
}

var (
	errSpillEntry  = errors.New("actors: spilled entry: malformed")
	errSpillBroken = errors.New("actors: a spilled key does not decode")
)

func decodeSpilled(body []byte) (spilledEntry, error) {
	var e spilledEntry
	r := body
	e.pipeline = nextBytes(&r)
	e.key = nextBytes(&r)
	e.dirtyAt = nextVarint(&r, binary.Uvarint)
	e.lastNow = nextVarint(&r, binary.Varint)
	if r == nil {
		return e, errSpillEntry
	}
	e.value = r
	return e, nil
}

// nextVarint reads a varint off *b with decode (binary.Uvarint or Varint);
// a malformed one leaves *b nil, and so do the reads after it.
func nextVarint[T uint64 | int64](b *[]byte, decode func([]byte) (T, int)) T {
	v, n := decode(*b)
	if n <= 0 {
		*b = nil
		return 0
	}
	*b = (*b)[n:]
	return v
}

// nextBytes reads a length-prefixed byte string off *b, within it.
func nextBytes(b *[]byte) []byte {
	n := nextVarint(b, binary.Uvarint)
	if n > uint64(len(*b)) {
		*b = nil
		return nil
	}
	v := (*b)[:n:n]
	*b = (*b)[n:]
	return v
}

// name appends the entry's key name (keyID.appendSnapshotKey) to b.
func (e *spilledEntry) name(b []byte) []byte {
	return append(append(append(b, e.pipeline...), 0), e.key...)
}

func (e *spilledEntry) id() keyID { return keyID{string(e.pipeline), string(e.key)} }

func (e *spilledEntry) is(id keyID) bool {
	return string(e.pipeline) == id.pipeline && string(e.key) == id.key
}

// hash returns the index's hash of a key, whose name it leaves in sp.name.
func (sp *spill) hash(id keyID) uint64 {
	sp.name = id.appendSnapshotKey(sp.name[:0])
	return sp.hashName()
}

// hashName is the index's hash of the key name in sp.name.
func (sp *spill) hashName() uint64 { return maphash.Bytes(sp.seed, sp.name) }

// spillLocked packs a parked dirty key into its group's spill and takes it
// out of memory. It reports false if the key cannot leave so (its state
// does not pack, or packs in more than a chunk; another spilled key has
// its hash): it stays parked until a checkpoint. A key of a Go handler's
// pipeline stays too: its state packs with the user's codec, and a
// spilled state that did not decode again would be lost (a cached one is
// read from the store instead). A key whose ids are in buckets is packed
// with what of them its stored parts lack (fold.AppendSpilled; until
// session 45 such keys stayed). h.mu must be held.
func (h *Host) spillLocked(g *grain) bool {
	if g.broken != nil || g.dirtyIdx == 0 || g.pipeline.HasHandler() || !h.currentLocked(g) || g.state.Empty() {
		return false
	}
	g.catchUpSaved() // (its id buckets then know what is stored)
	sp := &h.resident.spill
	hash := sp.hash(g.id)
	if _, taken := sp.index[hash]; taken {
		return false
	}
	body, ok := h.packSpilled(g)
	if !ok || spillEntryBytes(body) > spillChunkBytes {
		return false
	}
	gs := &h.groups[g.group]
	var a *spillArena
	if n := len(gs.spills); n > 0 && !gs.spills[n-1].frozen && len(gs.spills[n-1].chunks) < spillMaxChunks {
		a = gs.spills[n-1]
	} else {
		sp.nextArena++
		a = &spillArena{id: sp.nextArena}
		gs.spills = append(gs.spills, a)
	}
	was := a.bytes
	off := a.add(body)
	if sp.index == nil {
		sp.index = map[uint64]spillLoc{}
	}
	sp.index[hash] = spillLoc{g.group, a.id, off}
	gs.spilled++
	grown := a.bytes - was + spillIndexBytes
	sp.bytes += grown
	h.resident.bytes += grown
	h.stats.spilled.Add(1)

	removeAt(&gs.dirty, g.dirtyIdx, func(moved *grain, idx int32) { moved.dirtyIdx = idx })
	g.dirtyIdx, g.spilled = 0, true // (a checkpoint holding the grain finds the key by it: snapshotKeys)
	h.keyLeftMemory()
	g.leaveMemory()
	h.unparkLocked(g)
	h.forgetLocked(g)
	return true
}

// packSpilled encodes a key's spill entry body, in the spill's scratch
// buffer.
func (h *Host) packSpilled(g *grain) (body []byte, ok bool) {
	defer func() {
		// A Go handler's codec runs here, under h.mu (as in cache.put).
		if r := recover(); r != nil {
			h.log.Error("spill: encoding panicked; the key stays in memory", "pipeline", g.id.pipeline, "key", g.id.key, "panic", r)
			body, ok = nil, false
		}
	}()
	sp := &h.resident.spill
	b := binary.AppendUvarint(sp.buf[:0], uint64(len(g.id.pipeline)))
	b = append(b, g.id.pipeline...)
	b = binary.AppendUvarint(b, uint64(len(g.id.key)))
	b = append(b, g.id.key...)
	b = binary.AppendUvarint(b, g.dirtyAt)
	b = binary.AppendVarint(b, g.lastNow)
	b = binary.AppendUvarint(b, g.pos)
	b, err := g.pipeline.AppendSpilled(b, &g.state)
	if err != nil {
		return nil, false
	}
	sp.buf = b[:0]
	return b, true
}

// spilledAt is a spilled key's entry, where it is and decoded (its byte
// slices in the arena).
type spilledAt struct {
	a    *spillArena
	off  uint32
	hash uint64
	e    spilledEntry
}

// findSpilledLocked returns a key's entry, if the key is spilled. h.mu must
// be held.
func (h *Host) findSpilledLocked(id keyID, group uint32) (spilledAt, bool) {
	gs := &h.groups[group]
	if gs.spilled == 0 {
		return spilledAt{}, false
	}
	sp := &h.resident.spill
	hash := sp.hash(id)
	loc, ok := sp.index[hash]
	if !ok || loc.group != group {
		return spilledAt{}, false
	}
	for _, a := range gs.spills {
		if a.id != loc.arena {
			continue
		}
		_, body := a.at(loc.off)
		if e, err := decodeSpilled(body); err == nil && e.is(id) {
			return spilledAt{a, loc.off, hash, e}, true
		}
		return spilledAt{}, false // another key with the same hash
	}
	return spilledAt{}, false
}

// unspillLocked takes a key out of the spill, if it is there: it returns
// the key's state as the snapshot cache would (loaded.cached, a copy), and
// its dirty position and last processing time. h.mu must be held.
func (h *Host) unspillLocked(id keyID, group uint32) (l *loaded, dirtyAt persistence.Position, lastNow int64) {
	at, ok := h.findSpilledLocked(id, group)
	if !ok {
		return nil, 0, 0
	}
	at.a.kill(at.off)
	h.unindexSpilledLocked(group, at.hash)
	h.stats.unspilled.Add(1)
	return &loaded{cached: slices.Clone(at.e.value), spilled: true}, at.e.dirtyAt, at.e.lastNow
}

func (h *Host) unindexSpilledLocked(group uint32, hash uint64) {
	sp := &h.resident.spill
	delete(sp.index, hash)
	sp.bytes -= spillIndexBytes
	h.resident.bytes -= spillIndexBytes
	h.groups[group].spilled--
}

// freezeSpillLocked freezes a group's arenas for its checkpoint and
// returns them: what they hold live now, the checkpoint writes. h.mu must
// be held.
func (h *Host) freezeSpillLocked(group uint32) []*spillArena {
	gs := &h.groups[group]
	for _, a := range gs.spills {
		a.frozen = true
	}
	return slices.Clone(gs.spills)
}

// snapshotSpilled adds the snapshots of the live entries of frozen arenas
// to d. It runs without h.mu: frozen arenas are not written to.
func (h *Host) snapshotSpilled(arenas []*spillArena, d *checkpointData) (int, error) {
	var (
		n   int
		err error
	)
	for _, a := range arenas {
		a.each(func(_ uint32, dead bool, body []byte) {
			if dead || err != nil {
				return
			}
			var e spilledEntry
			if e, err = decodeSpilled(body); err == nil {
				err = h.snapshotEntry(e.id(), e.value, e.lastNow, d)
				n++
			}
		})
	}
	return n, err
}

// snapshotEntry adds the snapshot of a spilled key's state (value, as in
// its entry) to d, as its grain would have written it.
func (h *Host) snapshotEntry(id keyID, value []byte, lastNow int64, d *checkpointData) error {
	p := h.cfg.Pipelines[id.pipeline]
	state, pos, err := decodeCached(p, value)
	if err != nil {
		return err
	}
	g := grain{host: h, id: id, pipeline: p, pstats: h.stats.pipelines[id.pipeline], state: state, pos: pos, lastNow: lastNow,
		stored: min(state.Version(), fold.RestoredVersion)}
	r := g.snapshot()
	if r.err != nil {
		return r.err
	}
	appendSnapshot(d, &r)
	return nil
}

// entries calls f with each live entry of an arena of group (skipping those
// dead), its name's hash, and whether the index still has the key there
// (it was not activated since). h.mu must be held.
func (sp *spill) entries(group uint32, a *spillArena, f func(off uint32, e *spilledEntry, hash uint64, indexed bool)) {
	a.each(func(off uint32, dead bool, body []byte) {
		if dead {
			return
		}
		e, err := decodeSpilled(body)
		if err != nil {
			return // (not written so)
		}
		sp.name = e.name(sp.name[:0])
		hash := sp.hashName()
		loc, ok := sp.index[hash]
		f(off, &e, hash, ok && loc == spillLoc{group, a.id, off})
	})
}

// retireSpillLocked ends the arenas a checkpoint of the group wrote: the
// keys still spilled in them are clean now, and go to the snapshot cache;
// the arenas go. h.mu must be held.
func (h *Host) retireSpillLocked(group uint32, arenas []*spillArena) {
	gs := &h.groups[group]
	sp := &h.resident.spill
	for _, a := range arenas {
		sp.entries(group, a, func(_ uint32, e *spilledEntry, hash uint64, indexed bool) {
			if indexed {
				h.cache.putValue(sp.name, gs.epoch, e.value)
				gs.complete = false // it left memory
				h.unindexSpilledLocked(group, hash)
			}
		})
		h.dropArenaLocked(group, a)
	}
}

// retireMovedLocked ends the entries of keys a checkpoint of the group
// wrote that are in the spill's unfrozen arenas: those written from there
// (they spilled after it began, snapshotKeys) and those that spilled after
// their grain's snapshot reply (checkpointGroup). Each one still spilled
// where it was found is the key's whole state as written (a spilled key
// changes only by coming back, which takes it out), stored now, so the key
// is clean and goes to the snapshot cache, as a frozen entry would. (Left
// there, it stayed dirty and the next checkpoint wrote it again.) h.mu
// must be held.
func (h *Host) retireMovedLocked(group uint32, moved []spilledCopy) {
	if len(moved) == 0 {
		return
	}
	gs := &h.groups[group]
	sp := &h.resident.spill
	for _, m := range moved {
		at, ok := h.findSpilledLocked(m.id, group)
		if !ok || at.a.id != m.arena || at.off != m.off {
			continue // back in memory since (and maybe spilled again): not what was written
		}
		sp.name = at.e.name(sp.name[:0])
		h.cache.putValue(sp.name, gs.epoch, at.e.value)
		gs.complete = false // it left memory
		at.a.kill(at.off)
		h.unindexSpilledLocked(group, at.hash)
	}
	// An arena left with no live entry goes now, not at the next checkpoint.
	touched := make(map[uint32]bool)
	for _, m := range moved {
		touched[m.arena] = true
	}
	for _, a := range slices.Clone(gs.spills) {
		if a.frozen || !touched[a.id] {
			continue
		}
		live := false
		sp.entries(group, a, func(_ uint32, _ *spilledEntry, _ uint64, indexed bool) { live = live || indexed })
		if !live {
			h.dropArenaLocked(group, a)
		}
	}
}

// thawSpillLocked gives back the arenas of a checkpoint of the group that
// failed: what was activated from them since they froze is dead now, and
// the next checkpoint writes the rest. h.mu must be held.
func (h *Host) thawSpillLocked(group uint32, arenas []*spillArena) {
	for _, a := range arenas {
		a.frozen = false
		h.resident.spill.entries(group, a, func(off uint32, _ *spilledEntry, _ uint64, indexed bool) {
			if !indexed {
				a.kill(off)
			}
		})
	}
}

// dropSpillLocked drops a group's spill (its group is dropped: its log
// replays those keys). h.mu must be held.
func (h *Host) dropSpillLocked(group uint32) {
	gs := &h.groups[group]
	for len(gs.spills) > 0 {
		a := gs.spills[0]
		h.resident.spill.entries(group, a, func(_ uint32, _ *spilledEntry, hash uint64, indexed bool) {
			if indexed {
				h.unindexSpilledLocked(group, hash)
			}
		})
		h.dropArenaLocked(group, a)
	}
}

// dropArenaLocked takes an arena out of its group's and frees its bytes.
func (h *Host) dropArenaLocked(group uint32, a *spillArena) {
	gs := &h.groups[group]
	i := slices.Index(gs.spills, a)
	if i < 0 {
		return
	}
	gs.spills = slices.Delete(gs.spills, i, i+1)
	h.resident.spill.bytes -= a.bytes
	h.resident.bytes -= a.bytes
}
