// Package redisstore keeps keyfold's key-group logs and key snapshots in
// Redis (go-redis v9), for nodes that must survive the loss of any of them
// and for clusters of nodes.
//
// Each group operation is one atomic step that checks the caller's epoch
// and writes: a claim (a Lua script, after a read of the epoch it expects)
// bumps the epoch and renames the group's log, a stream named after the
// epoch; an append adds each group's record to the log of its epoch with
// XADD NOMKSTREAM (once another owner claimed the group, that log is gone),
// all groups of a commit in one MULTI/EXEC, each record compressed with S2
// where that makes it smaller (format 4, records.go; the scripts' appends,
// after a failure, store theirs as they are); a checkpoint writes snapshots
// and the group's timer index (a sorted set), advances the checkpoint
// position and trims the stream in one MULTI/EXEC under a WATCH of the
// group's meta, which a claim changes. Stores created before that layout
// (format 3) keep theirs, whose appends and checkpoints are scripts that
// read (and appends write) the group's meta. All keys of a group share a hash tag, so the
// store works unchanged on Redis Cluster; keys.go documents the layout.
//
// Each pipeline's output log is a stream of its own, outside every group's
// slot: a checkpoint appends its outputs there (XADD, pipelined) before its
// atomic step, so outputs are appended at least once (see
// [Store.Checkpoint]).
//
// An acknowledged write is as durable as Redis makes it: with appendonly yes
// and appendfsync always it survives a crash of the Redis host; with
// everysec up to a second of acknowledged writes can be lost with the host.
// Replication is asynchronous: a replica promoted after a failover may lack
// the last acknowledged writes.
package redisstore
