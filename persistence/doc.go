// Package persistence defines where keyfold keeps its state: a fenced,
// append-only log per key group, a snapshot per key, a timer index per key
// group and an output log per pipeline.
//
// Keys hash to one of a fixed number of key groups. A group is the unit of
// ownership: a node that takes a group over calls [Log.Claim], which bumps
// the group's epoch, and from then on every append and snapshot write
// carries that epoch. The store rejects a write with an older epoch
// ([ErrFenced]) and changes nothing, so a stale owner can never corrupt a
// group, whatever the cluster's placement believes.
//
// A checkpoint ([Store.Checkpoint]) writes the snapshots of the keys changed
// since the last one and advances the group's checkpoint position, trimming
// the log at or below it, in one atomic write. Recovery reads each key's
// snapshot and replays the records above the checkpoint position, skipping
// those a key's snapshot already reflects.
//
// The same checkpoint updates the group's timer index (which keys have a
// timer, and when the next one is due), so that a new owner finds the keys
// whose timers must fire with [Store.Timers], and appends the outputs the
// checkpointed records produced to their pipelines' output logs, which
// readers page through by cursor ([OutputLog.ReadOutputs]) and retention
// trims by age.
//
// Stores live in sub-packages (embedded is the on-disk store for one node,
// redisstore keeps everything in Redis for a cluster); every store passes the conformance suite in persistencetest.
package persistence
