package actors

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"time"
	"weak"

	"github.com/keyfold/keyfold/actors/fold"
)

// CachedKeys returns how many of a pipeline's keys the snapshot cache
// would return now: of those in memory nowhere (for benchmarks: the
// cache's own count, Stats.CachedKeys, may count entries whose space it
// reused, see snapshotCache.stats, and keeps those of keys back in memory).
func CachedKeys(h *Host, pipeline string, keys func(yield func(string) bool)) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for key := range keys {
		id, g := keyID{pipeline, key}, h.GroupOf(pipeline, key)
		if _, spilled := h.findSpilledLocked(id, g); h.lookupLocked(id, g) == nil && !spilled && h.cache.get(id, h.groups[g].epoch) != nil {
			n++
		}
	}
	return n
}

// SetMaxIdleActors bounds the idle actors kept for reuse (shell.go).
func SetMaxIdleActors(h *Host, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.maxShells = n
}

// PassivatedBy returns how many keys passivated at once, their actor idle,
// and how many by a message to their actor (stopLocked).
func PassivatedBy(h *Host) (atOnce, byMessage int64) {
	n := h.stats.parkedIdle.Load()
	return n, h.stats.passivated.Load() - n
}

// NudgeCheckpoint nudges the checkpoint loop as a commit does.
func NudgeCheckpoint(h *Host) { h.nudgeCheckpoint() }

// CheckpointNudged reports whether a nudge waits for the checkpoint loop.
func CheckpointNudged(h *Host) bool { return len(h.checkpointNow) > 0 }

// Checkpoint runs a checkpoint of every group now, as the loop does, but
// unpaced.
func Checkpoint(h *Host, ctx context.Context) error { return h.checkpoint(ctx, false, "test") }

// SetLastRound sets when the checkpoint loop's last round began, which
// paces its next (before New's host runs).
func SetLastRound(h *Host, at time.Time) { h.lastRound = at }

// Paced reports whether a paced checkpoint round is under way.
func Paced(h *Host) bool { return h.pacing.Load() != nil }

// HurryCheckpoint lifts the pace of the round under way, as a memory
// budget full of changed keys does.
func HurryCheckpoint(h *Host) { h.hurryCheckpoint() }

// SetAfterFreeze sets a function each group's checkpoint runs once it
// took its dirty keys and froze its spill (before New's host runs).
func SetAfterFreeze(h *Host, f func(group uint32)) { h.afterFreeze = f }

// SpillParked spills every parked changed key, as the budget would, and
// returns how many went.
func SpillParked(h *Host) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for g := h.resident.dirty.back(); g != nil; {
		prev := h.grains.prev(g)
		if h.spillLocked(g) {
			n++
		}
		g = prev
	}
	return n
}

// CheckpointMaxRecords is the records at which a group's checkpoint no
// longer waits, for c with its defaults.
func CheckpointMaxRecords(c Config) uint64 {
	c = WithDefaults(c)
	return c.checkpointMaxRecords()
}

// WithDefaults returns c with its defaults filled in, as New does.
func WithDefaults(c Config) Config {
	c.setDefaults()
	return c
}

// CorruptSpilled makes a spilled key's packed state undecodable (its form
// byte); false if the key is not spilled.
func CorruptSpilled(h *Host, pipeline, key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := keyID{pipeline, key}
	at, ok := h.findSpilledLocked(id, h.GroupOf(pipeline, key))
	if !ok {
		return false
	}
	_, n := binary.Uvarint(at.e.value) // the position, then the packed state
	at.e.value[n] = 0xee
	return true
}

// StoredKeysKey names a group's filter of stored keys among its snapshots
// (storedkeys.go).
const StoredKeysKey = storedKeysKey

// WithoutStoredKeysFilter makes h keep no filters of stored keys, as a
// keyfold from before them did (for a setup func of start).
func WithoutStoredKeysFilter(h *Host) { h.noStoredKeys = true }

// InMemory reports whether a key is in memory (active, stopping or parked).
func InMemory(h *Host, pipeline, key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lookupLocked(keyID{pipeline, key}, h.GroupOf(pipeline, key)) != nil
}

// CheckRegistry fails if a key with an actor or parked is not the grain the
// registry holds for it (a second grain of one key), or if the lists'
// table (lru.go) holds other grains than the lists', or holds them
// elsewhere than at their handles.
func CheckRegistry(h *Host) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	listed := 0
	for i, l := range []*lru{&h.lru, &h.resident.clean, &h.resident.dirty, &h.resident.pinned} {
		n := 0
		for g := l.front(); g != nil; g = h.grains.next(g) {
			if h.keys.get(g.id) != g {
				return fmt.Errorf("key %s/%s is in memory (tier %d) as a grain the registry does not hold", g.id.pipeline, g.id.key, g.tier)
			}
			if i == 0 && g.tier != tierActive || i > 0 && (g.tier != tierParked || h.resident.list(g) != l) {
				return fmt.Errorf("key %s/%s (tier %d, resident list %d) is in list %d", g.id.pipeline, g.id.key, g.tier, g.rlist, i)
			}
			if n++; n > len(h.grains.entries) {
				return fmt.Errorf("list %d does not end", i)
			}
		}
		if n != l.n {
			return fmt.Errorf("a list holds %d grains and counts %d", n, l.n)
		}
		listed += n
	}
	inTable := 0
	for x, e := range h.grains.entries {
		g := e.g
		if g == nil {
			continue
		}
		if g.slot != uint32(x) {
			return fmt.Errorf("key %s/%s is at %d in the lists' table, its handle is %d", g.id.pipeline, g.id.key, x, g.slot)
		}
		inTable++
	}
	if inTable != listed || len(h.grains.entries) > 0 && inTable+len(h.grains.free) != len(h.grains.entries)-1 {
		return fmt.Errorf("the lists' table holds %d grains and %d free handles of %d, the lists %d grains", inTable, len(h.grains.free), len(h.grains.entries)-1, listed)
	}
	parked := 0
	for i := range h.groups {
		for j, g := range h.groups[i].parked {
			if g.tier != tierParked || g.group != uint32(i) || g.parkIdx != int32(j+1) {
				return fmt.Errorf("group %d lists key %s/%s among its parked keys at %d, which is not its parked key there", i, g.id.pipeline, g.id.key, j)
			}
		}
		parked += len(h.groups[i].parked)
	}
	if parked != h.resident.n() {
		return fmt.Errorf("the groups list %d parked keys, the resident tier %d", parked, h.resident.n())
	}
	return nil
}

// Active reports whether a key has an actor.
func Active(h *Host, pipeline, key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.lookupLocked(keyID{pipeline, key}, h.GroupOf(pipeline, key))
	return g != nil && g.tier == tierActive
}

// Break makes a key in memory fail as one whose activation failed does
// (grain.broken), without losing its group.
func Break(h *Host, pipeline, key string, err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.lookupLocked(keyID{pipeline, key}, h.GroupOf(pipeline, key))
	if g == nil {
		return false
	}
	g.broken = err
	return true
}

// ShapeKey is the name of a pipeline's shape in its groups' snapshots.
func ShapeKey(p *fold.Pipeline) string {
	_, id := p.Shape()
	return shapeKey(p.Name(), id)
}

// IsPacked reports whether a stored snapshot is in the packed form.
func IsPacked(data []byte) bool { return isPacked(data) }

// WatchGrain returns a function that reports, after a collection, whether
// the grain the key has in memory now was collected (nil if it has none).
func WatchGrain(h *Host, pipeline, key string) func() bool {
	h.mu.Lock()
	g := h.keys.get(keyID{pipeline, key})
	h.mu.Unlock()
	if g == nil {
		return nil
	}
	w := weak.Make(g)
	return func() bool {
		runtime.GC()
		return w.Value() == nil
	}
}

// CheckpointDue reports whether the checkpoint loop, nudged now, would
// start a checkpoint.
func CheckpointDue(h *Host) bool { return h.checkpointDue() != "" }
