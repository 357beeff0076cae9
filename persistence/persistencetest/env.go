package persistencetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/keyfold/keyfold/persistence"
)

// env is one test's store and the helpers that fail the test on errors.
type env struct {
	t   *testing.T
	h   Harness
	ctx context.Context
	s   persistence.Store
}

func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	e := &env{t: t, h: h, ctx: t.Context(), s: h.New(t)}
	if e.s == nil {
		t.Fatal("persistencetest: Harness.New returned nil")
	}
	t.Cleanup(func() {
		// Close is safe twice, so this also covers tests that close the store.
		if err := e.s.Close(); err != nil && !errors.Is(err, persistence.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

// reopen closes the store and opens its data again.
func (e *env) reopen() {
	e.t.Helper()
	e.s = e.h.Reopen(e.t, e.s)
	if e.s == nil {
		e.t.Fatal("persistencetest: Harness.Reopen returned nil")
	}
}

// rec is a log record as read back.
type rec struct {
	Pos  persistence.Position
	Data string
}

func (r rec) String() string { return fmt.Sprintf("%d:%q", r.Pos, r.Data) }

// data is the payload of record i of group g in most tests.
func data(g uint32, i int) string { return fmt.Sprintf("g%d-r%d", g, i) }

func (e *env) claim(g uint32) persistence.GroupState {
	e.t.Helper()
	st, err := e.s.Claim(e.ctx, g)
	if err != nil {
		e.t.Fatalf("Claim(%d): %v", g, err)
	}
	return st
}

func (e *env) append(entries ...persistence.Entry) []persistence.Position {
	e.t.Helper()
	pos, err := e.s.Append(e.ctx, entries)
	if err != nil {
		e.t.Fatalf("Append(%d entries): %v", len(entries), err)
	}
	if len(pos) != len(entries) {
		e.t.Fatalf("Append(%d entries) returned %d positions", len(entries), len(pos))
	}
	return pos
}

// appendN appends n records data(g, from) … data(g, from+n-1) to g in one
// call and returns their positions.
func (e *env) appendN(g uint32, ep persistence.Epoch, from, n int) []persistence.Position {
	e.t.Helper()
	entries := make([]persistence.Entry, n)
	for i := range entries {
		entries[i] = persistence.Entry{Group: g, Epoch: ep, Data: []byte(data(g, from+i))}
	}
	return e.append(entries...)
}

func (e *env) read(g uint32, after persistence.Position) []rec {
	e.t.Helper()
	var got []rec
	err := e.s.Read(e.ctx, g, after, func(p persistence.Position, d []byte) error {
		got = append(got, rec{p, string(d)})
		return nil
	})
	if err != nil {
		e.t.Fatalf("Read(%d, after %d): %v", g, after, err)
	}
	return got
}

// wantLog checks the records of g after a position.
func (e *env) wantLog(g uint32, after persistence.Position, want ...rec) {
	e.t.Helper()
	if got := e.read(g, after); !slices.Equal(got, want) {
		e.t.Errorf("Read(%d, after %d) = %v, want %v", g, after, got, want)
	}
}

// recs returns the records data(g, from) … data(g, to) at positions first,
// first+1, ….
func recs(g uint32, first persistence.Position, from, to int) []rec {
	var rs []rec
	for i := from; i <= to; i++ {
		rs = append(rs, rec{first, data(g, i)})
		first++
	}
	return rs
}

func (e *env) trim(g uint32, ep persistence.Epoch, through persistence.Position) {
	e.t.Helper()
	if err := e.s.Checkpoint(e.ctx, g, ep, persistence.CheckpointData{Through: through}); err != nil {
		e.t.Fatalf("Checkpoint(%d, epoch %d, through %d): %v", g, ep, through, err)
	}
}

func (e *env) put(g uint32, ep persistence.Epoch, snaps ...persistence.Snapshot) {
	e.t.Helper()
	if err := e.s.Checkpoint(e.ctx, g, ep, persistence.CheckpointData{Snapshots: snaps}); err != nil {
		e.t.Fatalf("Checkpoint(%d, epoch %d, %d snapshots): %v", g, ep, len(snaps), err)
	}
}

// wantSnap checks a snapshot's data.
func (e *env) wantSnap(g uint32, key, want string) {
	e.t.Helper()
	got, err := e.s.Get(e.ctx, g, key)
	if err != nil {
		e.t.Errorf("Get(%d, %q): %v, want %q", g, key, err, want)
		return
	}
	if string(got) != want {
		e.t.Errorf("Get(%d, %q) = %q, want %q", g, key, got, want)
	}
}

// wantNoSnap checks that a snapshot does not exist.
func (e *env) wantNoSnap(g uint32, key string) {
	e.t.Helper()
	got, err := e.s.Get(e.ctx, g, key)
	if !errors.Is(err, persistence.ErrNotFound) {
		e.t.Errorf("Get(%d, %q) = %q, %v, want an error wrapping ErrNotFound", g, key, got, err)
	}
}

// wantState checks the checkpoint and last position a claim returns, and
// returns the new epoch.
func (e *env) wantState(g uint32, checkpoint, last persistence.Position) persistence.Epoch {
	e.t.Helper()
	st := e.claim(g)
	if st.Checkpoint != checkpoint || st.Last != last {
		e.t.Errorf("Claim(%d) = checkpoint %d, last %d, want checkpoint %d, last %d",
			g, st.Checkpoint, st.Last, checkpoint, last)
	}
	return st.Epoch
}

func snap(key, data string) persistence.Snapshot {
	return persistence.Snapshot{Key: key, Data: []byte(data)}
}

func entry(g uint32, ep persistence.Epoch, data string) persistence.Entry {
	return persistence.Entry{Group: g, Epoch: ep, Data: []byte(data)}
}

// wantFenced checks that err wraps ErrFenced.
func (e *env) wantFenced(op string, err error) {
	e.t.Helper()
	if !errors.Is(err, persistence.ErrFenced) {
		e.t.Errorf("%s = %v, want an error wrapping ErrFenced", op, err)
	}
}
