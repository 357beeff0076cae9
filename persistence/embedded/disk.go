package embedded

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/keyfold/keyfold/persistence"
)

// A full disk, and how the store lives through it.
//
//  1. The reserve (Options.DiskReserve): Append and AppendOutputs look at
//     the free space first (one statfs) and refuse, with
//     persistence.ErrNoSpace and nothing written, a write that would leave
//     less than the reserve. The caller keeps its state; writes succeed
//     again as soon as space is freed. Claims and checkpoints may use the
//     reserve (they are small, and checkpoints trim the log): they are
//     refused the same way only below an eighth of it.
//  2. A write that fails all the same (another process took the space
//     between the check and the write): Pebble cannot continue after a
//     failed WAL write (its log writer keeps the error, and the batch is
//     already in the memtable, readable though not durable). Fatalf panics
//     on the committing goroutine, Store.write recovers it, and the store
//     breaks: every call fails with ErrFailed (wrapping the cause) until a
//     background job has closed Pebble and, once the free space is above
//     the reserve again, reopened it. Reopening replays the WAL, the
//     truth: the failed write may or may not be in it, so callers must
//     treat its outcome as unknown (the host takes its groups over again).
//  3. Open: below the reserve it fails at once; otherwise Pebble replays
//     and flushes its WAL, and a flush that runs out of space would be
//     retried by Pebble forever, so Open gives up on the first one, with an
//     error naming the directory and ENOSPC (the abandoned open finishes,
//     or not, in the background).
//  4. What stays fatal. A Fatalf from one of Pebble's own goroutines (a
//     MANIFEST write of a flush or compaction) cannot be recovered: the
//     goroutine is parked and the store fails until the process restarts.
//     So is a Fatalf on a commit's path before the commit error itself: a
//     memtable rotation that cannot create the next WAL (the data
//     directory was removed) parks the commit with Pebble's commit mutex
//     held. Either may leave Pebble's locks held for good: no call waits
//     for them, every call fails at once, Close too (see wedge.go).
//     Pebble panics outright if it cannot close the WAL, or create the next
//     one for another reason than a missing file, when a full memtable
//     rotates: that ends the process (the panic unwinds through a deferred
//     unlock of the DB mutex, which is not held there). A full disk leads
//     to these only beyond the reserve, which holds two memtables (the
//     default memtable is smaller on small filesystems for that reason),
//     so only another process taking the space leads there.

// diskState is what the last look at the filesystem found.
type diskState struct {
	free        atomic.Int64 // bytes available, as of the last check
	full        atomic.Bool  // the last check refused a write
	lastNoSpace atomic.Int64 // unix nanoseconds of a background job's last ENOSPC
	// walErr is the first failed write or sync of the current Pebble's WAL
	// (walFile): commits after it must not enter Pebble (see Store.write).
	walErr atomic.Pointer[error]
	opened atomic.Bool // Open is over: log the changes of full
	// flushed and compacted are the bytes of the tables Pebble's flushes
	// and compactions wrote since Open (all its openings: counted as they
	// end, FlushEnd and CompactionEnd).
	flushed, compacted atomic.Int64
	// unmapped counts the tables the kernel refused to map (mapped.go).
	unmapped mapRefusals
}

// mapRefusals counts the openings of tables the kernel refused to map (a
// table Pebble closes and opens again counts again), and warns of them at
// most once every mapWarnEvery (mapped.go; nothing is mapped on systems
// other than Unix).
type mapRefusals struct {
	n     atomic.Int64
	limit logLimit
	log   *slog.Logger
}

// flushEnd counts a flush's tables.
func (d *diskState) flushEnd(info pebble.FlushInfo) {
	if info.Err == nil && !info.Ingest {
		d.flushed.Add(int64(tablesSize(info.Output)))
	}
}

// compactionEnd counts a compaction's tables; a move writes none.
func (d *diskState) compactionEnd(info pebble.CompactionInfo) {
	if info.Err == nil && info.Reason != "move" {
		d.compacted.Add(int64(tablesSize(info.Output.Tables)))
	}
}

func tablesSize(ts []pebble.TableInfo) (n uint64) {
	for _, t := range ts {
		n += t.Size
	}
	return n
}

// DiskStats describe the store's filesystem, for health checks and metrics.
type DiskStats struct {
	// Full reports that writes are refused now: the free space is below
	// the reserve, or a write failed for lack of space and the store has
	// not reopened since.
	Full bool
	// Failed is the store's failure (see ErrFailed), or nil.
	Failed error
	// FreeBytes is the space available on the filesystem; ReserveBytes the
	// reserve (negative when the check is off).
	FreeBytes, ReserveBytes int64
	// FlushedBytes and CompactedBytes are the bytes of the tables that
	// Pebble's memtable flushes and its compactions wrote since Open (the
	// log's segments are not among them): per event stored, what a key
	// count costs the disk and the CPU that compacts.
	FlushedBytes, CompactedBytes int64
	// UnmappedTables counts the openings of tables for point reads since
	// Open that the kernel refused to map (mapped.go): read by pread
	// instead, a system call per block. Not 0 points at vm.max_map_count.
	UnmappedTables int64
}

// Disk looks at the store's filesystem and reports its state.
func (s *Store) Disk() DiskStats {
	s.life.Lock()
	broken := s.broken
	s.life.Unlock()
	full := s.checkSpace(0) != nil
	if s.reserve < 0 { // checkSpace did not look
		if du, err := s.opts.fs.GetDiskUsage(s.dir); err == nil {
			s.disk.free.Store(int64(min(du.AvailBytes, 1<<62)))
		}
	}
	return DiskStats{
		Full:           full || isNoSpace(broken),
		Failed:         broken,
		FreeBytes:      s.disk.free.Load(),
		ReserveBytes:   s.reserve,
		FlushedBytes:   s.disk.flushed.Load(),
		CompactedBytes: s.disk.compacted.Load(),
		UnmappedTables: s.disk.unmapped.n.Load(),
	}
}

// checkSpace reports, with an error wrapping persistence.ErrNoSpace and
// syscall.ENOSPC, whether writing size bytes would leave less free space
// than the reserve. It logs when writes stop or resume being refused, once
// the store is open.
func (s *Store) checkSpace(size int) error {
	return s.checkFree(size, s.reserve, true)
}

// checkFloor is checkSpace for the writes that may use the reserve (claims,
// checkpoints): it refuses them only when the disk is all but full, where
// they would fail and break the store.
func (s *Store) checkFloor() error {
	return s.checkFree(0, s.reserve/8, false)
}

func (s *Store) checkFree(size int, need int64, reserve bool) error {
	if s.reserve < 0 {
		return nil
	}
	du, err := s.opts.fs.GetDiskUsage(s.dir)
	if err != nil {
		return nil // cannot tell: let the write find out
	}
	free := int64(min(du.AvailBytes, 1<<62))
	s.disk.free.Store(free)
	if free-int64(size) >= need {
		if reserve && s.disk.full.Swap(false) && s.disk.opened.Load() {
			s.log.Info("disk space available again: writes resume", "dir", s.dir, "free", free, "reserve", s.reserve)
		}
		return nil
	}
	if reserve && !s.disk.full.Swap(true) && s.disk.opened.Load() {
		s.log.Error("disk full: refusing writes until space is freed", "dir", s.dir, "free", free, "reserve", s.reserve)
	}
	what := "the reserve"
	if !reserve {
		what = "the floor for claims and checkpoints"
	}
	return fmt.Errorf("%w: %s has %d bytes free, below %s of %d: %w (ENOSPC)",
		persistence.ErrNoSpace, s.dir, free, what, need, syscall.ENOSPC)
}

// isNoSpace reports whether err is a full disk or an exhausted quota.
func isNoSpace(err error) bool {
	return err != nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT))
}

// write runs a Pebble commit, on a goroutine of its own (see inPebble: a
// commit in a wedged Pebble never returns). A fatal commit error (see
// pebbleLogger.Fatalf) breaks the store and is returned.
//
// Once the WAL failed, Pebble's log writer keeps the error, and a commit
// that enters Pebble after it panics with it while holding Pebble's commit
// mutex, which wedges that Pebble for good. So a commit first checks that
// the WAL has not failed (walFile records it before Pebble sees it), and
// fails the store instead; one that raced the failure anyway parks the
// store (fails until the process restarts) rather than crashing the node.
func (s *Store) write(commit func() error) error {
	if e := s.disk.walErr.Load(); e != nil {
		return s.fail(*e)
	}
	return s.inPebble(func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				switch f := r.(type) {
				case fatalPanic:
					err = s.fail(f.err)
				case error: // from Pebble's WAL write, with its commit mutex held
					s.log.Error("store failed: Pebble's WAL write failed during a commit", "dir", s.dir, "err", f.Error())
					s.stuck(f)
					err = s.wedgedErr()
				default:
					panic(r)
				}
			}
		}()
		return commit()
	})
}

// fail breaks the store after a fatal commit error and starts the reopen.
// The caller is an active call.
func (s *Store) fail(cause error) error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.broken == nil {
		what := "a write failed"
		if isNoSpace(cause) {
			what = "disk full (ENOSPC): a write failed"
		}
		s.broken = fmt.Errorf("%w: %s %s; reopening once there is space: %w", ErrFailed, s.dir, what, cause)
		s.log.Error("store failed: reopening", "dir", s.dir, "err", cause.Error())
		if !s.closed && !s.parked {
			s.jobs.Add(1)
			go s.reopen()
		}
	}
	return s.broken
}

// stuck breaks the store for good: a goroutine in Pebble met a fatal error
// and is parked, maybe holding Pebble's locks. Calls waiting for Pebble
// return the error at once (see inPebble); the first cause is kept.
func (s *Store) stuck(cause error) {
	what := "Pebble cannot continue, restart the process (after freeing space if the disk is full)"
	if _, err := s.opts.fs.Stat(s.dir); errors.Is(err, fs.ErrNotExist) {
		what = "the data directory was removed under the store: Pebble cannot continue, restart the process"
	}
	s.life.Lock()
	defer s.life.Unlock()
	if s.parked {
		return
	}
	s.parked = true
	s.broken = fmt.Errorf("%w: %s: %s: %w", ErrFailed, s.dir, what, cause)
	close(s.wedged)
	if s.openFailed != nil {
		select {
		case s.openFailed <- s.broken:
		default:
		}
	}
}

// backgroundError is Pebble's report of a failed flush or compaction, which
// it retries. The store logs one a second at most, without stack traces.
func (s *Store) backgroundError(err error) {
	if isNoSpace(err) {
		s.disk.lastNoSpace.Store(time.Now().UnixNano())
		s.life.Lock()
		if s.openFailed != nil {
			select {
			case s.openFailed <- err:
			default:
			}
		}
		s.life.Unlock()
	}
	s.limitedError("pebble background error", err)
}

// limitedError logs an error of Pebble's, one a second at most.
func (s *Store) limitedError(msg string, err error) {
	if ok, dropped := s.bgLogs.allow(time.Second); ok {
		s.log.Error(msg, "dir", s.dir, "err", err.Error(), "dropped", dropped)
	}
}

// openDB opens Pebble, giving up when its recovery runs out of space (see
// the top of this file).
func (s *Store) openDB() (*pebble.DB, error) {
	po := s.opts.pebbleOptions(s)
	po.Lock = s.lock
	s.compactions.Store(po.Experimental.CompactionScheduler.(*compactionScheduler))
	return s.openPebble(s.dir, po)
}

// openPebble opens a Pebble in dir (the store's, or its id index's),
// giving up when its recovery runs out of space.
func (s *Store) openPebble(dir string, po *pebble.Options) (*pebble.DB, error) {
	failed := make(chan error, 1)
	s.life.Lock()
	s.openFailed = failed
	s.life.Unlock()
	defer func() {
		s.life.Lock()
		s.openFailed = nil
		s.life.Unlock()
	}()
	type result struct {
		db  *pebble.DB
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				f, ok := p.(fatalPanic)
				if !ok {
					panic(p)
				}
				r.err = f.err
			}
			done <- r
		}()
		r.db, r.err = pebble.Open(dir, po)
	}()
	var err error
	select {
	case r := <-done:
		if r.err != nil {
			// Pebble registered its compaction scheduler, perhaps, and
			// does not unregister it when the open fails after that. (On
			// a goroutine of its own: its loop may be waiting for the
			// mutex of a Pebble that a failed write parked; see stuck.)
			go po.Experimental.CompactionScheduler.Unregister()
		}
		return r.db, r.err
	case err = <-failed:
	case <-s.stop:
		err = persistence.ErrClosed
	}
	go func() { // the abandoned open: close what it opens
		if r := <-done; r.db != nil {
			_ = r.db.Close()
		} else {
			po.Experimental.CompactionScheduler.Unregister() // (as above)
		}
	}()
	if isNoSpace(err) {
		return nil, fmt.Errorf("%w: recovering the log needs more space than is free: %w (ENOSPC)", persistence.ErrNoSpace, err)
	}
	return nil, err
}

// reopen closes the broken Pebble and opens it again, once there is space
// and until Close.
func (s *Store) reopen() {
	defer s.jobs.Done()
	s.life.Lock()
	for s.active > 0 && !s.closed {
		s.idle.Wait()
	}
	if s.closed || s.parked {
		s.life.Unlock()
		return // Close closes db
	}
	db, j, x := s.db, s.journal, s.ids
	s.db, s.journal, s.ids = nil, nil, nil
	s.life.Unlock()
	tail := j.failedTail() // the log is cut where its syncs ended
	j.close()
	if x != nil { // nil if the store failed while it opened
		if err := s.inPebble(x.db.Close); err != nil {
			s.log.Debug("closing the failed store's id index", "dir", s.dir, "err", err.Error())
		}
	}
	if err := s.inPebble(db.Close); err != nil {
		s.log.Debug("closing the failed store", "dir", s.dir, "err", err.Error())
	}
	s.disk.walErr.Store(nil) // what the next Pebble's WAL meets is its own

	backoff := 100 * time.Millisecond
	for {
		if s.isWedged() { // the old Pebble, or a new one's recovery, is parked
			return
		}
		var err error
		var legacy bool
		if err = s.checkSpace(0); err == nil {
			if db, err = s.openDB(); err == nil {
				if j, err = s.openJournal(db, tail); err == nil {
					if x, legacy, err = s.openIndex(db); err == nil {
						s.legacyIDs = legacy
						break
					}
					j.close()
				}
				_ = s.inPebble(db.Close)
			}
		}
		s.limitedError("store reopen failed: retrying", err)
		select {
		case <-s.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}

	// Positions and sequence numbers are read again: the failed write may
	// be in the log after all.
	s.groupsMu.Lock()
	s.groups = map[uint32]*group{}
	s.groupsMu.Unlock()
	s.pipelinesMu.Lock()
	s.pipelines = map[string]*pipeline{}
	s.pipelinesMu.Unlock()
	s.life.Lock()
	defer s.life.Unlock()
	if s.parked { // the new Pebble's recovery got stuck meanwhile
		s.db, s.journal, s.ids = db, j, x
		return
	}
	s.db, s.journal, s.ids, s.broken = db, j, x, nil
	s.log.Info("store reopened", "dir", s.dir)
}

// describeDirError says what is wrong with a data directory that cannot be
// created.
func describeDirError(err error) error {
	if notWritable(err) {
		return fmt.Errorf("directory not writable: %w", err)
	}
	return err
}

// describeLockError says why the directory's lock was not taken: it is
// held, or the directory cannot be written.
func describeLockError(err error) error {
	switch {
	case notWritable(err):
		return fmt.Errorf("directory not writable (cannot create its LOCK file): %w", err)
	case isNoSpace(err):
		return fmt.Errorf("cannot create its LOCK file: %w (ENOSPC)", err)
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EWOULDBLOCK),
		strings.Contains(err.Error(), "held by current process"):
		return fmt.Errorf("directory in use by another store: %w", err)
	}
	return fmt.Errorf("lock: %w", err)
}

func notWritable(err error) bool {
	return errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS)
}

// noSpaceBackoff is how long after a background job ran out of space the
// next one may create a table: Pebble retries a failed flush at once, and
// on a full disk would spin writing and deleting tables.
const noSpaceBackoff = time.Second

// backoffFS delays the creation of tables and blob files for a while after
// a background job ran out of space (see noSpaceBackoff). Pebble creates
// them with its DB mutex unlocked; WAL and MANIFEST files are not delayed.
type backoffFS struct {
	vfs.FS
	lastNoSpace *atomic.Int64 // unix nanoseconds
	walErr      *atomic.Pointer[error]
}

func (f backoffFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if strings.HasSuffix(name, ".sst") || strings.HasSuffix(name, ".blob") {
		if wait := time.Duration(f.lastNoSpace.Load() + int64(noSpaceBackoff) - time.Now().UnixNano()); wait > 0 {
			time.Sleep(min(wait, noSpaceBackoff))
		}
	}
	file, err := f.FS.Create(name, category)
	return f.wal(name, file), err
}

func (f backoffFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.ReuseForWrite(oldname, newname, category)
	return f.wal(newname, file), err
}

// wal wraps a WAL file so that its first failed write or sync is recorded.
func (f backoffFS) wal(name string, file vfs.File) vfs.File {
	if file == nil || f.walErr == nil || !strings.HasSuffix(name, ".log") {
		return file
	}
	return walFile{file, f.walErr}
}

// walFile records the first error of a WAL write or sync before Pebble
// sees it (see Store.write).
type walFile struct {
	vfs.File
	walErr *atomic.Pointer[error]
}

func (w walFile) record(err error) error {
	if err != nil {
		w.walErr.CompareAndSwap(nil, &err)
	}
	return err
}

func (w walFile) Write(p []byte) (int, error) {
	n, err := w.File.Write(p)
	return n, w.record(err)
}

func (w walFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := w.File.WriteAt(p, off)
	return n, w.record(err)
}

func (w walFile) Sync() error     { return w.record(w.File.Sync()) }
func (w walFile) SyncData() error { return w.record(w.File.SyncData()) }
func (w walFile) SyncTo(length int64) (bool, error) {
	full, err := w.File.SyncTo(length)
	return full, w.record(err)
}
