package actors

// lru orders elements by last use, most recent first, so that passivation
// (of the active grains) and eviction (of the resident ones, resident.go)
// take the least recently used in time proportional to what they take.
// (The active grains' order is kept lazily: a use marks the grain, and
// passivation moves a marked grain it meets to the front; see passivate.)
// (Passivation scanned and sorted every active key at each checkpoint, and
// ran at every commit once the node held more than MaxActive keys: 14% of
// the CPU at a million keys, BENCHMARKS.md.) The list is intrusive: the
// links live in the elements (a links field, reached through P), so that
// pushing and removing allocate nothing. Guarded by h.mu.
type lru[T any, P linked[T]] struct {
	head, tail P // most and least recently used
	n          int
}

// links are an element's neighbours in its list.
type links[P any] struct{ prev, next P }

// linked is a pointer to an element with links.
type linked[T any] interface {
	*T
	links() *links[*T]
}

func (l *lru[T, P]) pushFront(x P) {
	lx := x.links()
	lx.prev, lx.next = nil, (*T)(l.head)
	if l.head != nil {
		l.head.links().prev = x
	}
	l.head = x
	if l.tail == nil {
		l.tail = x
	}
	l.n++
}

func (l *lru[T, P]) remove(x P) {
	lx := x.links()
	if lx.prev != nil {
		P(lx.prev).links().next = lx.next
	} else if l.head == x {
		l.head = lx.next
	}
	if lx.next != nil {
		P(lx.next).links().prev = lx.prev
	} else if l.tail == x {
		l.tail = lx.prev
	}
	lx.prev, lx.next = nil, nil
	l.n--
}

func (l *lru[T, P]) touch(x P) {
	if l.head == x {
		return
	}
	l.remove(x)
	l.pushFront(x)
}

// A grain is in one list at a time: the active keys' (Host.lru) or one of
// the resident tier's.
func (g *grain) links() *links[*grain] { return &g.order }

// deactivateLocked takes an active key out of the order of use and drops
// its actor (the caller tells the actor). h.mu must be held.
func (h *Host) deactivateLocked(g *grain) {
	h.lru.remove(g)
	g.sh = nil
}
