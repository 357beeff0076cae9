// Package redisstore keeps keyfold's key-group logs and key snapshots in
// Redis (go-redis v9), for nodes that must survive the loss of any of them
// and for clusters of nodes.
//
// Each group operation is one Lua script call that checks the caller's epoch
// and writes in the same atomic step: a claim bumps the epoch and renames
// the group's log (a stream named after the epoch), an append adds a group's
// records to the log of its epoch (which is gone once another owner claimed
// the group), a checkpoint writes snapshots and the
// group's timer index (a sorted set), advances the checkpoint position and
// trims the stream. Append sends the calls of all groups of a commit in one
// pipelined round trip. All keys of a group share a hash tag, so the store
// works unchanged on Redis Cluster; keys.go documents the layout.
//
// Each pipeline's output log is a stream of its own, outside every group's
// slot: a checkpoint appends its outputs there (XADD, pipelined) before its
// script runs, so outputs are appended at least once (see
// [Store.Checkpoint]).
//
// An acknowledged write is as durable as Redis makes it: with appendonly yes
// and appendfsync always it survives a crash of the Redis host; with
// everysec up to a second of acknowledged writes can be lost with the host.
// Replication is asynchronous: a replica promoted after a failover may lack
// the last acknowledged writes.
package redisstore
