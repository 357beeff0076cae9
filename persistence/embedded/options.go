package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Options configures a Store. The zero value is a sane default.
type Options struct {
	// Logger receives the store's log messages and Pebble's: Pebble's
	// informational messages at debug level, its errors (background errors,
	// detected corruption) at error level, at most one a second. Nil
	// discards them.
	//
	// Pebble treats some failures as fatal, a failed WAL write among them,
	// because it cannot continue safely; its default would exit the process.
	// The store never does: the call that hit the failure gets ErrFailed and
	// the store reopens itself (see ErrFailed).
	Logger *slog.Logger

	// CacheSize is the most Pebble's block cache holds, in bytes (0 means
	// 256 MiB). It holds blocks as they are read, so a small store uses
	// less. With more keys than the node keeps in memory, the snapshots it
	// reads back need their tables' filter and index blocks, and with too
	// small a cache each read brought them from the file again: at ten
	// million keys 256 MiB was a quarter more events per second than 64
	// (BENCHMARKS.md, session 26).
	CacheSize int64

	// MemTableSize is the size of one Pebble memtable in bytes (0 means
	// 32 MiB, or a twentieth of a filesystem smaller than 640 MiB, so that
	// the disk reserve holds a flush); up to two are held in memory. Larger
	// memtables flush less often. It must be below 4 GiB.
	MemTableSize uint64

	// DiskReserve is the free space, in bytes, that the store keeps on its
	// filesystem: Append and AppendOutputs refuse a write that would leave
	// less (persistence.ErrNoSpace, nothing written), and Open refuses to
	// start below it. The reserve is what Pebble needs to flush its
	// memtables, compact, and take claims and checkpoints while ingest is
	// refused (those are refused only below an eighth of it). 0 means twice MemTableSize, but at most a tenth of the
	// filesystem; a negative value turns the check off.
	DiskReserve int64

	// PreadTables reads the store's tables with pread(2) only. By default
	// (on Unix, 64-bit) a table opened for point reads is mapped into
	// memory and a block read is a copy from the mapping, with no system
	// call once its page is mapped: at ten million keys, where most
	// snapshots are read back from the tables, the reads were 45% of the
	// CPU, pread alone 8% (mapped.go). The mapped pages count in the
	// process's resident memory, and so in the score the Linux OOM killer
	// gives it (they are the page cache's, which the kernel may reclaim).
	PreadTables bool

	// Now is the clock the store judges the ids' expiry by
	// (persistence.StoredID.Expires); nil is time.Now. A host run on a
	// clock of its own (actors.Config.Now, in tests) gives the store the
	// same one: the ids it stamps a week past the dedup window by its
	// clock would otherwise be judged by another.
	Now func() time.Time

	// fs is the filesystem, vfs.Default unless a test injects faults.
	fs vfs.FS
	// segmentSize is the size of a log segment (journal.go), 64 MiB unless
	// a test makes it smaller.
	segmentSize int64
}

// DefaultCacheSize is the block cache's size when Options.CacheSize is 0,
// and DefaultMemTableSize a memtable's when Options.MemTableSize is (the
// largest: a small filesystem gets smaller ones).
const (
	DefaultCacheSize    = 256 << 20
	DefaultMemTableSize = 32 << 20
)

const maxMemTableSize = 4 << 30

// Validate reports every problem with the options at once.
func (o Options) Validate() error {
	var errs []error
	if o.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("embedded: CacheSize %d is negative", o.CacheSize))
	}
	if o.MemTableSize >= maxMemTableSize {
		errs = append(errs, fmt.Errorf("embedded: MemTableSize %d is not below 4 GiB", o.MemTableSize))
	}
	return errors.Join(errs...)
}

// withDefaults returns the options with every zero field set to its default
// (DiskReserve is settled at Open, where the filesystem's size is known).
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.CacheSize == 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = DefaultMemTableSize
	}
	if o.segmentSize == 0 {
		o.segmentSize = defaultSegmentSize
	}
	if o.fs == nil {
		o.fs = vfs.Default
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// memTableSize returns the default memtable size on a filesystem of total
// bytes: a flush of two memtables must fit in the reserve.
func memTableSize(total uint64) uint64 {
	return min(DefaultMemTableSize, max(total/20, 1<<20))
}

// reserve returns the disk reserve for a filesystem of total bytes.
func (o Options) reserve(total uint64) int64 {
	if o.DiskReserve != 0 {
		return o.DiskReserve
	}
	return min(2*int64(o.MemTableSize), int64(total/10))
}

// pebbleFS returns the filesystem Pebble reads and writes through: the
// store's, its tables mapped unless PreadTables says not to (those the
// kernel refuses to map counted in refused).
func (o Options) pebbleFS(refused *mapRefusals) vfs.FS {
	if o.PreadTables {
		return o.fs
	}
	return mapTables(o.fs, refused)
}

// pebbleOptions returns the Pebble options for one opening of the store.
func (o Options) pebbleOptions(s *Store) *pebble.Options {
	// A new compaction scheduler for each Pebble opened (one registers
	// once), told of its write stalls.
	compactions := newCompactionScheduler()
	po := &pebble.Options{
		FS:           backoffFS{o.pebbleFS(&s.disk.unmapped), &s.disk.lastNoSpace, &s.disk.walErr},
		Logger:       pebbleLogger{l: o.Logger, s: s},
		CacheSize:    o.CacheSize,
		MemTableSize: o.MemTableSize,
		// Pinned rather than FormatNewest, so that upgrading Pebble does not
		// silently ratchet the on-disk format (which cannot be undone).
		FormatMajorVersion: pebble.FormatValueSeparation,
		EventListener: &pebble.EventListener{
			// Pebble retries a failed flush at once, without a backoff: on
			// a full disk that is dozens of errors a second.
			BackgroundError: s.backgroundError,
			// The read that found the corruption fails too; Pebble's default
			// would end the process.
			DataCorruption: func(info pebble.DataCorruptionInfo) {
				o.Logger.Error("pebble data corruption", "err", info.String())
			},
			// Writes wait while flushes or compactions fall behind: every
			// append (so every ack) waits with them.
			WriteStallBegin: func(info pebble.WriteStallBeginInfo) {
				compactions.writesStalled(true)
				s.stallBegin(info)
			},
			WriteStallEnd: func() {
				compactions.writesStalled(false)
				s.stallEnd()
			},
			FlushEnd:      s.disk.flushEnd,
			CompactionEnd: s.disk.compactionEnd,
		},
	}
	// Bloom filters (10 bits a key, ~1% false positives) on every level: an
	// activation reads the snapshot of a key that usually has none yet (a
	// first-time key) or sits in one table of many, and without filters
	// each such read searched every level's table index and block (17% of
	// the CPU at a million keys, BENCHMARKS.md).
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	po.Experimental.LevelMultiplier = levelMultiplier
	// Compactions paced while they keep up (compactions.go).
	po.Experimental.CompactionScheduler = compactions
	po.CompactionConcurrencyRange = func() (int, int) { return compactionConcurrencyLower, compactionConcurrencyUpper }
	po.Experimental.L0CompactionConcurrency = l0CompactionConcurrency
	if !o.PreadTables {
		// Pebble reads ahead of an iterator whose reads look sequential:
		// with readahead(2), then by reopening the table for sequential
		// reads, which reads it by pread instead of through its mapping
		// (GetMany's sorted keys look sequential: at ten million keys the
		// reopened files' reads and their opening were 1.9% of the CPU;
		// mapped.go). readahead(2) alone keeps a real scan's pages coming
		// ahead of it. Compactions keep theirs (informed: they read whole
		// tables).
		po.Local.ReadaheadConfig = objstorageprovider.NewReadaheadConfig()
		po.Local.ReadaheadConfig.Set(objstorageprovider.FadviseSequential, objstorageprovider.SysReadahead)
	}
	return po
}

// levelMultiplier is the ratio of each LSM level's target size to the one
// above it (Pebble's default is 10). Most of what the store's compactions
// write is snapshots: a new version of each changed key's every checkpoint
// round, over a set of keys far smaller than the store (the id index fills
// the bottom level). A version is rewritten at each level it passes, with
// the next level's data in its key range: at 10, up to ten times its size
// at the last step. At 4 there is a level more, each rewritten less: at a
// million keys, 13-31% fewer compaction bytes an event in three runs
// against 10 (BENCHMARKS.md, session 43). A point read checks one more
// level's Bloom filter.
const levelMultiplier = 4

// pebbleLogger routes Pebble's logging to a slog.Logger.
type pebbleLogger struct {
	l *slog.Logger
	s *Store
}

func (p pebbleLogger) Infof(format string, args ...any) {
	if p.l.Enabled(context.Background(), slog.LevelDebug) {
		p.l.Debug("pebble", "detail", fmt.Sprintf(format, args...))
	}
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.s.limitedError("pebble error", fmt.Errorf(format, args...))
}

// commitFatal is how Pebble's DB.Apply reports a failed WAL write.
const commitFatal = "pebble: fatal commit error"

// Fatalf is called by Pebble when it cannot go on, and must not return
// (Pebble would carry on as if nothing failed). A failed commit is reported
// on the committing goroutine, which is one of the store's calls, with none
// of Pebble's locks held: Fatalf panics with a fatalPanic that the call
// recovers (see Store.write), and the store reopens Pebble. Any other is
// parked for good and the store fails until the process restarts; calls
// waiting for Pebble return at once (see wedge.go).
//
// That includes the other Fatalf calls on a committing goroutine, such as
// base.MustExist's when a memtable rotation cannot create the next WAL (the
// data directory was removed): they are not treated like the commit error,
// because they come from inside Pebble's commit pipeline. Pebble's commit
// mutex is held there, so a panic would leave it locked and every later
// commit blocked all the same; and the rotation runs with the DB mutex
// released under a deferred Unlock, so unwinding it would unlock an
// unlocked mutex, a fatal runtime error that no recover catches (the
// process would end). Parking keeps the process up; the goroutine parked is
// the store's helper (inPebble), not the caller's.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	err := fatalError(format, args)
	if strings.HasPrefix(format, commitFatal) {
		// Every commit in flight meets it; the first one that fails the
		// store logs it once (Store.fail), the others return that error.
		panic(fatalPanic{err})
	}
	p.l.Error("pebble fatal error", "err", err.Error(), "detail", fmt.Sprintf(format, args...))
	p.s.stuck(err)
	select {}
}

// fatalPanic is the panic value of a fatal commit error.
type fatalPanic struct{ err error }

// fatalError is Fatalf's message as an error that wraps its first error
// argument, so that errors.Is finds syscall.ENOSPC in it. Its message is
// one line: %+v (base.MustExist's) would add the cause's stack trace, which
// Fatalf logs as the detail.
func fatalError(format string, args []any) error {
	msg := fmt.Sprintf(strings.ReplaceAll(format, "%+v", "%v"), args...)
	for _, a := range args {
		if e, ok := a.(error); ok {
			return &wrapped{msg, e}
		}
	}
	return errors.New(msg)
}

type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.err }

// logLimit spaces the store's repeated messages (Pebble's background
// errors, tables it could not map), counting those it drops.
type logLimit struct {
	last    atomic.Int64 // of the last message: nanoseconds since logEpoch, plus 1 (0: none yet)
	dropped atomic.Int64
}

// logEpoch is where logLimit's times count from: the monotonic clock, which
// a wall clock set back does not stop.
var logEpoch = time.Now()

// allow reports whether a message may be logged now, every apart from the
// last, and how many were dropped since the last one.
func (l *logLimit) allow(every time.Duration) (bool, int64) {
	now, last := int64(time.Since(logEpoch))+1, l.last.Load()
	if last != 0 && now-last < int64(every) || !l.last.CompareAndSwap(last, now) {
		l.dropped.Add(1)
		return false, 0
	}
	return true, l.dropped.Swap(0)
}
