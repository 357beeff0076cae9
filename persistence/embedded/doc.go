// Package embedded is keyfold's on-disk store for one node, on Pebble
// (github.com/cockroachdb/pebble/v2). It implements persistence.Store.
//
// Every write is one Pebble batch committed with a synced WAL write, so an
// acknowledged write is on disk. [Store.Append] puts the records of all the
// groups of a call in one batch: that is the group commit. Concurrent calls
// for different key groups run in parallel, and Pebble shares one WAL sync
// among the batches that commit together.
//
// Fencing needs no read on the write path: the store is the only writer of
// its directory (Pebble locks it), so it keeps each group's epoch, checkpoint
// and last position in memory, loaded on the group's first use, and checks
// and assigns them under a per-group lock that is held until the batch is
// durable. Likewise it keeps each pipeline's last output sequence number.
// The key layout is in keys.go.
//
// As in Pebble, a write is visible to reads (Read, Get, Timers) as soon as
// it is in the memtable, a little before its WAL sync completes; Claim and
// Checkpoint of a group wait for the group's appends in progress. Output
// records are the exception: [Store.ReadOutputs] returns a record only once
// its checkpoint and those of every record before it in its pipeline are
// durable, so that a reader resuming from a cursor never skips one that was
// still being committed. A failed WAL write is fatal to Pebble; the store
// keeps a disk reserve so that it does not come to that, and reopens Pebble
// when it does (see [Options.DiskReserve], [ErrFailed] and disk.go).
package embedded
