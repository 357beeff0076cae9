package embedded

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/keyfold/keyfold/persistence"
)

// Store is the on-disk store. It is safe for concurrent use.
type Store struct {
	dir     string
	opts    Options
	lock    *pebble.Lock
	log     *slog.Logger
	segSize int64 // see journal
	reserve int64 // see Options.DiskReserve; negative: no check

	// life guards db, closed, broken, parked and active: calls in progress
	// hold an active count so that Close and a reopen wait for them (Pebble
	// must not be closed under them). db changes only when no call is
	// active, so a call reads it without the lock after begin.
	life sync.Mutex
	idle sync.Cond // signalled when active drops to 0 after Close began or the store broke
	db   *pebble.DB
	// journal is the groups' log (journal.go), ids the id index (ids.go);
	// they change with db. legacyIDs reports that db held ids of the index
	// an older format kept there when it opened (LookupIDs reads them too).
	journal   *journal
	ids       *idIndex
	legacyIDs bool
	closed    bool
	broken    error         // why calls fail until the reopen (ErrFailed …), or nil
	parked    bool          // a Pebble goroutine is parked (see pebbleLogger.Fatalf): db cannot be closed
	wedged    chan struct{} // closed when parked is set: calls stop waiting for Pebble (wedge.go)
	active    int
	done      chan struct{} // closed when Close is over
	stop      chan struct{} // closed when Close begins: ends a reopen
	jobs      sync.WaitGroup

	openFailed chan error // during openDB: a reason to give up on Pebble's Open

	disk   diskState
	bgLogs logLimit

	stall stallState

	groupsMu sync.Mutex
	groups   map[uint32]*group

	metaMu sync.Mutex // serialises CheckGroups

	pipelinesMu sync.Mutex
	pipelines   map[string]*pipeline // output logs, by pipeline name

	// compactions paces the compactions of the Pebble open now
	// (compactions.go; tests read it).
	compactions atomic.Pointer[compactionScheduler]

	// testHookCommit, if set, runs before a checkpoint's batch is committed;
	// testHookIndex after a checkpoint with ids committed it, before its ids
	// are written into the id index.
	testHookCommit, testHookIndex func(group uint32)
}

var (
	_ persistence.Store           = (*Store)(nil)
	_ persistence.PackedSnapshots = (*Store)(nil)
	_ persistence.GroupsRecorder  = (*Store)(nil)
)

// group is a key group's state, loaded on its first use.
//
// fence orders writes against claims: Claim holds it exclusively until the
// new epoch is durable; Append and Checkpoint hold it shared from their
// epoch check until their write is durable, so no write checked against an
// old epoch lands after a claim. mu guards the fields; Append holds it until
// its batch is durable (positions are assigned in commit order), while
// Checkpoint takes it only around its checks, so a checkpoint's sync never
// holds up the appends of the same group.
type group struct {
	fence sync.RWMutex
	trim  sync.Mutex // serialises Checkpoints, so the stored checkpoint only grows
	// ids is held by a Checkpoint with ids from its commit until the id
	// index holds them, and shared by LookupIDs (see idIndex).
	ids        sync.RWMutex
	mu         sync.Mutex
	loaded     bool
	epoch      persistence.Epoch
	checkpoint persistence.Position
	last       persistence.Position
	drops      idDrops // its drops of ids (see idIndex)
}

// Open opens the store in dir, creating it if needed. Pebble locks the
// directory: a second Open of it, in this process or another, fails until
// the first store is closed.
//
// Open fails, naming the directory, on a filesystem with less free space
// than the reserve (the error wraps syscall.ENOSPC), and when Pebble's
// recovery of its log (a flush) runs out of space.
func Open(dir string, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("embedded: open %s: %w", dir, err)
	}
	sizeMemTable := opts.MemTableSize == 0
	opts = opts.withDefaults()
	// Pebble detects a second lock in this process by path: make it absolute.
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("embedded: open %s: %w", dir, err)
	}
	if err := opts.fs.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("embedded: open %s: %w", dir, describeDirError(err))
	}
	lock, err := pebble.LockDirectory(abs, opts.fs)
	if err != nil {
		return nil, fmt.Errorf("embedded: open %s: %w", dir, describeLockError(err))
	}
	s := &Store{
		dir:       abs,
		opts:      opts,
		lock:      lock,
		log:       opts.Logger,
		reserve:   -1,
		segSize:   opts.segmentSize,
		done:      make(chan struct{}),
		stop:      make(chan struct{}),
		wedged:    make(chan struct{}),
		groups:    map[uint32]*group{},
		pipelines: map[string]*pipeline{},
	}
	s.idle.L = &s.life
	s.disk.unmapped.log = opts.Logger
	if du, err := opts.fs.GetDiskUsage(abs); err == nil {
		if sizeMemTable {
			s.opts.MemTableSize = memTableSize(du.TotalBytes)
		}
		if opts.DiskReserve >= 0 {
			s.reserve = s.opts.reserve(du.TotalBytes)
		}
	}
	if err := s.checkSpace(0); err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("embedded: open %s: %w", dir, err)
	}
	db, err := s.openDB()
	if err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("embedded: open %s: %w", dir, err)
	}
	s.db = db
	if err := s.checkFormat(); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("embedded: open %s: %w", dir, err)
	}
	if s.journal, err = s.openJournal(s.db, syncedTail{}); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("embedded: open %s: %w", dir, err)
	}
	if s.ids, s.legacyIDs, err = s.openIndex(s.db); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("embedded: open %s: %w", dir, err)
	}
	s.disk.opened.Store(true)
	s.log.Debug("store opened", "dir", abs)
	return s, nil
}

// PackedSnapshots reports that the store allows packed snapshots
// (persistence.PackedSnapshots): its format version (3) keeps keyfolds that
// do not know them from opening it.
func (s *Store) PackedSnapshots() bool { return true }

// Dir returns the store's directory, made absolute.
func (s *Store) Dir() string { return s.dir }

// checkFormat records the key layout's version in a new store, moves the
// log of a version 1 store out of Pebble (see migrateLog), records the
// current version in a version 2 to 6 store (nothing else changes: from
// then on it may hold packed snapshots, fingerprints of ids, ids in their
// packed form and the id index in its own Pebble, which keyfolds that
// know only an older version cannot read), and refuses a store of another
// version.
func (s *Store) checkFormat() error {
	var v uint64
	err := s.inPebble(func() (err error) {
		v, err = getDecoded(s, metaFormatKey, decodeUint64)
		return err
	})
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return s.write(func() error { return s.db.Set(metaFormatKey, encodeUint64(formatVersion), pebble.Sync) })
	case err != nil:
		return fmt.Errorf("format version: %w", err)
	case v == 1:
		return s.migrateLog()
	case v >= 2 && v < formatVersion:
		if err := s.write(func() error { return s.db.Set(metaFormatKey, encodeUint64(formatVersion), pebble.Sync) }); err != nil {
			return fmt.Errorf("format version: %w", err)
		}
		s.log.Info(fmt.Sprintf("store format %d to %d: snapshots may be stored packed, keep fingerprints of the ids in the store's id index, keep ids in their packed form, and the id index is kept in the ids directory from now on (the ids an older format indexed are read where they are until dropped); keyfolds before it cannot open this store", v, formatVersion), "dir", s.dir)
	case v != formatVersion:
		return fmt.Errorf("unknown format version %d (this build knows %d): %w", v, formatVersion, persistence.ErrIncompatible)
	}
	return nil
}

// openJournal opens the log (journal.go), with the groups' checkpoints as
// db has them.
func (s *Store) openJournal(db *pebble.DB, tail syncedTail) (*journal, error) {
	checkpoint := func(id uint32) (persistence.Position, error) {
		b, closer, err := db.Get(checkpointKey(id))
		if errors.Is(err, pebble.ErrNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("checkpoint of group %d: %w", id, err)
		}
		defer closer.Close()
		return decodeUint64(b)
	}
	var j *journal
	err := s.inPebble(func() (err error) {
		j, err = openJournal(s.opts.fs, s.dir, s.segSize, tail, checkpoint)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("log: %w", err)
	}
	return j, nil
}

// migrateLog moves the log records of a version 1 store (in Pebble, under
// kindLog keys) to a new log, then deletes them from Pebble and records
// version 2 in one synced batch. Segments a migration cut short left are
// deleted first, so a migration interrupted anywhere starts over.
func (s *Store) migrateLog() error {
	j := &journal{fs: s.opts.fs, dir: s.opts.fs.PathJoin(s.dir, segmentDir)}
	if err := j.fs.MkdirAll(j.dir, 0o755); err != nil {
		return fmt.Errorf("migrate the log: %w", err)
	}
	seqs, err := j.list()
	if err != nil {
		return fmt.Errorf("migrate the log: %w", err)
	}
	for _, seq := range seqs {
		if err := j.fs.Remove(j.fs.PathJoin(j.dir, segmentName(seq))); err != nil {
			return fmt.Errorf("migrate the log: %w", err)
		}
	}
	if j, err = s.openJournal(s.db, syncedTail{}); err != nil {
		return fmt.Errorf("migrate the log: %w", err)
	}
	defer j.close()
	records := 0
	err = s.inPebble(func() error {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindLog}, UpperBound: []byte{kindLog + 1}})
		if err != nil {
			return err
		}
		defer it.Close()
		var fb frameBuilder
		flush := func() error {
			if err := fb.finish(); err != nil || len(fb.blocks) == 0 {
				return err
			}
			defer fb.reset()
			return j.write(fb.buf, fb.blocks)
		}
		for valid := it.First(); valid; valid = it.Next() {
			k := it.Key()
			p, err := logPos(k)
			if err != nil {
				return err
			}
			v, err := it.ValueAndErr()
			if err != nil {
				return err
			}
			if err := fb.add(binary.BigEndian.Uint32(k[1:]), p, v); err != nil {
				return err
			}
			if records++; len(fb.buf) > 4<<20 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := it.Error(); err != nil {
			return err
		}
		return flush()
	})
	if err != nil {
		return fmt.Errorf("migrate the log: %w", err)
	}
	err = s.write(func() error {
		b := s.db.NewBatch()
		defer b.Close()
		_ = b.DeleteRange([]byte{kindLog}, []byte{kindLog + 1}, nil)
		_ = b.Set(metaFormatKey, encodeUint64(formatVersion), nil)
		return b.Commit(pebble.Sync)
	})
	if err != nil {
		return fmt.Errorf("migrate the log: %w", err)
	}
	s.log.Info("log moved out of Pebble (store format 1 to 3)", "dir", s.dir, "records", records)
	return nil
}

// logFailed breaks the store after a failed write or sync of the log (the
// record may or may not be in it), and returns the store's error: it
// reopens, or, if the data directory was removed, it is stuck (the next
// segment could not be created).
func (s *Store) logFailed(err error) error {
	if _, serr := s.opts.fs.Stat(s.dir); errors.Is(serr, fs.ErrNotExist) {
		s.stuck(err)
		return s.wedgedErr()
	}
	return s.fail(err)
}

// Close waits for the calls in progress and closes the store. Later calls
// fail with persistence.ErrClosed. Close is safe to call more than once.
func (s *Store) Close() error {
	s.life.Lock()
	if s.closed {
		s.life.Unlock()
		<-s.done
		return nil
	}
	s.closed = true
	close(s.stop)
	for s.active > 0 {
		s.idle.Wait()
	}
	s.life.Unlock()
	defer close(s.done)
	s.jobs.Wait() // a reopen

	// No call is active and none can begin: db is settled.
	s.life.Lock()
	parked, broken := s.parked, s.broken
	s.life.Unlock()
	var err error
	switch {
	case parked:
		// Closing would wait for the parked goroutine: leave the database
		// to the end of the process.
		err = broken
	case s.db != nil:
		// Pebble may get stuck while it closes (a compaction it waits for
		// parks): then inPebble gives up on it.
		if s.ids != nil {
			err = s.inPebble(s.ids.db.Close)
		}
		if derr := s.inPebble(s.db.Close); err == nil {
			err = derr
		}
		if s.journal != nil {
			s.journal.close()
		}
		if err != nil && broken != nil {
			err = nil // the failure the calls were told about
		}
	}
	if lerr := s.lock.Close(); err == nil {
		err = lerr
	}
	if err != nil {
		return fmt.Errorf("embedded: close: %w", err)
	}
	return nil
}

// begin starts a call: it fails if ctx is done or the store is closed, and
// otherwise the caller must call end.
func (s *Store) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed {
		return persistence.ErrClosed
	}
	if s.broken != nil {
		return s.broken
	}
	s.active++
	return nil
}

func (s *Store) end() {
	s.life.Lock()
	defer s.life.Unlock()
	if s.active--; s.active == 0 && (s.closed || s.broken != nil) {
		s.idle.Broadcast()
	}
}

// group returns a group's state holder.
func (s *Store) group(id uint32) *group {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	g := s.groups[id]
	if g == nil {
		g = &group{}
		s.groups[id] = g
	}
	return g
}

// lockGroup locks a group's fields (g.mu), loading them on first use. The
// caller holds g.fence.
func (s *Store) lockGroup(id uint32) (*group, error) {
	g := s.group(id)
	g.mu.Lock()
	if !g.loaded {
		if err := s.inPebble(func() error { return s.load(id, g) }); err != nil {
			g.mu.Unlock()
			return nil, err
		}
		g.loaded = true
	}
	return g, nil
}

// load reads a group's epoch, checkpoint and last position. It calls
// Pebble directly: the caller runs it in inPebble, holding g.mu until it
// returns or the store is stuck (then g is never read again).
func (s *Store) load(id uint32, g *group) error {
	var err error
	if g.epoch, err = getDecoded(s, epochKey(id), decodeUint64); err != nil && !errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("load epoch: %w", err)
	}
	if g.checkpoint, err = getDecoded(s, checkpointKey(id), decodeUint64); err != nil && !errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("load checkpoint: %w", err)
	}
	g.last = max(g.checkpoint, s.journal.last(id))
	if g.drops, err = getDecoded(s, idDropsKey(id), decodeIDDrops); err != nil && !errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("load drops of ids: %w", err)
	}
	return nil
}

// getDecoded reads key's value and decodes it; a missing key is
// pebble.ErrNotFound. The caller runs it in inPebble.
func getDecoded[T any](s *Store, key []byte, decode func([]byte) (T, error)) (T, error) {
	b, closer, err := s.db.Get(key)
	if err != nil {
		var zero T
		return zero, err
	}
	defer closer.Close()
	return decode(b)
}

// owns reports whether epoch is the group's current one. Nobody owns a
// group that was never claimed.
func (g *group) owns(epoch persistence.Epoch) bool {
	return g.epoch != 0 && epoch == g.epoch
}

// Claim bumps the group's epoch, durably, and returns its state.
func (s *Store) Claim(ctx context.Context, id uint32) (persistence.GroupState, error) {
	if err := s.begin(ctx); err != nil {
		return persistence.GroupState{}, fmt.Errorf("embedded: claim group %d: %w", id, err)
	}
	defer s.end()
	fence := &s.group(id).fence
	fence.Lock()
	defer fence.Unlock()
	g, err := s.lockGroup(id)
	if err != nil {
		return persistence.GroupState{}, fmt.Errorf("embedded: claim group %d: %w", id, err)
	}
	defer g.mu.Unlock()
	if err := s.checkFloor(); err != nil {
		return persistence.GroupState{}, fmt.Errorf("embedded: claim group %d: %w", id, err)
	}
	epoch := g.epoch + 1
	if err := s.write(func() error { return s.db.Set(epochKey(id), encodeUint64(epoch), pebble.Sync) }); err != nil {
		return persistence.GroupState{}, fmt.Errorf("embedded: claim group %d: %w", id, err)
	}
	g.epoch = epoch
	return persistence.GroupState{Epoch: epoch, Checkpoint: g.checkpoint, Last: g.last}, nil
}

// Append appends the entries of all groups to the log (journal.go) with one
// write and one sync: a block per group, its records in slice order. It
// holds the locks of the groups involved, in ascending order, until the
// write is durable; calls for disjoint groups run in parallel and share
// syncs.
func (s *Store) Append(ctx context.Context, entries []persistence.Entry) ([]persistence.Position, error) {
	pos := make([]persistence.Position, len(entries))
	if err := s.begin(ctx); err != nil {
		return pos, fmt.Errorf("embedded: append: %w", err)
	}
	defer s.end()
	if len(entries) == 0 {
		return pos, nil
	}
	size := 0
	for _, e := range entries {
		size += len(e.Data)
	}
	if err := s.checkSpace(size); err != nil {
		return pos, fmt.Errorf("embedded: append: %w", err)
	}

	ids := make([]uint32, len(entries))
	for i, e := range entries {
		ids[i] = e.Group
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	groups := make([]*group, 0, len(ids))
	defer func() {
		for _, g := range groups {
			g.mu.Unlock()
			g.fence.RUnlock()
		}
	}()
	for _, id := range ids {
		s.group(id).fence.RLock()
		g, err := s.lockGroup(id)
		if err != nil {
			s.group(id).fence.RUnlock()
			return pos, fmt.Errorf("embedded: append group %d: %w", id, err)
		}
		groups = append(groups, g)
	}

	// One block per group, the group's records in slice order.
	ks := make([]int, len(entries))
	counts := make([]int, len(ids)+1)
	fenced := make([]bool, len(ids))
	for i, e := range entries {
		k, _ := slices.BinarySearch(ids, e.Group)
		ks[i] = k
		if !groups[k].owns(e.Epoch) {
			fenced[k] = true
			continue
		}
		counts[k+1]++
	}
	for k := range ids {
		counts[k+1] += counts[k]
	}
	order := make([]int, counts[len(ids)])
	for i, k := range ks {
		if groups[k].owns(entries[i].Epoch) { // fencing is per entry
			order[counts[k]] = i
			counts[k]++
		}
	}
	bp := appendBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= maxPooledAppend {
			appendBufs.Put(bp)
		}
	}()
	fb := frameBuilder{buf: slices.Grow((*bp)[:0], frameHeaderLen+size+len(entries)*binary.MaxVarintLen32+len(ids)*blockHeaderLen)}
	defer func() { *bp = fb.buf[:0] }()
	last := make([]persistence.Position, len(ids))
	for k, g := range groups {
		last[k] = g.last
	}
	for _, i := range order {
		k := ks[i]
		last[k]++
		pos[i] = last[k]
		if err := fb.add(ids[k], last[k], entries[i].Data); err != nil {
			clear(pos)
			return pos, fmt.Errorf("embedded: append: %w", err)
		}
	}
	if err := fb.finish(); err != nil {
		clear(pos)
		return pos, fmt.Errorf("embedded: append: %w", err)
	}
	if len(fb.blocks) > 0 {
		if err := s.journal.write(fb.buf, fb.blocks); err != nil {
			clear(pos)
			return pos, fmt.Errorf("embedded: append: %w", s.logFailed(err))
		}
		for k, g := range groups {
			g.last = last[k]
		}
	}

	var errs []error
	for k, f := range fenced {
		if f {
			errs = append(errs, fmt.Errorf("embedded: append group %d: %w", ids[k], persistence.ErrFenced))
		}
	}
	return pos, errors.Join(errs...)
}

// appendBufs holds Append's buffers (the blocks it writes), up to
// maxPooledAppend bytes each.
var appendBufs = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledAppend = 4 << 20

// Read calls fn with the group's records after a position. It reads a
// consistent view of the log as of the call. fn may call the store, but not
// Close.
func (s *Store) Read(ctx context.Context, id uint32, after persistence.Position, fn func(persistence.Position, []byte) error) error {
	if err := s.begin(ctx); err != nil {
		return fmt.Errorf("embedded: read group %d: %w", id, err)
	}
	defer s.end()
	if after == math.MaxUint64 {
		return nil
	}
	n := 0
	check := func() error {
		if n++; n%256 == 0 {
			return ctx.Err()
		}
		return nil
	}
	fnErr, err := s.journal.read(id, after, check, fn)
	if fnErr != nil {
		return fnErr // fn's own error, as it is
	}
	if err != nil {
		return fmt.Errorf("embedded: read group %d: %w", id, err)
	}
	return nil
}

// Checkpoint writes the snapshots, the timer index entries and the outputs
// and, when d.Through is above the stored checkpoint, records it, all in one
// synced batch; then the log forgets the records through it and deletes the
// segments that hold no others (journal.trim).
// Checkpointing beyond the last position is an error: later records would
// get positions at or below it.
//
// The outputs take their pipelines' next sequence numbers before the
// commit; readers see them once the commit and every earlier one of the
// pipeline is over (see pipeline). Checkpoints of different groups do not
// wait for each other's commits.
func (s *Store) Checkpoint(ctx context.Context, id uint32, epoch persistence.Epoch, d persistence.CheckpointData) error {
	if err := s.begin(ctx); err != nil {
		return fmt.Errorf("embedded: checkpoint group %d: %w", id, err)
	}
	defer s.end()
	if err := s.checkpoint(id, epoch, d); err != nil {
		return err
	}
	if d.DropIDsBefore > 0 {
		s.sweepIDs() // with the group's locks released
	}
	return nil
}

// checkpoint is Checkpoint's work, in a call begun.
func (s *Store) checkpoint(id uint32, epoch persistence.Epoch, d persistence.CheckpointData) error {
	gr := s.group(id)
	gr.trim.Lock()
	defer gr.trim.Unlock()
	gr.fence.RLock()
	defer gr.fence.RUnlock()
	g, err := s.lockGroup(id)
	if err != nil {
		return fmt.Errorf("embedded: checkpoint group %d: %w", id, err)
	}
	owns, checkpoint, last, drops := g.owns(epoch), g.checkpoint, g.last, g.drops
	g.mu.Unlock()
	if !owns {
		return fmt.Errorf("embedded: checkpoint group %d: %w", id, persistence.ErrFenced)
	}
	if d.Through > last {
		return fmt.Errorf("embedded: checkpoint group %d through %d: beyond the last position %d", id, d.Through, last)
	}
	if err := d.CheckIDs(); err != nil {
		return fmt.Errorf("embedded: checkpoint group %d: %w", id, err)
	}
	advance := d.Through > checkpoint
	if len(d.Snapshots) == 0 && len(d.Timers) == 0 && len(d.Outputs) == 0 && len(d.IDs) == 0 && d.DropIDsBefore <= 0 && !advance {
		return nil
	}
	if err := s.checkFloor(); err != nil {
		return fmt.Errorf("embedded: checkpoint group %d: %w", id, err)
	}
	b := s.db.NewBatch()
	defer closeBatch(&b)
	// The ids go to the id index after this batch is committed; the batch
	// holds them as pending until then, and the index's records (see
	// idIndex).
	var plan idPlan
	withIDs := len(d.IDs) > 0 || d.DropIDsBefore > 0
	if withIDs {
		s.ids.gate.RLock()
		defer s.ids.gate.RUnlock()
		plan = s.ids.plan(id, drops, d.DropIDsBefore, d.IDs)
		if err := plan.addToBatch(b, id, d.DropIDsBefore > 0); err != nil {
			return fmt.Errorf("embedded: checkpoint group %d: ids: %w", id, err)
		}
	}
	if len(d.IDs) > 0 {
		// Written in the batch's own bytes: built apart and copied, the
		// pending ids of a checkpoint at a million keys were 8% of the
		// bytes the node allocated (BENCHMARKS.md, session 58).
		key := pendingIDsKey(id)
		op := b.SetDeferred(len(key), pendingIDsSize(plan.drops.gen, d.IDs))
		copy(op.Key, key)
		if v := appendPendingIDs(op.Value[:0:len(op.Value)], plan.drops.gen, d.IDs); len(v) != len(op.Value) || &v[0] != &op.Value[0] {
			// (The batch is dropped: nothing of the checkpoint is written.)
			return fmt.Errorf("embedded: checkpoint group %d: ids: %d bytes of pending ids, sized %d", id, len(v), len(op.Value))
		}
		if err := op.Finish(); err != nil {
			return fmt.Errorf("embedded: checkpoint group %d: ids: %w", id, err)
		}
	}
	if d.DropIDsBefore > 0 && s.legacyIDs {
		if err := b.DeleteRange(idBucketKey(id, 0), idBucketKey(id, d.DropIDsBefore), nil); err != nil {
			return fmt.Errorf("embedded: checkpoint group %d: drop ids: %w", id, err)
		}
	}
	// One buffer for the keys of snapshots, which Set copies into the
	// batch: a key allocated for each was 3% of the bytes the node
	// allocated at a million keys (BENCHMARKS.md, session 49).
	var kb []byte
	for _, sn := range d.Snapshots {
		kb = appendSnapshotKey(kb[:0], id, sn.Key)
		if sn.Data == nil {
			err = b.Delete(kb, nil)
		} else {
			err = b.Set(kb, sn.Data, nil)
		}
		if err != nil {
			return fmt.Errorf("embedded: checkpoint group %d key %q: %w", id, sn.Key, err)
		}
	}
	for _, t := range d.Timers {
		if t.Due == 0 {
			err = b.Delete(timerKey(id, t.Key), nil)
		} else {
			err = b.Set(timerKey(id, t.Key), encodeUint64(uint64(t.Due)), nil)
		}
		if err != nil {
			return fmt.Errorf("embedded: checkpoint group %d timer of key %q: %w", id, t.Key, err)
		}
	}
	if advance {
		if err := b.Set(checkpointKey(id), encodeUint64(d.Through), nil); err != nil {
			return fmt.Errorf("embedded: checkpoint group %d: %w", id, err)
		}
	}
	// Last: the outputs' sequence numbers stay in flight until the commit
	// is over, holding back the readers of their pipelines.
	ranges, err := s.addOutputs(b, d.Outputs)
	defer endOutputs(ranges)
	if err != nil {
		return fmt.Errorf("embedded: checkpoint group %d outputs: %w", id, err)
	}
	if s.testHookCommit != nil {
		s.testHookCommit(id)
	}
	if withIDs {
		gr.ids.Lock()
		defer gr.ids.Unlock()
	}
	if err := s.commit(&b); err != nil {
		return fmt.Errorf("embedded: checkpoint group %d: %w", id, err)
	}
	if withIDs {
		g.mu.Lock()
		g.drops = plan.drops
		g.mu.Unlock()
		s.ids.committed(id, &plan)
	}
	if len(d.IDs) > 0 {
		if s.testHookIndex != nil {
			s.testHookIndex(id)
		}
		if err := s.indexIDs(id, plan.drops.gen, d.IDs); err != nil {
			return fmt.Errorf("embedded: checkpoint group %d: %w", id, err)
		}
	}
	if advance {
		g.mu.Lock()
		g.checkpoint = max(g.checkpoint, d.Through)
		g.mu.Unlock()
		s.journal.trim(id, d.Through)
	}
	return nil
}

// LookupIDs returns the times the ids were stored with in the group's id
// index (0: not held), from one consistent view of it (and one of the index
// an older format kept in the store's Pebble, while that holds ids).
func (s *Store) LookupIDs(ctx context.Context, id uint32, lookups []persistence.IDLookup) ([]int64, error) {
	if err := persistence.CheckIDLookups(lookups); err != nil {
		return nil, fmt.Errorf("embedded: look up ids of group %d: %w", id, err)
	}
	if err := s.begin(ctx); err != nil {
		return nil, fmt.Errorf("embedded: look up ids of group %d: %w", id, err)
	}
	defer s.end()
	at := make([]int64, len(lookups))
	if len(lookups) == 0 {
		return at, nil
	}
	gr := s.group(id)
	gr.ids.RLock()
	defer gr.ids.RUnlock()
	g, err := s.lockGroup(id)
	if err != nil {
		return nil, fmt.Errorf("embedded: look up ids of group %d: %w", id, err)
	}
	drops := g.drops
	g.mu.Unlock()
	err = s.inPebble(func() error {
		return s.ids.lookUp(id, drops, lookups, at, ctx.Err)
	})
	if err != nil {
		return nil, fmt.Errorf("embedded: look up ids of group %d: %w", id, err)
	}
	if !s.legacyIDs {
		return at, nil
	}
	// One iterator, so that the look-ups see one view, with the bottom
	// level's Bloom filters too (DB.Get skips them): most ids looked up
	// are absent, and without them each would read an index and a data
	// block there.
	lower, upper := groupBounds(kindID, id)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper, UseL6Filters: true})
	if err != nil {
		return nil, fmt.Errorf("embedded: look up ids of group %d: %w", id, err)
	}
	for i, l := range lookups {
		if i%256 == 255 {
			if err := ctx.Err(); err != nil {
				_ = s.closeIter(it)
				return nil, fmt.Errorf("embedded: look up ids of group %d: %w", id, err)
			}
		}
		if at[i] != 0 {
			continue // the index holds the later one
		}
		v, ok, err := seekValue(it, idKey(id, l.Bucket, l.Key, l.ID))
		var u uint64
		if ok {
			u, err = decodeUint64(v)
		}
		if err != nil {
			_ = s.closeIter(it)
			return nil, fmt.Errorf("embedded: look up id %q of key %q in group %d: %w", l.ID, l.Key, id, err)
		}
		at[i] = int64(u)
	}
	if err := s.closeIter(it); err != nil {
		return nil, fmt.Errorf("embedded: look up ids of group %d: %w", id, err)
	}
	return at, nil
}

// Timers calls fn with the group's timer index entries in key order (byte
// order), from a consistent view of the index as of the call. fn may call
// the store, but not Close.
func (s *Store) Timers(ctx context.Context, id uint32, fn func(key string, due int64) error) error {
	if err := s.begin(ctx); err != nil {
		return fmt.Errorf("embedded: timers of group %d: %w", id, err)
	}
	defer s.end()
	lower, upper := timerBounds(id)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("embedded: timers of group %d: %w", id, err)
	}
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		if n++; n%256 == 0 {
			if err := ctx.Err(); err != nil {
				_ = s.closeIter(it)
				return fmt.Errorf("embedded: timers of group %d: %w", id, err)
			}
		}
		v, err := it.ValueAndErr()
		var due uint64
		if err == nil {
			due, err = decodeUint64(v)
		}
		if err != nil {
			_ = s.closeIter(it)
			return fmt.Errorf("embedded: timers of group %d: %w", id, err)
		}
		if err := fn(string(it.Key()[len(lower):]), int64(due)); err != nil {
			_ = s.closeIter(it)
			return err // fn's own error, as it is
		}
	}
	if err := errors.Join(it.Error(), s.closeIter(it)); err != nil {
		return fmt.Errorf("embedded: timers of group %d: %w", id, err)
	}
	return nil
}

// Get returns a copy of a key's snapshot.
func (s *Store) Get(ctx context.Context, id uint32, key string) ([]byte, error) {
	if err := s.begin(ctx); err != nil {
		return nil, fmt.Errorf("embedded: get group %d key %q: %w", id, key, err)
	}
	defer s.end()
	v, err := s.snapshot(id, key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("embedded: get group %d key %q: %w", id, key, persistence.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("embedded: get group %d key %q: %w", id, key, err)
	}
	return v, nil
}

// snapshot returns a copy of a stored snapshot, or pebble.ErrNotFound. It
// runs on the caller's goroutine, not in inPebble (see wedge.go: point
// reads).
func (s *Store) snapshot(id uint32, key string) ([]byte, error) {
	v, closer, err := s.db.Get(snapshotKey(id, key))
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return append(make([]byte, 0, len(v)), v...), nil
}

// GetGroups returns copies of the snapshots of keys of several groups
// (GetMany for each: a local store has no round trips to save).
func (s *Store) GetGroups(ctx context.Context, reads []persistence.GroupKeys) ([][][]byte, error) {
	out := make([][][]byte, len(reads))
	for i, r := range reads {
		var err error
		if out[i], err = s.GetMany(ctx, r.Group, r.Keys); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// GetMany returns copies of several snapshots; a missing one is nil.
//
// Several keys are read in key order with one iterator, whose tables'
// index and data blocks serve the keys after: a Get per key opened every
// level's table iterators anew and read their index blocks again (a
// restart at a million keys, reading the snapshots of 300k keys, spent a
// third of its time in index block reads; BENCHMARKS.md, session 22).
// SeekPrefixGE consults the tables' bloom filters as Get does, so a key
// without a snapshot still costs little.
func (s *Store) GetMany(ctx context.Context, id uint32, keys []string) ([][]byte, error) {
	if err := s.begin(ctx); err != nil {
		return nil, fmt.Errorf("embedded: get group %d: %w", id, err)
	}
	defer s.end()
	out := make([][]byte, len(keys))
	if len(keys) == 1 {
		v, err := s.snapshot(id, keys[0])
		if err != nil && !errors.Is(err, pebble.ErrNotFound) {
			return nil, fmt.Errorf("embedded: get group %d key %q: %w", id, keys[0], err)
		}
		out[0] = v
		return out, nil
	}
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
	lower, upper := snapshotBounds(id)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, fmt.Errorf("embedded: get group %d: %w", id, err)
	}
	k := slices.Clone(lower)
	for n, i := range order {
		if n%256 == 255 {
			if err := ctx.Err(); err != nil {
				_ = s.closeIter(it)
				return nil, fmt.Errorf("embedded: get group %d: %w", id, err)
			}
		}
		k = append(k[:len(lower)], keys[i]...)
		v, ok, err := seekValue(it, k)
		if err != nil {
			_ = s.closeIter(it)
			return nil, fmt.Errorf("embedded: get group %d key %q: %w", id, keys[i], err)
		}
		if ok {
			out[i] = append(make([]byte, 0, len(v)), v...)
		}
	}
	if err := errors.Join(it.Error(), s.closeIter(it)); err != nil {
		return nil, fmt.Errorf("embedded: get group %d: %w", id, err)
	}
	return out, nil
}

// seekValue returns the value of key k through it, valid until it moves,
// and whether there is one (an empty value is one). The error of a seek that found nothing is
// checked here: each seek clears the last one's, and unchecked the key
// would read as never stored.
func seekValue(it *pebble.Iterator, k []byte) (v []byte, ok bool, err error) {
	if !it.SeekPrefixGE(k) {
		return nil, false, it.Error()
	}
	if !bytes.Equal(it.Key(), k) {
		return nil, false, nil
	}
	v, err = it.ValueAndErr()
	return v, err == nil, err
}

// RecordedGroups returns the number of key groups the store records (0:
// none yet) (persistence.GroupsRecorder).
func (s *Store) RecordedGroups(ctx context.Context) (uint32, error) {
	if err := s.begin(ctx); err != nil {
		return 0, fmt.Errorf("embedded: recorded groups: %w", err)
	}
	defer s.end()
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	var groups uint32
	err := s.inPebble(func() (err error) {
		if groups, err = getDecoded(s, metaGroupsKey, decodeUint32); errors.Is(err, pebble.ErrNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("embedded: recorded groups: %w", err)
	}
	return groups, nil
}

// CheckGroups records the number of key groups and the layout in a new store
// and checks the count in an existing one, returning its layout.
func (s *Store) CheckGroups(ctx context.Context, groups, layout uint32) (uint32, error) {
	if groups == 0 {
		return 0, fmt.Errorf("embedded: check groups: the number of key groups must be positive")
	}
	if err := s.begin(ctx); err != nil {
		return 0, fmt.Errorf("embedded: check groups: %w", err)
	}
	defer s.end()
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	var stored, storedLayout uint32
	err := s.inPebble(func() (err error) {
		if stored, err = getDecoded(s, metaGroupsKey, decodeUint32); err != nil {
			return err
		}
		if storedLayout, err = getDecoded(s, metaLayoutKey, decodeUint32); err != nil && !errors.Is(err, pebble.ErrNotFound) {
			return fmt.Errorf("layout: %w", err)
		}
		return nil // no layout: created before layouts were recorded (0)
	})
	if errors.Is(err, pebble.ErrNotFound) {
		err := s.write(func() error {
			batch := s.db.NewBatch()
			defer batch.Close()
			_ = batch.Set(metaGroupsKey, encodeUint32(groups), nil)
			_ = batch.Set(metaLayoutKey, encodeUint32(layout), nil)
			return batch.Commit(pebble.Sync)
		})
		if err != nil {
			return 0, fmt.Errorf("embedded: check groups: %w", err)
		}
		return layout, nil
	}
	if err != nil {
		return 0, fmt.Errorf("embedded: check groups: %w", err)
	}
	if stored != groups {
		return 0, fmt.Errorf("embedded: check groups: %d, the store has %d: %w", groups, stored, persistence.ErrGroupsMismatch)
	}
	return storedLayout, nil
}
