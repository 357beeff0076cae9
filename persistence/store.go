package persistence

import (
	"context"
	"fmt"
	"io"
	"time"
)

// Position addresses a record in a key group's log. The records of a group
// get positions 1, 2, 3, … in append order, never reused, even after a trim;
// 0 means "before the first record".
type Position = uint64

// Epoch is a group owner's fencing token. Each claim of a group returns an
// epoch larger than every earlier one.
type Epoch = uint64

// Entry is one record to append to a group's log.
type Entry struct {
	Group uint32
	Epoch Epoch // the appender's epoch for Group, from Claim
	Data  []byte
}

// GroupState is what a new owner needs to take a group over.
type GroupState struct {
	Epoch      Epoch    // the owner's epoch, newer than any before it
	Checkpoint Position // every record at or below it is reflected in snapshots
	Last       Position // position of the last appended record (0 if none ever)
}

// Log is the set of key-group logs.
type Log interface {
	// Claim makes the caller the group's owner: it atomically bumps the
	// group's epoch, fencing off every earlier owner, and returns the state
	// needed to replay the group.
	Claim(ctx context.Context, group uint32) (GroupState, error)

	// Append durably appends the entries, which may belong to many groups,
	// in as few synced writes as the store allows (one for the embedded
	// store), and returns each entry's position in its group. Entries of one
	// group get consecutive positions in slice order.
	//
	// Groups are independent: an entry whose epoch is not its group's
	// current epoch is not appended and the error wraps ErrFenced; entries
	// of other groups may still be appended. On error, positions[i] is 0 for
	// every entry that was not appended. Append keeps no reference to the
	// entries' Data once it returns: the caller reuses its buffers.
	Append(ctx context.Context, entries []Entry) (positions []Position, err error)

	// Read calls fn with each record of the group whose position is greater
	// than after, in position order, until fn returns an error (which Read
	// returns) or the log ends. The data passed to fn is valid only during
	// the call.
	Read(ctx context.Context, group uint32, after Position, fn func(Position, []byte) error) error
}

// Snapshot is one key's snapshot within a group. Key is opaque to the store.
// A nil Data deletes the snapshot.
type Snapshot struct {
	Key  string
	Data []byte
}

// Snapshots stores one snapshot per key.
type Snapshots interface {
	// Get returns a key's snapshot, or an error wrapping ErrNotFound.
	Get(ctx context.Context, group uint32, key string) ([]byte, error)

	// GetMany returns the snapshots of several keys of one group, in one
	// round trip where the store has round trips: data[i] is keys[i]'s
	// snapshot, nil if it has none.
	GetMany(ctx context.Context, group uint32, keys []string) (data [][]byte, err error)

	// GetGroups is GetMany for the keys of several groups at once, in one
	// round trip where the store has round trips: data[i][j] is
	// reads[i].Keys[j]'s snapshot, nil if it has none. A node activating
	// the keys of one commit reads them this way: they are spread over
	// most groups, and a round trip per group cost more than the reads.
	GetGroups(ctx context.Context, reads []GroupKeys) (data [][][]byte, err error)
}

// GroupKeys names keys of one group to read (Snapshots.GetGroups).
type GroupKeys struct {
	Group uint32
	Keys  []string
}

// Timer indexes one key of a group under the time of its next timer, so a
// new owner of the group finds the keys whose timers must fire without
// reading every snapshot. Key is opaque to the store (the keys are the same
// names as snapshot keys); the index holds at most one entry per key.
type Timer struct {
	Key string
	Due int64 // Unix ms of the key's next timer; 0 removes the key from the index
}

// Output is one record to append to a pipeline's output log.
type Output struct {
	Pipeline string // the output log's name, opaque to the store
	Data     []byte
}

// OutputEntry is one stored output record.
type OutputEntry struct {
	// Cursor names the entry: ReadOutputs(after: Cursor) resumes after it.
	// It is opaque, and valid only for the store (kind) that returned it.
	Cursor string
	// Time is when the entry was appended, by the store's clock, to the
	// millisecond. Entries of a pipeline have non-decreasing times in
	// append order.
	Time time.Time
	Data []byte
}

// CheckpointData is what one checkpoint of a group writes.
type CheckpointData struct {
	// Snapshots are written, or deleted for nil Data.
	Snapshots []Snapshot
	// Timers are set in the group's timer index (any Due but 0) or removed
	// from it (Due 0), in order: of two entries for one key the later wins.
	Timers []Timer
	// Outputs are appended to their pipelines' output logs, those of each
	// pipeline in slice order.
	Outputs []Output
	// Through, if above the group's checkpoint position, becomes the new
	// one, and the log records at or below it are deleted. The snapshots
	// and timers must reflect every record through it.
	Through Position
	// IDs are stored in the group's id index (Store.LookupIDs), each
	// under its time bucket: the ids keys applied (for deduplication),
	// kept apart from the keys' snapshots so that a checkpoint writes an
	// id once, not with every later snapshot of its key. An id stored
	// again under the same bucket and key keeps the last At.
	IDs []StoredID
	// DropIDsBefore, if positive, deletes every id of the group's index
	// in a bucket below it (the buckets past the dedup window), before
	// IDs are stored. Set it when a bucket passes the window, not at every
	// checkpoint: each costs a range deletion (embedded) or a read of the
	// group's buckets (Redis).
	//
	// A store without an id index (Redis formats 1 and 2) refuses a
	// checkpoint with IDs or DropIDsBefore, writing nothing.
	DropIDsBefore int64
}

// StoredID is an id that a key applied, in the group's id index.
type StoredID struct {
	// Bucket is the id's time bucket, a number the caller gives its
	// meaning (a store only orders by it); non-negative.
	Bucket int64
	Key    string // the key's name, as Snapshot.Key
	ID     string
	// At is when the key applied it (Unix ms), returned by LookupIDs;
	// not 0.
	At int64
	// Expires is when the store may forget the id by itself (Unix ms): a
	// store without range deletions (Redis) expires a bucket's ids
	// together, after the latest Expires of those stored in it (never, if
	// one of them has 0). 0: never by itself.
	Expires int64
}

// IDLookup names an id to look up in a group's id index.
type IDLookup struct {
	Bucket  int64
	Key, ID string
}

// OutputLog is the set of pipelines' output logs. Outputs are appended by
// checkpoints ([Store.Checkpoint]) and read by cursor.
type OutputLog interface {
	// AppendOutputs durably appends each output to its pipeline's log,
	// those of one pipeline in slice order. On error some may have been
	// appended: callers give outputs stable ids, and appending one again
	// is allowed.
	AppendOutputs(ctx context.Context, outputs []Output) error

	// ReadOutputs returns up to limit entries of the pipeline appended after
	// the entry whose Cursor is after ("" reads from the oldest entry still
	// retained), in append order. No entry becomes visible before one
	// appended earlier to the same pipeline, so a reader that resumes from
	// the last cursor it got misses nothing. A cursor of an entry trimmed
	// since still works: the read resumes with the oldest retained entries
	// after it. A pipeline with no entries has none to return (no error).
	//
	// limit must be positive; a cursor the store cannot parse, or one past
	// the last entry ever appended (no entry has it: a reader holding it
	// would silently skip what comes next), gets an error wrapping
	// ErrBadCursor.
	ReadOutputs(ctx context.Context, pipeline string, after string, limit int) ([]OutputEntry, error)

	// TrimOutputs deletes the pipeline's entries appended before the given
	// time (those whose Time is earlier than it truncated to the
	// millisecond) and returns how many it deleted. Cursors are never
	// reused, also after a trim of every entry.
	TrimOutputs(ctx context.Context, pipeline string, before time.Time) (int, error)
}

// Store is a complete keyfold store.
type Store interface {
	Log
	Snapshots
	OutputLog

	// Checkpoint durably and atomically writes (or, for nil Data, deletes)
	// snapshots of keys of the group, updates the group's timer index and,
	// if d.Through is above the group's checkpoint position, records it as
	// the new one and deletes the log records at or below it. A stale epoch
	// gets ErrFenced and writes nothing; a Through beyond the group's last
	// position is an error and writes nothing; a Through at or below the
	// checkpoint leaves it be (snapshots and timers are still written).
	//
	// d.Outputs are appended to their pipelines' output logs at least once.
	// The embedded and in-memory stores append them atomically with the
	// rest (nothing if the checkpoint fails). The Redis store appends them
	// before it checks the epoch, since a pipeline's output log lives in
	// another Redis Cluster slot than the group: a checkpoint that fails,
	// fenced or not, may have appended its outputs, and a retried one
	// appends them again. Callers give outputs stable ids in their Data so
	// that readers can drop duplicates.
	Checkpoint(ctx context.Context, group uint32, epoch Epoch, d CheckpointData) error

	// LookupIDs returns, for each lookup, the At that a checkpoint of the
	// group stored the id with under that bucket and key, or 0 if the
	// group's index does not hold it (never stored, dropped, or expired).
	// It needs no epoch: the index changes only by checkpoints.
	LookupIDs(ctx context.Context, group uint32, lookups []IDLookup) ([]int64, error)

	// Timers calls fn with each entry of the group's timer index, in no
	// order callers may rely on (each store documents its own), until fn
	// returns an error, which Timers returns. A new owner calls it after
	// its claim to find the keys with timers; it needs no epoch.
	Timers(ctx context.Context, group uint32, fn func(key string, due int64) error) error

	// CheckGroups records the deployment's number of key groups in a new
	// store and, in an existing one, fails with ErrGroupsMismatch if it
	// differs. It also returns the store's key-group layout: the one it
	// records, with the count, in a new store (layout), or the one recorded
	// when the store was created, 0 for a store created before layouts were
	// recorded. The caller gives the number its meaning (actors.Layout); a
	// store only keeps it, so every node on one store agrees on it.
	CheckGroups(ctx context.Context, groups, layout uint32) (uint32, error)

	io.Closer
}

// GroupsRecorder is implemented by a store that tells the number of key
// groups it records before CheckGroups is called, so that a node whose
// configuration leaves it unset adopts the deployment's (keyfold's default
// applies to a new store only).
type GroupsRecorder interface {
	// RecordedGroups returns the number of key groups the store records,
	// 0 if it records none yet (a new store).
	RecordedGroups(ctx context.Context) (uint32, error)
}

// RecordedGroups returns the number of key groups s records: 0 for a new
// store, and for one that does not implement GroupsRecorder.
func RecordedGroups(ctx context.Context, s Store) (uint32, error) {
	if r, ok := s.(GroupsRecorder); ok {
		return r.RecordedGroups(ctx)
	}
	return 0, nil
}

// PackedSnapshots is implemented by a store that allows snapshots in
// keyfold's packed form (actors/packed.go): one whose every reader knows
// it, because the store's recorded format keeps older keyfolds, which do
// not, from opening it. The snapshot bytes are opaque to a store either
// way; a store that does not implement it gets the other form only.
type PackedSnapshots interface {
	// PackedSnapshots reports whether the store allows them; it may know
	// only once CheckGroups has returned (the store's recorded format).
	PackedSnapshots() bool
}

// AllowsPacked reports whether s allows packed snapshots.
func AllowsPacked(s Store) bool {
	p, ok := s.(PackedSnapshots)
	return ok && p.PackedSnapshots()
}

// IDIndexer is implemented by a store whose id index (CheckpointData.IDs,
// Store.LookupIDs) may be missing: a Redis store of a format before 3. A
// store that does not implement it has one.
type IDIndexer interface {
	// IDIndex reports whether the store keeps an id index; it may know
	// only once CheckGroups has returned (the store's recorded format).
	IDIndex() bool
}

// HasIDIndex reports whether s keeps an id index.
func HasIDIndex(s Store) bool {
	x, ok := s.(IDIndexer)
	return !ok || x.IDIndex()
}

// CheckIDs returns an error if a checkpoint's ids are out of range (a
// negative bucket, a stored id without its time): a store's Checkpoint
// refuses them, writing nothing.
func (d CheckpointData) CheckIDs() error {
	for _, id := range d.IDs {
		if id.Bucket < 0 || id.At == 0 {
			return fmt.Errorf("stored id %q of key %q: bucket %d, at %d: the bucket must not be negative, nor the time 0", id.ID, id.Key, id.Bucket, id.At)
		}
	}
	if d.DropIDsBefore < 0 {
		return fmt.Errorf("ids dropped before bucket %d: the bucket must not be negative", d.DropIDsBefore)
	}
	return nil
}

// CheckIDLookups returns an error if a look-up names a negative bucket:
// a store's LookupIDs refuses it.
func CheckIDLookups(lookups []IDLookup) error {
	for _, l := range lookups {
		if l.Bucket < 0 {
			return fmt.Errorf("id %q of key %q looked up in bucket %d: the bucket must not be negative", l.ID, l.Key, l.Bucket)
		}
	}
	return nil
}
