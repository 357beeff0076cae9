// Package actors runs keyfold's per-key state machines (package fold) as
// protoactor-go actors, one per (pipeline, key), and owns the path of an
// ingest through them: group commit to the key-group logs, then apply, then
// respond. It also checkpoints, recovers and passivates keys.
//
// A [Host] is one node's worth of keys. Every key hashes to a key group; the
// host claims its groups at start (bumping their epochs, which fences any
// earlier owner) and replays each group's log above its checkpoint into the
// keys' actors before it serves.
//
// Ordering: one commit loop appends records and hands each key its inputs
// in log order, so a key applies its events in the order of its group's log.
// Queries travel through the same mailboxes, so a query sees every event
// acknowledged before it was sent; so do a checkpoint's snapshot requests,
// but for keys whose actor is idle (everything sent to them was
// processed), which the checkpoint snapshots itself.
//
// Joins: a join is a pipeline of its own keys (fold.CompileJoin). An event
// is logged once, under its pipeline; the commit loop, after the append,
// and replay, from the record, hand it also to the key of every join the
// pipeline is a side of, in the order of the record's keys. The store's
// key-group layout (Layout) hashes the key alone, so those keys share the
// event's group; a store of the old layout refuses joins (ErrLayout).
//
// Memory: a key has an actor while it is among about the MaxActive most
// recently used (a key used twice is kept over one used once); passivated, it stays in memory without one (the resident tier,
// resident.go) within MaxMemory; beyond that its state is kept packed in
// the snapshot cache (cache.go) within CacheMemory, and beyond that only in
// the store. A changed key beyond the budget is kept packed in the spill
// (spill.go) until its group's next checkpoint writes it.
package actors
