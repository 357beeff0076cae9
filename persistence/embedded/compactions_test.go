package embedded

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/keyfold/keyfold/persistence"
)

// fakeCompactions is a DB for the scheduler: it allows allowed
// compactions, has waiting ones waiting, and counts those scheduled.
type fakeCompactions struct {
	mu        sync.Mutex
	allowed   int
	waiting   int
	scheduled []pebble.CompactionGrantHandle
}

func (f *fakeCompactions) GetAllowedWithoutPermission() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.allowed
}

func (f *fakeCompactions) GetWaitingCompaction() (bool, pebble.WaitingCompaction) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiting > 0, pebble.WaitingCompaction{}
}

func (f *fakeCompactions) Schedule(h pebble.CompactionGrantHandle) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.waiting == 0 {
		return false
	}
	f.waiting--
	f.scheduled = append(f.scheduled, h)
	return true
}

func (f *fakeCompactions) set(allowed, waiting int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allowed, f.waiting = allowed, waiting
}

func (f *fakeCompactions) granted() []pebble.CompactionGrantHandle {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]pebble.CompactionGrantHandle(nil), f.scheduled...)
}

// pacedForTest is a scheduler on a clock the test moves, recording its
// rests instead of taking them.
func pacedForTest(t *testing.T, db pebble.DBForCompaction) (s *compactionScheduler, advance func(time.Duration), rests func() []time.Duration) {
	t.Helper()
	var mu sync.Mutex
	clock := time.Unix(0, 0)
	var slept []time.Duration
	s = newCompactionScheduler()
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	s.sleep = func(d time.Duration, _, _ <-chan struct{}) { mu.Lock(); defer mu.Unlock(); slept = append(slept, d) }
	s.Register(1, db)
	t.Cleanup(s.Unregister)
	return s,
		func(d time.Duration) { mu.Lock(); defer mu.Unlock(); clock = clock.Add(d) },
		func() []time.Duration { mu.Lock(); defer mu.Unlock(); return append([]time.Duration(nil), slept...) }
}

// A compaction rests compactionRest times as long as it worked, once it worked
// compactionStretch (its progress reports before that add up), at most
// maxCompactionRest at a time.
func TestCompactionRestsAsLongAsItWorked(t *testing.T) {
	db := &fakeCompactions{allowed: 1}
	s, advance, rests := pacedForTest(t, db)
	h := schedule(t, s)
	h.Started()
	report := func() { h.CumulativeStats(pebble.CompactionGrantHandleStats{}) }

	advance(compactionStretch / 4)
	report()
	advance(compactionStretch / 4)
	report()
	if r := rests(); len(r) != 0 {
		t.Fatalf("rested %v after half a stretch of work", r)
	}
	advance(compactionStretch) // 1.5 stretches since the last rest
	report()
	want := time.Duration(float64(3*compactionStretch/2) * compactionRest)
	if r := rests(); len(r) != 1 || r[0] != want {
		t.Fatalf("after 1.5 ms of work: rests %v, want [%v]", r, want)
	}
	advance(compactionStretch / 2) // a new stretch began at the rest's end
	report()
	if r := rests(); len(r) != 1 {
		t.Fatalf("rested again %v after half a stretch", r[1:])
	}
	advance(time.Second) // a long stretch (waiting for a CPU counts)
	report()
	if r := rests(); len(r) != 2 || r[1] != maxCompactionRest {
		t.Fatalf("after a second of work: rests %v, want the last %v", r, maxCompactionRest)
	}
	if n := s.rests.Load(); n != 2 {
		t.Fatalf("counted %d rests, want 2", n)
	}
	h.Done()
}

// While compactions fall behind (Pebble allows more than one), none rests.
func TestCompactionBehindDoesNotRest(t *testing.T) {
	db := &fakeCompactions{allowed: compactionConcurrencyUpper}
	s, advance, rests := pacedForTest(t, db)
	h := schedule(t, s)
	h.Started()
	for range 5 {
		advance(10 * compactionStretch)
		h.CumulativeStats(pebble.CompactionGrantHandleStats{})
	}
	if r := rests(); len(r) != 0 {
		t.Fatalf("rested %v while Pebble allowed %d compactions", r, compactionConcurrencyUpper)
	}
	// Caught up: the next stretch rests (one stretch, not the time behind).
	db.set(1, 0)
	advance(2 * compactionStretch)
	h.CumulativeStats(pebble.CompactionGrantHandleStats{})
	if r := rests(); len(r) != 1 || r[0] != time.Duration(float64(2*compactionStretch)*compactionRest) {
		t.Fatalf("once caught up: rests %v, want one of %v", r, 2*compactionStretch)
	}
	h.Done()
}

// The scheduler runs as many compactions as Pebble allows: TrySchedule
// refuses beyond them, and a compaction's end, or Pebble allowing more,
// starts those waiting.
func TestCompactionSchedulerRunsWhatPebbleAllows(t *testing.T) {
	db := &fakeCompactions{allowed: 1}
	s, _, _ := pacedForTest(t, db)
	first := schedule(t, s)
	if ok, _ := s.TrySchedule(); ok {
		t.Fatal("TrySchedule granted a second compaction with one allowed")
	}
	db.set(1, 3) // three wait
	first.Done()
	waitFor(t, func() bool { return len(db.granted()) == 1 }, "the waiting compaction to start after the first ended")
	s.grantWaiting() // what the loop's next tick does
	if n := len(db.granted()); n != 1 {
		t.Fatalf("%d compactions started with one allowed", n)
	}
	db.set(2, 2)
	s.UpdateGetAllowedWithoutPermission()
	waitFor(t, func() bool { return len(db.granted()) == 2 }, "a second compaction to start once two are allowed")
	for _, h := range db.granted() {
		h.Done()
	}
	waitFor(t, func() bool { return len(db.granted()) == 3 }, "the last waiting compaction to start")
	db.granted()[2].Done()
	s.Unregister() // (the loop may count one while it looks for a waiting one)
	if s.running != 0 {
		t.Fatalf("%d compactions counted running after all ended", s.running)
	}
}

// schedule starts a compaction that Pebble allows, failing the test if the
// scheduler refuses it.
func schedule(t *testing.T, s *compactionScheduler) pebble.CompactionGrantHandle {
	t.Helper()
	ok, h := s.TrySchedule()
	if !ok {
		t.Fatal("TrySchedule refused a compaction Pebble allows")
	}
	return h
}

// restingCompaction starts a compaction on a registered scheduler whose
// rests last an hour, and returns once it rests; rested closes when the
// rest ends.
func restingCompaction(t *testing.T) (s *compactionScheduler, h pebble.CompactionGrantHandle, rested <-chan struct{}) {
	t.Helper()
	s = newCompactionScheduler()
	s.rest = func(time.Duration) time.Duration { return time.Hour }
	s.Register(1, &fakeCompactions{allowed: 1})
	t.Cleanup(s.Unregister)
	h = schedule(t, s)
	h.Started()
	done := make(chan struct{})
	go func() {
		h.CumulativeStats(pebble.CompactionGrantHandleStats{})
		close(done)
	}()
	waitFor(t, func() bool { return s.rests.Load() == 1 }, "the compaction to rest")
	return s, h, done
}

// Closing the store ends a compaction's rest: Unregister does not wait it out.
func TestUnregisterEndsARest(t *testing.T) {
	s, h, rested := restingCompaction(t)
	s.Unregister()
	waitFor(t, func() bool { return isClosed(rested) }, "the rest to end after Unregister")
	if ok, _ := s.TrySchedule(); ok {
		t.Fatal("TrySchedule granted a compaction after Unregister")
	}
	// Compactions still running rest no more, nor ask the DB.
	h.CumulativeStats(pebble.CompactionGrantHandleStats{})
	if n := s.rests.Load(); n != 1 {
		t.Fatalf("%d rests, want the one before Unregister", n)
	}
	s.Unregister() // (again: a no-op)
}

// While Pebble holds writes back, no compaction rests, and one resting as
// the stall begins goes on.
func TestWriteStallEndsRests(t *testing.T) {
	s, h, rested := restingCompaction(t)
	s.writesStalled(true)
	waitFor(t, func() bool { return isClosed(rested) }, "the rest to end as writes stalled")
	h.CumulativeStats(pebble.CompactionGrantHandleStats{}) // returns at once
	if n := s.rests.Load(); n != 1 {
		t.Fatalf("%d rests while writes were stalled, want the one before", n)
	}
	s.writesStalled(false)
	s.rest = func(time.Duration) time.Duration { return time.Millisecond }
	h.CumulativeStats(pebble.CompactionGrantHandleStats{})
	if n := s.rests.Load(); n != 2 {
		t.Fatalf("after the stall: %d rests, want 2", n)
	}
	h.Done()
}

// Unregister without Register (pebble.Open failed before it) returns.
func TestUnregisterUnregistered(t *testing.T) {
	s := newCompactionScheduler()
	s.Unregister()
	s.Unregister()
}

// A store's compactions rest, and what they compacted reads back whole.
func TestStoreCompactionsRest(t *testing.T) {
	ctx := t.Context()
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	epoch := claim(t, s, 0)[0]
	const keys = 40_000
	value := func(round, k int) []byte { return fmt.Appendf(nil, "round %d of key %d: %0100d", round, k, k) }
	for round := range 3 {
		var d persistence.CheckpointData
		for k := range keys {
			d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: fmt.Sprintf("key-%d", k), Data: value(round, k)})
		}
		if err := s.Checkpoint(ctx, 0, epoch, d); err != nil {
			t.Fatal(err)
		}
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Compact(ctx, []byte{kindSnapshot}, []byte{kindSnapshot + 1}, false); err != nil {
		t.Fatal(err)
	}
	if s.compactions.Load().rests.Load() == 0 {
		t.Fatalf("a compaction of %d keys' snapshots, three versions each, did not rest", keys)
	}
	got, err := s.GetMany(ctx, 0, []string{"key-0", "key-39999"})
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range []int{0, keys - 1} {
		if string(got[i]) != string(value(2, k)) {
			t.Fatalf("key-%d after the compaction: %q, want %q", k, got[i], value(2, k))
		}
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A Pebble's write stalls reach its compaction scheduler, and the store's
// own record of the stall (pebbleOptions wires both).
func TestWriteStallsReachTheScheduler(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	po := s.opts.pebbleOptions(s)
	c := po.Experimental.CompactionScheduler.(*compactionScheduler)
	po.EventListener.WriteStallBegin(pebble.WriteStallBeginInfo{Reason: "memtable count limit reached"})
	c.mu.Lock()
	stalled := c.stalled
	c.mu.Unlock()
	s.stall.mu.Lock()
	reason := s.stall.reason
	s.stall.mu.Unlock()
	if !stalled || reason != "memtable count limit reached" {
		t.Fatalf("after WriteStallBegin: scheduler stalled %v, store's reason %q", stalled, reason)
	}
	po.EventListener.WriteStallEnd()
	c.mu.Lock()
	stalled = c.stalled
	c.mu.Unlock()
	if stalled {
		t.Fatal("after WriteStallEnd the scheduler still counts writes stalled")
	}
	c.Unregister() // (never registered: a no-op)
}
