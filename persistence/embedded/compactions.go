package embedded

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// A checkpoint round writes a snapshot of every key that changed, and
// Pebble's flushes and compactions of them follow in a burst: at 100k keys
// and half load, a compaction took half a core for seconds on top of the
// flushes and the collector, the two cores were saturated, and the acks
// of the commits meanwhile waited for a CPU (execution trace: goroutines
// waiting to run went from ~1 to ~4 on average; acks of 100 ms to 2 s).
// So a compaction rests between the stretches of its work, as long as it
// worked, while it keeps up: it runs at most half of the time, spread over
// twice as long, and leaves the rest to the commits. (Flushes are not
// paced: a memtable waiting for its flush holds writes back.)
// BENCHMARKS.md, session 56.

const (
	// compactionRest is how long a compaction rests for each unit of time
	// it worked (3, a quarter of the time, was measured too, without a
	// clear gain over 1: BENCHMARKS.md, session 56).
	compactionRest = 1.0
	// compactionStretch is the least work after which a compaction rests:
	// Pebble reports its progress every 128 keys, and resting after each
	// would cost a timer per few dozen microseconds of work.
	compactionStretch = time.Millisecond
	// maxCompactionRest bounds one rest (a stretch includes the time the
	// compaction waited for a CPU, which under load can be long).
	maxCompactionRest = 50 * time.Millisecond
	// compactionConcurrency is the compactions Pebble runs at once: one,
	// and two while level 0 is l0CompactionConcurrency sublevels deep or
	// more (not counting those being compacted), the compaction debt
	// passes Pebble's threshold (Options.Experimental.
	// CompactionDebtConcurrency, 1 GiB), deletions leave much garbage, or
	// a manual compaction waits. More than one allowed is also the sign
	// that compactions fall behind: none rests then. Nor while Pebble
	// holds writes back (writesStalled), which the sublevels being
	// compacted can bring about with one allowed.
	compactionConcurrencyLower, compactionConcurrencyUpper = 1, 2
	// l0CompactionConcurrency is half of the sublevels at which Pebble
	// stops writes (L0StopWritesThreshold, 12), not Pebble's 10: a paced
	// compaction lets level 0 grow, and the pacing ends before it nears
	// the stop.
	l0CompactionConcurrency = 6
)

// compactionScheduler is the store's Pebble CompactionScheduler: it runs
// the compactions Pebble allows (DB.GetAllowedWithoutPermission), as
// Pebble's default one does, and hands each a grant that paces it
// (pacedCompaction).
type compactionScheduler struct {
	db pebble.DBForCompaction

	// rest is how long a compaction rests after working for worked (0:
	// not at all); sleep rests, returning early if stop or hurry closes;
	// now is the clock. All three are seams for tests.
	rest  func(worked time.Duration) time.Duration
	sleep func(d time.Duration, stop, hurry <-chan struct{})
	now   func() time.Time

	mu      sync.Mutex
	running int // compactions granted and not done
	// stalled is set while Pebble holds writes back; hurry closes as it
	// begins (ending the rests under way) and is made anew as it ends.
	stalled bool
	hurry   chan struct{}

	poke     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{} // closed as the loop (started by Register) ends

	rests atomic.Int64 // rests taken (tests)
}

var _ pebble.CompactionScheduler = (*compactionScheduler)(nil)

func newCompactionScheduler() *compactionScheduler {
	return &compactionScheduler{
		rest:  restAfterCompacting,
		sleep: sleepUnlessStopped,
		now:   time.Now,
		hurry: make(chan struct{}),
		poke:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
}

// restAfterCompacting is a compaction's rest after it worked for worked.
func restAfterCompacting(worked time.Duration) time.Duration {
	if worked < compactionStretch {
		return 0
	}
	return min(time.Duration(float64(worked)*compactionRest), maxCompactionRest)
}

func sleepUnlessStopped(d time.Duration, stop, hurry <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	case <-hurry:
	}
}

// Register starts the loop that grants waiting compactions: every 100 ms,
// and when Pebble says it allows more (UpdateGetAllowedWithoutPermission)
// or a compaction ends.
func (s *compactionScheduler) Register(_ int, db pebble.DBForCompaction) {
	s.db = db
	go s.loop()
}

// Unregister stops the loop and ends any rest under way; it returns once
// the loop no longer calls the DB, and compactions still running call it
// no more either (they rest no more). It may be called again, and without
// Register: openPebble calls it when pebble.Open fails after registering,
// which Pebble does not.
func (s *compactionScheduler) Unregister() {
	s.stopOnce.Do(func() { close(s.stop) })
	if s.db != nil { // registered: the loop runs
		<-s.done
	}
}

// writesStalled is the DB's WriteStallBegin (true) and WriteStallEnd
// (false): no compaction rests while writes wait, and those resting as
// the stall begins go on.
func (s *compactionScheduler) writesStalled(stalled bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if stalled == s.stalled {
		return
	}
	s.stalled = stalled
	if stalled {
		close(s.hurry)
	} else {
		s.hurry = make(chan struct{})
	}
}

func (s *compactionScheduler) loop() {
	defer close(s.done)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.poke:
		case <-s.stop:
			return
		}
		s.grantWaiting()
	}
}

// grantWaiting starts waiting compactions while Pebble allows more than
// are running.
func (s *compactionScheduler) grantWaiting() {
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		if !s.take() {
			return
		}
		if waiting, _ := s.db.GetWaitingCompaction(); !waiting || !s.db.Schedule(s.grant()) {
			s.release()
			return
		}
	}
}

// take counts one more compaction running if Pebble allows it.
func (s *compactionScheduler) take() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.stop:
		return false // unregistered: the DB is closing
	default:
	}
	if s.db.GetAllowedWithoutPermission() <= s.running {
		return false
	}
	s.running++
	return true
}

func (s *compactionScheduler) release() {
	s.mu.Lock()
	s.running--
	s.mu.Unlock()
}

// TrySchedule is Pebble asking to run a compaction now.
func (s *compactionScheduler) TrySchedule() (bool, pebble.CompactionGrantHandle) {
	if !s.take() {
		return false, nil
	}
	return true, s.grant()
}

// UpdateGetAllowedWithoutPermission is Pebble saying it may allow more
// now (a flush ended): the loop looks at once.
func (s *compactionScheduler) UpdateGetAllowedWithoutPermission() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

func (s *compactionScheduler) grant() *pacedCompaction {
	return &pacedCompaction{s: s, since: s.now()}
}

// pacedCompaction is one compaction's grant: Pebble reports its progress
// through it (CumulativeStats, every 128 keys and after each table), and
// there it rests.
type pacedCompaction struct {
	s     *compactionScheduler
	since time.Time // when its current stretch of work began
}

func (c *pacedCompaction) Started()                                  { c.since = c.s.now() }
func (c *pacedCompaction) MeasureCPU(pebble.CompactionGoroutineKind) {}

// CumulativeStats rests after a stretch of work, unless compactions fall
// behind (Pebble allows more than one, or holds writes back: see
// compactionConcurrencyUpper) or the DB is closing.
func (c *pacedCompaction) CumulativeStats(pebble.CompactionGrantHandleStats) {
	worked := c.s.now().Sub(c.since)
	d := c.s.rest(worked)
	if d <= 0 {
		return // the stretch goes on
	}
	select {
	case <-c.s.stop:
		return // unregistered: no more calls to the DB
	default:
	}
	c.s.mu.Lock()
	stalled, hurry := c.s.stalled, c.s.hurry
	c.s.mu.Unlock()
	if !stalled && c.s.db.GetAllowedWithoutPermission() <= compactionConcurrencyLower {
		c.s.rests.Add(1)
		c.s.sleep(d, c.s.stop, hurry)
	}
	c.since = c.s.now()
}

func (c *pacedCompaction) Done() {
	c.s.release()
	c.s.UpdateGetAllowedWithoutPermission()
}
