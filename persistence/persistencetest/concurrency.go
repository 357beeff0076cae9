package persistencetest

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/keyfold/keyfold/persistence"
)

// Goroutines appending to their own groups concurrently all get consecutive
// positions, and every acknowledged record is in the log.
func testConcurrentAppendGroups(e *env) {
	const (
		workers   = 4
		perWorker = 4 // groups
		rounds    = 20
		perRound  = 2 // records per group per call
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			groups := make([]uint32, perWorker)
			epochs := make([]persistence.Epoch, perWorker)
			last := make([]persistence.Position, perWorker)
			for i := range groups {
				groups[i] = uint32(w*perWorker + i)
				st, err := e.s.Claim(e.ctx, groups[i])
				if err != nil {
					e.t.Errorf("Claim(%d): %v", groups[i], err)
					return
				}
				epochs[i] = st.Epoch
			}
			for r := range rounds {
				var entries []persistence.Entry
				for j := range perRound {
					for i, g := range groups {
						entries = append(entries, entry(g, epochs[i], data(g, r*perRound+j+1)))
					}
				}
				pos, err := e.s.Append(e.ctx, entries)
				if err != nil {
					e.t.Errorf("Append by worker %d: %v", w, err)
					return
				}
				for k, p := range pos {
					i := k % perWorker
					if want := last[i] + 1; p != want {
						e.t.Errorf("group %d got position %d, want %d", groups[i], p, want)
						return
					}
					last[i] = p
				}
			}
		})
	}
	wg.Wait()
	if e.t.Failed() {
		return
	}
	for g := range uint32(workers * perWorker) {
		e.wantLog(g, 0, recs(g, 1, 1, rounds*perRound)...)
	}
}

// Goroutines appending to the same group concurrently get distinct,
// gap-free positions, each call's consecutive, and the log holds what each
// was told.
func testConcurrentAppendOneGroup(e *env) {
	const (
		workers  = 4
		rounds   = 15
		perRound = 3
	)
	ep := e.claim(42).Epoch
	var (
		mu  sync.Mutex
		got = map[persistence.Position]string{}
		wg  sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				entries := make([]persistence.Entry, perRound)
				for j := range entries {
					entries[j] = entry(42, ep, fmt.Sprintf("w%d-r%d-%d", w, r, j))
				}
				pos, err := e.s.Append(e.ctx, entries)
				if err != nil {
					e.t.Errorf("Append by worker %d: %v", w, err)
					return
				}
				mu.Lock()
				for j, p := range pos {
					if p != pos[0]+persistence.Position(j) {
						e.t.Errorf("one call got positions %v, want consecutive ones", pos)
					}
					if prev, dup := got[p]; dup {
						e.t.Errorf("position %d given to %q and %q", p, prev, entries[j].Data)
					}
					got[p] = string(entries[j].Data)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if e.t.Failed() {
		return
	}
	var want []rec
	for p := range persistence.Position(workers * rounds * perRound) {
		want = append(want, rec{p + 1, got[p+1]})
	}
	if read := e.read(42, 0); !slices.Equal(read, want) {
		e.t.Errorf("Read after concurrent appends = %v, want %v", read, want)
	}
	e.wantState(42, 0, workers*rounds*perRound)
}

// A claim fences writes racing it: once Claim returns, every write that
// succeeded with the old epoch is visible, and none with it succeeds later.
// (Stores may let checkpoint writes and appends of one group proceed in
// parallel; this is the order they must still keep.)
func testClaimFencesRacingWrites(e *env) {
	const g = 7
	old := e.claim(g).Epoch
	stop := make(chan struct{})
	var (
		mu        sync.Mutex
		lastPut   int  // the last value Put acknowledged under the old epoch
		afterStop bool // the claim has returned
		wg        sync.WaitGroup
	)
	wg.Go(func() {
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			startedAfter := afterStop
			mu.Unlock()
			err := e.s.Checkpoint(e.ctx, g, old, persistence.CheckpointData{Snapshots: []persistence.Snapshot{{Key: "k", Data: fmt.Appendf(nil, "%d", i)}}})
			mu.Lock()
			if err == nil {
				lastPut = i
				if startedAfter {
					e.t.Errorf("Put %d with the old epoch, started after the claim returned, succeeded", i)
				}
			}
			mu.Unlock()
			if err != nil {
				return
			}
		}
	})
	wg.Go(func() {
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := e.s.Append(e.ctx, []persistence.Entry{entry(g, old, data(g, i))}); err != nil {
				return
			}
		}
	})
	for range 50 { // let the writers run a little
		if _, err := e.s.Get(e.ctx, g, "k"); err == nil {
			break
		}
	}
	e.claim(g)
	atClaim, _ := e.s.Get(e.ctx, g, "k")
	mu.Lock()
	afterStop = true
	mu.Unlock()
	close(stop)
	wg.Wait()
	if lastPut > 0 && string(atClaim) != fmt.Sprint(lastPut) {
		e.t.Errorf("when the claim returned the snapshot was %q, but Put %d with the old epoch was acknowledged: it landed after the claim", atClaim, lastPut)
	}
}

// Concurrent trims of one group leave the checkpoint at the largest, also
// after a reopen, so positions are never reused.
func testConcurrentTrimsReopen(e *env) {
	const g, n = 3, 40
	ep := e.claim(g).Epoch
	e.appendN(g, ep, 1, n)
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		wg.Go(func() {
			if err := e.s.Checkpoint(e.ctx, g, ep, persistence.CheckpointData{Through: persistence.Position(i)}); err != nil {
				e.t.Errorf("Trim(%d): %v", i, err)
			}
		})
	}
	wg.Wait()
	e.reopen()
	st := e.claim(g)
	if st.Checkpoint != n || st.Last != n {
		e.t.Errorf("after concurrent trims and a reopen: checkpoint %d, last %d; want %d, %d", st.Checkpoint, st.Last, n, n)
	}
	if got := e.appendN(g, st.Epoch, n+1, 1); got[0] != n+1 {
		e.t.Errorf("append after concurrent trims and a reopen got position %d, want %d", got[0], n+1)
	}
}

// Checkpoints of many groups appending to one pipeline concurrently, with a
// reader resuming from the last cursor it got all along: the reader sees
// every output exactly once, each group's in order. A store that lets a
// reader see an output before an earlier one that is still being committed
// fails this: the reader resumes after the later one and never sees the
// earlier.
func testConcurrentOutputs(e *env) {
	const (
		groups    = 16 // as many checkpoints at once as the host runs
		rounds    = 8
		perRound  = 3
		pageLimit = 5
	)
	var (
		writers sync.WaitGroup
		reader  sync.WaitGroup
		done    = make(chan struct{})
		seen    []string
	)
	reader.Go(func() {
		after := ""
		for {
			select {
			case <-done:
				// The writers are over: read to the end and stop.
				for {
					page, err := e.s.ReadOutputs(e.ctx, pipeA, after, pageLimit)
					if err != nil {
						e.t.Errorf("ReadOutputs(after %q): %v", after, err)
						return
					}
					if len(page) == 0 {
						return
					}
					seen = append(seen, datas(page)...)
					after = page[len(page)-1].Cursor
				}
			default:
			}
			page, err := e.s.ReadOutputs(e.ctx, pipeA, after, pageLimit)
			if err != nil {
				e.t.Errorf("ReadOutputs(after %q): %v", after, err)
				return
			}
			if len(page) > 0 {
				seen = append(seen, datas(page)...)
				after = page[len(page)-1].Cursor
			}
		}
	})
	for g := range uint32(groups) {
		writers.Go(func() {
			st, err := e.s.Claim(e.ctx, g)
			if err != nil {
				e.t.Errorf("Claim(%d): %v", g, err)
				return
			}
			for r := range rounds {
				outs := make([]persistence.Output, perRound)
				for i := range outs {
					outs[i] = out(pipeA, data(g, r*perRound+i))
				}
				err := e.s.Checkpoint(e.ctx, g, st.Epoch, persistence.CheckpointData{
					Snapshots: []persistence.Snapshot{snap("k", data(g, r))},
					Outputs:   outs,
				})
				if err != nil {
					e.t.Errorf("Checkpoint(%d) round %d: %v", g, r, err)
					return
				}
			}
		})
	}
	writers.Wait()
	close(done)
	reader.Wait()
	if e.t.Failed() {
		return
	}

	next := map[string]bool{} // the next output each group must show
	for g := range uint32(groups) {
		next[data(g, 0)] = true
	}
	got := map[string]bool{}
	for _, d := range seen {
		if got[d] {
			e.t.Fatalf("the reader saw output %q twice", d)
		}
		got[d] = true
		if !next[d] {
			e.t.Fatalf("the reader saw output %q out of its group's order (or one of its group's before it never)", d)
		}
		delete(next, d)
		var g uint32
		var i int
		if _, err := fmt.Sscanf(d, "g%d-r%d", &g, &i); err != nil {
			e.t.Fatalf("unexpected output %q", d)
		}
		if i+1 < rounds*perRound {
			next[data(g, i+1)] = true
		}
	}
	if want := groups * rounds * perRound; len(seen) != want {
		e.t.Errorf("the reader saw %d outputs, want %d: it skipped some (missing the next of: %v)", len(seen), want, slices.Sorted(maps.Keys(next)))
	}
}
