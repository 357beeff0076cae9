package actors

// lru orders the active grains by last use, most recent first, so that
// passivation takes the least recently used ones in time proportional to
// what it passivates. (It scanned and sorted every active key at each
// checkpoint, and ran at every commit once the node held more than
// MaxActive keys: 14% of the CPU at a million keys, BENCHMARKS.md.) The
// list is intrusive (the links live in activation) and guarded by h.mu.
type lru struct {
	head, tail *activation // most and least recently used
}

func (l *lru) pushFront(a *activation) {
	a.prev, a.next = nil, l.head
	if l.head != nil {
		l.head.prev = a
	}
	l.head = a
	if l.tail == nil {
		l.tail = a
	}
}

func (l *lru) remove(a *activation) {
	if a.prev != nil {
		a.prev.next = a.next
	} else if l.head == a {
		l.head = a.next
	}
	if a.next != nil {
		a.next.prev = a.prev
	} else if l.tail == a {
		l.tail = a.prev
	}
	a.prev, a.next = nil, nil
}

func (l *lru) touch(a *activation) {
	if l.head == a {
		return
	}
	l.remove(a)
	l.pushFront(a)
}

// deactivateLocked takes a grain out of the registry and the LRU order.
// h.mu must be held.
func (h *Host) deactivateLocked(a *activation) {
	delete(h.active, a.id)
	h.lru.remove(a)
}
