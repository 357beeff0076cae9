package actors

import "hash/maphash"

// grainIndex finds the grain of a key in memory by the key's name: the
// registry's index (registry.go). It is an open-addressing table of slots,
// each a grain and its key's hash, probed linearly from the slot the hash
// names; a removal shifts the slots after it back (no tombstones).
//
// It replaced a map[keyID]*grain. At a million keys in memory the map was
// two things a key: its entry held the key's two strings and the grain,
// so the collector followed, every cycle, the key's string into the grain
// (its bytes are the grain's, newGrainLocked) besides the grain itself,
// each a cache miss for the span's mark bits (BENCHMARKS.md, session 57);
// and finding, adding and removing keys were 8% of the node's CPU, most of
// it the misses on the map's control words and entries. A slot holds one
// pointer, and a probe reads the slots' hashes, touching a grain only
// when its hash is the key's.
//
// It grows by doubling under h.mu (a copy of its slots, 32 MB at a million
// keys, once: tens of milliseconds), past 7 keys in 10 slots, and never
// shrinks: the map did not either. Keys are the clients' to choose; the
// hash is seeded per process, as the map's is, so that they cannot
// choose keys that collide.
type grainIndex struct {
	seed  maphash.Seed
	slots []indexSlot // a power of two
	n     int
}

type indexSlot struct {
	hash uint64 // the key's (hashOf: never 0); 0: the slot is empty
	g    *grain
}

// minIndexSlots is the table's size until it grows.
const minIndexSlots = 64

func newGrainIndex() grainIndex {
	return grainIndex{seed: maphash.MakeSeed(), slots: make([]indexSlot, minIndexSlots)}
}

// hashOf is id's hash, its top bit set so that no key's is 0.
func (x *grainIndex) hashOf(id keyID) uint64 {
	return maphash.Comparable(x.seed, id) | 1<<63
}

// get returns the grain of id, nil if it has none.
func (x *grainIndex) get(id keyID) *grain {
	h := x.hashOf(id)
	mask := len(x.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		switch s := &x.slots[i]; {
		case s.hash == 0:
			return nil
		case s.hash == h && s.g.id == id:
			return s.g
		}
	}
}

// put makes g its key's grain, in place of the one the key had if any.
func (x *grainIndex) put(g *grain) {
	if (x.n+1)*10 > len(x.slots)*7 {
		x.grow()
	}
	h := x.hashOf(g.id)
	mask := len(x.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		switch s := &x.slots[i]; {
		case s.hash == 0:
			*s = indexSlot{hash: h, g: g}
			x.n++
			return
		case s.hash == h && s.g.id == g.id:
			s.g = g
			return
		}
	}
}

// remove takes g out if it is its key's grain there.
func (x *grainIndex) remove(g *grain) {
	h := x.hashOf(g.id)
	mask := len(x.slots) - 1
	i := int(h) & mask
	for ; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.hash == 0 {
			return // not there
		}
		if s.g == g {
			break
		}
	}
	// Backward shift: each slot after the hole that may move to it (its
	// home is not after the hole, cyclically) does; the hole moves on.
	for j := i; ; {
		j = (j + 1) & mask
		s := x.slots[j]
		if s.hash == 0 {
			break
		}
		if home := int(s.hash) & mask; (j-home)&mask >= (j-i)&mask {
			x.slots[i] = s
			i = j
		}
	}
	x.slots[i] = indexSlot{}
	x.n--
}

// clear takes every grain out.
func (x *grainIndex) clear() {
	clear(x.slots)
	x.n = 0
}

func (x *grainIndex) grow() {
	old := x.slots
	x.slots = make([]indexSlot, 2*len(old))
	mask := len(x.slots) - 1
	for _, s := range old {
		if s.hash == 0 {
			continue
		}
		i := int(s.hash) & mask
		for x.slots[i].hash != 0 {
			i = (i + 1) & mask
		}
		x.slots[i] = s
	}
}
