package persistence

import (
	"context"
	"io"
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
	// every entry that was not appended.
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
}

// Store is a complete keyfold store.
type Store interface {
	Log
	Snapshots

	// Checkpoint durably and atomically writes (or, for nil Data, deletes)
	// snapshots of keys of the group and, if through is above the group's
	// checkpoint position, records through as the new one and deletes the
	// log records at or below it. The snapshots must reflect every record
	// through it. A stale epoch gets ErrFenced and writes nothing; through
	// beyond the group's last position is an error and writes nothing; a
	// through at or below the checkpoint leaves it be (snapshots are still
	// written).
	Checkpoint(ctx context.Context, group uint32, epoch Epoch, snaps []Snapshot, through Position) error

	// CheckGroups records the deployment's number of key groups in a new
	// store and, in an existing one, fails with ErrGroupsMismatch if it
	// differs.
	CheckGroups(ctx context.Context, groups uint32) error

	io.Closer
}
