package actors

// lru orders grains by last use, most recent first, so that passivation
// (of the active grains) and eviction (of the resident ones, resident.go)
// take the least recently used in time proportional to what they take.
// (The active grains' order is kept lazily: a use marks the grain, and
// passivation moves a marked grain it meets to the front; see passivate.)
// (Passivation scanned and sorted every active key at each checkpoint, and
// ran at every commit once the node held more than MaxActive keys: 14% of
// the CPU at a million keys, BENCHMARKS.md.) Pushing and removing allocate
// nothing once the table has grown to the keys. Guarded by h.mu.
//
// The links are not in the grains. A grain in a list has a handle
// (grain.slot), its place in the host's grainTable, and the table keeps
// the grain and its links by handle, 16 bytes each: removing a grain
// rewrites its neighbours' links there, not in the neighbours themselves,
// which at a million keys are two grains the CPU's caches do not hold
// (grain.links was 2.5% of the node's CPU, a cache miss each). And the
// collector, which follows every pointer to a grain (a cache miss each at
// a million keys: the Green Tea collector's spanClass.sizeclass was 10% of
// the CPU), finds one per grain in a list, the table's, instead of two,
// its neighbours' (BENCHMARKS.md, session 57). The table grows by
// doubling, under h.mu (at a million keys a copy of 16 MB), and does not
// shrink.
type lru struct {
	t          *grainTable
	head, tail uint32 // most and least recently used; 0: none
	n          int
}

// grainTable holds the grains in lists (lru) by handle, and their links.
// Handle 0 is none. A grain has a handle exactly while it is in a list: it
// takes one as it joins and gives it back as it leaves, so the table holds
// no grain that left (nor keeps one from the collector).
type grainTable struct {
	entries []tableEntry
	free    []uint32
}

// tableEntry is a listed grain and its neighbours, by handle: together,
// so that taking, giving and unlinking a handle reads one line of the
// table each.
type tableEntry struct {
	g          *grain
	prev, next uint32
}

// tableBytes is what the table takes a grain in a list (the resident
// tier's estimates, grainBytes).
const tableBytes = 16

// take gives g a handle.
func (t *grainTable) take(g *grain) uint32 {
	var x uint32
	if n := len(t.free); n > 0 {
		x, t.free = t.free[n-1], t.free[:n-1]
	} else {
		if len(t.entries) == 0 {
			t.entries = make([]tableEntry, 1, 1024) // (0: none)
		}
		x = uint32(len(t.entries))
		t.entries = append(t.entries, tableEntry{})
	}
	t.entries[x], g.slot = tableEntry{g: g}, x
	return x
}

// give takes g's handle back.
func (t *grainTable) give(g *grain) {
	t.entries[g.slot] = tableEntry{}
	t.free = append(t.free, g.slot)
	g.slot = 0
}

// next and prev return g's neighbours in its list (nil at an end): the
// less and the more recently used.
func (t *grainTable) next(g *grain) *grain { return t.entries[t.entries[g.slot].next].g }
func (t *grainTable) prev(g *grain) *grain { return t.entries[t.entries[g.slot].prev].g }

// front and back return the most and least recently used, nil if none.
func (l *lru) front() *grain { return l.at(l.head) }
func (l *lru) back() *grain  { return l.at(l.tail) }

func (l *lru) at(x uint32) *grain {
	if x == 0 {
		return nil
	}
	return l.t.entries[x].g
}

// pushFront adds g, which is in no list, as the most recently used.
func (l *lru) pushFront(g *grain) {
	if g.slot != 0 {
		panic("actors: a grain joins a list while in one")
	}
	l.link(l.t.take(g))
	l.n++
}

func (l *lru) link(x uint32) {
	e := l.t.entries
	e[x].prev, e[x].next = 0, l.head
	if l.head != 0 {
		e[l.head].prev = x
	}
	l.head = x
	if l.tail == 0 {
		l.tail = x
	}
}

// remove takes g out of the list.
func (l *lru) remove(g *grain) {
	if g.slot == 0 {
		panic("actors: a grain leaves a list it is not in")
	}
	l.unlink(g.slot)
	l.t.give(g)
	l.n--
}

func (l *lru) unlink(x uint32) {
	e := l.t.entries
	prev, next := e[x].prev, e[x].next
	if prev != 0 {
		e[prev].next = next
	} else if l.head == x {
		l.head = next
	}
	if next != 0 {
		e[next].prev = prev
	} else if l.tail == x {
		l.tail = prev
	}
	e[x].prev, e[x].next = 0, 0
}

// moveTo moves g from the list to the front of to, keeping its handle.
func (l *lru) moveTo(to *lru, g *grain) {
	if g.slot == 0 {
		panic("actors: a grain leaves a list it is not in")
	}
	l.unlink(g.slot)
	l.n--
	to.link(g.slot)
	to.n++
}

// touch makes g, in the list, the most recently used.
func (l *lru) touch(g *grain) {
	if g.slot == 0 {
		panic("actors: a grain is used in a list it is not in")
	}
	if x := g.slot; l.head != x {
		l.unlink(x)
		l.link(x)
	}
}

// deactivateLocked takes an active key out of the order of use and drops
// its actor (the caller tells the actor). h.mu must be held.
func (h *Host) deactivateLocked(g *grain) {
	h.lru.remove(g)
	g.sh = nil
}
