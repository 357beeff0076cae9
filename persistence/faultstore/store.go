package faultstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/keyfold/keyfold/persistence"
)

// Store is a persistence.Store that injects faults into the calls it passes
// to another one.
type Store struct {
	inner persistence.Store

	mu     sync.Mutex
	calls  [numOps]int
	nth    [numOps]map[int]Fault // by call number, counted from 1
	always [numOps]*Fault
}

var (
	_ persistence.Store           = (*Store)(nil)
	_ persistence.PackedSnapshots = (*Store)(nil)
	_ persistence.GroupsRecorder  = (*Store)(nil)
)

// New returns a Store that passes calls to inner, with no faults arranged.
func New(inner persistence.Store) *Store {
	return &Store{inner: inner}
}

// PackedSnapshots is the wrapped store's (persistence.PackedSnapshots).
func (s *Store) PackedSnapshots() bool { return persistence.AllowsPacked(s.inner) }

// IDIndex implements persistence.IDIndexer, as the wrapped store does.
func (s *Store) IDIndex() bool { return persistence.HasIDIndex(s.inner) }

// Inner returns the wrapped store.
func (s *Store) Inner() persistence.Store { return s.inner }

// Inject arranges f for the nth call of op from now on (1 is the next).
// A later Inject for the same call replaces it.
func (s *Store) Inject(op Op, nth int, f Fault) {
	if nth < 1 {
		panic(fmt.Sprintf("faultstore: Inject %v: nth is %d, want 1 or more", op, nth))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nth[op] == nil {
		s.nth[op] = map[int]Fault{}
	}
	s.nth[op][s.calls[op]+nth] = f
}

// InjectAll arranges f for every later call of op that has no fault of its
// own from Inject, until Reset.
func (s *Store) InjectAll(op Op, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.always[op] = &f
}

// FailNext makes the next call of op fail with err without reaching the
// inner store.
func (s *Store) FailNext(op Op, err error) { s.Inject(op, 1, Fault{Err: err}) }

// FailNth makes the nth call of op from now on (1 is the next) fail with
// err without reaching the inner store.
func (s *Store) FailNth(op Op, nth int, err error) { s.Inject(op, nth, Fault{Err: err}) }

// DelayNext delays the next call of op by d.
func (s *Store) DelayNext(op Op, d time.Duration) { s.Inject(op, 1, Fault{Delay: d}) }

// Calls returns the number of calls of op so far, failed ones included.
func (s *Store) Calls(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

// Reset drops every fault not yet applied. Call counts go on.
func (s *Store) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nth = [numOps]map[int]Fault{}
	s.always = [numOps]*Fault{}
}

// call numbers a call of op and returns its fault.
func (s *Store) call(op Op) Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[op]++
	n := s.calls[op]
	if f, ok := s.nth[op][n]; ok {
		delete(s.nth[op], n)
		return f
	}
	if f := s.always[op]; f != nil {
		return *f
	}
	return Fault{}
}

// before applies the part of f that comes before the call: the delay, then
// the error unless f.After. A non-nil result fails the call.
func before(ctx context.Context, op Op, f Fault) error {
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("faultstore: %v delayed: %w", op, ctx.Err())
		}
	}
	if f.Wait != nil {
		select {
		case <-f.Wait:
		case <-ctx.Done():
			return fmt.Errorf("faultstore: %v held: %w", op, ctx.Err())
		}
	}
	if f.Err != nil && !f.After {
		return f.Err
	}
	return nil
}

// after returns the error of the call: f.Err if f.After, else the store's.
func after(f Fault, err error) error {
	if f.Err != nil && f.After {
		return f.Err
	}
	return err
}

// Claim implements persistence.Log.
func (s *Store) Claim(ctx context.Context, group uint32) (persistence.GroupState, error) {
	f := s.call(OpClaim)
	if err := before(ctx, OpClaim, f); err != nil {
		return persistence.GroupState{}, err
	}
	st, err := s.inner.Claim(ctx, group)
	if err = after(f, err); err != nil {
		return persistence.GroupState{}, err
	}
	return st, nil
}

// Append implements persistence.Log.
func (s *Store) Append(ctx context.Context, entries []persistence.Entry) ([]persistence.Position, error) {
	f := s.call(OpAppend)
	if err := before(ctx, OpAppend, f); err != nil {
		return make([]persistence.Position, len(entries)), err
	}
	pos, err := s.inner.Append(ctx, entries)
	if f.Err != nil && f.After {
		return make([]persistence.Position, len(entries)), f.Err
	}
	return pos, err
}

// Read implements persistence.Log.
func (s *Store) Read(ctx context.Context, group uint32, afterPos persistence.Position, fn func(persistence.Position, []byte) error) error {
	f := s.call(OpRead)
	if err := before(ctx, OpRead, f); err != nil {
		return err
	}
	return after(f, s.inner.Read(ctx, group, afterPos, fn))
}

// Checkpoint implements persistence.Store. A fault After it lets the whole
// checkpoint through, outputs included.
func (s *Store) Checkpoint(ctx context.Context, group uint32, epoch persistence.Epoch, d persistence.CheckpointData) error {
	f := s.call(OpCheckpoint)
	if err := before(ctx, OpCheckpoint, f); err != nil {
		return err
	}
	return after(f, s.inner.Checkpoint(ctx, group, epoch, d))
}

// LookupIDs implements persistence.Store.
func (s *Store) LookupIDs(ctx context.Context, group uint32, lookups []persistence.IDLookup) ([]int64, error) {
	f := s.call(OpLookupIDs)
	if err := before(ctx, OpLookupIDs, f); err != nil {
		return nil, err
	}
	at, err := s.inner.LookupIDs(ctx, group, lookups)
	if err = after(f, err); err != nil {
		return nil, err
	}
	return at, nil
}

// Timers implements persistence.Store. A fault After it comes once fn has
// seen every entry.
func (s *Store) Timers(ctx context.Context, group uint32, fn func(key string, due int64) error) error {
	f := s.call(OpTimers)
	if err := before(ctx, OpTimers, f); err != nil {
		return err
	}
	return after(f, s.inner.Timers(ctx, group, fn))
}

// AppendOutputs implements persistence.OutputLog.
func (s *Store) AppendOutputs(ctx context.Context, outputs []persistence.Output) error {
	f := s.call(OpAppendOutputs)
	if err := before(ctx, OpAppendOutputs, f); err != nil {
		return err
	}
	return after(f, s.inner.AppendOutputs(ctx, outputs))
}

// ReadOutputs implements persistence.OutputLog.
func (s *Store) ReadOutputs(ctx context.Context, pipeline string, afterCursor string, limit int) ([]persistence.OutputEntry, error) {
	f := s.call(OpReadOutputs)
	if err := before(ctx, OpReadOutputs, f); err != nil {
		return nil, err
	}
	out, err := s.inner.ReadOutputs(ctx, pipeline, afterCursor, limit)
	if err = after(f, err); err != nil {
		return nil, err
	}
	return out, nil
}

// TrimOutputs implements persistence.OutputLog. A fault After it trims and
// returns 0 with the fault's error.
func (s *Store) TrimOutputs(ctx context.Context, pipeline string, cut time.Time) (int, error) {
	f := s.call(OpTrimOutputs)
	if err := before(ctx, OpTrimOutputs, f); err != nil {
		return 0, err
	}
	n, err := s.inner.TrimOutputs(ctx, pipeline, cut)
	if err = after(f, err); err != nil {
		return 0, err
	}
	return n, nil
}

// GetMany implements persistence.Snapshots; it counts as an OpGet.
func (s *Store) GetMany(ctx context.Context, group uint32, keys []string) ([][]byte, error) {
	f := s.call(OpGet)
	if err := before(ctx, OpGet, f); err != nil {
		return nil, err
	}
	data, err := s.inner.GetMany(ctx, group, keys)
	if err = after(f, err); err != nil {
		return nil, err
	}
	return data, nil
}

// GetGroups implements persistence.Snapshots; it counts as an OpGet.
func (s *Store) GetGroups(ctx context.Context, reads []persistence.GroupKeys) ([][][]byte, error) {
	f := s.call(OpGet)
	if err := before(ctx, OpGet, f); err != nil {
		return nil, err
	}
	data, err := s.inner.GetGroups(ctx, reads)
	if err = after(f, err); err != nil {
		return nil, err
	}
	return data, nil
}

// Get implements persistence.Snapshots.
func (s *Store) Get(ctx context.Context, group uint32, key string) ([]byte, error) {
	f := s.call(OpGet)
	if err := before(ctx, OpGet, f); err != nil {
		return nil, err
	}
	b, err := s.inner.Get(ctx, group, key)
	if err = after(f, err); err != nil {
		return nil, err
	}
	return b, nil
}

// RecordedGroups forwards to the wrapped store (persistence.GroupsRecorder),
// without faults.
func (s *Store) RecordedGroups(ctx context.Context) (uint32, error) {
	return persistence.RecordedGroups(ctx, s.inner)
}

// CheckGroups implements persistence.Store.
func (s *Store) CheckGroups(ctx context.Context, groups, layout uint32) (uint32, error) {
	f := s.call(OpCheckGroups)
	if err := before(ctx, OpCheckGroups, f); err != nil {
		return 0, err
	}
	layout, err := s.inner.CheckGroups(ctx, groups, layout)
	return layout, after(f, err)
}

// Close closes the inner store. A delay of Close is not cut short.
func (s *Store) Close() error {
	f := s.call(OpClose)
	if err := before(context.Background(), OpClose, f); err != nil {
		return err
	}
	return after(f, s.inner.Close())
}
