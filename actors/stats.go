package actors

import "sync/atomic"

type hostStats struct {
	events      atomic.Int64
	duplicates  atomic.Int64
	commits     atomic.Int64
	checkpoints atomic.Int64
	snapshots   atomic.Int64 // key snapshots the checkpoints wrote
	replayed    atomic.Int64
	activations atomic.Int64
	spawned     atomic.Int64
	unparked    atomic.Int64
	passivated  atomic.Int64
	parkedIdle  atomic.Int64 // of those passivated, parked at once: their actor was idle (stopLocked)
	groupsLost  atomic.Int64
	timersFired atomic.Int64
	spilled     atomic.Int64              // changed keys that left memory into the spill (spill.go)
	unspilled   atomic.Int64              // of those, activated from it
	newKeys     atomic.Int64              // activated as new, without a read (Stats.NewKeys)
	idLookups   atomic.Int64              // events whose id was looked up in the store's id index (Stats.IDLookups)
	pipelines   map[string]*pipelineStats // fixed at New
}

type pipelineStats struct {
	events     atomic.Int64
	duplicates atomic.Int64
	late       atomic.Int64
	emitted    atomic.Int64
	expired    atomic.Int64
	failures   atomic.Int64 // Go handler calls that failed (dead letters)
	// Calls of the Go handler's OnCall applied (logged, replays included,
	// or read-only), and those the handler failed (call.go).
	calls, callFailures atomic.Int64
	buffered            atomic.Int64 // of a join: events its keys in memory buffer
	unmatched           atomic.Int64 // of a join: results of one event
	join                bool
	lateIn              []atomic.Int64 // per window, as fold.Pipeline.WindowNames
	windows             []string
	coreSize            atomic.Int64 // the last encoded core snapshot's size: the next one's buffer
}

// PipelineStats are the counters of one pipeline.
type PipelineStats struct {
	Events     int64 // events applied (duplicates included) since start
	Duplicates int64
	Late       int64 // events too late for every window they belonged to
	Emitted    int64 // window results emitted (replays emit theirs again)
	Expired    int64 // keys deleted by their pipeline's ttl
	// HandlerFailures counts the calls of the pipeline's Go handler that
	// failed (each emitted a dead letter; replays count theirs again).
	HandlerFailures int64
	// Calls counts the calls (request/reply) applied to the pipeline's
	// keys, logged (replays included) or read-only; CallFailures those the
	// handler failed (the caller got the error).
	Calls, CallFailures int64
	// Of a join: its results that joined two events (Emitted less
	// Unmatched), its results of one event with the other side empty, and
	// the events its keys in this node's memory buffer now. Late counts
	// its events too late to be joined.
	Join      bool
	Unmatched int64
	Buffered  int64
	// LateByWindow counts, per window name, the events too late for at
	// least one window of that name they fell in (taken by other windows
	// or not); nil without windows.
	LateByWindow map[string]int64
}

// Stats are counters of a host, for tests, metrics and the dashboard.
type Stats struct {
	ActiveKeys int
	// ResidentKeys are the keys held in memory without an actor, and
	// ResidentBytes the estimate of what they take (resident.go).
	ResidentKeys  int
	ResidentBytes int64
	// CachedKeys are the entries of the snapshot cache's index (cache.go:
	// an upper bound of the keys whose state it keeps, up to twice them;
	// keys back in memory keep their entry until they leave again),
	// CacheBytes the memory it holds; CacheHits counts the
	// activations that decoded a cached state instead of reading the
	// store, CacheMisses those that looked in the cache and read the store.
	CachedKeys             int64
	CacheBytes             int64
	CacheHits, CacheMisses int64
	DirtyKeys              int // keys changed since their last snapshot (spilled ones too)
	// SpilledKeys are the changed keys that left memory packed until their
	// group's next checkpoint (spill.go), SpilledBytes what the spill
	// holds (part of ResidentBytes); Spills and Unspills count the keys
	// that went there and those activated from there.
	SpilledKeys      int
	SpilledBytes     int64
	Spills, Unspills int64
	// NewKeys counts the keys activated as new without a store read: their
	// group's filter of stored keys does not hold them (storedkeys.go).
	// FilterBytes is the filters' memory (about 1.5 B a stored key).
	NewKeys     int64
	FilterBytes int64
	// IDLookups counts the events whose id the store's id index was read
	// for: the key held the fingerprint of an id it applied before it was
	// restored (fold.LookUp). A few in ten thousand events at a few dozen
	// remembered ids a key; every duplicate of an id applied before.
	IDLookups int64
	// IndexingIDs reports whether checkpoints write the ids they hand over
	// to the store's id index, and fingerprints into the snapshots: while
	// keys leave memory for want of room (see Config.AlwaysIndexIDs).
	IndexingIDs bool
	Events      int64 // events applied (duplicates included) since start
	Duplicates  int64
	Commits     int64 // group commits (synced appends)
	Checkpoints int64 // group checkpoints written
	Snapshots   int64 // key snapshots written by checkpoints (keys changed since their last)
	Replayed    int64 // log records replayed by take-overs (at start and after a loss)
	// LoggedBytes is the size of the log records above the groups'
	// checkpoints: what a restart would replay (about CheckpointMaxBytes at
	// most).
	LoggedBytes int64
	Activations int64 // keys given an actor: from the resident tier or the store
	// Spawned counts the actors spawned; an activation reuses the actor of
	// a passivated key when one is idle (shell.go), IdleActors of them now.
	Spawned     int64
	IdleActors  int
	Unparked    int64 // activations from the resident tier (no store read)
	Passivated  int64
	GroupsLost  int64 // key groups lost (failed or fenced write) and taken over again
	TimersFired int64 // keys woken because a timer was due
	// Overflows counts the actors' mailbox runs that found the workers'
	// queue full and got a goroutine of their own: bursts of messages to
	// many keys at once (a few at times of load are harmless; a steady
	// rise means the node is overloaded).
	Overflows int64
	// GroupsUnavailable is the number of key groups not being served now:
	// being recovered or taken over again.
	GroupsUnavailable int
	// GroupsTakingOver is the number of key group take-overs running.
	GroupsTakingOver int
	// Pipelines has the counters of each pipeline.
	Pipelines map[string]PipelineStats
}

// Stats returns the host's counters.
func (h *Host) Stats() Stats {
	h.mu.Lock()
	n, dirty, unavailable, takingOver, logged, filterBytes := h.lru.n, 0, 0, 0, int64(0), int64(0)
	resident, residentBytes := h.resident.n(), h.resident.bytes
	spilled, spilledBytes := len(h.resident.spill.index), h.resident.spill.bytes
	idle := len(h.shells)
	cached, cacheBytes := h.cache.stats()
	// Read with the groups' states: a loss counts under h.mu as its group
	// turns unavailable, and a caller waiting for "lost and served again"
	// must not see the count of a loss whose group still reads as served.
	lost := h.stats.groupsLost.Load()
	for i := range h.groups {
		gs := &h.groups[i]
		dirty += gs.changed()
		logged += gs.appended - gs.covered
		filterBytes += gs.stored.bytes()
		if gs.owned && !gs.ready {
			unavailable++
		}
		if gs.takingOver {
			takingOver++
		}
	}
	h.mu.Unlock()
	per := make(map[string]PipelineStats, len(h.stats.pipelines))
	for name, ps := range h.stats.pipelines {
		st := PipelineStats{Events: ps.events.Load(), Duplicates: ps.duplicates.Load(), Late: ps.late.Load(), Emitted: ps.emitted.Load(),
			Expired: ps.expired.Load(), HandlerFailures: ps.failures.Load(), Calls: ps.calls.Load(), CallFailures: ps.callFailures.Load(),
			Join: ps.join, Unmatched: ps.unmatched.Load(), Buffered: ps.buffered.Load()}
		if len(ps.windows) > 0 {
			st.LateByWindow = make(map[string]int64, len(ps.windows))
			for i, w := range ps.windows {
				st.LateByWindow[w] = ps.lateIn[i].Load()
			}
		}
		per[name] = st
	}
	return Stats{
		Pipelines:     per,
		ActiveKeys:    n,
		ResidentKeys:  resident,
		ResidentBytes: residentBytes,
		CachedKeys:    cached,
		CacheBytes:    cacheBytes,
		CacheHits:     h.cache.hits.Load(),
		CacheMisses:   h.cache.misses.Load(),
		Unparked:      h.stats.unparked.Load(),
		DirtyKeys:     dirty,
		SpilledKeys:   spilled,
		SpilledBytes:  spilledBytes,
		Spills:        h.stats.spilled.Load(),
		Unspills:      h.stats.unspilled.Load(),
		NewKeys:       h.stats.newKeys.Load(),
		IDLookups:     h.stats.idLookups.Load(),
		IndexingIDs:   h.indexing.Load(),
		FilterBytes:   filterBytes,
		Events:        h.stats.events.Load(),
		Duplicates:    h.stats.duplicates.Load(),
		Commits:       h.stats.commits.Load(),
		Checkpoints:   h.stats.checkpoints.Load(),
		Snapshots:     h.stats.snapshots.Load(),
		Replayed:      h.stats.replayed.Load(),
		LoggedBytes:   logged,
		Activations:   h.stats.activations.Load(),
		Spawned:       h.stats.spawned.Load(),
		IdleActors:    idle,
		Passivated:    h.stats.passivated.Load(),
		GroupsLost:    lost,
		TimersFired:   h.stats.timersFired.Load(),
		Overflows:     h.dispatcher.overflows.Load(),

		GroupsUnavailable: unavailable,
		GroupsTakingOver:  takingOver,
	}
}
