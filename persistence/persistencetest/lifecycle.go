package persistencetest

import (
	"context"
	"errors"
	"time"

	"github.com/keyfold/keyfold/persistence"
)

// CheckGroups records the first count and layout, rejects another count
// and returns the first layout whatever later calls pass.
func testCheckGroups(e *env) {
	recorded := func(want uint32, when string) {
		e.t.Helper()
		if r, ok := e.s.(persistence.GroupsRecorder); ok {
			if n, err := r.RecordedGroups(e.ctx); err != nil || n != want {
				e.t.Errorf("RecordedGroups %s = %d, %v; want %d", when, n, err, want)
			}
		}
	}
	recorded(0, "of a new store")
	for i := range 2 {
		layout, err := e.s.CheckGroups(e.ctx, 256, uint32(7+i))
		if err != nil {
			e.t.Fatalf("CheckGroups(256): %v", err)
		}
		if layout != 7 {
			e.t.Errorf("CheckGroups(256, %d) = layout %d, want 7 (recorded by the first call)", 7+i, layout)
		}
	}
	if _, err := e.s.CheckGroups(e.ctx, 128, 7); !errors.Is(err, persistence.ErrGroupsMismatch) {
		e.t.Errorf("CheckGroups(128) after 256 = %v, want an error wrapping ErrGroupsMismatch", err)
	}
	recorded(256, "after CheckGroups(256)")
}

// The recorded group count and layout survive a reopen.
func testCheckGroupsReopen(e *env) {
	if _, err := e.s.CheckGroups(e.ctx, 256, 2); err != nil {
		e.t.Fatalf("CheckGroups(256): %v", err)
	}
	e.reopen()
	if r, ok := e.s.(persistence.GroupsRecorder); ok {
		if n, err := r.RecordedGroups(e.ctx); err != nil || n != 256 {
			e.t.Errorf("RecordedGroups after reopen = %d, %v; want 256", n, err)
		}
	}
	if _, err := e.s.CheckGroups(e.ctx, 128, 2); !errors.Is(err, persistence.ErrGroupsMismatch) {
		e.t.Errorf("CheckGroups(128) after reopen = %v, want an error wrapping ErrGroupsMismatch", err)
	}
	if layout, err := e.s.CheckGroups(e.ctx, 256, 3); err != nil || layout != 2 {
		e.t.Errorf("CheckGroups(256) after reopen = layout %d, %v; want 2, nil", layout, err)
	}
}

// Epochs, logs, checkpoints and snapshots survive a reopen.
func testDurability(e *env) {
	groups := []uint32{0, 1, 2, 3, 1000}
	epochs := map[uint32]persistence.Epoch{}
	var entries []persistence.Entry
	for _, g := range groups {
		epochs[g] = e.claim(g).Epoch
		for i := range 4 {
			entries = append(entries, entry(g, epochs[g], data(g, i+1)))
		}
	}
	e.append(entries...)
	for _, g := range groups {
		e.trim(g, epochs[g], persistence.Position(g%4))
		e.put(g, epochs[g], snap("k", data(g, 0)), snap("deleted", "x"))
		e.put(g, epochs[g], persistence.Snapshot{Key: "deleted"})
	}

	e.reopen()
	for _, g := range groups {
		checkpoint := persistence.Position(g % 4)
		e.wantLog(g, 0, recs(g, checkpoint+1, int(checkpoint)+1, 4)...)
		e.wantSnap(g, "k", data(g, 0))
		e.wantNoSnap(g, "deleted")
		st := e.claim(g)
		if st.Epoch <= epochs[g] || st.Checkpoint != checkpoint || st.Last != 4 {
			e.t.Errorf("Claim(%d) after reopen = %+v, want an epoch above %d, checkpoint %d, last 4",
				g, st, epochs[g], checkpoint)
		}
		// The epoch before the reopen is fenced.
		_, err := e.s.Append(e.ctx, []persistence.Entry{entry(g, epochs[g], "stale")})
		e.wantFenced("Append with the epoch from before the reopen", err)
		if got := e.append(entry(g, st.Epoch, data(g, 5))); got[0] != 5 {
			e.t.Errorf("append to group %d after reopen got position %d, want 5", g, got[0])
		}
	}

	// And a second reopen keeps the writes of the first session.
	e.reopen()
	for _, g := range groups {
		checkpoint := persistence.Position(g % 4)
		e.wantLog(g, 0, recs(g, checkpoint+1, int(checkpoint)+1, 5)...)
	}
}

// Every call on a closed store fails with ErrClosed; Close is safe twice.
func testClosed(e *env) {
	ep := e.claim(1).Epoch
	e.append(entry(1, ep, "a"))
	if err := e.s.Close(); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	if err := e.s.Close(); err != nil && !errors.Is(err, persistence.ErrClosed) {
		e.t.Errorf("second Close = %v, want nil or an error wrapping ErrClosed", err)
	}
	for _, c := range storeCalls(e.ctx, e.s, ep) {
		if err := c.call(); !errors.Is(err, persistence.ErrClosed) {
			e.t.Errorf("%s on a closed store = %v, want an error wrapping ErrClosed", c.name, err)
		}
	}
}

// A call with a cancelled context fails and writes nothing.
func testCancelledContext(e *env) {
	ep := e.claim(1).Epoch
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	for _, c := range storeCalls(ctx, e.s, ep) {
		if err := c.call(); !errors.Is(err, context.Canceled) {
			e.t.Errorf("%s with a cancelled context = %v, want an error wrapping context.Canceled", c.name, err)
		}
	}
	e.wantLog(1, 0)
	e.wantNoSnap(1, "k")
	e.wantTimers(1, nil)
	e.wantOutputs(pipeA, "")
	e.wantState(1, 0, 0)
	if _, err := e.s.CheckGroups(e.ctx, 128, 2); err != nil {
		e.t.Errorf("CheckGroups(128) after a cancelled CheckGroups(256): %v", err)
	}
}

type storeCall struct {
	name string
	call func() error
}

// storeCalls returns one call of each method but Close, as the owner of
// group 1 at epoch ep.
func storeCalls(ctx context.Context, s persistence.Store, ep persistence.Epoch) []storeCall {
	return []storeCall{
		{"Claim", func() error { _, err := s.Claim(ctx, 2); return err }},
		{"Append", func() error {
			pos, err := s.Append(ctx, []persistence.Entry{entry(1, ep, "x"), entry(1, ep, "y")})
			for _, p := range pos {
				if p != 0 {
					return errors.New("failed Append returned a non-zero position")
				}
			}
			return err
		}},
		{"Read", func() error {
			return s.Read(ctx, 1, 0, func(persistence.Position, []byte) error { return nil })
		}},
		{"Checkpoint", func() error {
			return s.Checkpoint(ctx, 1, ep, persistence.CheckpointData{
				Snapshots: []persistence.Snapshot{snap("k", "v")},
				Timers:    []persistence.Timer{timer("k", t0)},
				Outputs:   []persistence.Output{out(pipeA, "x")},
				Through:   1,
			})
		}},
		{"Get", func() error { _, err := s.Get(ctx, 1, "k"); return err }},
		{"GetMany", func() error { _, err := s.GetMany(ctx, 1, []string{"k"}); return err }},
		{"GetGroups", func() error {
			_, err := s.GetGroups(ctx, []persistence.GroupKeys{{Group: 1, Keys: []string{"k"}}})
			return err
		}},
		{"CheckGroups", func() error { _, err := s.CheckGroups(ctx, 256, 2); return err }},
		{"Timers", func() error {
			return s.Timers(ctx, 1, func(string, int64) error { return nil })
		}},
		{"ReadOutputs", func() error { _, err := s.ReadOutputs(ctx, pipeA, "", 10); return err }},
		{"TrimOutputs", func() error { _, err := s.TrimOutputs(ctx, pipeA, time.Now()); return err }},
	}
}
