package embedded

import (
	"github.com/cockroachdb/pebble/v2"
)

// A wedged Pebble, and why no call waits for it.
//
// When Pebble meets an error it cannot continue from on a path that holds
// its locks, our Fatalf parks the goroutine for good (see
// pebbleLogger.Fatalf) and the store is stuck: it fails until the process
// restarts. Parking is the only way out that keeps the process alive, but
// the parked goroutine keeps what it holds. Two cases are known:
//
//   - A commit that rotates the WAL when its memtable is full, with the
//     data directory removed under the store: the new WAL cannot be created
//     (base.MustExist calls Fatalf) while Pebble's commit mutex is held. Every
//     later commit blocks in commitPipeline.prepare on that mutex.
//   - A flush or compaction whose MANIFEST write fails: Fatalf is called
//     with the DB mutex held. Commits that rotate a memtable block on it,
//     and so do reads whose iterator close takes it (the last reference to
//     an old read state, read-triggered compactions).
//
// Nothing can unblock a goroutine waiting on one of Pebble's mutexes, so the
// store never makes that wait on the caller's goroutine: each call into
// Pebble runs on a goroutine of its own (inPebble), and the caller waits for
// it or for the store to be stuck, whichever comes first. A call abandoned
// that way leaves its goroutine blocked inside the wedged Pebble until the
// process exits; the call returns the store's broken error, and so does
// every later call, at once (begin). Close does not close a wedged Pebble
// (it would wait for the parked goroutines too): it returns the error.
//
// Point reads (Get, GetMany: a key's activation) are the exception: they
// run on the caller's goroutine, because the handoff tripled the time of a
// Get of a cached snapshot (BenchmarkGet: 3 µs, 10 µs through inPebble, on
// 2 shared cores) while a commit's synced write hides it. A point read
// takes none of Pebble's commit locks, and the DB mutex only when it drops
// the last reference to a read state that was replaced while it read (a
// Get's iterator samples no reads; GetMany's iterator may, and is closed,
// which is when it takes the DB mutex for them, in inPebble), so it can
// block only if a flush or
// compaction parks holding the DB mutex in those few microseconds; with
// the data directory removed (the commit mutex only) it cannot. Later ones
// fail at once like every call.
//
// A call is not abandoned when its context ends: a commit's outcome must be
// known before the caller's locks are released (Append assigns positions
// under them, and a commit landing after its call returned would reuse
// them), and a read that is merely slow is not a reason to break the store.
// Contexts are checked between calls, as before.

// inPebble runs fn, a call into Pebble, on a goroutine of its own and
// returns its error, or the store's broken error as soon as the store is
// stuck (see the top of this file), leaving fn's goroutine to the wedged
// Pebble. fn must not touch the caller's state after it could have been
// abandoned: what it hands back goes through its own variables, which the
// caller reads only when inPebble returned fn's error.
func (s *Store) inPebble(fn func() error) error {
	select {
	case <-s.wedged:
		return s.wedgedErr()
	default:
	}
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-s.wedged:
		return s.wedgedErr()
	}
}

// wedgedErr returns the error of a stuck store.
func (s *Store) wedgedErr() error {
	s.life.Lock()
	defer s.life.Unlock()
	return s.broken
}

// isWedged reports whether the store is stuck.
func (s *Store) isWedged() bool {
	select {
	case <-s.wedged:
		return true
	default:
		return false
	}
}

// closeIter closes an iterator (see inPebble: closing may take Pebble's DB
// mutex).
func (s *Store) closeIter(it *pebble.Iterator) error {
	return s.inPebble(it.Close)
}

// commit commits *b with a synced write (see write) and takes the batch
// over: *b is nil afterwards. The batch is closed on the goroutine that
// committed it, once the commit is over; a commit abandoned in a wedged
// Pebble, or one that panicked, leaves it unclosed (Pebble may still hold
// it) for the garbage collector.
func (s *Store) commit(b **pebble.Batch) error {
	batch := *b
	*b = nil
	return s.write(func() error {
		err := batch.Commit(pebble.Sync)
		_ = batch.Close()
		return err
	})
}

// closeBatch closes *b unless commit took it.
func closeBatch(b **pebble.Batch) {
	if *b != nil {
		_ = (*b).Close()
	}
}
