package actors

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/VictoriaMetrics/fastcache"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
)

// The snapshot cache: what a key that left memory was, kept encoded.
//
// A key in memory costs its grain and its decoded state (about 900 B with a
// few aggregates, resident.go); the same state encoded takes a tenth of
// that (fold.AppendPacked). Once keys outnumber what max_memory holds as grains, nine events in
// ten met a key that had left memory, and reading it back from the store
// was most of the CPU (Pebble's Get 34% at ten times more keys than fit,
// BENCHMARKS.md session 11). So a clean key leaving the resident tier
// leaves its state here, packed, and the next
// activation decodes it instead of reading the store; beyond the cache's
// budget the oldest entries go, and those keys are read from the store
// again. A cache hit saves the store read, not the decode. A key whose ids
// are in buckets (more than fold.InlineIDs) is kept with its buckets'
// numbering, so that it comes back knowing which parts of them the store
// holds (fold.AppendCached; until session 37 such keys were not kept, and
// after minutes of load most keys at a million were such).
//
// Why an entry is current: it is written when a clean key leaves memory,
// so it holds what the key's snapshot in the store holds, and a key that is
// not in memory does not change (resident.go: only an actor applies inputs,
// and activation takes the key into memory first). An entry stays when its
// key comes back into memory: nothing reads it while the key is there
// (activation looks in memory first, and a commit's prefetch only for keys
// in memory nowhere), and the key leaves memory again only through put,
// which replaces the entry or deletes it if it does not keep the key, or
// changed, into the spill, which activation reads before the cache and
// whose checkpoint replaces the entry (spill.go). (The delete at each
// activation was a cache miss in fastcache's index, about 1% of the CPU at a
// million keys, BENCHMARKS.md session 32; the entry's bytes stay in its
// chunk either way until the ring wraps.) The store's snapshot of a key
// changes otherwise only in another incarnation of its group (a take-over
// replaying it, another node owning it): an entry carries the group's
// epoch and counts only in it.
//
// The cache is VictoriaMetrics' fastcache: it keeps entries in 64 KiB
// chunks outside the Go heap (so the collector neither scans them nor
// counts them towards the heap's growth: held as grains, the same keys
// cost twice their size in heap, BENCHMARKS.md session 10), indexed by
// maps without pointers, and evicts the oldest chunk of a bucket when the
// budget is full. Written only as its key leaves memory, an entry's age is
// the time since its key was last used: oldest first is least recently
// used first. A hash collision or a deleted entry is a miss, which only
// costs the store read. Every call but lookup runs
// under h.mu, so the scratch buffers are the host's; lookup, which a
// commit's read calls without it, takes its caller's.
type snapshotCache struct {
	c            *fastcache.Cache // nil: no cache
	key, val     []byte           // scratch, under h.mu
	hits, misses atomic.Int64
}

// The cache's budget covers its entries, in fastcache's chunks, and their
// index, maps in the Go heap: about 58 B for an entry of a key with a few
// aggregates and one id, and 20-40 B for its index entry (a swiss table's
// slot of 16 B between growths, and fastcache keeps entries whose space it
// reused in the index until the ring next wraps; BenchmarkCachedKeyMemory).
// So the chunks get two thirds of it.
func cacheChunkBytes(budget int64) int64 { return budget / 3 * 2 }

// MinCacheMemory is the smallest Config.CacheMemory: fastcache allocates a
// 64 KiB chunk for each of its 512 buckets, 32 MiB, at least.
const MinCacheMemory = 48 << 20

func newSnapshotCache(budget int64) snapshotCache {
	if budget <= 0 {
		return snapshotCache{}
	}
	return snapshotCache{c: fastcache.New(int(cacheChunkBytes(budget)))}
}

// name returns the cache key of id, in the scratch buffer: the key's name
// in the snapshot store, unique across groups.
func (c *snapshotCache) name(id keyID) []byte {
	c.key = id.appendSnapshotKey(c.key[:0])
	return c.key
}

// put keeps a clean key's state as it leaves memory, if it is small
// enough (fold.AppendCached: a key whose ids are in buckets with their
// buckets' numbering, which its snapshot stores); otherwise it deletes the
// key's entry, which may be from an earlier time the key left memory. Not
// kept: an empty state (the store has no snapshot of it, and from there it
// comes back as a new key), and one with changes its snapshot lacks though
// the key is clean (a restore that asked for a new bucket layout,
// fold.RestoreParts: a copy would forget to delete the old buckets). The
// grain must be parked (put is the host's, under h.mu, which it must hold).
func (c *snapshotCache) put(g *grain) {
	if c.c == nil {
		return
	}
	g.catchUpSaved() // (the key's id buckets then know what is stored)
	if g.state.Empty() || g.state.Version() > g.stored {
		c.del(g.id)
		return
	}
	defer func() {
		// A Go handler's codec runs here, under h.mu: a panic in it must
		// not leave the lock held (it fails the key's next snapshot too).
		if r := recover(); r != nil {
			c.del(g.id)
			g.host.log.Error("snapshot cache: encoding panicked; not cached", "pipeline", g.id.pipeline, "key", g.id.key, "panic", r)
		}
	}()
	v := binary.AppendUvarint(c.val[:0], g.epoch)
	v = binary.AppendUvarint(v, g.pos)
	v, err := g.pipeline.AppendCached(v, &g.state)
	c.val = v[:0]
	if err != nil {
		// Not cached: the store has it. (The checkpoint that stored
		// this state encoded it, so this does not happen.)
		c.del(g.id)
		g.host.log.Warn("snapshot cache: encode failed", "pipeline", g.id.pipeline, "key", g.id.key, "err", err)
		return
	}
	c.set(c.name(g.id), v)
}

// putValue keeps the state of a clean key that left memory from the
// spill: value is its position and its state as the spill packs it
// (spill.go), which a snapshot stored since holds: it is kept in the
// cache's form (fold.StoredCached). name is its cache key. h.mu must be
// held.
func (c *snapshotCache) putValue(name []byte, epoch persistence.Epoch, value []byte) {
	if c.c == nil {
		return
	}
	pos, n := binary.Uvarint(value)
	if n <= 0 { // (not expected: the spill holds what it encoded)
		c.c.Del(name)
		return
	}
	v := binary.AppendUvarint(binary.AppendUvarint(c.val[:0], epoch), pos)
	v, err := fold.StoredCached(v, value[n:])
	if err != nil { // (likewise)
		c.c.Del(name)
		return
	}
	c.val = v[:0]
	c.set(name, v)
}

// maxEntryBytes bounds what fastcache keeps: an entry of 64 KiB or more,
// with its name and 4 bytes of lengths, it silently does not store, and
// the key's older entry would stay.
const maxEntryBytes = 1<<16 - 4

// set writes the entry of a key, or deletes its older one if the entry is
// too large to keep.
func (c *snapshotCache) set(name, v []byte) {
	if len(name)+len(v) >= maxEntryBytes {
		c.c.Del(name)
		return
	}
	c.c.Set(name, v)
}

// get returns the cached state of a key of a group in epoch, or nil. h.mu
// must be held.
func (c *snapshotCache) get(id keyID, epoch persistence.Epoch) *loaded {
	state, _, key := c.lookup(c.key, nil, id, epoch)
	c.key = key
	if state == nil {
		return nil
	}
	return &loaded{cached: state}
}

// lookup appends the cached state of a key of a group in epoch to dst and
// returns it (nil if there is none; dst is then as it was), dst, and the
// caller's scratch buffer for the entry's name, for reuse. It needs no
// h.mu: fastcache is safe for concurrent use, and the counters are atomic.
// (c.c is set once, before the host runs, and reset after it stopped.)
func (c *snapshotCache) lookup(scratch, dst []byte, id keyID, epoch persistence.Epoch) (state, _, _ []byte) {
	if c.c == nil {
		return nil, dst, scratch
	}
	scratch = id.appendSnapshotKey(scratch[:0])
	start := len(dst)
	v, ok := c.c.HasGet(dst, scratch)
	if ok {
		if e, n := binary.Uvarint(v[start:]); n > 0 && e == epoch {
			c.hits.Add(1)
			return v[start+n : len(v) : len(v)], v, scratch
		}
	}
	c.misses.Add(1)
	return nil, v[:start], scratch
}

// del forgets a key's entry. h.mu must be held.
func (c *snapshotCache) del(id keyID) {
	if c.c != nil {
		c.c.Del(c.name(id))
	}
}

// reset frees the cache's memory (for the next host's cache: fastcache
// keeps freed chunks for reuse).
func (c *snapshotCache) reset() {
	if c.c != nil {
		c.c.Reset()
		c.c = nil
	}
}

// stats returns the entries in the cache's index and the bytes it holds.
// The count is fastcache's: it forgets an entry whose space was reused
// only when its bucket's ring next wraps, so it may be up to twice the
// keys the cache can return.
func (c *snapshotCache) stats() (entries, bytes int64) {
	if c.c == nil {
		return 0, 0
	}
	var s fastcache.Stats
	c.c.UpdateStats(&s)
	return int64(s.EntriesCount), int64(s.BytesSize)
}

// decodeCached rebuilds a state cached by put: the log position it is as
// of, then the state (which keeps nothing of data).
func decodeCached(p *fold.Pipeline, data []byte) (fold.State, persistence.Position, error) {
	pos, n := binary.Uvarint(data)
	if n <= 0 {
		return fold.State{}, 0, fmt.Errorf("cached snapshot: bad position")
	}
	s, err := p.UnpackCached(data[n:])
	return s, pos, err
}
