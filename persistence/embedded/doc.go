// Package embedded is keyfold's on-disk store for one node, on Pebble
// (github.com/cockroachdb/pebble/v2). It implements persistence.Store.
//
// The key groups' log is not in Pebble: [Store.Append] writes the records
// of all the groups of a call to a segment file with one write and one
// fdatasync (the group commit; concurrent calls share syncs), and a
// checkpoint deletes the segments whose records it covers (journal.go).
// Everything else (epochs, checkpoints, snapshots, timers, outputs) is
// written in Pebble batches committed with a synced WAL write. Either way
// an acknowledged write is on disk.
//
// Fencing needs no read on the write path: the store is the only writer of
// its directory (Pebble locks it), so it keeps each group's epoch, checkpoint
// and last position in memory, loaded on the group's first use, and checks
// and assigns them under a per-group lock that is held until the batch is
// durable. Likewise it keeps each pipeline's last output sequence number.
// The key layout is in keys.go, the log's in journal.go.
//
// A log record is visible to Read once it is durable. As in Pebble, a
// snapshot or timer is visible to reads (Get, Timers) as soon as it is in
// the memtable, a little before its WAL sync completes; Claim and
// Checkpoint of a group wait for the group's appends in progress. Output
// records are the exception: [Store.ReadOutputs] returns a record only once
// its checkpoint and those of every record before it in its pipeline are
// durable, so that a reader resuming from a cursor never skips one that was
// still being committed. A failed WAL write is fatal to Pebble, and a
// failed log write or sync to the log; the store keeps a disk reserve so
// that it does not come to that, and reopens both when it does (see [Options.DiskReserve], [ErrFailed] and disk.go).
package embedded
