package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
)

// Config configures a Host. Zero durations and sizes take the defaults
// below.
type Config struct {
	// Store keeps the key-group logs and the snapshots. Required.
	Store persistence.Store
	// Pipelines by name. Required.
	Pipelines map[string]*fold.Pipeline
	// Groups is the number of key groups, fixed for the deployment (0:
	// DefaultGroups).
	Groups uint32
	// Owned lists the key groups Recover takes over; nil means all of them
	// (one node). SetOwned changes them later.
	Owned []uint32
	// CheckpointInterval bounds the time between checkpoints on a quiet
	// node; under load CheckpointBytes and CheckpointRecords come first.
	CheckpointInterval time.Duration
	// CheckpointBytes triggers a checkpoint once this many bytes were logged
	// since the last one began: it bounds the replay after a crash by the
	// log's size, while a key changed many times between checkpoints is
	// written once (a checkpoint's cost follows the keys that changed, not
	// the events).
	CheckpointBytes int64
	// CheckpointMaxBytes bounds the log between checkpoints, and so the
	// replay after a crash. Past CheckpointBytes (or CheckpointRecords) a
	// checkpoint waits, up to this bound, while the keys changed since the
	// last one took fewer than two deliveries each on average
	// (checkpointDeliveriesPerKey): with many more keys than events between
	// two checkpoints (a million keys, uniform) nearly every event would
	// otherwise be followed by a snapshot of its key, which costs about as
	// much as the event. 0: DefaultCheckpointMaxBytes with the default
	// CheckpointBytes, else 4 × CheckpointBytes (CheckpointBounds). Equal
	// to CheckpointBytes: a checkpoint never waits.
	CheckpointMaxBytes int64
	// CheckpointRecords triggers a checkpoint early once any group's log has
	// this many records above its checkpoint. 0: one per 64 KiB of
	// CheckpointBytes, at least DefaultCheckpointRecords (a commit writes a
	// small record to most groups: a fixed count would decide before a
	// larger CheckpointBytes does).
	CheckpointRecords int
	// IdleTimeout passivates keys that received nothing for this long
	// (or up to twice as long: see Host.passivate).
	IdleTimeout time.Duration
	// MaxActive bounds the number of active keys (keys with an actor);
	// beyond it the least recently used ones are passivated into the
	// resident tier (about: a key used again since it became active is
	// kept over one that was not, see Host.passivate). 0: as many as a quarter of MaxMemory holds at
	// ActiveKeyBytes each (DefaultMaxActive without a MaxMemory).
	MaxActive int
	// MaxMemory bounds, in bytes, the memory of the keys held in memory: the
	// active ones (each charged ActiveKeyBytes) and those resident without
	// an actor (charged their estimated size, see resident.go). Keys beyond
	// it are only in the store, read back on demand. Negative: no resident
	// tier (a passivated key leaves memory).
	MaxMemory int64
	// CacheMemory is the part of MaxMemory that keeps keys which left
	// memory in the snapshot cache (cache.go), encoded, in a tenth of what
	// a resident key takes: activating one decodes it instead of reading
	// the store. It covers the cache's entries and their index (cache.go).
	// 0: a quarter of MaxMemory (if that is at least 48 MiB, the cache's
	// smallest size; else none), see cacheShare. Negative: no cache.
	CacheMemory int64
	// AlwaysIndexIDs makes every checkpoint store the remembered ids its
	// snapshots hand over in the store's id index, leaving only their
	// fingerprints in the snapshots, if the store keeps one
	// (persistence.HasIDIndex). By default checkpoints do so only while
	// keys leave memory for want of room (one did within the last 10
	// minutes): where every key fits, the snapshots keep ids in full,
	// which costs the store less, and the index would help only after a
	// restart.
	AlwaysIndexIDs bool
	// MaxCommitEvents bounds the events one group commit collects.
	MaxCommitEvents int
	// Logger receives the host's logs; nil discards them.
	Logger *slog.Logger
	// WatermarkInterval is how often the watermarks of pipelines with
	// windows advance and due timers fire.
	WatermarkInterval time.Duration
	// OutputInterval is how often the results keys emitted are stored (and
	// become readable), in one store call.
	OutputInterval time.Duration
	// Now is the processing-time clock; nil is time.Now. Its readings are
	// logged with the inputs, so replay never reads it. The ids a key
	// applied are stored to expire a week past the dedup window by it, and
	// a store judges that expiry by its own clock (embedded.Options.Now;
	// the Redis server's): a host on another clock than the wall clock
	// gives its store the same one. (The stores also stamp outputs with
	// the wall clock, which output retention reads against this one.)
	Now func() time.Time
}

// Defaults.
const (
	DefaultGroups             = 256
	DefaultCheckpointInterval = 30 * time.Second
	DefaultCheckpointBytes    = 128 << 20
	DefaultCheckpointMaxBytes = 256 << 20 // with the default CheckpointBytes
	DefaultCheckpointRecords  = 1000
	DefaultCheckpointWait     = 4 // CheckpointMaxBytes's default for a CheckpointBytes set, in CheckpointBytes
	DefaultIdleTimeout        = 5 * time.Minute
	DefaultMaxActive          = 100_000
	DefaultMaxMemory          = 1 << 30
	// ActiveKeyBytes is what MaxMemory charges an active key: its actor
	// (≈ 460 B) and the state of a key with a few aggregates (≈ 700 B
	// since session 58; ≈ 900 B before), as measured by
	// BenchmarkActiveKeyMemory (1,164 B in all; BENCHMARKS.md). It was not
	// lowered with them: the active keys' share of MaxMemory and their
	// number are a trade measured apart (session 55).
	ActiveKeyBytes           = 1536
	DefaultMaxCommitEvents   = 50_000
	DefaultWatermarkInterval = 200 * time.Millisecond
	DefaultOutputInterval    = 100 * time.Millisecond
)

// CheckpointBounds returns the CheckpointBytes and CheckpointMaxBytes in
// effect for those given (0: unset). Both unset: DefaultCheckpointBytes
// and DefaultCheckpointMaxBytes. A CheckpointBytes set alone:
// DefaultCheckpointWait times it bounds the log. A CheckpointMaxBytes set
// alone below DefaultCheckpointBytes: checkpoints may start there too.
//
// The default start was 64 MiB with the bound at 4 times it, the same
// 256 MiB: where keys take several events between checkpoints (ten to a
// hundred thousand under load) a round began every 64 MiB and wrote a
// snapshot of nearly every key each time; at 128 MiB half as many, for
// 1.07–1.46x the events per second at a hundred thousand keys on both
// stores (BENCHMARKS.md, session 54). The replay bound did not move, and
// with a million keys and more the rounds wait for two deliveries a key,
// past 128 MiB already (checkpointDeliveriesPerKey). Note that 128 MiB
// set as CheckpointBytes is a CheckpointBytes set: its bound is 512 MiB.
// A negative value (which Validate refuses) is returned as it is.
func CheckpointBounds(checkpointBytes, maxBytes int64) (start, bound int64) {
	switch {
	case checkpointBytes < 0 || maxBytes < 0:
		return checkpointBytes, maxBytes
	case checkpointBytes == 0 && maxBytes == 0:
		return DefaultCheckpointBytes, DefaultCheckpointMaxBytes
	case checkpointBytes == 0:
		return min(DefaultCheckpointBytes, maxBytes), maxBytes
	case maxBytes == 0 && checkpointBytes > math.MaxInt64/DefaultCheckpointWait:
		return checkpointBytes, math.MaxInt64
	case maxBytes == 0:
		return checkpointBytes, DefaultCheckpointWait * checkpointBytes
	}
	return checkpointBytes, maxBytes
}

// checkpointBytesPerRecord derives CheckpointRecords from CheckpointBytes.
const checkpointBytesPerRecord = 64 << 10

// checkpointDeliveriesPerKey is what a checkpoint past CheckpointBytes waits
// for (up to CheckpointMaxBytes): deliveries (a key's events of one commit)
// since the last checkpoint began, per key changed since. At one each, a
// checkpoint writes a snapshot per event; at two, fewer: 0.6-0.7 an event
// at a million uniform keys, not the half that two deliveries a key would
// give, because a round takes its groups one after another over seconds
// and the deliveries to a group's keys before it took them count too.
// Counted by group since each group's checkpoint took its keys, the rule
// wrote half a snapshot an event and ran 12% slower: the rounds then came
// at CheckpointMaxBytes, hurried, and the log above the checkpoints
// outlived the store's memtables (BENCHMARKS.md, session 44).
const checkpointDeliveriesPerKey = 2

// checkpointMaxRecords is CheckpointRecords scaled as CheckpointMaxBytes
// scales CheckpointBytes (not rounded down to a whole ratio: a bound of
// 200 MiB over a start of 128 waits for 1.56 times the records): the
// records in a group above its checkpoint at which a checkpoint no longer
// waits.
func (c *Config) checkpointMaxRecords() uint64 {
	records := uint64(max(c.CheckpointRecords, 0))
	start := uint64(max(c.CheckpointBytes, 1))
	bound := uint64(max(c.CheckpointMaxBytes, c.CheckpointBytes, 1))
	hi, lo := bits.Mul64(records, bound)
	if hi >= start {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, start)
	return max(q, records)
}

// storeTimeout bounds one store call of the write path (an append, a
// checkpoint, a snapshot read): a store that hangs fails the call, which
// loses the group (appends, reads) or is retried (checkpoints), instead of
// stalling every ingest behind it.
const storeTimeout = 10 * time.Second

func (c *Config) setDefaults() {
	if c.Groups == 0 {
		c.Groups = DefaultGroups
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	c.CheckpointBytes, c.CheckpointMaxBytes = CheckpointBounds(c.CheckpointBytes, c.CheckpointMaxBytes)
	if c.CheckpointRecords == 0 {
		c.CheckpointRecords = int(max(c.CheckpointBytes/checkpointBytesPerRecord, DefaultCheckpointRecords))
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxMemory == 0 {
		c.MaxMemory = DefaultMaxMemory
	}
	if c.MaxActive == 0 {
		c.MaxActive = DefaultMaxActive
		if c.MaxMemory > 0 {
			c.MaxActive = int(max(c.MaxMemory/4/ActiveKeyBytes, 1))
		}
	}
	c.CacheMemory = cacheMemoryFor(c.MaxMemory, c.CacheMemory)
	if c.MaxCommitEvents == 0 {
		c.MaxCommitEvents = DefaultMaxCommitEvents
	}
	if c.WatermarkInterval == 0 {
		c.WatermarkInterval = DefaultWatermarkInterval
	}
	if c.OutputInterval == 0 {
		c.OutputInterval = DefaultOutputInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// cacheShare is the default CacheMemory's share of MaxMemory: 1/cacheShare.
// The cache and the resident tier divide what the active keys leave, and
// they buy different things: a cached key's next activation decodes it
// instead of reading the store, while the resident tier's room for
// changed keys (parked and spilled) is what lets checkpoints wait for
// CheckpointBytes and two deliveries a key. When changed keys fill it,
// the budget asks for a round at once (why=memory), unpaced, that writes
// every changed key after a delivery or so each. With half of MaxMemory
// for the cache (until session 44), a million uniform keys after five
// minutes ran on memory's rounds alone, each after 1.3-1.5 deliveries a
// key; with a quarter, rounds were begun by CheckpointBytes and the
// store's compactions wrote about a quarter fewer bytes an event (most of
// them are snapshots; BENCHMARKS.md, session 44). After ten minutes,
// keys of more than 32 ids filled it again: they could not be spilled
// until session 45.
const cacheShare = 4

// cacheMemoryFor is the CacheMemory in effect for a MaxMemory (its default
// applied) and a CacheMemory as configured: negative for no cache.
func cacheMemoryFor(maxMemory, cacheMemory int64) int64 {
	if maxMemory < 0 {
		return -1 // a key that is passivated leaves memory at once
	}
	if cacheMemory == 0 {
		cacheMemory = -1
		if maxMemory/cacheShare >= MinCacheMemory {
			cacheMemory = maxMemory / cacheShare
		}
	}
	return cacheMemory
}

// CacheEntryMemory is the most memory the snapshot cache's entries take
// outside the Go heap (fastcache maps its chunks) for a host configured
// with maxMemory (its default applied) and cacheMemory (as configured).
func CacheEntryMemory(maxMemory, cacheMemory int64) int64 {
	if m := cacheMemoryFor(maxMemory, cacheMemory); m > 0 {
		return cacheChunkBytes(m)
	}
	return 0
}

// residentBudget is the memory left for resident keys: MaxMemory less
// what the active keys may take and the snapshot cache (none when that
// leaves nothing).
func (c *Config) residentBudget() int64 {
	return max(c.MaxMemory-int64(c.MaxActive)*ActiveKeyBytes-max(c.CacheMemory, 0), 0)
}

// Validate reports every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("actors: config: Store is required"))
	}
	if len(c.Pipelines) == 0 {
		errs = append(errs, errors.New("actors: config: at least one pipeline is required"))
	}
	for _, name := range slices.Sorted(maps.Keys(c.Pipelines)) {
		if p := c.Pipelines[name]; p.IsJoin() {
			for _, side := range p.JoinSides() {
				if s := c.Pipelines[side]; s == nil || s.IsJoin() {
					errs = append(errs, fmt.Errorf("actors: config: join %q: side %q is not one of the pipelines", name, side))
				}
			}
		}
	}
	if c.CacheMemory > 0 && c.CacheMemory < MinCacheMemory {
		errs = append(errs, fmt.Errorf("actors: config: CacheMemory %d is below the snapshot cache's smallest size, 48 MiB (negative: no cache)", c.CacheMemory))
	}
	if c.MaxMemory > 0 && c.CacheMemory > c.MaxMemory {
		errs = append(errs, fmt.Errorf("actors: config: CacheMemory %d is more than MaxMemory %d, of which it is a part", c.CacheMemory, c.MaxMemory))
	}
	if c.CheckpointMaxBytes > 0 && c.CheckpointMaxBytes < c.CheckpointBytes {
		errs = append(errs, fmt.Errorf("actors: config: CheckpointMaxBytes %d is less than CheckpointBytes %d, the log at which a checkpoint may start", c.CheckpointMaxBytes, c.CheckpointBytes))
	}
	for _, v := range []struct {
		name string
		bad  bool
	}{
		{"CheckpointInterval", c.CheckpointInterval < 0},
		{"CheckpointBytes", c.CheckpointBytes < 0},
		{"CheckpointMaxBytes", c.CheckpointMaxBytes < 0},
		{"CheckpointRecords", c.CheckpointRecords < 0},
		{"IdleTimeout", c.IdleTimeout < 0},
		{"MaxActive", c.MaxActive < 0},
		{"MaxCommitEvents", c.MaxCommitEvents < 0},
		{"WatermarkInterval", c.WatermarkInterval < 0},
		{"OutputInterval", c.OutputInterval < 0},
	} {
		if v.bad {
			errs = append(errs, fmt.Errorf("actors: config: %s must not be negative", v.name))
		}
	}
	return errors.Join(errs...)
}
