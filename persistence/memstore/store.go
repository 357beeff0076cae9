// Package memstore is an in-memory keyfold store: the persistence model
// with nothing written anywhere. It is not durable (a process exit loses
// everything), so keyfold never uses it to serve; it is the baseline that
// benchmarks compare the real stores against ("no store at all"), and the
// simplest reference implementation of the conformance suite.
package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/keyfold/keyfold/persistence"
)

// Store is an in-memory store, safe for concurrent use.
type Store struct {
	d      *data
	mu     sync.Mutex // guards closed
	closed bool
}

var (
	_ persistence.Store           = (*Store)(nil)
	_ persistence.PackedSnapshots = (*Store)(nil)
	_ persistence.GroupsRecorder  = (*Store)(nil)
)

// PackedSnapshots reports that the store allows packed snapshots
// (persistence.PackedSnapshots): it lives and dies with its process.
func (s *Store) PackedSnapshots() bool { return true }

type data struct {
	mu     sync.Mutex
	groups uint32 // 0 until CheckGroups
	layout uint32 // recorded with groups
	g      map[uint32]*group
	out    map[string]*outputLog
}

type group struct {
	epoch, checkpoint, last persistence.Position
	log                     map[persistence.Position][]byte
	snaps                   map[string][]byte
	timers                  map[string]int64
	ids                     map[int64]map[idName]int64 // bucket → key and id → at
}

// idName is a stored id's key and id.
type idName struct{ key, id string }

// outputLog is a pipeline's output log. Its cursors are the decimal
// sequence numbers of its entries, 1, 2, 3, … in append order, never
// reused.
type outputLog struct {
	entries []output // retained, in sequence order
	last    uint64   // sequence number of the last entry appended
	lastMs  int64    // its time: later entries never get an earlier one
}

type output struct {
	seq  uint64
	ms   int64
	data []byte
}

// New returns an empty store.
func New() *Store {
	return &Store{d: &data{g: map[uint32]*group{}, out: map[string]*outputLog{}}}
}

// Reopen returns a new handle on the same data, as reopening a durable
// store would; s may be closed.
func (s *Store) Reopen() *Store { return &Store{d: s.d} }

// Close makes later calls fail with persistence.ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// lock checks the call may run and locks the data; the caller unlocks it.
func (s *Store) lock(ctx context.Context) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return persistence.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.d.mu.Lock()
	return nil
}

func (d *data) group(id uint32) *group {
	g := d.g[id]
	if g == nil {
		g = &group{log: map[persistence.Position][]byte{}, snaps: map[string][]byte{}, timers: map[string]int64{}}
		d.g[id] = g
	}
	return g
}

func (g *group) owns(epoch persistence.Epoch) bool { return g.epoch != 0 && g.epoch == epoch }

// Claim implements persistence.Log.
func (s *Store) Claim(ctx context.Context, id uint32) (persistence.GroupState, error) {
	if err := s.lock(ctx); err != nil {
		return persistence.GroupState{}, fmt.Errorf("memstore: claim group %d: %w", id, err)
	}
	defer s.d.mu.Unlock()
	g := s.d.group(id)
	g.epoch++
	return persistence.GroupState{Epoch: g.epoch, Checkpoint: g.checkpoint, Last: g.last}, nil
}

// Append implements persistence.Log.
func (s *Store) Append(ctx context.Context, entries []persistence.Entry) ([]persistence.Position, error) {
	pos := make([]persistence.Position, len(entries))
	if err := s.lock(ctx); err != nil {
		return pos, fmt.Errorf("memstore: append: %w", err)
	}
	defer s.d.mu.Unlock()
	fenced := map[uint32]bool{}
	for i, e := range entries {
		g := s.d.group(e.Group)
		if !g.owns(e.Epoch) {
			fenced[e.Group] = true
			continue
		}
		g.last++
		g.log[g.last] = append([]byte(nil), e.Data...)
		pos[i] = g.last
	}
	var errs []error
	for id := range fenced {
		errs = append(errs, fmt.Errorf("memstore: append group %d: %w", id, persistence.ErrFenced))
	}
	return pos, errors.Join(errs...)
}

// Read implements persistence.Log. fn runs without the store's lock.
func (s *Store) Read(ctx context.Context, id uint32, after persistence.Position, fn func(persistence.Position, []byte) error) error {
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("memstore: read group %d: %w", id, err)
	}
	g := s.d.group(id)
	type rec struct {
		pos  persistence.Position
		data []byte
	}
	var recs []rec
	for p := max(after, g.checkpoint) + 1; p <= g.last && p > after; p++ {
		if d, ok := g.log[p]; ok {
			recs = append(recs, rec{p, d})
		}
	}
	s.d.mu.Unlock()
	for _, r := range recs {
		if err := fn(r.pos, r.data); err != nil {
			return err
		}
	}
	return nil
}

// Checkpoint implements persistence.Store. It appends the outputs
// atomically with the rest: a failed checkpoint appends none.
func (s *Store) Checkpoint(ctx context.Context, id uint32, epoch persistence.Epoch, d persistence.CheckpointData) error {
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("memstore: checkpoint group %d: %w", id, err)
	}
	defer s.d.mu.Unlock()
	g := s.d.group(id)
	if !g.owns(epoch) {
		return fmt.Errorf("memstore: checkpoint group %d: %w", id, persistence.ErrFenced)
	}
	if d.Through > g.last {
		return fmt.Errorf("memstore: checkpoint group %d through %d: beyond the last position %d", id, d.Through, g.last)
	}
	if err := d.CheckIDs(); err != nil {
		return fmt.Errorf("memstore: checkpoint group %d: %w", id, err)
	}
	for _, sn := range d.Snapshots {
		if sn.Data == nil {
			delete(g.snaps, sn.Key)
		} else {
			g.snaps[sn.Key] = append([]byte{}, sn.Data...)
		}
	}
	for _, t := range d.Timers {
		if t.Due == 0 {
			delete(g.timers, t.Key)
		} else {
			g.timers[t.Key] = t.Due
		}
	}
	for b := range g.ids {
		if b < d.DropIDsBefore {
			delete(g.ids, b)
		}
	}
	for _, sid := range d.IDs {
		if g.ids == nil {
			g.ids = map[int64]map[idName]int64{}
		}
		if g.ids[sid.Bucket] == nil {
			g.ids[sid.Bucket] = map[idName]int64{}
		}
		g.ids[sid.Bucket][idName{sid.Key, sid.ID}] = sid.At
	}
	s.d.appendOutputs(d.Outputs)
	for ; g.checkpoint < d.Through; g.checkpoint++ {
		delete(g.log, g.checkpoint+1)
	}
	return nil
}

// LookupIDs implements persistence.Store.
func (s *Store) LookupIDs(ctx context.Context, id uint32, lookups []persistence.IDLookup) ([]int64, error) {
	if err := persistence.CheckIDLookups(lookups); err != nil {
		return nil, fmt.Errorf("memstore: look up ids of group %d: %w", id, err)
	}
	if err := s.lock(ctx); err != nil {
		return nil, fmt.Errorf("memstore: look up ids of group %d: %w", id, err)
	}
	defer s.d.mu.Unlock()
	g := s.d.group(id)
	at := make([]int64, len(lookups))
	for i, l := range lookups {
		at[i] = g.ids[l.Bucket][idName{l.Key, l.ID}]
	}
	return at, nil
}

// Timers implements persistence.Store: it calls fn in due order, keys of
// one due in byte order, without the store's lock.
func (s *Store) Timers(ctx context.Context, id uint32, fn func(key string, due int64) error) error {
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("memstore: timers of group %d: %w", id, err)
	}
	timers := make([]persistence.Timer, 0, len(s.d.group(id).timers))
	for k, due := range s.d.group(id).timers {
		timers = append(timers, persistence.Timer{Key: k, Due: due})
	}
	s.d.mu.Unlock()
	slices.SortFunc(timers, func(a, b persistence.Timer) int {
		return cmp.Or(cmp.Compare(a.Due, b.Due), cmp.Compare(a.Key, b.Key))
	})
	for _, t := range timers {
		if err := fn(t.Key, t.Due); err != nil {
			return err
		}
	}
	return nil
}

// AppendOutputs implements persistence.OutputLog.
func (s *Store) AppendOutputs(ctx context.Context, outputs []persistence.Output) error {
	if err := s.lock(ctx); err != nil {
		return fmt.Errorf("memstore: append outputs: %w", err)
	}
	defer s.d.mu.Unlock()
	s.d.appendOutputs(outputs)
	return nil
}

// appendOutputs appends to the output logs; s.d.mu must be held.
func (d *data) appendOutputs(outputs []persistence.Output) {
	ms := time.Now().UnixMilli()
	for _, o := range outputs {
		l := d.out[o.Pipeline]
		if l == nil {
			l = &outputLog{}
			d.out[o.Pipeline] = l
		}
		l.last++
		l.lastMs = max(l.lastMs, ms)
		l.entries = append(l.entries, output{seq: l.last, ms: l.lastMs, data: append([]byte{}, o.Data...)})
	}
}

// ReadOutputs implements persistence.OutputLog.
func (s *Store) ReadOutputs(ctx context.Context, pipeline string, after string, limit int) ([]persistence.OutputEntry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("memstore: read outputs of %q: limit %d is not positive", pipeline, limit)
	}
	var seq uint64
	if after != "" {
		var err error
		if seq, err = strconv.ParseUint(after, 10, 64); err != nil {
			return nil, fmt.Errorf("memstore: read outputs of %q after %q: %w", pipeline, after, persistence.ErrBadCursor)
		}
	}
	if err := s.lock(ctx); err != nil {
		return nil, fmt.Errorf("memstore: read outputs of %q: %w", pipeline, err)
	}
	defer s.d.mu.Unlock()
	l := s.d.out[pipeline]
	if last := uint64(0); (l != nil && seq > l.last) || (l == nil && seq > last) {
		return nil, fmt.Errorf("memstore: read outputs of %q after %q: past the last entry: %w", pipeline, after, persistence.ErrBadCursor)
	}
	if l == nil {
		return nil, nil
	}
	i, _ := slices.BinarySearchFunc(l.entries, seq+1, func(o output, seq uint64) int { return cmp.Compare(o.seq, seq) })
	if seq == ^uint64(0) {
		i = len(l.entries) // nothing comes after the largest cursor
	}
	out := make([]persistence.OutputEntry, 0, min(limit, len(l.entries)-i))
	for _, o := range l.entries[i:min(len(l.entries), i+limit)] {
		out = append(out, persistence.OutputEntry{
			Cursor: strconv.FormatUint(o.seq, 10),
			Time:   time.UnixMilli(o.ms),
			Data:   append([]byte{}, o.data...),
		})
	}
	return out, nil
}

// TrimOutputs implements persistence.OutputLog.
func (s *Store) TrimOutputs(ctx context.Context, pipeline string, before time.Time) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, fmt.Errorf("memstore: trim outputs of %q: %w", pipeline, err)
	}
	defer s.d.mu.Unlock()
	l := s.d.out[pipeline]
	if l == nil {
		return 0, nil
	}
	ms := before.UnixMilli()
	n, _ := slices.BinarySearchFunc(l.entries, ms, func(o output, ms int64) int { return cmp.Compare(o.ms, ms) })
	l.entries = slices.Delete(l.entries, 0, n)
	return n, nil
}

// Get implements persistence.Snapshots.
func (s *Store) Get(ctx context.Context, id uint32, key string) ([]byte, error) {
	if err := s.lock(ctx); err != nil {
		return nil, fmt.Errorf("memstore: get group %d key %q: %w", id, key, err)
	}
	defer s.d.mu.Unlock()
	d, ok := s.d.group(id).snaps[key]
	if !ok {
		return nil, fmt.Errorf("memstore: get group %d key %q: %w", id, key, persistence.ErrNotFound)
	}
	return append([]byte{}, d...), nil
}

// GetMany implements persistence.Snapshots.
func (s *Store) GetMany(ctx context.Context, id uint32, keys []string) ([][]byte, error) {
	if err := s.lock(ctx); err != nil {
		return nil, fmt.Errorf("memstore: get group %d: %w", id, err)
	}
	defer s.d.mu.Unlock()
	return s.getLocked(id, keys), nil
}

// getLocked returns copies of the group's snapshots of keys (nil for a
// missing one); s.d.mu must be held.
func (s *Store) getLocked(id uint32, keys []string) [][]byte {
	g := s.d.group(id)
	out := make([][]byte, len(keys))
	for i, k := range keys {
		if d, ok := g.snaps[k]; ok {
			out[i] = append([]byte{}, d...)
		}
	}
	return out
}

// GetGroups implements persistence.Snapshots.
func (s *Store) GetGroups(ctx context.Context, reads []persistence.GroupKeys) ([][][]byte, error) {
	if err := s.lock(ctx); err != nil {
		return nil, fmt.Errorf("memstore: get groups: %w", err)
	}
	defer s.d.mu.Unlock()
	out := make([][][]byte, len(reads))
	for i, r := range reads {
		out[i] = s.getLocked(r.Group, r.Keys)
	}
	return out, nil
}

// RecordedGroups returns the number of key groups the store records (0:
// none yet) (persistence.GroupsRecorder).
func (s *Store) RecordedGroups(ctx context.Context) (uint32, error) {
	if err := s.lock(ctx); err != nil {
		return 0, fmt.Errorf("memstore: recorded groups: %w", err)
	}
	defer s.d.mu.Unlock()
	return s.d.groups, nil
}

// CheckGroups implements persistence.Store.
func (s *Store) CheckGroups(ctx context.Context, groups, layout uint32) (uint32, error) {
	if groups == 0 {
		return 0, errors.New("memstore: check groups: the number of key groups must be positive")
	}
	if err := s.lock(ctx); err != nil {
		return 0, fmt.Errorf("memstore: check groups: %w", err)
	}
	defer s.d.mu.Unlock()
	switch s.d.groups {
	case 0:
		s.d.groups, s.d.layout = groups, layout
	case groups:
	default:
		return 0, fmt.Errorf("memstore: check groups: %d, the store has %d: %w", groups, s.d.groups, persistence.ErrGroupsMismatch)
	}
	return s.d.layout, nil
}
