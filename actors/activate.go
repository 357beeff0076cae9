package actors

import (
	"context"
	"fmt"
	"slices"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// Activation reads snapshots in batches. A key the commit loop is about to
// activate is read together with the other keys the same commit activates,
// of every group, while the commit's append is syncing: two batched reads
// (the snapshots, then the id buckets they name), where one read per key
// inside each grain's mailbox cost a fifth of the CPU at a million keys
// (BENCHMARKS.md), a round trip per key on Redis, and later one read per
// group a sixth of it again (session 36).
//
// Why such a read is current when the grain starts from it: only keys that
// are not in memory are read (not active, parked or stopping); a key that
// is not in memory is clean (its snapshot holds its state: only clean keys
// leave memory, resident.go); and only a commit makes a key dirty, and
// commits run one at a time, this one waiting for its read. (Checkpoints of
// the group meanwhile write only dirty keys, in memory or spilled, and a
// spilled key is not read: mayBeStoredLocked.) A take-over of the group meanwhile replays it into new grains, and
// this commit then does not dispatch to it (its epoch moved). A key a query
// activates reads for itself.

// loaded is a key's state as read from the store, or as the snapshot cache
// kept it (cache.go).
type loaded struct {
	found bool // the key has a snapshot
	// state is set if found. (Behind a pointer: most loads are of the
	// snapshot cache, which sets cached alone, and a State in each was
	// most of the bytes a commit's look-ups allocated.)
	state *fold.State
	pos   persistence.Position
	// cached is the key's state in the snapshot cache or the spill, which
	// the grain decodes (on its actor, not under h.mu); found and state are
	// unset. spilled: from the spill, so the store's snapshot is older.
	cached  []byte
	spilled bool
}

// keyAt is a key and its group.
type keyAt struct {
	id    keyID
	group uint32
}

// loadKeys reads the snapshots of keys, and then the id buckets they name:
// one read each for all the keys' groups (persistence.Snapshots.GetGroups,
// one round trip on Redis). A key without a snapshot (never seen, or
// erased) loads as empty. out[i] is keys[i]'s.
func loadKeys(ctx context.Context, store persistence.Store, pipelines map[string]*fold.Pipeline, keys []keyAt) ([]loaded, error) {
	groups := make([]uint32, len(keys))
	names := make([]string, len(keys))
	for i, k := range keys {
		groups[i], names[i] = k.group, k.id.snapshotKey()
	}
	datas, err := readGroups(ctx, store, groups, names)
	if err != nil {
		return nil, err
	}
	snaps := make([]*keyfoldv1.Snapshot, len(keys))
	out := make([]loaded, len(keys))
	var (
		bucketGroups []uint32
		bucketNames  []string
		packed       []packedAt
	)
	for i, data := range datas {
		if data == nil {
			continue
		}
		id := keys[i].id
		if isPacked(data) {
			ps, err := parsePacked(data)
			if err != nil {
				return nil, fmt.Errorf("snapshot of %s/%s: %w", id.pipeline, id.key, err)
			}
			packed = append(packed, packedAt{i, ps})
			continue
		}
		var snap keyfoldv1.Snapshot
		if err := proto.Unmarshal(data, &snap); err != nil {
			return nil, fmt.Errorf("snapshot of %s/%s: %w", id.pipeline, id.key, err)
		}
		snaps[i] = &snap
		st := snap.GetState()
		for bi, b := range st.GetSeenBuckets() {
			for part := range fold.StoredParts(st, bi) {
				bucketGroups = append(bucketGroups, keys[i].group)
				bucketNames = append(bucketNames, id.bucketKey(b, part))
			}
		}
	}
	// (A bucket's name holds its key's, and a key has one group: the
	// names are distinct across the groups.)
	buckets := map[string][]byte{}
	if len(bucketNames) > 0 {
		vals, err := readGroups(ctx, store, bucketGroups, bucketNames)
		if err != nil {
			return nil, err
		}
		for i, name := range bucketNames {
			if vals[i] != nil {
				buckets[name] = vals[i]
			}
		}
	}
	if err := loadPacked(ctx, store, pipelines, keys, packed, out); err != nil {
		return nil, err
	}
	for i, snap := range snaps {
		if snap == nil {
			continue
		}
		id := keys[i].id
		state, err := pipelines[id.pipeline].RestoreParts(snap.State, func(b int64, part int) ([]byte, error) {
			return buckets[id.bucketKey(b, part)], nil // nil: not stored
		})
		if err != nil {
			return nil, fmt.Errorf("snapshot of %s/%s: %w", id.pipeline, id.key, err)
		}
		out[i] = loaded{found: true, state: &state, pos: snap.Position}
	}
	return out, nil
}

// readGroups reads the snapshots names[i] of groups groups[i], all in one
// persistence.Snapshots.GetGroups; out[i] is names[i]'s (nil: none).
func readGroups(ctx context.Context, store persistence.Snapshots, groups []uint32, names []string) ([][]byte, error) {
	type at struct{ read, i int }
	var (
		reads []persistence.GroupKeys
		index = map[uint32]int{} // a group's read
		where = make([]at, len(names))
	)
	for i, g := range groups {
		r, ok := index[g]
		if !ok {
			r = len(reads)
			index[g] = r
			reads = append(reads, persistence.GroupKeys{Group: g})
		}
		where[i] = at{r, len(reads[r].Keys)}
		reads[r].Keys = append(reads[r].Keys, names[i])
	}
	datas, err := store.GetGroups(ctx, reads)
	if err != nil {
		return nil, err
	}
	if len(datas) != len(reads) {
		return nil, fmt.Errorf("store returned %d groups' snapshots for %d groups", len(datas), len(reads))
	}
	for r, d := range datas {
		if len(d) != len(reads[r].Keys) {
			// (Read as missing, its keys would start empty and
			// overwrite their snapshots at the next checkpoint.)
			return nil, fmt.Errorf("store returned %d snapshots for %d keys of group %d", len(d), len(reads[r].Keys), reads[r].Group)
		}
	}
	out := make([][]byte, len(names))
	for i, w := range where {
		out[i] = datas[w.read][w.i]
	}
	return out, nil
}

// newKey is the load of a key known to have no snapshot (read only).
var newKey = &loaded{}

// mayBeStoredLocked reports whether activating the key could read its
// snapshot: it is neither in memory nor spilled, and its group does not
// know it to be new (groupState.complete; its filter of stored keys,
// groupState.stored, is the reader's to ask: prefetch.read). It returns
// the key's grain if the key is in memory (active, parked, or stopping:
// its grain takes the message). h.mu must be held.
func (h *Host) mayBeStoredLocked(id keyID, group uint32) (*grain, bool) {
	if g := h.lookupLocked(id, group); g != nil {
		return g, false
	}
	if h.groups[group].complete {
		return nil, false
	}
	_, spilled := h.findSpilledLocked(id, group)
	return nil, !spilled
}

// prefetch is the batched read of the keys one commit activates.
type prefetch struct {
	done  chan struct{}
	byKey map[keyID]*loaded // valid once done is closed; nil if the read failed
	// cached are the keys found in the snapshot cache, and those known to
	// be new (newKey: their group's filter of stored keys does not hold
	// them), not read (valid once done is closed).
	cached map[keyID]*loaded
}

// prefetchKey is a key a commit may have to read, and its group's
// incarnation when the commit looked.
type prefetchKey struct {
	id     keyID
	group  uint32
	epoch  persistence.Epoch
	stored *storedKeys // the group's filter then
}

// prefetchLocked starts reading the states of the commit's keys that are
// in memory nowhere (neither active, parked, stopping nor spilled) and may
// be stored: from the snapshot cache, else from the store; h.mu must be
// held. It returns nil if there is no such key.
//
// The cache is looked up with the store reads, while the append syncs, not
// here under h.mu: at a million keys its look-ups (a cache miss or two
// each, and a copy of the entry) were a third of the commit loop's time
// under the lock (BENCHMARKS.md, session 20). A key's entry cannot change
// meanwhile for the reasons its snapshot cannot (above): it is clean, and
// an entry is written only when a key leaves memory, with the state it has
// when clean. So is the group's filter of stored keys (a cache line a
// layer per key: under h.mu, 0.7 µs of an event at ten million keys,
// BENCHMARKS.md session 24), which cannot come to hold such a key
// meanwhile either: a checkpoint writes only changed keys.
func (h *Host) prefetchLocked(groups []*groupBatch) *prefetch {
	var keys []prefetchKey
	for _, gb := range groups {
		for _, kb := range gb.keys {
			var stored bool
			if kb.g, stored = h.mayBeStoredLocked(kb.id, gb.group); stored {
				gs := &h.groups[gb.group]
				keys = append(keys, prefetchKey{kb.id, gb.group, gs.epoch, gs.stored})
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	p := &prefetch{done: make(chan struct{})}
	go p.read(h, keys)
	return p
}

// read looks the keys up in the snapshot cache, then in their group's
// filter of stored keys, and reads the others from the store, then closes
// p.done.
func (p *prefetch) read(h *Host, keys []prefetchKey) {
	defer close(p.done)
	var want []keyAt // the keys to read from the store
	// The hits share two allocations, their loaded and their entries' bytes:
	// at a million keys most of a commit's keys are cache hits, and one
	// object each (of ~240 B, with the state's room) was a twentieth of
	// the bytes allocated per event (BENCHMARKS.md, session 23). Both are
	// made at the first hit, for the keys left; the slab never grows, so
	// that its elements stay where they are.
	var (
		name  []byte // the cache's key, scratch
		vals  []byte // the hits' entries
		state []byte
		hits  []loaded
	)
	for i, k := range keys {
		state, vals, name = h.cache.lookup(name, vals, k.id, k.epoch)
		known := state == nil && !k.stored.mayHave(k.id)
		if (state != nil || known) && p.cached == nil {
			p.cached = make(map[keyID]*loaded, len(keys)-i)
		}
		switch {
		case state != nil:
			if hits == nil {
				hits = make([]loaded, 0, len(keys)-i)
				// (Entries of aggregates take 60 B or so. The first
				// stays where it is: state is its own slice.)
				vals = slices.Grow(vals, 64*(len(keys)-i-1))
			}
			hits = append(hits, loaded{cached: state})
			p.cached[k.id] = &hits[len(hits)-1]
		case known:
			p.cached[k.id] = newKey
		default:
			want = append(want, keyAt{k.id, k.group})
		}
	}
	if len(want) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	// Every group's keys in one read: a commit of keys not in memory
	// touches most groups, and a read per group (32 at a time, each a
	// goroutine and a Redis round trip) cost a fifth of the node's CPU at
	// a million keys (BENCHMARKS.md, session 36).
	ls, err := loadKeys(ctx, h.store, h.cfg.Pipelines, want)
	if err != nil {
		return // the grains read for themselves (and fail as they would)
	}
	p.byKey = make(map[keyID]*loaded, len(want))
	for i := range ls {
		p.byKey[want[i].id] = &ls[i]
	}
}

// take returns the read of a key, once the read is done (nil if it failed,
// or the key was not read). The commit dispatches only to groups whose epoch
// did not move since the read began, so a read it takes is current.
func (p *prefetch) take(id keyID) *loaded {
	if p == nil {
		return nil
	}
	if l := p.cached[id]; l != nil {
		return l
	}
	return p.byKey[id] // (nil if the read failed)
}
